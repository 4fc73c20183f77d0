"""build_patch: exact RFC 6902 op lists for pin, colocate and spread, plus no-op, escaping and bad input."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import pytest

from app import jobs
from app.config import Settings
from app.engine import patches
from app.models.decision import Decision
from app.models.job import JobGroup, Replica, UserPlacement
from tests.builders import mark_everything
from tests.unit.crd.jsonpatch import apply_patch

ZL = "topology.kubernetes.io/zone"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
GROUP = "topoguard.io/group"
IN_A = {"key": ZL, "operator": "In", "values": ["zone-a"]}
IN_AC = {"key": ZL, "operator": "In", "values": ["zone-a", "zone-c"]}
GPU_TOLERATION = {"key": "gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
CONTAINER = {"name": "pytorch", "image": "pytorch/pytorch:2.4.0"}
MASTER = "/spec/pytorchReplicaSpecs/Master/template"
WORKER = "/spec/pytorchReplicaSpecs/Worker/template"
PIN = Settings()
COLOCATE = Settings(mode="colocate")
PIN_SPREAD = Settings(spread_within_zone="hostname")


def pin_affinity(*terms: Mapping[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [dict(t) for t in terms]}}}


def pytorchjob(templates: Mapping[str, Any], *, annotations: Mapping[str, str] | None = None,
               name: str = "train") -> dict[str, Any]:
    """A PyTorchJob; a template of None means the replica spec has no `template` key at all."""
    metadata: dict[str, Any] = {"name": name, "namespace": "ml"}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    specs = {key: {"replicas": 1, **({} if t is None else {"template": copy.deepcopy(t)})}
             for key, t in templates.items()}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata,
            "spec": {"pytorchReplicaSpecs": specs}}


def jobset(*names: str) -> dict[str, Any]:
    jobs = [{"name": n, "template": {"spec": {"template": {"spec": {"containers": [CONTAINER]}}}}} for n in names]
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "namespace": "ml"}, "spec": {"replicatedJobs": jobs}}


def _replica(key: str, path: str, template: Any) -> Replica:
    return Replica(
        key=key, role=key.lower(), count=1, template_path=path,
        template=template if isinstance(template, Mapping) else {},
        pod_labels={}, index_label="", gpus={}, ports=(), service_account="default", host_network=False,
        placement=UserPlacement(node_selector={}, node_selector_terms=(), tolerations=()),
        is_coordinator=key in ("Master", "driver"),
    )


def group_of(doc: Mapping[str, Any], *, supports_spread: bool = True) -> JobGroup:
    """The JobGroup an adapter would produce, reading templates from `doc` as it stands."""
    spec = doc["spec"]
    if "pytorchReplicaSpecs" in spec:
        replicas = tuple(_replica(k, f"/spec/pytorchReplicaSpecs/{k}/template", v.get("template"))
                         for k, v in spec["pytorchReplicaSpecs"].items())
    else:
        replicas = tuple(_replica(rj["name"], f"/spec/replicatedJobs/{i}/template/spec/template",
                                  rj["template"]["spec"].get("template"))
                         for i, rj in enumerate(spec["replicatedJobs"]))
    return JobGroup(api_version=doc["apiVersion"], kind=doc["kind"], name=doc["metadata"].get("name", ""),
                    namespace="ml", replicas=replicas, coordinator=replicas[0].key, flows=(),
                    group_selector={}, annotations=doc["metadata"].get("annotations", {}),
                    supports_spread=supports_spread)


def decision(zone: str | None = "zone-a", *, tolerations: Mapping[str, Any] | None = None,
             labels: Mapping[str, str] | None = None, open_zones: tuple[str, ...] = ("zone-a",),
             allowed: bool = True) -> Decision:
    return Decision(allowed=allowed, zone=zone, zones=(), reasons=(), tolerations=dict(tolerations or {}),
                    labels=dict(labels or {}), open_zones=open_zones, summary=f"zone={zone}")


def annotations_add(zone: str = "zone-a") -> dict[str, Any]:
    return {"op": "add", "path": "/metadata/annotations",
            "value": {"topoguard.io/zone": zone, "topoguard.io/decision": f"zone={zone}"}}


def add(path: str, value: Any) -> dict[str, Any]:
    return {"op": "add", "path": path, "value": value}


BARE = {"spec": {"containers": [CONTAINER]}}

CASES = [
    pytest.param(
        pytorchjob({"Master": BARE, "Worker": BARE}), decision(), PIN,
        [annotations_add(),
         add(f"{MASTER}/spec/affinity", pin_affinity({"matchExpressions": [IN_A]})),
         add(f"{WORKER}/spec/affinity", pin_affinity({"matchExpressions": [IN_A]}))],
        id="bare templates get one required term with the zone and the job gets both annotations",
    ),
    pytest.param(
        pytorchjob({"Master": BARE, "Worker": {"spec": {"containers": [CONTAINER], "affinity": pin_affinity(
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["true"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
            {},
        )}}}), decision(), PIN,
        [annotations_add(),
         add(f"{MASTER}/spec/affinity", pin_affinity({"matchExpressions": [IN_A]})),
         add(f"{WORKER}/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms/0/matchExpressions/-", IN_A),
         add(f"{WORKER}/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms/1/matchExpressions", [IN_A])],
        id="every ORed user term gets the zone ANDed in and an empty term (matches nothing) stays empty",
    ),
    pytest.param(
        pytorchjob({"Worker": {"spec": {"containers": [CONTAINER], "affinity": pin_affinity(
            {"matchExpressions": [IN_A]},
            {"matchExpressions": [{"key": ZL, "operator": "In", "values": ["zone-a", "zone-b"]}]},
        )}}}), decision(), PIN,
        [annotations_add(),
         add(f"{WORKER}/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms/1/matchExpressions/-", IN_A)],
        id="a term already confined to the zone is kept as written and a wider term is narrowed",
    ),
    pytest.param(
        pytorchjob({"Worker": {"spec": {"containers": [CONTAINER], "nodeSelector": {ZL: "zone-a"}}}}),
        decision(), PIN, [annotations_add()],
        id="a nodeSelector on the chosen zone already pins the template so no affinity is added",
    ),
    pytest.param(
        pytorchjob({"Worker": {"spec": {"containers": [CONTAINER], "nodeSelector": {ZL: "zone-a"}, "affinity": None}}}),
        decision(), PIN, [annotations_add()],
        id="a null affinity beside a nodeSelector that already pins stays null (no op, no placeholder value)",
    ),
    pytest.param(
        pytorchjob({"Master": {"metadata": {"labels": {"app": "x", "zone": "zone-b"}}, **BARE}, "Worker": BARE}),
        decision(labels={"zone": "zone-a", "example.com/tier": "gpu"}), PIN,
        [annotations_add(),
         {"op": "replace", "path": f"{MASTER}/metadata/labels/zone", "value": "zone-a"},
         add(f"{MASTER}/metadata/labels/example.com~1tier", "gpu"),
         add(f"{MASTER}/spec/affinity", pin_affinity({"matchExpressions": [IN_A]})),
         add(f"{WORKER}/spec/affinity", pin_affinity({"matchExpressions": [IN_A]})),
         add(f"{WORKER}/metadata", {"labels": {"zone": "zone-a", "example.com/tier": "gpu"}})],
        id="a wrong zone identity label is replaced and label keys with a slash are escaped",
    ),
    pytest.param(
        pytorchjob({"Worker": BARE}, annotations={"owner": "me", "topoguard.io/zone": "zone-b"}), decision(), PIN,
        [{"op": "replace", "path": "/metadata/annotations/topoguard.io~1zone", "value": "zone-a"},
         add("/metadata/annotations/topoguard.io~1decision", "zone=zone-a"),
         add(f"{WORKER}/spec/affinity", pin_affinity({"matchExpressions": [IN_A]}))],
        id="existing annotations are kept and ours are set with escaped keys",
    ),
    pytest.param(
        pytorchjob({"Master": BARE,
                    "Worker": {"spec": {"containers": [CONTAINER], "nodeSelector": {ZL: "zone-a"},
                                        "tolerations": [{"key": "gpu", "operator": "Exists"}]}},
                    "Evaluator": {"spec": {"containers": [CONTAINER], "nodeSelector": {ZL: "zone-a"},
                                           "tolerations": [{"key": "spot", "operator": "Exists"}]}}}),
        decision(tolerations={"Master": (GPU_TOLERATION,), "Worker": (GPU_TOLERATION,),
                              "Evaluator": (GPU_TOLERATION,)}), PIN,
        [annotations_add(),
         add(f"{MASTER}/spec/affinity", pin_affinity({"matchExpressions": [IN_A]})),
         add(f"{MASTER}/spec/tolerations", [GPU_TOLERATION]),
         add("/spec/pytorchReplicaSpecs/Evaluator/template/spec/tolerations/-", GPU_TOLERATION)],
        id="tolerations are appended only where the taint is not already tolerated",
    ),
    pytest.param(
        pytorchjob({"Master": BARE, "Worker": None}), decision(), PIN,
        [annotations_add(),
         add(f"{MASTER}/spec/affinity", pin_affinity({"matchExpressions": [IN_A]})),
         add(WORKER, {"spec": {"affinity": pin_affinity({"matchExpressions": [IN_A]})}})],
        id="an absent template is created whole by one add",
    ),
    pytest.param(
        pytorchjob({"Master": BARE, "Worker": BARE}), decision(None, open_zones=("zone-a", "zone-c")), COLOCATE,
        [add("/metadata/annotations", {"topoguard.io/decision": "zone=None"}),
         add(f"{MASTER}/spec/affinity", {
             **pin_affinity({"matchExpressions": [IN_AC]}),
             "podAffinity": {REQUIRED: [{"labelSelector": {"matchLabels": {GROUP: "train"}}, "topologyKey": ZL}]}}),
         add(f"{MASTER}/metadata", {"labels": {GROUP: "train"}}),
         add(f"{WORKER}/spec/affinity", {
             **pin_affinity({"matchExpressions": [IN_AC]}),
             "podAffinity": {REQUIRED: [{"labelSelector": {"matchLabels": {GROUP: "train"}}, "topologyKey": ZL}]}}),
         add(f"{WORKER}/metadata", {"labels": {GROUP: "train"}})],
        id="colocate adds podAffinity on the group label and confines nodes to the open zones without a zone name",
    ),
    pytest.param(
        pytorchjob({"Worker": {"spec": {"containers": [CONTAINER], "nodeSelector": {ZL: "zone-a"},
                                        "topologySpreadConstraints": [
                                            {"maxSkew": 1, "topologyKey": ZL, "whenUnsatisfiable": "DoNotSchedule"}]}},
                    "Master": BARE}),
        decision(), PIN_SPREAD,
        [annotations_add(),
         add(f"{WORKER}/spec/topologySpreadConstraints/-",
             {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
              "labelSelector": {"matchLabels": {GROUP: "train"}}}),
         add(f"{WORKER}/metadata", {"labels": {GROUP: "train"}}),
         add(f"{MASTER}/spec/affinity", pin_affinity({"matchExpressions": [IN_A]})),
         add(f"{MASTER}/spec/topologySpreadConstraints",
             [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
               "labelSelector": {"matchLabels": {GROUP: "train"}}}]),
         add(f"{MASTER}/metadata", {"labels": {GROUP: "train"}})],
        id="spreadWithinZone hostname adds a soft hostname spread over the group beside the user's zone spread",
    ),
    pytest.param(
        pytorchjob({"Worker": {"spec": {"containers": [CONTAINER], "nodeSelector": {ZL: "zone-a"},
                                        "topologySpreadConstraints": [
                                            {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname",
                                             "whenUnsatisfiable": "ScheduleAnyway"}]}}}),
        decision(), PIN_SPREAD,
        [annotations_add(), add(f"{WORKER}/metadata", {"labels": {GROUP: "train"}})],
        id="no second hostname ScheduleAnyway spread when the user has one (duplicate list-map key)",
    ),
    pytest.param(
        jobset("driver", "workers"), decision(tolerations={"workers": (GPU_TOLERATION,)}), PIN,
        [{"op": "add", "path": "/metadata/annotations",
          "value": {"topoguard.io/zone": "zone-a", "topoguard.io/decision": "zone=zone-a"}},
         add("/spec/replicatedJobs/0/template/spec/template/spec/affinity", pin_affinity({"matchExpressions": [IN_A]})),
         add("/spec/replicatedJobs/1/template/spec/template/spec/affinity", pin_affinity({"matchExpressions": [IN_A]})),
         add("/spec/replicatedJobs/1/template/spec/template/spec/tolerations", [GPU_TOLERATION])],
        id="JobSet replicatedJobs are patched by list index",
    ),
]


@pytest.mark.parametrize("doc, chosen, settings, want", CASES)
def test_build_patch_emits_exactly_these_ops(
    doc: dict[str, Any], chosen: Decision, settings: Settings, want: list[dict[str, Any]]
) -> None:
    before = copy.deepcopy(doc)
    got = patches.build_patch(doc, group_of(doc), chosen, settings)
    assert got == want
    assert doc == before, "build_patch must not modify the job it was given"


@pytest.mark.parametrize("doc, chosen, settings, want", CASES)
def test_second_review_of_a_patched_job_is_a_no_op(
    doc: dict[str, Any], chosen: Decision, settings: Settings, want: list[dict[str, Any]]
) -> None:
    patched = apply_patch(doc, want)
    assert patches.build_patch(patched, group_of(patched), chosen, settings) == []


@pytest.mark.parametrize(
    "supports_spread, want",
    [
        pytest.param(False, [annotations_add(),
                             add(f"{WORKER}/spec/affinity", pin_affinity({"matchExpressions": [IN_A]}))],
                     id="a kind whose schema prunes spread constraints gets none and no group label"),
        pytest.param(True, [annotations_add(),
                            add(f"{WORKER}/spec/affinity", pin_affinity({"matchExpressions": [IN_A]})),
                            add(f"{WORKER}/spec/topologySpreadConstraints",
                                [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                  "whenUnsatisfiable": "ScheduleAnyway",
                                  "labelSelector": {"matchLabels": {GROUP: "train"}}}]),
                            add(f"{WORKER}/metadata", {"labels": {GROUP: "train"}})],
                     id="the same job with spread support gets the hostname spread"),
    ],
)
def test_spread_respects_supports_spread(supports_spread: bool, want: list[dict[str, Any]]) -> None:
    doc = pytorchjob({"Worker": BARE})
    assert patches.build_patch(doc, group_of(doc, supports_spread=supports_spread), decision(), PIN_SPREAD) == want


def test_colocate_adds_no_spread_where_the_schema_prunes_it() -> None:
    doc = pytorchjob({"Worker": BARE})
    colocate_spread = Settings(mode="colocate", spread_within_zone="hostname")
    got = patches.build_patch(doc, group_of(doc, supports_spread=False), decision(None), colocate_spread)
    assert got == [
        add("/metadata/annotations", {"topoguard.io/decision": "zone=None"}),
        add(f"{WORKER}/spec/affinity", {
            **pin_affinity({"matchExpressions": [IN_A]}),
            "podAffinity": {REQUIRED: [{"labelSelector": {"matchLabels": {GROUP: "train"}}, "topologyKey": ZL}]}}),
        add(f"{WORKER}/metadata", {"labels": {GROUP: "train"}}),
    ]


def test_a_refused_decision_patches_nothing() -> None:
    doc = pytorchjob({"Worker": BARE})
    assert patches.build_patch(doc, group_of(doc), decision(None, allowed=False), PIN) == []


@pytest.mark.parametrize(
    "template, where",
    [
        pytest.param({"spec": {"tolerations": {"key": "gpu"}}}, f"{WORKER}/spec/tolerations",
                     id="tolerations as an object is refused naming its path"),
        pytest.param({"spec": {"affinity": "zone-a"}}, f"{WORKER}/spec/affinity",
                     id="affinity as a string is refused naming its path"),
        pytest.param({"spec": {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": ["x"]}}}}},
                     f"{WORKER}/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms/0",
                     id="a node selector term that is not an object is refused naming its index"),
        pytest.param({"metadata": {"labels": ["zone"]}}, f"{WORKER}/metadata/labels",
                     id="labels as a list is refused naming its path"),
    ],
)
def test_wrong_types_are_a_patch_error_naming_the_field(template: dict[str, Any], where: str) -> None:
    doc = pytorchjob({"Worker": template})
    with pytest.raises(patches.PatchError) as info:
        patches.build_patch(doc, group_of(doc), decision(tolerations={"Worker": (GPU_TOLERATION,)},
                                                         labels={"zone": "zone-a"}), PIN)
    assert where in str(info.value)


@pytest.mark.parametrize(
    "token, want",
    [
        pytest.param("topoguard.io/zone", "topoguard.io~1zone", id="slash becomes ~1"),
        pytest.param("a~b", "a~0b", id="tilde becomes ~0"),
        pytest.param("~1", "~01", id="a literal ~1 is escaped tilde-first so it does not read back as a slash"),
        pytest.param("~/", "~0~1", id="tilde and slash together"),
        pytest.param("Worker", "Worker", id="plain tokens are unchanged"),
    ],
)
def test_escape_json_pointer_follows_rfc_6901(token: str, want: str) -> None:
    assert patches.escape_json_pointer(token) == want
    assert patches.unescape_json_pointer(want) == token


@pytest.mark.parametrize(
    "doc, want",
    [
        pytest.param(pytorchjob({"Worker": BARE}, name="mnist"), "mnist", id="the job name when it is a label value"),
        pytest.param(pytorchjob({"Worker": {"metadata": {"labels": {GROUP: "kept"}}, **BARE}}, name="mnist"), "kept",
                     id="a value already on a template wins so a patched job keeps it"),
        pytest.param(pytorchjob({"Worker": BARE}, name="x" * 70), "x" * 52 + "-",
                     id="a name longer than 63 characters is cut and suffixed with a hash"),
    ],
)
def test_group_label_value(doc: dict[str, Any], want: str) -> None:
    got = patches.group_label_value(doc, group_of(doc))
    assert got.startswith(want)
    assert len(got) <= patches.LABEL_VALUE_MAX_CHARS


def test_group_label_value_without_a_name_is_derived_from_generate_name_and_stable() -> None:
    doc = pytorchjob({"Worker": BARE}, name="")
    doc["metadata"] = {"generateName": "mnist-", "namespace": "ml"}
    got = patches.group_label_value(doc, group_of(doc))
    assert got.startswith("mnist-") and len(got) == len("mnist-") + 10
    assert patches.group_label_value(copy.deepcopy(doc), group_of(doc)) == got


@pytest.mark.parametrize(
    "old, new, want",
    [
        pytest.param({"a": 1}, {"a": 1}, [], id="equal documents give no ops"),
        pytest.param({"a": None}, {"a": {"b": 1}}, [{"op": "replace", "path": "/a", "value": {"b": 1}}],
                     id="null replaced by an object is a replace"),
        pytest.param({"a": [1]}, {"a": [1, 2, 3]}, [add("/a/-", 2), add("/a/-", 3)],
                     id="appended items are adds at the end in order"),
        pytest.param({"a": {"b": [1, {"c": "x"}]}}, {"a": {"b": [1, {"c": "y"}]}},
                     [{"op": "replace", "path": "/a/b/1/c", "value": "y"}],
                     id="a changed scalar deep inside is one replace at its own path"),
        pytest.param({"a~b": {"c/d": 1}}, {"a~b": {"c/d": 2}}, [{"op": "replace", "path": "/a~0b/c~1d", "value": 2}],
                     id="keys with tilde and slash are escaped in the path"),
    ],
)
def test_diff_documents(old: Any, new: Any, want: list[dict[str, Any]]) -> None:
    assert patches.diff_documents(old, new) == want


@pytest.mark.parametrize(
    "old, new",
    [
        pytest.param({"a": 1, "b": 2}, {"a": 1}, id="a removed key is refused"),
        pytest.param({"a": [1, 2]}, {"a": [1]}, id="a shortened list is refused"),
        pytest.param({"a": 1}, [1], id="replacing the whole document is refused"),
    ],
)
def test_diff_documents_refuses_removals(old: Any, new: Any) -> None:
    with pytest.raises(patches.PatchError):
        patches.diff_documents(old, new)


# --- a job as kubectl sends it (the bench's shape), and what op values are made of ----------------

GPU = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}


def kubectl_job() -> dict[str, Any]:
    """A PyTorchJob with managedFields and a last-applied annotation, one replica already tolerating spot."""
    def replica(role: str, count: int, **spec: Any) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "OnFailure", "template": {
            "metadata": {"labels": {"app": "llm", "role": role}},
            "spec": {"containers": [CONTAINER], "volumes": [{"name": "shm", "emptyDir": {}}], **spec}}}

    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "llm", "namespace": "ml", "labels": {"team": "ml"},
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                     "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]},
        "spec": {"pytorchReplicaSpecs": {
            "Master": replica("coordinator", 1),
            "Worker": replica("worker", 15, tolerations=[{"key": "spot", "operator": "Exists"}])}},
    }


def parsed(doc: Mapping[str, Any]) -> JobGroup:
    return jobs.parse_job(doc, gpu_resources=("nvidia.com/gpu",), namespace="ml")


def kubectl_decision(**changes: Any) -> Decision:
    return dataclasses.replace(Decision(
        allowed=True, zone="zone-a", zones=(), reasons=(), tolerations={"Master": (GPU,)},
        labels={"zone": "zone-a"}, open_zones=("zone-a",), summary="zone=zone-a"), **changes)


def test_a_job_as_kubectl_sends_it_gets_exactly_these_ops() -> None:
    doc = kubectl_job()
    identity = Settings(zone_identity_label="zone")
    pin = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": identity.zone_label, "operator": "In", "values": ["zone-a"]}]}]}}}
    assert patches.build_patch(doc, parsed(doc), kubectl_decision(), identity) == [
        add("/metadata/annotations/topoguard.io~1zone", "zone-a"),
        add("/metadata/annotations/topoguard.io~1decision", "zone=zone-a"),
        add(f"{MASTER}/metadata/labels/zone", "zone-a"),
        add(f"{MASTER}/spec/affinity", pin),
        add(f"{MASTER}/spec/tolerations", [GPU]),
        add(f"{WORKER}/metadata/labels/zone", "zone-a"),
        add(f"{WORKER}/spec/affinity", pin),
    ]


def test_op_values_share_nothing_with_the_job_or_the_decision() -> None:
    """The decision is shared by a memo and the job is the caller's: changing an op's value reaches neither,
    nor a later patch."""
    doc = kubectl_job()
    chosen = kubectl_decision(tolerations={"Master": (GPU,), "Worker": ({**GPU, "extra": {"a": [1]}},)})
    config = Settings(mode="colocate", spread_within_zone="hostname")
    before = json.dumps([doc, dataclasses.asdict(chosen)], default=dict)
    first = patches.build_patch(doc, parsed(doc), chosen, config)
    want = json.dumps(first)
    for op in first:
        mark_everything(op["value"])
    assert json.dumps([doc, dataclasses.asdict(chosen)], default=dict) == before
    assert json.dumps(patches.build_patch(doc, parsed(doc), chosen, config)) == want


@pytest.mark.parametrize("present", [None, [], [{"key": "spot", "operator": "Exists"}], "absent"])
def test_a_toleration_is_copied_without_its_empty_parts(present: Any) -> None:
    doc = kubectl_job()
    if present != "absent":
        doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["tolerations"] = present
    odd = {"key": "x", "operator": "Exists", "effect": "NoSchedule", "extra": {"empty": []}}
    chosen = kubectl_decision(tolerations={"Master": (odd, {}, GPU)})
    ops = patches.build_patch(doc, parsed(doc), chosen, Settings(zone_identity_label="zone"))
    added = [op for op in ops if op["path"].startswith(f"{MASTER}/spec/tolerations")]
    pruned = {"key": "x", "operator": "Exists", "effect": "NoSchedule"}
    if isinstance(present, list):  # appended one by one; the empty one's op is dropped
        assert added == [add(f"{MASTER}/spec/tolerations/-", pruned), add(f"{MASTER}/spec/tolerations/-", GPU)]
    else:
        assert [op["value"] for op in added] == [[pruned, {}, GPU]]


@pytest.mark.parametrize("second", [MASTER, "/spec/pytorchReplicaSpecs/Master"], ids=["the same", "its parent"])
def test_template_pointers_that_lead_one_into_the_other_are_a_patch_error(second: str) -> None:
    """No adapter makes such pointers; the patch refuses them rather than editing one template twice."""
    doc = kubectl_job()
    group = parsed(doc)
    odd = dataclasses.replace(group, replicas=(group.replicas[0], dataclasses.replace(group.replicas[1],
                                                                                      template_path=second)))
    with pytest.raises(patches.PatchError, match="one pod template inside another"):
        patches.build_patch(doc, odd, kubectl_decision(), Settings(zone_identity_label="zone"))
