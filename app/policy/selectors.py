"""Label selectors as Cilium matches them against endpoint identities (cilium-semantics.md §1.2, §2).

Owns: parsing an EndpointSelector / Kubernetes LabelSelector into requirements that carry a label
source (`k8s:`, `any:`, `reserved:`, ...), matching them against a pod identity or a node identity
(`host` / `remote-node`, the identities a hostNetwork pod's traffic carries, §1.4), and the
namespace scoping Cilium adds to peer selectors.
Must not: know about rules, ports or verdicts.

Errors the CRD schema or the apiserver would reject (an operator outside the four, a non-string
value) raise `InvalidPolicy`; selectors that only fail to *parse* in the agent (empty `values` for
`In`, a malformed label value) match nothing, as Cilium does (pkg/policy/api/selector.go), and
carry the reason in `Selector.broken`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from app.models.cilium import Version
from app.models.labels import (
    CILIUM_CLUSTER_LABEL,
    CILIUM_NAMESPACE_LABEL,
    CILIUM_NAMESPACE_LABELS_PREFIX,
    CILIUM_SERVICE_ACCOUNT_LABEL,
)

Match = Literal["yes", "no", "maybe"]
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
# Sources whose labels a Kubernetes pod carries: `k8s:` labels, and `any:` matches every source.
POD_SOURCES = frozenset({"k8s", "any"})
RESERVED_SOURCE = "reserved"
# Kubernetes label value syntax (apimachinery validation.IsValidLabelValue).
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# The reserved identities a hostNetwork pod's traffic carries: `host` on its own node,
# `remote-node` on the others (§1.4). Both are in no namespace and have no service account.
NODE_IDENTITIES = ("host", "remote-node")
# Labels only a pod's identity has; a node identity never carries them.
_POD_ONLY_KEYS = (CILIUM_NAMESPACE_LABEL, CILIUM_NAMESPACE_LABELS_PREFIX, CILIUM_SERVICE_ACCOUNT_LABEL,
                  CILIUM_CLUSTER_LABEL)


class InvalidPolicy(ValueError):
    """The policy would be rejected (CRD schema, apiserver or Cilium validation): not enforced."""


@dataclass(frozen=True)
class Requirement:
    source: str  # k8s | any | reserved | any other source (never on a pod)
    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist
    values: frozenset[str] = frozenset()

    def matches(self, identity: Mapping[str, str]) -> bool:
        return self.holds(identity.get(self.key) if self.source in POD_SOURCES else None)

    def holds(self, value: str | None) -> bool:
        """Whether a label with this key and `value` (None: no such label) satisfies the requirement."""
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        return value is None  # DoesNotExist

    def on_node(self, node: str) -> Match:
        """Whether the `node` identity (host | remote-node) satisfies the requirement.

        Exact for reserved keys and for the labels only pods carry; `maybe` for any other key,
        since node identities may carry node labels (node-selector labels), which are not modelled,
        and for `reserved:kube-apiserver`, which a node running the apiserver also carries.
        """
        reserved = self.source == RESERVED_SOURCE
        if reserved or (self.source == "any" and self.key in (*NODE_IDENTITIES, "kube-apiserver")):
            if self.key == "kube-apiserver":
                return "maybe"
            return "yes" if self.holds("" if self.key == node else None) else "no"
        if self.source not in POD_SOURCES or self.key.startswith(_POD_ONLY_KEYS):
            return "yes" if self.holds(None) else "no"
        return "maybe"

    def __str__(self) -> str:
        key = self.key if self.source == "any" else f"{self.source}:{self.key}"
        if self.operator == "In" and len(self.values) == 1:
            return f"{key}={next(iter(self.values))}"
        if self.operator in ("In", "NotIn"):
            return f"{key} {self.operator} ({','.join(sorted(self.values))})"
        return f"{key} {self.operator}"


@dataclass(frozen=True)
class Selector:
    """Requirements ANDed together; `{}` (no requirements) matches every identity."""

    requirements: tuple[Requirement, ...] = ()
    broken: str = ""  # why the agent cannot parse it: then it matches nothing

    def matches(self, identity: Mapping[str, str]) -> bool:
        return not self.broken and all(r.matches(identity) for r in self.requirements)

    def mentions(self, key: str) -> bool:
        """Whether a requirement with a pod source (k8s:/any:) names `key`."""
        return any(r.key == key and r.source in POD_SOURCES for r in self.requirements)

    def with_requirement(self, requirement: Requirement) -> Selector:
        return Selector((*self.requirements, requirement), self.broken)

    def __str__(self) -> str:
        if self.broken:
            return f"<matches nothing: {self.broken}>"
        return "{" + ", ".join(str(r) for r in self.requirements) + "}" if self.requirements else "{}"


def split_key(raw: str, *, default_source: str) -> tuple[str, str]:
    """`k8s:app` → ("k8s", "app"); `$host` → ("reserved", "host"); `app` → (default_source, "app").

    Mirrors pkg/labels GetExtendedKeyFrom: the source is everything before the first ':'.
    """
    if raw.startswith("$"):
        return RESERVED_SOURCE, raw[1:]
    source, sep, key = raw.partition(":")
    if not sep:
        return default_source, raw
    return source or default_source, key


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidPolicy(f"{where}: must be a string, got {type(value).__name__} {value!r}")
    return value


def parse_selector(raw: Any, where: str, *, default_source: str = "any", key_prefix: str = "") -> Selector:
    """Parse a LabelSelector mapping (`matchLabels` + `matchExpressions`).

    Args:
        raw: the selector as written; None is treated as `{}`.
        where: the field path, for messages.
        default_source: source of keys written without one ("any" for Cilium, "k8s" for KNP).
        key_prefix: prepended to every key (KNP namespaceSelector → namespace-label keys).

    Raises:
        InvalidPolicy: shapes the CRD schema rejects (non-mapping, unknown operator, non-strings).
    """
    if raw is None:
        return Selector()
    if not isinstance(raw, Mapping):
        raise InvalidPolicy(f"{where}: a label selector must be a mapping, got {type(raw).__name__}")
    unknown = sorted(set(raw) - {"matchLabels", "matchExpressions"})
    if unknown:
        raise InvalidPolicy(f"{where}: unknown selector field(s) {', '.join(map(str, unknown))}")
    requirements: list[Requirement] = []
    broken = ""
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise InvalidPolicy(f"{where}.matchLabels: must be a mapping")
    for raw_key, raw_value in labels.items():
        key = _string(raw_key, f"{where}.matchLabels key")
        if key.startswith("$"):
            # NB: the `$host` shorthand of pkg/labels is not a valid label key: Cilium 1.20's
            # Sanitize rejects the whole policy for it ("name part must consist of alphanumeric
            # characters"), found by hack/oracle.
            raise InvalidPolicy(f"{where}.matchLabels: {key!r} is not a valid label key (Cilium rejects the policy)")
        value = _string(raw_value, f"{where}.matchLabels[{key}]")
        if not _LABEL_VALUE.match(value) or len(value) > 63:
            broken = broken or f"matchLabels[{key}]: {value!r} is not a valid label value"
        source, name = _source_key(key, default_source, key_prefix)
        requirements.append(Requirement(source, name, "In", frozenset({value})))
    expressions = raw.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise InvalidPolicy(f"{where}.matchExpressions: must be a list")
    for i, expr in enumerate(expressions):
        requirement, problem = _parse_expression(expr, f"{where}.matchExpressions[{i}]", default_source, key_prefix)
        requirements.append(requirement)
        broken = broken or problem
    return Selector(tuple(requirements), broken)


def _source_key(key: str, default_source: str, key_prefix: str) -> tuple[str, str]:
    if not key:
        raise InvalidPolicy("a selector key is empty")
    if key_prefix:
        return default_source, key_prefix + key
    return split_key(key, default_source=default_source)


def _parse_expression(expr: Any, where: str, default_source: str, key_prefix: str) -> tuple[Requirement, str]:
    if not isinstance(expr, Mapping):
        raise InvalidPolicy(f"{where}: must be a mapping with key, operator, values")
    key = _string(expr.get("key"), f"{where}.key")
    operator = _string(expr.get("operator"), f"{where}.operator")
    if operator not in OPERATORS:
        # NB: the CRD enum is case-sensitive; Cilium's own and-statement example uses `in`.
        raise InvalidPolicy(f"{where}.operator: {operator!r} is not one of {', '.join(OPERATORS)}")
    raw_values = expr.get("values") or []
    if not isinstance(raw_values, list):
        raise InvalidPolicy(f"{where}.values: must be a list")
    values = frozenset(_string(v, f"{where}.values[]") for v in raw_values)
    problem = ""
    if operator in ("In", "NotIn") and not values:
        problem = f"{where}: operator {operator} needs at least one value"
    elif operator in ("Exists", "DoesNotExist") and values:
        problem = f"{where}: operator {operator} takes no values"
    source, name = _source_key(key, default_source, key_prefix)
    return Requirement(source, name, operator, values), problem


# getEndpointSelector (pkg/k8s/apis/cilium.io/utils) leaves a peer that names namespace labels
# unscoped from v1.16.0 on; v1.15.6 scopes every peer without a namespace key to the policy's
# namespace (read from both module sources).
UNSCOPED_NAMESPACE_LABELS_SINCE = (1, 16)


@dataclass(frozen=True)
class PeerSelector:
    """A peer selector after Cilium's scoping (getEndpointSelector, pkg/k8s/apis/cilium.io/utils).

    `namespace` is the namespace a matching pod must be in (None: any). `scope_uncertain` marks
    a CNP peer that names namespace labels: current Cilium leaves it unscoped, older releases
    scoped it to the policy's namespace (§2.3 step 3), so a cross-namespace match is `maybe`.
    """

    selector: Selector
    namespace: str | None = None
    scope_uncertain: bool = False

    def match(self, identity: Mapping[str, str], namespace: str, *, version: Version | None = None) -> Match:
        """`version`: the agent's; it settles `scope_uncertain` (unscoped from 1.16, scoped before)."""
        if not self.selector.matches(identity):
            return "no"
        if self.namespace is None or self.namespace == namespace:
            return "yes"
        if not self.scope_uncertain:
            return "no"
        if version is None:
            return "maybe"
        return "yes" if version[:2] >= UNSCOPED_NAMESPACE_LABELS_SINCE else "no"

    def match_node(self, node: str) -> tuple[Match, str]:
        """Whether traffic of a hostNetwork pod, seen as the `node` identity, is a peer (§1.4)."""
        if self.selector.broken:
            return "no", f"peer selector {self} matches nothing"
        if self.namespace is not None and not self.scope_uncertain:
            return "no", f"peer selector {self} is scoped to a namespace, which a node identity is not in"
        got: Match = "yes"
        for requirement in self.selector.requirements:
            one = requirement.on_node(node)
            if one == "no":
                return "no", f"peer selector {self}: {requirement} does not hold for entity {node}"
            if one == "maybe":
                got = "maybe"
        if got == "maybe":
            return "maybe", (f"peer selector {self} may select entity {node}: node identities may carry node or "
                             "kube-apiserver labels, which the snapshot does not tell")
        if self.namespace is not None:
            return "maybe", (f"peer selector {self} names namespace labels and selects entity {node} unscoped: "
                             "older Cilium releases scope it to the policy's namespace, newer ones do not")
        return "yes", f"peer selector {self} selects entity {node}"

    def __str__(self) -> str:
        scope = f" in namespace {self.namespace}" if self.namespace is not None else ""
        return f"{self.selector}{scope}"


def scope_peer(selector: Selector, *, policy_namespace: str | None) -> PeerSelector:
    """The effective peer of a CNP (policy_namespace set) or CCNP (None) selector (§2.3, §2.4).

    A selector with a `reserved:` key, or one that names `io.kubernetes.pod.namespace` with any
    operator, is used as written (the "namespace escape"). A CCNP peer otherwise only gains
    `Exists io.kubernetes.pod.namespace`, which every pod satisfies.
    """
    if any(r.source == RESERVED_SOURCE for r in selector.requirements) or selector.mentions(CILIUM_NAMESPACE_LABEL):
        return PeerSelector(selector)
    if policy_namespace is None:
        return PeerSelector(selector.with_requirement(Requirement("k8s", CILIUM_NAMESPACE_LABEL, "Exists")))
    names_namespace_labels = any(
        r.source in POD_SOURCES and r.key.startswith(CILIUM_NAMESPACE_LABELS_PREFIX.rstrip("."))
        for r in selector.requirements
    )
    return PeerSelector(selector, policy_namespace, scope_uncertain=names_namespace_labels)
