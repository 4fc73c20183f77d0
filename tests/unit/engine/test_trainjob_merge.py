"""topoguard's runtimePatches entry, merged the way Trainer merges runtime patches, loses nothing.

For each case: a runtime (its own tolerations, nodeSelector, affinity terms), a TrainJob with the
user's and other managers' patches, a decision; build_patch; then the final pod spec of every
replicatedJob is computed as Trainer v2.3 computes it (the runtime's pod template, then every
runtimePatches entry in list order as a strategic merge patch in which tolerations and affinity term
lists are replaced whole: ecosystem-2026-12.md §8). `trainer_merge` below is written for this test
from that description, not taken from app/. The final spec keeps every toleration, nodeSelector entry
and affinity term the merge without topoguard gives, gains topoguard's, leaves other entries as they
were, and reviewing the patched job again gives an empty patch.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app import jobs
from app.cache.files import build_snapshot
from app.config import Settings
from app.engine import patches
from app.models.decision import Decision
from app.models.labels import MANAGER_NAME
from tests.unit.crd.jsonpatch import apply_patch

ZL = "topology.kubernetes.io/zone"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
GPU = "nvidia.com/gpu"
OURS = {"key": GPU, "operator": "Equal", "value": "present", "effect": "NoSchedule"}
POOL = {"key": "pool", "operator": "Exists", "effect": "NoSchedule"}
USER = {"key": "team", "operator": "Equal", "value": "a", "effect": "NoSchedule"}
KUEUE = {"key": "flavor", "operator": "Exists", "effect": "NoSchedule"}
TERM_H100 = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
TERM_A100 = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
TERM_USER = {"matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["r9"]}]}
POD_TERM = {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "kubernetes.io/hostname"}


def trainer_merge(base: Any, patch: Any) -> Any:
    """Strategic merge as Trainer applies a runtime patch: maps merge, containers merge by name, other lists replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if key == "containers" and isinstance(out.get(key), list):
                names = {c["name"]: i for i, c in enumerate(out[key])}
                for c in value:
                    if c["name"] in names:
                        out[key][names[c["name"]]] = trainer_merge(out[key][names[c["name"]]], c)
                    else:
                        out[key].append(copy.deepcopy(c))
            else:
                out[key] = trainer_merge(out.get(key), value)
        return out
    return copy.deepcopy(patch)


def final_pods(runtime: dict[str, Any], job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """replicatedJob name → the pod spec Trainer creates."""
    pods = {r["name"]: copy.deepcopy(r["template"]["spec"]["template"])
            for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    for entry in job["spec"].get("runtimePatches", []):
        for rjob in entry.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", []):
            pods[rjob["name"]] = trainer_merge(pods[rjob["name"]], rjob["template"]["spec"]["template"])
    return {name: pod.get("spec", {}) for name, pod in pods.items()}


def runtime(*names: str, **pod_spec: Any) -> dict[str, Any]:
    rjobs = []
    for name in names:
        spec = {"containers": [{"name": "node", "image": "pytorch"}], **copy.deepcopy(pod_spec)}
        labels = {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"} if name == "node" else {}
        rjobs.append({"name": name, "template": {"metadata": {"labels": labels}, "spec": {"template": {"spec": spec}}}})
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": "rt"}, "spec": {"mlPolicy": {"numNodes": 1, "torch": {}},
                                                 "template": {"spec": {"replicatedJobs": rjobs}}}}


def entry(manager: str, **per_job: dict[str, Any]) -> dict[str, Any]:
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": name, "template": {"spec": {"template": {"spec": spec}}}} for name, spec in per_job.items()]}}}}


def trainjob(*patches: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"runtimeRef": {"name": "rt"}, "trainer": {"numNodes": 2,
                                                                      "resourcesPerNode": {"limits": {GPU: 8}}}}
    if patches:
        spec["runtimePatches"] = list(patches)
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "tj", "namespace": "ml"}, "spec": spec}


def affinity(*terms: dict[str, Any], pod_terms: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if terms:
        out["nodeAffinity"] = {REQUIRED: {"nodeSelectorTerms": list(terms)}}
    if pod_terms:
        out["podAffinity"] = {REQUIRED: list(pod_terms)}
    return out


CASES = [
    pytest.param(runtime("node", tolerations=[POOL], nodeSelector={"pool": "h100"}),
                 trainjob(), "pin", id="runtime tolerations and nodeSelector, no user patch"),
    pytest.param(runtime("node", tolerations=[POOL]),
                 trainjob(entry("example.io/platform", node={"tolerations": [USER], "nodeSelector": {"team": "a"}})),
                 "pin", id="a user patch replaces the runtime's tolerations; ours carries the user's"),
    pytest.param(runtime("node", affinity=affinity(TERM_H100, TERM_A100)), trainjob(), "pin",
                 id="the zone is ANDed into each of the runtime's ORed terms"),
    pytest.param(runtime("node", tolerations=[POOL], affinity=affinity(TERM_H100)),
                 trainjob(entry("example.io/platform", node={"affinity": affinity(TERM_USER)})), "pin",
                 id="a user's terms replace the runtime's; ours keeps the user's"),
    pytest.param(runtime("dataset-initializer", "node", tolerations=[POOL]),
                 trainjob(entry("kueue.x-k8s.io/manager", node={"tolerations": [POOL, KUEUE]}),
                          entry("example.io/platform", **{"dataset-initializer": {"nodeSelector": {"disk": "ssd"}}})),
                 "pin", id="initializer and node, another manager's entry before ours"),
    pytest.param(runtime("node", tolerations=[POOL], affinity=affinity(TERM_H100, pod_terms=(POD_TERM,))),
                 trainjob(entry("example.io/platform", node={"tolerations": [POOL, USER]})), "colocate",
                 id="colocate: the runtime's podAffinity terms are kept beside ours"),
]


@pytest.mark.parametrize("rt, job, mode", CASES)
def test_trainers_merge_of_the_patched_job_keeps_runtime_user_and_topoguard(
    rt: dict[str, Any], job: dict[str, Any], mode: str
) -> None:
    settings = Settings(mode=mode)  # type: ignore[arg-type]
    known = build_snapshot([rt]).training_runtimes
    group = jobs.parse_job(job, gpu_resources=settings.gpu_resources, namespace="ml", runtimes=known)
    decision = Decision(allowed=True, zone="zone-a" if mode == "pin" else None, zones=(), reasons=(),
                        tolerations={r.key: (OURS,) for r in group.replicas}, open_zones=("zone-a", "zone-b"),
                        summary="zone-a")

    patched = apply_patch(job, patches.build_patch(job, group, decision, settings))
    before, after = final_pods(rt, job), final_pods(rt, patched)

    for name, want in before.items():
        got = after[name]
        assert [t for t in want.get("tolerations", [])] + [OURS] == got["tolerations"], name
        assert want.get("nodeSelector", {}).items() <= got.get("nodeSelector", {}).items(), name
        terms = got["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
        wanted_terms = want.get("affinity", {}).get("nodeAffinity", {}).get(REQUIRED, {}).get("nodeSelectorTerms")
        for term, wanted in zip(terms, wanted_terms or [{"matchExpressions": []}], strict=True):
            zone = {"key": ZL, "operator": "In", "values": ["zone-a"] if mode == "pin" else ["zone-a", "zone-b"]}
            assert term["matchExpressions"] == [*wanted["matchExpressions"], zone], name
        if mode == "colocate":
            pod_terms = got["affinity"]["podAffinity"][REQUIRED]
            old = want.get("affinity", {}).get("podAffinity", {}).get(REQUIRED, [])
            assert pod_terms[: len(old)] == old and len(pod_terms) == len(old) + 1, name
            assert pod_terms[-1]["topologyKey"] == ZL
    others = [e for e in patched["spec"]["runtimePatches"] if e["manager"] != MANAGER_NAME]
    assert others == job["spec"].get("runtimePatches", [])
    assert [e["manager"] for e in patched["spec"]["runtimePatches"]][-1] == MANAGER_NAME

    again = jobs.parse_job(patched, gpu_resources=settings.gpu_resources, namespace="ml", runtimes=known)
    assert patches.build_patch(patched, again, decision, settings) == []
