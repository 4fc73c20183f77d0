"""Never pin a replica where it cannot run: every admitted patch leaves each replica a node that passes what
the kube-scheduler's Filter plugins check at allocatable (resources, nodeSelector / required node affinity,
taints), judged by a small reference scheduler filter written here from the Kubernetes docs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import jobs
from app.cache import projections
from app.config import Settings
from app.engine import patches
from app.engine.decide import decide_fresh
from app.models.cluster import Snapshot
from tests.builders import make_snapshot, match_expression
from tests.unit.crd.jsonpatch import apply_patch

ZL = "topology.kubernetes.io/zone"
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"
SETTINGS = Settings()
UNITS = {"m": 1, "": 1000}


def node(name: str, zone: str, *, cpu: str = "32", memory: str = "128Gi", gpus: int = 0, resource: str = GPU,
         taints: list[dict[str, str]] | None = None, labels: dict[str, str] | None = None,
         extra: dict[str, str] | None = None) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110", **(extra or {})}
    if gpus:
        allocatable[resource] = str(gpus)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {ZL: zone, "kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints or []},
        "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def snapshot(*nodes: dict[str, Any]) -> Snapshot:
    return make_snapshot([projections.project_node(n) for n in nodes])


def pytorchjob(master: dict[str, Any], worker: dict[str, Any], workers: int = 2) -> dict[str, Any]:
    def template(resources: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": "pytorch", "image": "x", "resources": resources}], **spec}}
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": template(master.get("resources", {}), master.get("spec", {}))},
            "Worker": {"replicas": workers, "template": template(worker.get("resources", {}), worker.get("spec", {}))},
        }},
    }


def decide_on(job: dict[str, Any], snap: Snapshot) -> tuple[Any, dict[str, Any]]:
    group = jobs.parse_job(job, gpu_resources=SETTINGS.gpu_resources, namespace="ml")
    decision = decide_fresh(group, snap, SETTINGS)
    patched = job
    if decision.allowed and decision.zone:
        patched = apply_patch(job, patches.build_patch(job, group, decision, SETTINGS))
    return decision, patched


# --- the reference filter --------------------------------------------------------------------------

def _quantity(value: Any, resource: str) -> float:
    text = str(value)
    for suffix, scale in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("Ti", 2**40), ("m", 0.001)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)


def _requests(spec: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in spec.get("containers", []):
        res = c.get("resources", {})
        for r, v in {**res.get("limits", {}), **res.get("requests", {})}.items():
            out[r] = out.get(r, 0) + _quantity(v, r)
    return out


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, str]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint["key"]):
            return True
        if t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def passes(spec: dict[str, Any], n: dict[str, Any]) -> bool:
    labels = n["metadata"]["labels"]
    if any(labels.get(k) != v for k, v in spec.get("nodeSelector", {}).items()):
        return False
    required = spec.get("affinity", {}).get("nodeAffinity", {}).get(patches.REQUIRED, {})
    terms = required.get("nodeSelectorTerms")
    if terms and not any(all(match_expression(e, labels) for e in t.get("matchExpressions", [])) for t in terms):
        return False
    if any(t["effect"] in ("NoSchedule", "NoExecute") and not _tolerates(spec.get("tolerations", []), t)
           for t in n["spec"]["taints"]):
        return False
    allocatable = n["status"]["allocatable"]
    return all(_quantity(allocatable.get(r, 0), r) >= amount for r, amount in _requests(spec).items())


def every_replica_has_a_node(job: dict[str, Any], nodes: list[dict[str, Any]]) -> list[str]:
    return [key for key, replica in job["spec"]["pytorchReplicaSpecs"].items()
            if not any(passes(replica["template"]["spec"], n) for n in nodes)]


# --- table cases --------------------------------------------------------------------------------------

GPU_TAINT = {"key": "gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "gpu", "operator": "Exists"}


def test_a_coordinator_too_big_for_the_gpu_zone_is_refused_naming_the_largest_node() -> None:
    nodes = [node("g1", "zone-a", gpus=8, taints=[GPU_TAINT], cpu="16"), node("c1", "zone-b", cpu="64")]
    job = pytorchjob({"resources": {"requests": {"cpu": "48"}}},
                     {"resources": {"limits": {GPU: 1}}, "spec": {"tolerations": [GPU_TOLERATION]}})
    decision, _ = decide_on(job, snapshot(*nodes))
    assert not decision.allowed
    assert "Master cannot run here: no node it may use offers cpu 48 (the largest node has cpu 16)" in \
        " ".join(decision.reasons)


def test_the_zone_whose_nodes_hold_the_coordinator_is_chosen() -> None:
    nodes = [node("g1", "zone-a", gpus=8, memory="64Gi"), node("g2", "zone-b", gpus=2, memory="512Gi")]
    job = pytorchjob({"resources": {"requests": {"memory": "300Gi"}}}, {"resources": {"limits": {GPU: 1}}})
    decision, patched = decide_on(job, snapshot(*nodes))
    assert decision.allowed and decision.zone == "zone-b"
    assert every_replica_has_a_node(patched, nodes) == []


def test_an_extended_resource_no_node_offers_is_refused() -> None:
    nodes = [node("g1", "zone-a", gpus=8, extra={"rdma/ib": "4"}), node("g2", "zone-b", gpus=8)]
    job = pytorchjob({}, {"resources": {"limits": {GPU: 1, "rdma/ib": "1"}}})
    decision, patched = decide_on(job, snapshot(*nodes))
    assert decision.allowed and decision.zone == "zone-a"
    assert every_replica_has_a_node(patched, nodes) == []
    decision, _ = decide_on(pytorchjob({}, {"resources": {"limits": {GPU: 1, "example.com/fpga": "1"}}}),
                            snapshot(*nodes))
    assert not decision.allowed
    assert "example.com/fpga 1 (the largest node has example.com/fpga 0)" in " ".join(decision.reasons)


def test_sidecars_and_init_containers_add_up_as_the_scheduler_sums_them() -> None:
    nodes = [node("g1", "zone-a", gpus=8, cpu="8")]
    job = pytorchjob({}, {"resources": {"limits": {GPU: 1}, "requests": {"cpu": "5"}}})
    spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    spec["initContainers"] = [{"name": "proxy", "image": "x", "restartPolicy": "Always",
                               "resources": {"requests": {"cpu": "4"}}}]
    decision, _ = decide_on(job, snapshot(*nodes))
    assert not decision.allowed  # 5 + 4 cpu > 8
    spec["initContainers"][0].pop("restartPolicy")  # a plain init container runs alone: max(5, 4)
    decision, _ = decide_on(job, snapshot(*nodes))
    assert decision.allowed


def test_a_mig_job_goes_to_the_zone_offering_its_profile_not_the_cpu_zone() -> None:
    nodes = [node("m1", "zone-a", gpus=7, resource=MIG, taints=[GPU_TAINT]), node("c1", "zone-b")]
    job = pytorchjob({}, {"resources": {"limits": {MIG: 1}}, "spec": {"tolerations": [GPU_TOLERATION]}}, workers=4)
    decision, patched = decide_on(job, snapshot(*nodes))
    assert decision.allowed and decision.zone == "zone-a"
    assert every_replica_has_a_node(patched, nodes) == []
    other = node("m2", "zone-c", gpus=7, resource="nvidia.com/mig-3g.40gb")
    decision, _ = decide_on(job, snapshot(other, nodes[1]))
    assert not decision.allowed  # another profile is another pool


# --- the property -------------------------------------------------------------------------------------

ZONES = ("zone-a", "zone-b", "zone-c")


@st.composite
def clusters(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.sampled_from([0, 0, 1, 4, 8]))
        out.append(node(
            f"n{i}", draw(st.sampled_from(ZONES)),
            cpu=str(draw(st.sampled_from([4, 16, 64]))),
            memory=f"{draw(st.sampled_from([16, 128, 512]))}Gi",
            gpus=gpus,
            resource=draw(st.sampled_from([GPU, MIG])),
            taints=[GPU_TAINT] if gpus and draw(st.booleans()) else [],
            labels={"pool": draw(st.sampled_from(["p1", "p2"]))},
            extra={"rdma/ib": "1"} if draw(st.booleans()) else {},
        ))
    return out


@st.composite
def job_specs(draw: st.DrawFn) -> dict[str, Any]:
    def resources(gpu: bool) -> dict[str, Any]:
        requests: dict[str, Any] = {"cpu": draw(st.sampled_from(["500m", "2", "12", "40"])),
                                    "memory": draw(st.sampled_from(["1Gi", "64Gi", "256Gi"]))}
        limits: dict[str, Any] = {}
        if gpu:
            limits[draw(st.sampled_from([GPU, MIG]))] = draw(st.sampled_from([1, 2, 8]))
        if draw(st.booleans()):
            limits["rdma/ib"] = "1"
        return {"requests": requests, "limits": limits}

    def spec() -> dict[str, Any]:
        out: dict[str, Any] = {}
        if draw(st.booleans()):
            out["tolerations"] = [GPU_TOLERATION]
        if draw(st.booleans()):
            out["nodeSelector"] = {"pool": draw(st.sampled_from(["p1", "p2"]))}
        return out

    return pytorchjob({"resources": resources(draw(st.booleans())), "spec": spec()},
                      {"resources": resources(True), "spec": spec()}, workers=draw(st.integers(1, 4)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), job_specs())
def test_no_admitted_patch_leaves_a_replica_without_a_node(nodes: list[dict[str, Any]], job: dict[str, Any]) -> None:
    decision, patched = decide_on(job, snapshot(*nodes))
    if decision.allowed and decision.zone:
        assert every_replica_has_a_node(patched, nodes) == [], decision.reasons


@pytest.mark.parametrize("value", ["abc", "-1", "1.5.5"])
def test_a_request_that_is_no_quantity_is_a_clear_error(value: str) -> None:
    job = pytorchjob({"resources": {"requests": {"cpu": value}}}, {"resources": {"limits": {GPU: 1}}})
    with pytest.raises(jobs.JobError, match=r"resources\.requests\.cpu.*non-negative quantity"):
        jobs.parse_job(job, gpu_resources=SETTINGS.gpu_resources, namespace="ml")
