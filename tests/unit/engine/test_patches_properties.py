"""Properties of build_patch over generated templates: applies cleanly, loses nothing, confines, idempotent."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config import Settings
from app.engine import patches
from app.models.decision import Decision
from tests.unit.crd.jsonpatch import apply_patch
from tests.unit.engine.test_patches import group_of, pytorchjob

ZL = "topology.kubernetes.io/zone"
ZONES = ("zone-a", "zone-b", "zone-c")
NODE_LABELS = {"gpu": ("true", "false"), "pool": ("p1", "p2"), ZL: ZONES}
# Every node the generated selectors can tell apart: one per combination of label values.
NODES = [dict(zip(NODE_LABELS, values, strict=True)) for values in itertools.product(*NODE_LABELS.values())]

expressions = st.builds(
    lambda key, op, values: {"key": key, "operator": op, **({"values": list(values)} if op in ("In", "NotIn") else {})},
    st.sampled_from(list(NODE_LABELS)),
    st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]),
    st.sets(st.sampled_from(["true", "false", "p1", "p2", *ZONES]), min_size=1, max_size=2).map(sorted),
)
terms = st.lists(expressions, max_size=2).map(lambda exprs: {"matchExpressions": exprs} if exprs else {})
tolerations = st.sampled_from([
    {"key": "gpu", "operator": "Exists"},
    {"key": "gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
    {"key": "spot", "operator": "Exists", "effect": "NoSchedule"},
    {"operator": "Exists"},
])
spreads = st.sampled_from([
    {"maxSkew": 1, "topologyKey": ZL, "whenUnsatisfiable": "DoNotSchedule"},
    {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"},
])


@st.composite
def templates(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if draw(st.booleans()):
        key, value = draw(st.sampled_from([(k, v) for k, vs in NODE_LABELS.items() for v in vs]))
        spec["nodeSelector"] = {key: value}
    if draw(st.booleans()):
        required = {"nodeSelectorTerms": draw(st.lists(terms, max_size=3))}
        spec["affinity"] = {"nodeAffinity": {patches.REQUIRED: required}}
    if draw(st.booleans()):
        spec["tolerations"] = draw(st.lists(tolerations, max_size=3))
    if draw(st.booleans()):
        spec["topologySpreadConstraints"] = draw(st.lists(spreads, max_size=2, unique_by=lambda s: s["topologyKey"]))
    template: dict[str, Any] = {"spec": spec}
    if draw(st.booleans()):
        template["metadata"] = {"labels": draw(st.dictionaries(st.sampled_from(["app", "zone"]),
                                                               st.sampled_from(ZONES), max_size=2))}
    return template


def _matches(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    return {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
            "Exists": key in labels, "DoesNotExist": key not in labels}[op]


def schedulable_zones(spec: dict[str, Any]) -> set[str]:
    """Zones of the nodes the template's nodeSelector and required node affinity admit."""
    out = set()
    for node in NODES:
        if any(node.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            continue
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(patches.REQUIRED)
        if required is not None and not any(
            term.get("matchExpressions") and all(_matches(e, node) for e in term["matchExpressions"])
            for term in required["nodeSelectorTerms"]
        ):
            continue
        out.add(node[ZL])
    return out


def contained(orig: Any, new: Any, ignore: set[str]) -> bool:
    if isinstance(orig, dict):
        return isinstance(new, dict) and all(k in ignore or (k in new and contained(v, new[k], ignore))
                                             for k, v in orig.items())
    if isinstance(orig, list):
        return isinstance(new, list) and len(new) >= len(orig) and all(
            contained(a, b, ignore) for a, b in zip(orig, new, strict=False))
    return bool(orig == new)


def covered(wanted: dict[str, Any], present: list[dict[str, Any]]) -> bool:
    """`wanted` is in the list, or it tolerates one taint and some toleration in the list does too."""
    if wanted in present:
        return True
    if wanted.get("operator") == "Exists" or not wanted.get("key") or not wanted.get("effect"):
        return False
    taint = (wanted["key"], wanted.get("value", ""), wanted["effect"])
    return any(patches.tolerates(t, *taint) for t in present)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    master=templates(), worker=templates(), zone=st.sampled_from(ZONES),
    wanted=st.lists(tolerations, max_size=2), mode=st.sampled_from(["pin", "colocate"]),
    spread=st.sampled_from(["none", "hostname"]), identity=st.booleans(),
)
def test_patch_applies_keeps_user_data_confines_and_is_idempotent(
    master: dict[str, Any], worker: dict[str, Any], zone: str, wanted: list[dict[str, Any]],
    mode: str, spread: str, identity: bool,
) -> None:
    config = Settings(mode=mode, spread_within_zone=spread)
    doc = pytorchjob({"Master": master, "Worker": worker})
    open_zones = tuple(sorted({zone, "zone-c"}))
    chosen = Decision(allowed=True, zone=zone if mode == "pin" else None, zones=(), reasons=(),
                      tolerations={"Master": tuple(wanted), "Worker": tuple(wanted)},
                      labels={"zone": zone} if identity and mode == "pin" else {}, open_zones=open_zones,
                      summary=f"zone={zone}")
    ops = patches.build_patch(doc, group_of(doc), chosen, config)
    patched = apply_patch(doc, ops)

    assert contained(doc, patched, ignore={"zone", "topoguard.io/zone", "topoguard.io/group"})
    allowed_zones = {zone} if mode == "pin" else set(open_zones)
    for key in ("Master", "Worker"):
        template = patched["spec"]["pytorchReplicaSpecs"][key]["template"]
        assert schedulable_zones(template["spec"]) <= allowed_zones
        spread_keys = template["spec"].get("topologySpreadConstraints", [])
        keys = [(c["topologyKey"], c["whenUnsatisfiable"]) for c in spread_keys]
        assert len(keys) == len(set(keys)), "duplicate spread list-map key"
        for toleration in wanted:
            assert covered(toleration, template["spec"]["tolerations"])
    assert patches.build_patch(patched, group_of(patched), chosen, config) == []
