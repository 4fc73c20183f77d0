"""build_patch (copy-on-write) equals the old "deep-copy everything, edit, diff it all" way, op for op.

The reference below is the implementation build_patch had before it copied only what the edits
touch: a full deep copy, `prepare_templates` always, the module's own edit helpers, then a plain
recursive diff of the whole document and a pruning pass (both kept here verbatim, so the rewritten
`diff_documents` is checked too). Every input must give byte-identical JSON (same ops, same order,
same values) or the same error, and the job passed in must come back unchanged.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from app import jobs
from app.config import Settings
from app.engine import patches
from app.models import labels
from app.models.decision import Decision
from app.models.job import JobGroup
from tests.builders import mark_everything
from tests.unit.crd.jsonpatch import apply_patch
from tests.unit.jobs.builders import (
    FIXTURES,
    GPU_RESOURCES,
    jobset,
    kubeflow_job,
    load_fixture,
    rjob,
    runtime_patch,
    trainjob,
)

ZL = "topology.kubernetes.io/zone"
ZONES = ("zone-a", "zone-b", "zone-c")
REQUIRED = patches.REQUIRED
GROUP = labels.GROUP_LABEL
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
REVIEWS = Path(__file__).parents[2] / "data" / "reviews"


# --- the reference: the pre-copy-on-write build_patch ------------------------------------------


def reference_diff(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """diff_documents as it was: equality fast path, then a recursive walk of everything that differs."""
    if isinstance(old, dict | list) and old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[dict[str, Any]] = []
        for key in old:
            if key not in new:
                raise patches.PatchError(f"{path}/{patches.escape_json_pointer(key)}: an edit removed a key")
        for key, value in new.items():
            child = f"{path}/{patches.escape_json_pointer(str(key))}"
            if key in old:
                ops += reference_diff(old[key], value, child)
            else:
                ops.append({"op": "add", "path": child, "value": copy.deepcopy(value)})
        return ops
    if isinstance(old, list) and isinstance(new, list):
        if len(new) < len(old):
            raise patches.PatchError(f"{path}: an edit removed list items")
        ops = []
        for i, item in enumerate(old):
            ops += reference_diff(item, new[i], f"{path}/{i}")
        ops += [{"op": "add", "path": f"{path}/-", "value": copy.deepcopy(item)} for item in new[len(old) :]]
        return ops
    if old == new and type(old) is type(new):
        return []
    if path == "":
        raise patches.PatchError("an edit replaced the whole document")
    return [{"op": "replace", "path": path, "value": copy.deepcopy(new)}]


def _prune_empty(value: Any) -> Any:
    if isinstance(value, dict):
        pruned = {k: _prune_empty(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if not (isinstance(v, dict | list) and not v)}
    if isinstance(value, list):
        return [_prune_empty(v) for v in value]
    return value


def _prune_op(op: dict[str, Any]) -> dict[str, Any] | None:
    value = _prune_empty(op["value"])
    if isinstance(value, dict | list) and not value:
        return None
    return {**op, "value": value}


def reference_build_patch(
    raw_job: Mapping[str, Any], group: JobGroup, decision: Decision, config: Settings
) -> list[dict[str, Any]]:
    if not decision.allowed:
        return []
    edited: dict[str, Any] = json.loads(json.dumps(raw_job))  # NB: no shared objects, unlike copy.deepcopy
    jobs.prepare_templates(edited, group)
    selector = (
        {GROUP: patches.group_label_value(raw_job, group)} if patches.needs_group_label(group, config) else {}
    )
    for replica in group.replicas:
        template = patches.resolve_pointer(edited, replica.template_path)
        patches._edit_template(
            template,
            replica,
            decision,
            config,
            selector,
            spread=patches.spreads(group, config),
            where=replica.template_path,
        )
    annotations = patches._child_map(patches._child_map(edited, "metadata", ""), "annotations", "/metadata")
    if decision.zone and config.mode == "pin":
        annotations[labels.ZONE_ANNOTATION] = decision.zone
    if decision.summary:
        annotations[labels.DECISION_ANNOTATION] = patches.decision_annotation(decision, group)
    return [op for op in map(_prune_op, reference_diff(dict(raw_job), edited)) if op is not None]


def outcome(build: Any, raw: Mapping[str, Any], group: JobGroup, decision: Decision, config: Settings) -> Any:
    """The patch as the JSON bytes the webhook would send, or the error (type and message)."""
    try:
        return json.dumps(build(raw, group, decision, config))
    except (patches.PatchError, jobs.JobError) as e:
        return (type(e).__name__, str(e))


def assert_equivalent(raw: dict[str, Any], decision_of: Any, config: Settings) -> None:
    group = jobs.parse_job(raw, gpu_resources=GPU_RESOURCES, namespace="ml")
    decision = decision_of(group)
    before = json.dumps(raw)
    got = outcome(patches.build_patch, raw, group, decision, config)
    assert json.dumps(raw) == before, "build_patch modified the job it was given"
    assert got == outcome(reference_build_patch, raw, group, decision, config)


def make_decision(
    group: JobGroup,
    *,
    zone: str | None = "zone-a",
    open_zones: tuple[str, ...] = ("zone-a", "zone-c"),
    tolerate: bool = True,
    identity: bool = False,
    summary: str = "zone=zone-a",
    allowed: bool = True,
) -> Decision:
    return Decision(
        allowed=allowed,
        zone=zone,
        zones=(),
        reasons=(),
        tolerations={r.key: (GPU_TOLERATION,) for r in group.replicas} if tolerate else {},
        labels={"zone": zone} if identity and zone else {},
        open_zones=open_zones,
        summary=summary,
    )


# --- table: every adapter fixture and the golden review, as the apiserver sends them ---------------


def _with_server_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` plus what a real review carries: managedFields and the last-applied annotation."""
    out = json.loads(json.dumps(doc))
    metadata = out.setdefault("metadata", {})
    metadata.setdefault("annotations", {})["kubectl.kubernetes.io/last-applied-configuration"] = json.dumps(doc)
    metadata["managedFields"] = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
    return out


def _load_yaml(path: Path) -> dict[str, Any]:
    """A fixture as JSON data (what the webhook gets: no objects shared through YAML anchors)."""
    return dict(json.loads(json.dumps(load_fixture(path.name))))


TERMS = {
    REQUIRED: {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["true"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
            {"matchExpressions": [{"key": ZL, "operator": "In", "values": ["zone-a"]}]},
            {},
        ]
    }
}
BUSY_TEMPLATE = {
    "metadata": {"labels": {"app": "x", "zone": "zone-c", GROUP: "kept"}},
    "spec": {
        "containers": [{"name": "main", "image": "x"}],
        "affinity": {
            "nodeAffinity": TERMS,
            "podAffinity": {REQUIRED: [{"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": ZL}]},
        },
        "tolerations": [{"key": "spot", "operator": "Exists"}],
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZL, "whenUnsatisfiable": "DoNotSchedule"}],
    },
}
BUSY = {
    "spec": {
        "containers": [{"name": "main", "image": "x"}],
        "nodeSelector": {ZL: "zone-a"},
        "affinity": {"nodeAffinity": TERMS},
    }
}

JOBS = [
    pytest.param(
        kubeflow_job("PyTorchJob", {"Master": {"template": BUSY_TEMPLATE}, "Worker": {"template": BUSY}}),
        id="user terms, pod affinity, tolerations, spreads and labels on every template",
    ),
    pytest.param(
        kubeflow_job("TFJob", {"PS": {}, "Worker": {"template": None}, "a/b~c": {"template": BUSY_TEMPLATE}}),
        id="templates absent, null, and under a key that needs escaping",
    ),
    pytest.param(
        jobset(rjob("driver", BUSY_TEMPLATE), {"name": "workers", "template": {}}),
        id="jobset with a busy template and a replicatedJob without a job spec",
    ),
    pytest.param(
        trainjob(
            patches=[
                runtime_patch("example.io/team", {"node": BUSY_TEMPLATE}),
                runtime_patch(labels.MANAGER_NAME, {"node": BUSY}),
            ],
            numNodes=2,
        ),
        id="trainjob whose own runtimePatches entry is already there",
    ),
    pytest.param(
        trainjob(patches=[runtime_patch("example.io/mpi", {"launcher": BUSY_TEMPLATE})], numNodes=2),
        id="trainjob that gets a new runtimePatches entry",
    ),
]
JOBS += [pytest.param(_load_yaml(p), id=p.stem) for p in sorted(FIXTURES.glob("*.yaml"))]
JOBS += [
    pytest.param(_with_server_fields(_load_yaml(p)), id=f"{p.stem}+server-fields")
    for p in sorted(FIXTURES.glob("*.yaml"))
]
JOBS += [
    pytest.param(json.loads((REVIEWS / "lab-pytorchjob-create.json").read_text())["request"]["object"], id="lab-review")
]

CONFIGS = [
    pytest.param(Settings(), id="pin"),
    pytest.param(Settings(mode="colocate"), id="colocate"),
    pytest.param(Settings(spread_within_zone="hostname"), id="pin+spread"),
    pytest.param(Settings(mode="colocate", spread_within_zone="hostname", zone_label="zone"), id="colocate+spread"),
]

DECISIONS = [
    pytest.param(lambda g: make_decision(g), id="zone+tolerations"),
    pytest.param(lambda g: make_decision(g, zone=None, tolerate=False, summary=""), id="no-zone-no-summary"),
    pytest.param(lambda g: make_decision(g, identity=True, zone="zone-b", open_zones=("zone-b",)), id="identity"),
    pytest.param(lambda g: make_decision(g, allowed=False), id="refused"),
]


@pytest.mark.parametrize("decision_of", DECISIONS)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("raw", JOBS)
def test_fixture_jobs_patch_as_the_reference_does(raw: dict[str, Any], config: Settings, decision_of: Any) -> None:
    assert_equivalent(raw, decision_of, config)


def test_a_second_review_of_the_patched_lab_job_is_a_no_op_in_both() -> None:
    raw = json.loads((REVIEWS / "lab-pytorchjob-create.json").read_text())["request"]["object"]
    group = jobs.parse_job(raw, gpu_resources=GPU_RESOURCES, namespace="ml")
    decision = make_decision(group, identity=True)
    patched = apply_patch(raw, patches.build_patch(raw, group, decision, Settings()))
    again = jobs.parse_job(patched, gpu_resources=GPU_RESOURCES, namespace="ml")
    assert patches.build_patch(patched, again, decision, Settings()) == []
    assert reference_build_patch(patched, again, decision, Settings()) == []


# --- generated jobs of every kind --------------------------------------------------------------

expressions = st.builds(
    lambda key, op, values: {"key": key, "operator": op, **({"values": values} if op in ("In", "NotIn") else {})},
    st.sampled_from([ZL, "zone", "gpu", "pool"]),
    st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]),
    st.lists(st.sampled_from([*ZONES, "true", "p1"]), min_size=1, max_size=2, unique=True),
)
node_terms = st.one_of(
    st.lists(expressions, min_size=1, max_size=2).map(lambda e: {"matchExpressions": e}),
    st.just({}),
    st.just({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}),
    st.just({"matchExpressions": []}),
)
tolerations = st.sampled_from(
    [
        GPU_TOLERATION,
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists"},
        {"operator": "Exists"},
    ]
)
pod_affinity_terms = st.sampled_from(
    [
        {"labelSelector": {"matchLabels": {GROUP: "train"}}, "topologyKey": ZL},
        {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": ZL},
        {"labelSelector": {}, "topologyKey": "kubernetes.io/hostname"},
    ]
)
spreads = st.sampled_from(
    [
        {"maxSkew": 1, "topologyKey": ZL, "whenUnsatisfiable": "DoNotSchedule"},
        {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"},
    ]
)
# A field the patch must edit, with the wrong type: both ways must refuse it the same way.
wrong_types = st.sampled_from(
    [
        ("tolerations", {"key": "gpu"}),
        ("affinity", "zone-a"),
        ("affinity", {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": ["x"]}}}),
        ("topologySpreadConstraints", "x"),
    ]
)


@st.composite
def affinities(draw: st.DrawFn) -> Any:
    out: dict[str, Any] = {}
    if draw(st.booleans()):
        required = draw(st.one_of(st.none(), st.lists(node_terms, max_size=3).map(lambda t: {"nodeSelectorTerms": t})))
        out["nodeAffinity"] = {REQUIRED: required, "preferredDuringSchedulingIgnoredDuringExecution": []}
    if draw(st.booleans()):
        out["podAffinity"] = {REQUIRED: draw(st.lists(pod_affinity_terms, max_size=2))}
    return draw(st.sampled_from([out, None]))


@st.composite
def pod_templates(draw: st.DrawFn) -> Any:
    """A pod template with or without each field the patch edits (absent, null or populated)."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x", "env": [{"name": "A", "value": "1"}]}]}
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(st.sampled_from([{ZL: "zone-a"}, {ZL: "zone-b"}, {"zone": "zone-a"}, {"gpu": "1"}]))
    if draw(st.booleans()):
        spec["affinity"] = draw(affinities())
    if draw(st.booleans()):
        spec["tolerations"] = draw(st.one_of(st.none(), st.lists(tolerations, max_size=3)))
    if draw(st.booleans()):
        spec["topologySpreadConstraints"] = draw(st.lists(spreads, max_size=2, unique_by=lambda s: s["topologyKey"]))
    if draw(st.integers(0, 9)) == 0:
        key, value = draw(wrong_types)
        spec[key] = value
    template: dict[str, Any] = {"spec": spec} if draw(st.integers(0, 7)) else {}
    metadata = draw(
        st.one_of(
            st.none(),
            st.just({}),
            st.dictionaries(
                st.sampled_from(["app", "zone", GROUP]), st.sampled_from([*ZONES, "train", "kept"]), max_size=3
            ).map(lambda ls: {"labels": ls, "annotations": {"a": "b"}}),
        )
    )
    if metadata is not None or draw(st.booleans()):
        template["metadata"] = metadata
    return template


def _optional_template(draw: st.DrawFn) -> Any:
    """A template, or no `template` key (None), or an explicit null."""
    return draw(st.one_of(pod_templates(), st.none(), st.just("null")))


def _replica_spec(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {"replicas": draw(st.integers(1, 3))}
    template = _optional_template(draw)
    if template is not None:
        out["template"] = None if template == "null" else template
    return out


KUBEFLOW = [
    ("kubeflow.org/v1", "PyTorchJob", ("Master", "Worker")),
    ("kubeflow.org/v1", "TFJob", ("Chief", "PS", "Worker", "Evaluator")),
    ("kubeflow.org/v1", "XGBoostJob", ("Master", "Worker")),
    ("kubeflow.org/v1", "PaddleJob", ("Master", "Worker")),
    ("kubeflow.org/v1", "JAXJob", ("Worker",)),
    ("kubeflow.org/v1", "MPIJob", ("Launcher", "Worker")),
    ("kubeflow.org/v2beta1", "MPIJob", ("Launcher", "Worker")),
]


@st.composite
def kubeflow_jobs(draw: st.DrawFn) -> dict[str, Any]:
    api_version, kind, types = draw(st.sampled_from(KUBEFLOW))
    chosen = draw(st.lists(st.sampled_from(types), min_size=1, max_size=len(types), unique=True))
    specs = {t: _replica_spec(draw) for t in (types[0], *chosen)}  # the first type often coordinates
    return kubeflow_job(kind, specs, api_version=api_version)


@st.composite
def jobsets(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(["driver", "workers", "ps/x"]), min_size=1, max_size=3, unique=True))
    entries = []
    for name in names:
        shape = draw(st.sampled_from(["template", "no-pod-template", "no-job-spec"]))
        if shape == "template":
            entries.append(rjob(name, draw(pod_templates()), replicas=draw(st.integers(1, 2))))
        elif shape == "no-pod-template":
            entries.append({"name": name, "template": {"spec": {"parallelism": 2}}})
        else:
            entries.append({"name": name, "template": {}})
    return jobset(*entries)


@st.composite
def trainjobs(draw: st.DrawFn) -> dict[str, Any]:
    entries = []
    if draw(st.booleans()):
        entries.append(runtime_patch("example.io/team", {"node": draw(pod_templates())}))
    if draw(st.booleans()):
        entries.append(runtime_patch("example.io/mpi", {"launcher": draw(pod_templates())}))
    if draw(st.booleans()):
        ours = {"node": draw(pod_templates())}
        if draw(st.booleans()):
            ours["launcher"] = draw(pod_templates())
        entries.insert(draw(st.integers(0, len(entries))), runtime_patch(labels.MANAGER_NAME, ours))
    return trainjob(
        name="tj", patches=entries if entries or draw(st.booleans()) else None, numNodes=draw(st.integers(1, 4))
    )


@st.composite
def job_metadata(draw: st.DrawFn) -> dict[str, Any]:
    metadata: dict[str, Any] = dict(
        draw(
            st.sampled_from(
                [
                    {"name": "train", "namespace": "ml"},
                    {"name": "x" * 70, "namespace": "ml"},
                    {"generateName": "sweep-", "namespace": "ml"},
                ]
            )
        )
    )
    annotations = draw(st.sampled_from([None, {}, {"owner": "me"}, {labels.ZONE_ANNOTATION: "zone-b", "a/b~c": "d"}]))
    if annotations is not None or draw(st.booleans()):
        metadata["annotations"] = annotations
    if draw(st.booleans()):
        metadata["labels"] = {"team": "ml"}
        metadata["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:metadata": {"f:labels": {}}}}]
    return metadata


@st.composite
def jobs_of_every_kind(draw: st.DrawFn) -> dict[str, Any]:
    doc = draw(st.one_of(kubeflow_jobs(), jobsets(), trainjobs()))
    doc["metadata"] = draw(job_metadata())
    return dict(json.loads(json.dumps(doc)))


@st.composite
def decisions(draw: st.DrawFn) -> Any:
    zone = draw(st.sampled_from([*ZONES, None]))
    open_zones = tuple(sorted(draw(st.sets(st.sampled_from(ZONES), min_size=1, max_size=3))))
    tolerate = draw(st.booleans())
    identity = draw(st.booleans())
    summary = draw(st.sampled_from(["", f"zone={zone}"]))
    allowed = draw(st.integers(0, 9)) > 0
    return lambda g: make_decision(
        g, zone=zone, open_zones=open_zones, tolerate=tolerate, identity=identity, summary=summary, allowed=allowed
    )


configs = st.builds(
    Settings,
    mode=st.sampled_from(["pin", "colocate"]),
    spread_within_zone=st.sampled_from(["none", "hostname"]),
    zone_label=st.sampled_from([ZL, "zone"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=jobs_of_every_kind(), decision_of=decisions(), config=configs)
def test_generated_jobs_patch_as_the_reference_does(raw: dict[str, Any], decision_of: Any, config: Settings) -> None:
    try:
        jobs.parse_job(raw, gpu_resources=GPU_RESOURCES, namespace="ml")
    except jobs.JobError:
        assume(False)  # not a job the webhook would patch
    assert_equivalent(raw, decision_of, config)


def test_the_jobs_are_not_shared_with_the_patch() -> None:
    """A value in the patch is the patch's own: changing it later must not reach the job or a second patch."""
    raw = json.loads((REVIEWS / "lab-pytorchjob-create.json").read_text())["request"]["object"]
    before = json.dumps(raw)
    group = jobs.parse_job(raw, gpu_resources=GPU_RESOURCES, namespace="ml")
    decision = make_decision(group)
    for op in patches.build_patch(raw, group, decision, Settings(mode="colocate")):
        mark_everything(op["value"])
    assert json.dumps(raw) == before
    assert "mutated" not in json.dumps(patches.build_patch(raw, group, decision, Settings(mode="colocate")))




# --- diff_documents alone, on arbitrary JSON ------------------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-2, 2)
    | st.floats(allow_nan=True, allow_infinity=False)
    | st.sampled_from(["", "a", "b"])
)
KEYS = st.sampled_from(["a", "b", "c", "x/y", "m~n", "~1"])
JSON = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3), max_leaves=15
)


def _derive(draw: st.DrawFn, value: Any) -> Any:
    """`value` after random edits: subtrees shared as they are, equal copies, changed scalars, added
    keys and items, and (rarely) a removed key or item."""
    how = draw(st.sampled_from(["share", "copy", "edit", "edit"]))
    if how == "share":
        return value
    if how == "copy":
        return copy.deepcopy(value)
    if isinstance(value, dict):
        out = {k: _derive(draw, v) for k, v in value.items() if draw(st.integers(0, 15))}
        out.update(draw(st.dictionaries(KEYS, JSON, max_size=2)))
        return out
    if isinstance(value, list):
        out_list = [_derive(draw, v) for v in value][: len(value) - (draw(st.integers(0, 15)) == 0)]
        return out_list + draw(st.lists(JSON, max_size=2))
    return draw(SCALARS)


@st.composite
def document_pairs(draw: st.DrawFn) -> tuple[Any, Any]:
    old = draw(st.dictionaries(KEYS, JSON, max_size=4))
    return old, _derive(draw, old)


def _diff_outcome(diff: Any, old: Any, new: Any) -> Any:
    try:
        return json.dumps(diff(old, new))
    except patches.PatchError as e:
        return str(e)


NAN = float("nan")


@pytest.mark.parametrize(
    "old, new",
    [
        pytest.param({"a": NAN, "b": 1}, {"a": NAN, "b": 2}, id="an unchanged NaN beside a change is replaced"),
        pytest.param({"a": {"n": NAN}, "b": 1}, {"a": {"n": NAN}, "b": 2}, id="a NaN in an equal object is not"),
        pytest.param({"a": [1], "b": {"c": 1}}, {"a": [1, 2]}, id="a removed key is refused before the walk"),
    ],
)
def test_diff_documents_corner_cases_match_the_plain_diff(old: Any, new: Any) -> None:
    assert _diff_outcome(patches.diff_documents, old, new) == _diff_outcome(reference_diff, old, new)


@settings(max_examples=300, deadline=None)
@given(pair=document_pairs())
def test_diff_documents_equals_the_plain_recursive_diff(pair: tuple[Any, Any]) -> None:
    old, new = pair
    before = json.dumps([old, new])
    assert _diff_outcome(patches.diff_documents, old, new) == _diff_outcome(reference_diff, old, new)
    assert json.dumps([old, new]) == before
