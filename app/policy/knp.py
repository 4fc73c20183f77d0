"""Kubernetes NetworkPolicy → compiled `Rule`, as Cilium translates it (pkg/k8s/network_policy.go;
cilium-semantics.md §2.5, §8).

Owns: podSelector subject (namespace-scoped, `k8s:` keys), peers (podSelector, namespaceSelector
→ namespace-label keys, ipBlock → never a pod), ports with endPort and named ports, and which
directions the policy enforces — including Cilium's divergence from upstream: a non-empty
`ingress`/`egress` section is enforced even when `policyTypes` leaves it out (cilium#48703).
Must not: decide verdicts, or raise on any input.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from app.models.cluster import PolicyObject
from app.models.labels import CILIUM_NAMESPACE_LABEL, CILIUM_NAMESPACE_LABELS_PREFIX
from app.policy.cidrs import CidrRule
from app.policy.ports import parse_knp_port
from app.policy.rules import DIRECTIONS, CompiledPolicy, Direction, Entry, Peers, Rule
from app.policy.selectors import InvalidPolicy, PeerSelector, Requirement, Selector, parse_selector

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"
PEER_FIELD: Mapping[Direction, str] = {"ingress": "from", "egress": "to"}
POLICY_TYPES: Mapping[Direction, str] = {"ingress": "Ingress", "egress": "Egress"}


def compile_knp(policy: PolicyObject) -> CompiledPolicy:
    """Compile one NetworkPolicy; never raises."""
    body: Mapping[str, Any] = policy.body
    problems: list[str] = []
    unsupported: list[str] = []
    if policy.api_version != API_VERSION:
        unsupported.append(f"apiVersion {policy.api_version!r} is not {API_VERSION}")
    spec = body.get("spec")
    try:
        if not isinstance(spec, Mapping):
            raise InvalidPolicy("spec must be a mapping")
        unknown = sorted(set(map(str, spec)) - {"podSelector", "policyTypes", "ingress", "egress"})
        if unknown:
            unsupported.append(f"unknown spec field(s) {', '.join(unknown)}")
        rule = _compile(policy, spec, problems, unsupported)
    except InvalidPolicy as e:
        why = f"invalid (the apiserver rejects it): {e}"
        return CompiledPolicy(policy.ref, KIND, (_shadow(policy, spec, why),), (why,))
    if unsupported:
        why = "unsupported: " + "; ".join(unsupported)
        return CompiledPolicy(policy.ref, KIND, (_shadow(policy, spec, why),), (why, *problems))
    return CompiledPolicy(policy.ref, KIND, (rule,), tuple(problems))


def _subject(policy: PolicyObject, raw: Any) -> Selector:
    selector = parse_selector(raw, "spec.podSelector", default_source="k8s")
    return selector.with_requirement(Requirement("k8s", CILIUM_NAMESPACE_LABEL, "In", frozenset({policy.namespace})))


def _compile(policy: PolicyObject, spec: Mapping[str, Any], problems: list[str], unsupported: list[str]) -> Rule:
    if "podSelector" not in spec:
        raise InvalidPolicy("spec.podSelector is required")
    subject = _subject(policy, spec.get("podSelector"))
    types = spec.get("policyTypes")
    if types is not None and (not isinstance(types, list) or any(t not in ("Ingress", "Egress") for t in types)):
        raise InvalidPolicy("spec.policyTypes: must be a list of Ingress and Egress")
    entries: dict[Direction, tuple[Entry, ...]] = {}
    enforces: set[Direction] = set()
    for direction in DIRECTIONS:
        raw_rules = spec.get(direction)
        if raw_rules is not None and not isinstance(raw_rules, list):
            raise InvalidPolicy(f"spec.{direction}: must be a list")
        entries[direction] = tuple(
            _entry(policy, r, f"{direction}[{i}]", direction, unsupported) for i, r in enumerate(raw_rules or [])
        )
        declared = types is not None and POLICY_TYPES[direction] in types
        if raw_rules and types is not None and not declared:
            problems.append(f"warning: spec.{direction} is not in policyTypes; Cilium enforces it anyway "
                            "(cilium/cilium#48703), upstream Kubernetes would ignore it")
        implied = direction == "ingress" and (types is None or "Egress" not in types)
        if raw_rules or declared or implied:
            enforces.add(direction)
    return Rule(
        policy=policy.ref,
        kind=KIND,
        path="spec",
        subject=subject,
        namespace=policy.namespace,
        ingress=entries["ingress"],
        egress=entries["egress"],
        enforces=frozenset(enforces),
        directions=frozenset(enforces),
    )


def _entry(policy: PolicyObject, raw: Any, path: str, direction: Direction, unsupported: list[str]) -> Entry:
    if not isinstance(raw, Mapping):
        raise InvalidPolicy(f"spec.{path}: must be a mapping")
    field = PEER_FIELD[direction]
    unknown = sorted(set(map(str, raw)) - {field, "ports"})
    if unknown:
        unsupported.append(f"spec.{path}: unknown field(s) {', '.join(unknown)}")
    raw_peers, raw_ports = raw.get(field), raw.get("ports")
    if raw_peers is not None and not isinstance(raw_peers, list):
        raise InvalidPolicy(f"spec.{path}.{field}: must be a list")
    if raw_ports is not None and not isinstance(raw_ports, list):
        raise InvalidPolicy(f"spec.{path}.ports: must be a list")
    ports = tuple(parse_knp_port(p, f"spec.{path}.ports[{i}]") for i, p in enumerate(raw_ports or [])) or None
    if not raw_peers:
        return Entry(path, False, Peers(wildcard=True), ports)  # the true wildcard, world and host included
    selectors: list[PeerSelector] = []
    blocks: list[CidrRule] = []
    never = ""
    for i, peer in enumerate(raw_peers):
        selector = _peer(policy, peer, f"spec.{path}.{field}[{i}]")
        if isinstance(selector, CidrRule):
            never = "ipBlock: a CIDR peer never matches a Cilium-managed pod (default policy-cidr-match-mode)"
            blocks.append(selector)
        else:
            selectors.append(selector)
    return Entry(path, False, Peers(selectors=tuple(selectors), never=never, cidrs=tuple(blocks)), ports)


def _peer(policy: PolicyObject, raw: Any, where: str) -> PeerSelector | CidrRule:
    """One NetworkPolicyPeer: a selector, or an ipBlock's CIDR rule."""
    if not isinstance(raw, Mapping):
        raise InvalidPolicy(f"{where}: must be a mapping")
    unknown = sorted(set(map(str, raw)) - {"podSelector", "namespaceSelector", "ipBlock"})
    if unknown:
        raise InvalidPolicy(f"{where}: unknown field(s) {', '.join(unknown)}")
    pods, namespaces, block = raw.get("podSelector"), raw.get("namespaceSelector"), raw.get("ipBlock")
    if block is not None:
        if pods is not None or namespaces is not None:
            raise InvalidPolicy(f"{where}: ipBlock cannot be combined with podSelector or namespaceSelector")
        return _ip_block(block, f"{where}.ipBlock")
    if pods is None and namespaces is None:
        raise InvalidPolicy(f"{where}: needs podSelector, namespaceSelector or ipBlock")
    selector = parse_selector(pods, f"{where}.podSelector", default_source="k8s")
    if namespaces is None:
        return PeerSelector(selector, policy.namespace)
    ns_selector = parse_selector(
        namespaces, f"{where}.namespaceSelector", default_source="k8s", key_prefix=CILIUM_NAMESPACE_LABELS_PREFIX
    )
    combined = Selector(selector.requirements + ns_selector.requirements, selector.broken or ns_selector.broken)
    if not ns_selector.requirements:  # `namespaceSelector: {}`: every pod of every namespace
        combined = combined.with_requirement(Requirement("k8s", CILIUM_NAMESPACE_LABEL, "Exists"))
    return PeerSelector(combined)


def _ip_block(raw: Any, where: str) -> CidrRule:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("cidr"), str):
        raise InvalidPolicy(f"{where}: needs a cidr")
    try:
        network = ipaddress.ip_network(raw["cidr"], strict=False)
        excepts = []
        for exc in raw.get("except") or []:
            sub = ipaddress.ip_network(str(exc), strict=False)
            if sub.version != network.version or not sub.subnet_of(network):  # type: ignore[arg-type]
                raise InvalidPolicy(f"{where}.except: {exc} is not inside {raw['cidr']}")
            excepts.append(sub)
        return CidrRule(network, tuple(excepts))
    except (ValueError, TypeError) as e:
        if isinstance(e, InvalidPolicy):
            raise
        raise InvalidPolicy(f"{where}: {e}") from e


def _shadow(policy: PolicyObject, spec: Any, why: str) -> Rule:
    subject: Selector | None = None
    if isinstance(spec, Mapping):
        try:
            subject = _subject(policy, spec.get("podSelector"))
        except InvalidPolicy:
            subject = None
    return Rule(policy.ref, KIND, "spec", subject, policy.namespace, directions=frozenset(DIRECTIONS), uncertain=why)
