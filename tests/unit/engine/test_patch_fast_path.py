"""build_patch's fast path (`patch_ops.build_patch_fast`, ops emitted directly) gives exactly the general
path's ops, or steps aside.

The general path (`patches._build_patch_general`: copy-on-write copy, edits, diff) is the reference; it is
itself held to a deep-copy reference in test_patch_equivalence.py. For a job written the usual way
the fast path must be taken and give the same ops, values and order (compared as JSON text, so 1
and true or 1.0 differ); for anything else it must return None, and build_patch must still answer
as the general path does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import jobs
from app.config import Settings
from app.engine import patch_ops, patches
from app.models import labels
from app.models.decision import Decision
from app.models.job import JobGroup
from tests.unit.crd.jsonpatch import apply_patch
from tests.unit.engine import test_patch_equivalence as equivalence
from tests.unit.jobs.builders import GPU_RESOURCES, jobset, kubeflow_job, rjob, runtime_patch, trainjob

ZL = "topology.kubernetes.io/zone"
ZONES = ("zone-a", "zone-b", "zone-c")
GROUP = labels.GROUP_LABEL
HOSTNAME = labels.HOSTNAME_LABEL
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
CONTAINER = {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 4}}}


def parse(raw: Mapping[str, Any]) -> JobGroup:
    return jobs.parse_job(raw, gpu_resources=GPU_RESOURCES, namespace="ml")


def outcome(
    build: Callable[..., Any], raw: Mapping[str, Any], group: JobGroup, decision: Decision, config: Settings
) -> Any:
    """The patch as JSON text (or the error), so that values of another JSON type are told apart."""
    try:
        return json.dumps(build(raw, group, decision, config))
    except (patches.PatchError, jobs.JobError, TypeError) as e:  # NB: TypeError: an unhashable zone label value
        return (type(e).__name__, str(e))


def fast_outcome(raw: Mapping[str, Any], group: JobGroup, decision: Decision, config: Settings) -> str | None:
    ops = patch_ops.build_patch_fast(raw, group, decision, config)
    return None if ops is None else json.dumps(ops)


def assert_same_as_general(raw: dict[str, Any], group: JobGroup, decision: Decision, config: Settings) -> str | None:
    """build_patch answers as the general path does; the fast path's answer (None: it stepped aside)."""
    before = json.dumps(raw)
    general = outcome(patches._build_patch_general, raw, group, decision, config)
    fast = fast_outcome(raw, group, decision, config) if decision.allowed else None
    assert outcome(patches.build_patch, raw, group, decision, config) == general
    if fast is not None:
        assert fast == general
    assert json.dumps(raw) == before, "a path modified the job it was given"
    return fast


# --- the bench's shape: a PyTorchJob as kubectl sends it, pinned, one replica tolerating the GPU taint ---


def bench_like_job() -> dict[str, Any]:
    def replica(role: str, count: int, **spec: Any) -> dict[str, Any]:
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {
                "metadata": {"labels": {"app": "llm", "role": role}},
                "spec": {"containers": [CONTAINER], "volumes": [{"name": "shm", "emptyDir": {}}], **spec},
            },
        }

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "llm",
            "namespace": "ml",
            "labels": {"team": "ml"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
            "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": replica("coordinator", 1),
                "Worker": replica("worker", 15, tolerations=[{"key": "spot", "operator": "Exists"}]),
            }
        },
    }


def bench_decision() -> Decision:
    return Decision(
        allowed=True,
        zone="zone-a",
        zones=(),
        reasons=(),
        tolerations={"Master": (GPU_TOLERATION,)},
        labels={"zone": "zone-a"},
        open_zones=("zone-a",),
        summary="zone=zone-a",
    )


BENCH_SETTINGS = Settings(zone_identity_label="zone")


def test_the_bench_like_job_takes_the_fast_path_with_the_general_paths_ops() -> None:
    raw = bench_like_job()
    group = parse(raw)
    master, worker = "/spec/pytorchReplicaSpecs/Master/template", "/spec/pytorchReplicaSpecs/Worker/template"
    pin = {"nodeAffinity": {patches.REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": BENCH_SETTINGS.zone_label, "operator": "In", "values": ["zone-a"]}]}]}}}
    want = [
        {"op": "add", "path": "/metadata/annotations/topoguard.io~1zone", "value": "zone-a"},
        {"op": "add", "path": "/metadata/annotations/topoguard.io~1decision", "value": "zone=zone-a"},
        {"op": "add", "path": f"{master}/metadata/labels/zone", "value": "zone-a"},
        {"op": "add", "path": f"{master}/spec/affinity", "value": pin},
        {"op": "add", "path": f"{master}/spec/tolerations", "value": [GPU_TOLERATION]},
        {"op": "add", "path": f"{worker}/metadata/labels/zone", "value": "zone-a"},
        {"op": "add", "path": f"{worker}/spec/affinity", "value": pin},
    ]
    assert patch_ops.build_patch_fast(raw, group, bench_decision(), BENCH_SETTINGS) == want
    assert patches._build_patch_general(raw, group, bench_decision(), BENCH_SETTINGS) == want
    assert patches.build_patch(raw, group, bench_decision(), BENCH_SETTINGS) == want


def test_the_fast_paths_values_are_its_own() -> None:
    """Ops carry copies: the decision is shared by a memo, the job is the caller's."""
    raw = bench_like_job()
    group = parse(raw)
    both = {"Master": (GPU_TOLERATION,), "Worker": (GPU_TOLERATION,)}
    decision = dataclasses.replace(bench_decision(), tolerations=both)
    config = Settings(mode="colocate", spread_within_zone="hostname")
    before = json.dumps([raw, dataclasses.asdict(decision)], default=dict)
    ops = patch_ops.build_patch_fast(raw, group, decision, config)
    assert ops is not None
    for op in ops:
        equivalence._mark(op["value"])
    assert json.dumps([raw, dataclasses.asdict(decision)], default=dict) == before
    assert patch_ops.build_patch_fast(raw, group, decision, config) == patches._build_patch_general(
        raw, group, decision, config
    )


# --- jobs the fast path must leave to the general path ---------------------------------------------


def _with(raw: dict[str, Any], edit: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    edit(raw)
    return raw


def _master(raw: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = raw["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    return template


NAN = float("nan")
STEP_ASIDE = [
    pytest.param(lambda r: _master(r)["spec"].update(affinity={}), id="an affinity, even empty"),
    pytest.param(lambda r: _master(r)["spec"].update(tolerations={"key": "x"}), id="tolerations not a list"),
    pytest.param(lambda r: _master(r)["metadata"].update(labels=["x"]), id="labels not an object"),
    pytest.param(lambda r: _master(r).pop("metadata"), id="a template without metadata"),
    pytest.param(lambda r: _master(r).update(spec=None), id="a template with a null spec"),
    pytest.param(lambda r: r["spec"]["pytorchReplicaSpecs"]["Master"].pop("template"), id="no template"),
    pytest.param(lambda r: r["metadata"].update(annotations="x"), id="job annotations not an object"),
    pytest.param(lambda r: r.pop("metadata"), id="no job metadata"),
    pytest.param(lambda r: _master(r)["spec"].update(nodeSelector={ZL: ["zone-a"]}), id="an unhashable zone"),
    pytest.param(lambda r: _master(r)["spec"].update(priority=NAN), id="NaN in a template spec"),
    pytest.param(lambda r: _master(r)["metadata"]["labels"].update(x=NAN), id="NaN among the labels"),
    pytest.param(lambda r: r["metadata"].update(x=NAN), id="NaN in the job metadata"),
    pytest.param(lambda r: r["spec"]["pytorchReplicaSpecs"]["Master"].update(x=NAN), id="NaN on a pointer"),
    pytest.param(lambda r: r.update(x=NAN), id="NaN at the root"),
    pytest.param(lambda r: _master(r)["spec"].update(tolerations=[NAN]), id="NaN in an edited list"),
]


@pytest.mark.parametrize("edit", STEP_ASIDE)
@pytest.mark.parametrize(
    "config",
    [Settings(zone_label=ZL), Settings(zone_label=ZL, mode="colocate", spread_within_zone="hostname")],
    ids=["pin", "colocate+spread"],
)
def test_unusual_jobs_take_the_general_path(edit: Callable[[dict[str, Any]], Any], config: Settings) -> None:
    raw = _with(bench_like_job(), edit)
    group = parse(bench_like_job())  # NB: some edits make the job unparsable; the group is only read
    decision = dataclasses.replace(bench_decision(), tolerations={"Master": (GPU_TOLERATION,)})
    assert patch_ops.build_patch_fast(raw, group, decision, config) is None
    assert_same_as_general(raw, group, decision, config)


def test_templates_out_of_document_order_take_the_general_path() -> None:
    raw = bench_like_job()
    group = parse(raw)
    backwards = dataclasses.replace(group, replicas=group.replicas[::-1])
    assert patch_ops.build_patch_fast(raw, backwards, bench_decision(), BENCH_SETTINGS) is None
    assert assert_same_as_general(raw, group, bench_decision(), BENCH_SETTINGS) is not None
    assert_same_as_general(raw, backwards, bench_decision(), BENCH_SETTINGS)


@pytest.mark.parametrize("present", [None, [], [{"key": "spot", "operator": "Exists"}], "absent"])
def test_a_toleration_with_empty_parts_is_copied_without_them(present: Any) -> None:
    """The general path's op values drop empty objects and lists inside a toleration (and an empty one)."""
    raw = bench_like_job()
    if present != "absent":
        _master(raw)["spec"]["tolerations"] = present
    group = parse(raw)
    odd = {"key": "x", "operator": "Exists", "effect": "NoSchedule", "extra": {"empty": []}}
    decision = dataclasses.replace(bench_decision(), tolerations={"Master": (odd, {}, GPU_TOLERATION)})
    assert assert_same_as_general(raw, group, decision, BENCH_SETTINGS) is not None


MASTER = "/spec/pytorchReplicaSpecs/Master/template"


@pytest.mark.parametrize(
    "pointers",
    [
        pytest.param((MASTER, MASTER), id="the same template twice"),
        pytest.param((MASTER, "/spec/pytorchReplicaSpecs/Master"), id="one template inside another"),
        pytest.param((MASTER, "/template"), id="under another root key"),
        pytest.param((MASTER, "/spec/pytorchReplicaSpecs/W~2orker/template"), id="a superfluous escape"),
        pytest.param(("spec/pytorchReplicaSpecs/Master/template", MASTER), id="not a pointer"),
    ],
)
def test_pointers_the_diff_would_not_spell_so_take_the_general_path(pointers: tuple[str, str]) -> None:
    raw = bench_like_job()
    group = parse(raw)
    raw["template"] = _master(raw)
    specs = raw["spec"]["pytorchReplicaSpecs"]
    specs["W~2orker"] = specs["Worker"]  # NB: the key `~2` unescapes to; spelled `W~02orker` by the diff
    odd = dataclasses.replace(group, replicas=tuple(
        dataclasses.replace(r, template_path=p) for r, p in zip(group.replicas, pointers, strict=True)
    ))
    assert patch_ops.build_patch_fast(raw, odd, bench_decision(), BENCH_SETTINGS) is None
    try:
        assert_same_as_general(raw, odd, bench_decision(), BENCH_SETTINGS)
    except ValueError as e:  # NB: the general path's own answer to a malformed pointer
        assert "JSON pointer" in str(e)


def test_a_template_under_the_job_metadata_takes_the_general_path() -> None:
    """The diff would put its ops among the annotations' (here: before them, as `annotations` is new)."""
    raw = kubeflow_job("JAXJob", {"Worker": {"template": {"metadata": {}, "spec": {}}}})
    group = parse(raw)
    raw["metadata"]["pod"] = raw["spec"].pop("jaxReplicaSpecs")["Worker"]["template"]
    odd = dataclasses.replace(group, replicas=(dataclasses.replace(group.replicas[0], template_path="/metadata/pod"),))
    assert patch_ops.build_patch_fast(raw, odd, bench_decision(), BENCH_SETTINGS) is None
    assert_same_as_general(raw, odd, bench_decision(), BENCH_SETTINGS)


def test_a_jobset_index_with_a_leading_zero_takes_the_general_path() -> None:
    raw = jobset(rjob("driver", {"metadata": {}, "spec": {}}), rjob("workers", {"metadata": {}, "spec": {}}))
    group = parse(raw)
    zero = dataclasses.replace(group, replicas=(
        dataclasses.replace(group.replicas[0], template_path="/spec/replicatedJobs/00/template/spec/template"),
        group.replicas[1],
    ))
    assert patch_ops.build_patch_fast(raw, zero, bench_decision(), BENCH_SETTINGS) is None
    assert patch_ops.build_patch_fast(raw, group, bench_decision(), BENCH_SETTINGS) is not None
    assert_same_as_general(raw, zero, bench_decision(), BENCH_SETTINGS)


def test_a_trainjob_with_its_entry_in_place_takes_the_fast_path() -> None:
    template = {"metadata": {"labels": {"a": "b"}}, "spec": {"tolerations": None}}
    raw = trainjob(patches=[runtime_patch(labels.MANAGER_NAME, {"node": template})], numNodes=2)
    group = parse(raw)
    decision = dataclasses.replace(bench_decision(), tolerations={r.key: (GPU_TOLERATION,) for r in group.replicas})
    config = Settings(mode="colocate", spread_within_zone="hostname")
    assert assert_same_as_general(raw, group, decision, config) is not None


# --- generated: jobs written the usual way --------------------------------------------------------

tolerations = st.sampled_from([
    GPU_TOLERATION,
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists"},
    {"key": "spot", "operator": "Exists"},
    {"operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Equal", "value": "other", "effect": "NoSchedule"},
])
spreads = st.sampled_from([
    {"maxSkew": 1, "topologyKey": ZL, "whenUnsatisfiable": "DoNotSchedule"},
    {"maxSkew": 2, "topologyKey": HOSTNAME, "whenUnsatisfiable": "ScheduleAnyway"},
    {"maxSkew": 1, "topologyKey": HOSTNAME, "whenUnsatisfiable": "DoNotSchedule"},
])
# What a decision may ask to tolerate: an empty toleration's op has an empty value (dropped from the list).
wanted: st.SearchStrategy[dict[str, Any]] = tolerations | st.just({})
label_maps = st.dictionaries(
    st.sampled_from(["app", "zone", GROUP, "a/b~c"]), st.sampled_from([*ZONES, "train", "kept", "llm"]), max_size=3
)


def _shuffled(draw: st.DrawFn, items: dict[str, Any]) -> dict[str, Any]:
    """`items` with its keys in a drawn order (the diff keeps the order of keys that exist)."""
    return {key: items[key] for key in draw(st.permutations(list(items)))}


def _maybe(draw: st.DrawFn, out: dict[str, Any], key: str, value: st.SearchStrategy[Any]) -> None:
    """Leave `key` absent, set it null, or set it to a drawn value."""
    how = draw(st.sampled_from(["absent", "null", "value", "value"]))
    if how == "null":
        out[key] = None
    elif how == "value":
        out[key] = draw(value)


@st.composite
def usual_templates(draw: st.DrawFn) -> dict[str, Any]:
    """A pod template with `metadata` and `spec` objects and no affinity."""
    spec: dict[str, Any] = {"containers": [CONTAINER]}
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(st.sampled_from([{ZL: "zone-a"}, {ZL: "zone-b"}, {"zone": "zone-c"}, {"gpu": "1"}]))
    _maybe(draw, spec, "tolerations", st.lists(tolerations, max_size=3))
    _maybe(draw, spec, "topologySpreadConstraints", st.lists(spreads, max_size=2, unique_by=lambda s: s["topologyKey"]))
    if draw(st.booleans()):
        spec["restartPolicy"] = "Never"
    metadata: dict[str, Any] = {}
    _maybe(draw, metadata, "labels", label_maps)
    if draw(st.booleans()):
        metadata["annotations"] = {"note": "x"}
    return _shuffled(draw, {"metadata": _shuffled(draw, metadata), "spec": _shuffled(draw, spec)})


@st.composite
def job_metadata(draw: st.DrawFn) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": draw(st.sampled_from(["train", "x" * 70])), "namespace": "ml"}
    annotations = st.sampled_from([
        {},
        {"owner": "me"},
        {labels.ZONE_ANNOTATION: "zone-a"},
        {labels.ZONE_ANNOTATION: "zone-b", "a/b~c": "d"},
        {labels.DECISION_ANNOTATION: "old", "owner": "me", labels.ZONE_ANNOTATION: "zone-c"},
    ])
    _maybe(draw, metadata, "annotations", annotations)
    if draw(st.booleans()):
        metadata["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:metadata": {}}}]
    return _shuffled(draw, metadata)


KUBEFLOW = [("PyTorchJob", ("Master", "Worker")), ("TFJob", ("Chief", "PS", "Worker")), ("JAXJob", ("Worker",))]


@st.composite
def usual_jobs(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        kind, types = draw(st.sampled_from(KUBEFLOW))
        chosen = draw(st.permutations(types).flatmap(lambda ts: st.lists(st.sampled_from(ts), min_size=1, unique=True)))
        specs = {t: {"replicas": draw(st.integers(1, 3)), "template": draw(usual_templates())} for t in chosen}
        doc = kubeflow_job(kind, specs)
    else:
        names = draw(st.lists(st.sampled_from(["driver", "workers", "ps/x"]), min_size=1, max_size=3, unique=True))
        doc = jobset(*(rjob(n, draw(usual_templates()), replicas=draw(st.integers(1, 2))) for n in names))
    doc["metadata"] = draw(job_metadata())
    doc = _shuffled(draw, doc)
    return dict(json.loads(json.dumps(doc)))  # NB: nothing shared, as when read from the wire


@st.composite
def decisions(draw: st.DrawFn, keys: tuple[str, ...]) -> Decision:
    zone = draw(st.sampled_from(ZONES))
    return Decision(
        allowed=True,
        zone=draw(st.sampled_from([zone, None])),
        zones=(),
        reasons=(),
        tolerations={k: tuple(draw(st.lists(wanted, max_size=3))) for k in draw(st.sets(st.sampled_from(keys)))},
        labels=draw(st.sampled_from([{}, {"zone": zone}, {"app": "llm"}, {"zone": zone, GROUP: "mine"}])),
        open_zones=tuple(sorted(draw(st.sets(st.sampled_from(ZONES), max_size=3)))),
        summary=draw(st.sampled_from(["", f"zone={zone}"])),
    )


configs = st.builds(
    Settings,
    mode=st.sampled_from(["pin", "colocate"]),
    spread_within_zone=st.sampled_from(["none", "hostname"]),
    zone_label=st.sampled_from([ZL, "zone"]),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=usual_jobs(), data=st.data(), config=configs)
def test_usual_jobs_take_the_fast_path_with_the_general_paths_ops(
    raw: dict[str, Any], data: st.DataObject, config: Settings
) -> None:
    group = parse(raw)
    decision = data.draw(decisions(tuple(r.key for r in group.replicas)))
    fast = assert_same_as_general(raw, group, decision, config)
    assert fast is not None, "the fast path stepped aside for a job written the usual way"
    patched = apply_patch(raw, json.loads(fast))
    assert patches.build_patch(patched, parse(patched), decision, config) == [], "a second review must be a no-op"


# --- generated: jobs of every kind and shape, fast path or not ---------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=equivalence.jobs_of_every_kind(), decision_of=equivalence.decisions(), config=equivalence.configs)
def test_any_job_gets_the_general_paths_answer(raw: dict[str, Any], decision_of: Any, config: Settings) -> None:
    try:
        group = parse(raw)
    except jobs.JobError:
        return  # not a job the webhook would patch
    assert_same_as_general(raw, group, decision_of(group), config)
