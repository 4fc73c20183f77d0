"""Kubernetes scheduling predicates the engine needs: node selectors and taints/tolerations.

PURE. Semantics follow the Kubernetes API reference (core/v1 NodeSelectorRequirement, Toleration)
and the scheduler's NodeAffinity and TaintToleration filter plugins:

- `nodeSelector` is an exact match on every key; required `nodeSelectorTerms` are ORed, the
  expressions and fields inside one term are ANDed, and a term with neither matches no node.
- Operators: In, NotIn, Exists, DoesNotExist, Gt, Lt (integers only); `matchFields` supports
  `metadata.name` with In / NotIn. An unknown operator matches nothing, as the apiserver would
  have rejected it anyway.
- Only NoSchedule and NoExecute taints keep a pod off a node; PreferNoSchedule is a preference.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.models.cluster import Taint
from app.models.job import UserPlacement
from app.models.labels import SYSTEM_TAINT_PREFIX

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
NODE_NAME_FIELD = "metadata.name"


def _values(requirement: Mapping[str, Any]) -> list[str]:
    raw = requirement.get("values")
    return [str(v) for v in raw] if isinstance(raw, list) else []


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def match_requirement(requirement: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One NodeSelectorRequirement against a label (or field) map."""
    key, op, values = str(requirement.get("key", "")), requirement.get("operator"), _values(requirement)
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        have, bound = _as_int(labels[key]), _as_int(values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _requirements(term: Mapping[str, Any], field: str) -> list[Mapping[str, Any]]:
    raw = term.get(field)
    return [r for r in raw if isinstance(r, Mapping)] if isinstance(raw, list) else []


def match_term(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    """One NodeSelectorTerm: every expression and field matches; an empty term matches nothing."""
    expressions, fields = _requirements(term, "matchExpressions"), _requirements(term, "matchFields")
    if not expressions and not fields:
        return False
    node_fields = {NODE_NAME_FIELD: name}
    return all(match_requirement(e, labels) for e in expressions) and all(
        match_requirement(f, node_fields) for f in fields
    )


def match_placement(placement: UserPlacement, labels: Mapping[str, str], name: str) -> bool:
    """Whether the user's nodeSelector and required nodeSelectorTerms admit this node."""
    if any(labels.get(k) != v for k, v in placement.node_selector.items()):
        return False
    if placement.node_selector_terms:
        return any(match_term(t, labels, name) for t in placement.node_selector_terms)
    return True


def selector_label_keys(placement: UserPlacement) -> frozenset[str]:
    """Every node label key the placement's selectors read."""
    keys = set(placement.node_selector)
    for term in placement.node_selector_terms:
        keys.update(str(e.get("key", "")) for e in _requirements(term, "matchExpressions"))
    return frozenset(keys)


def selects_by_name(placement: UserPlacement) -> bool:
    """Whether any term uses `matchFields` (node name), which must be matched node by node."""
    return any(_requirements(t, "matchFields") for t in placement.node_selector_terms)


def tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    """Kubernetes `Toleration.ToleratesTaint`: effect (empty = all), key (empty + Exists = all), value."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = str(toleration.get("key") or "")
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return not key or key == taint.key
    if operator == "Equal":
        return key == taint.key and str(toleration.get("value") or "") == taint.value
    return False


def untolerated(taints: Iterable[Taint], tolerations: Iterable[Mapping[str, Any]]) -> tuple[Taint, ...]:
    """The blocking (NoSchedule/NoExecute) taints that no toleration tolerates."""
    tols = list(tolerations)
    return tuple(t for t in taints if t.effect in BLOCKING_EFFECTS and not any(tolerates(tol, t) for tol in tols))


def is_system_taint(taint: Taint) -> bool:
    """Taints the node lifecycle controller owns (not-ready, unschedulable, pressure ...)."""
    return taint.key.startswith(SYSTEM_TAINT_PREFIX)


def toleration_for(taint: Taint) -> dict[str, str]:
    """The narrowest toleration of `taint` (Equal on key and value; Exists when it has no value)."""
    if taint.value:
        return {"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect}
    return {"key": taint.key, "operator": "Exists", "effect": taint.effect}


def format_taint(taint: Taint) -> str:
    """`key=value:Effect`, as kubectl prints a taint."""
    return f"{taint.key}={taint.value}:{taint.effect}" if taint.value else f"{taint.key}:{taint.effect}"
