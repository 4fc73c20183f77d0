"""GPUs as clusters expose them now, through the real control plane: topoguard picks the zone at
admission, training-operator makes the pods, the controller-manager's resource-claim controller makes
each pod's ResourceClaims from its template, and the real kube-scheduler (v1.36: DRA GA,
DRAExtendedResource beta and on) allocates devices from the ResourceSlices the suite published for
fake nodes (fixtures/dra-cluster.yaml) and binds. No kubelet is needed for any of it.

All GPUs here are in zone-c; zone-b is CPU-only. A job whose GPUs topoguard does not see looks
CPU-only, and a CPU-only job goes to the first zone its coordinator fits: zone-b (zone-a's nodes are
all tainted), where the workers can never be bound. That was issue 24.

1. Workers that claim GPUs through a ResourceClaimTemplate (DeviceClass gpu.nvidia.com), asking for
   no `nvidia.com/gpu` and tolerating every GPU taint: only zone-c's slices publish such devices.
2. Workers writing `nvidia.com/gpu: 8` that tolerate only the taint of the DRA and MIG nodes
   (KEP-5004): the DRA-only nodes list no nvidia.com/gpu in allocatable (the MIG nodes list 0); the
   DeviceClass maps it, and the scheduler serves it from the slices in a claim of its own.
3. MIG `mixed`: workers asking `nvidia.com/mig-1g.10gb: 1`, offered only by zone-c's MIG nodes.

Each job has a CPU-only coordinator (no GPU, no toleration): it must be bound in the workers' zone,
which only topoguard's pin makes it (left alone the scheduler may put it in zone-b). The namespace
carries the lab's policies; with the workers not labelled `role: gpu-worker` every zone is open, so
the zone is decided by where the GPUs are.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e import kube
from tests.e2e_full.components import Operator
from tests.e2e_full.conftest import clean_namespace, fixture, record, wait_bound, wait_for

pytestmark = pytest.mark.e2e

NAMESPACE = "dra"
JOB_PODS = "training.kubeflow.org/job-name={name}"
REPLICA_TYPE = "training.kubeflow.org/replica-type"
RESOURCE = "/apis/resource.k8s.io/v1"
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"
DRIVER = "gpu.nvidia.com"


def _run(cluster: kube.Cluster, file: str, count: int, gpus: int) -> tuple[str, list[kube.RawObject]]:
    """Create the job; return the zone topoguard wrote on it and its pods once all are bound. topoguard
    must have counted `gpus` GPUs (devices or MIG slices) for the whole job, all free now."""
    job = fixture(file, namespace=NAMESPACE)
    try:
        cluster.create(job)
    except ApiException as e:
        pytest.fail(f"{job['metadata']['name']} was refused: {kube.api_error_body(e).get('message', e)}")
    stored = cluster.get(job)
    assert stored is not None
    annotations = stored["metadata"].get("annotations") or {}
    assert "topoguard.io/zone" in annotations, annotations
    decision = annotations.get("topoguard.io/decision", "").split()
    assert f"gpus={gpus}" in decision and "capacity=now" in decision, decision
    bound = wait_bound(cluster, NAMESPACE, JOB_PODS.format(name=job["metadata"]["name"]), count=count)
    return annotations["topoguard.io/zone"], bound


def _split(bound: list[kube.RawObject]) -> tuple[kube.RawObject, list[kube.RawObject]]:
    masters = [p for p in bound if p["metadata"]["labels"].get(REPLICA_TYPE) == "master"]
    workers = [p for p in bound if p["metadata"]["labels"].get(REPLICA_TYPE) == "worker"]
    assert len(masters) == 1 and len(masters) + len(workers) == len(bound), [p["metadata"]["name"] for p in bound]
    return masters[0], workers


def _assert_together(test: str, cluster: kube.Cluster, chosen: str, bound: list[kube.RawObject]) -> None:
    """Every pod, the CPU-only coordinator included, bound in the chosen zone and labelled with it."""
    zones = record(test, cluster, bound)
    assert zones == {p["metadata"]["name"]: chosen for p in bound}, (chosen, zones)
    for pod in bound:
        assert pod["metadata"]["labels"].get("zone") == chosen, pod["metadata"]["name"]
    master, _ = _split(bound)
    assert not master["spec"].get("resourceClaims"), master["spec"]
    for container in master["spec"]["containers"]:
        limits = (container.get("resources") or {}).get("limits") or {}
        assert not any("nvidia.com" in name for name in limits), limits


def _pod(cluster: kube.Cluster, pod: kube.RawObject) -> kube.RawObject:
    body, _ = cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}")
    return body


def _claim(cluster: kube.Cluster, name: str) -> kube.RawObject:
    body, _ = cluster.request("GET", f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{name}")
    return body


def _with_extended_claim(cluster: kube.Cluster, pod: kube.RawObject) -> kube.RawObject:
    """The pod once its status names the claim the scheduler made for its extended resources (written
    while binding it)."""
    current = pod

    def has_claim() -> bool:
        nonlocal current
        current = _pod(cluster, pod)
        return bool((current["status"].get("extendedResourceClaimStatus") or {}).get("resourceClaimName"))

    wait_for(has_claim, f"the extended-resource claim of {pod['metadata']['name']}", 60)
    return current


def _allocated_on(claim: kube.RawObject, pod: kube.RawObject, devices: int) -> None:
    """The claim holds `devices` GPUs of the driver from the pool of the node the pod is bound to, and is
    reserved for that pod: the scheduler allocated it from the published slices."""
    node = pod["spec"]["nodeName"]
    status: dict[str, Any] = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    assert len(results) == devices, (claim["metadata"]["name"], status)
    assert {(r["driver"], r["pool"]) for r in results} == {(DRIVER, node)}, results
    assert len({r["device"] for r in results}) == devices, results
    assert pod["metadata"]["uid"] in {r.get("uid") for r in status.get("reservedFor") or []}, status


def test_dra_claim_template_workers_bound_where_the_slices_are(
    admission: kube.Cluster, training_operator: Operator,
) -> None:
    cluster = admission
    try:
        chosen, bound = _run(cluster, "pytorchjob-dra-claims.yaml", count=3, gpus=2 * 4)
        assert chosen == "zone-c", chosen
        _assert_together("dra: claim template", cluster, chosen, bound)
        _, workers = _split(bound)
        for worker in workers:
            statuses = worker["status"].get("resourceClaimStatuses") or []
            assert [s["name"] for s in statuses] == ["gpus"], statuses
            claim = _claim(cluster, statuses[0]["resourceClaimName"])
            assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
            _allocated_on(claim, worker, devices=4)
    finally:
        clean_namespace(cluster, NAMESPACE, [fixture("pytorchjob-dra-claims.yaml", namespace=NAMESPACE)])


def test_dra_extended_resource_workers_bound_on_dra_only_nodes(
    admission: kube.Cluster, training_operator: Operator,
) -> None:
    cluster = admission
    gpu_class, _ = cluster.request("GET", f"{RESOURCE}/deviceclasses/gpu.nvidia.com")
    # Dropped on write were DRAExtendedResource off in the apiserver.
    assert gpu_class["spec"].get("extendedResourceName") == "nvidia.com/gpu", gpu_class["spec"]
    try:
        chosen, bound = _run(cluster, "pytorchjob-dra-extended.yaml", count=3, gpus=2 * 8)
        assert chosen == "zone-c", chosen
        _assert_together("dra: nvidia.com/gpu via DRA", cluster, chosen, bound)
        _, workers = _split(bound)
        nodes, _ = cluster.request("GET", "/api/v1/nodes")
        allocatable = {n["metadata"]["name"]: n["status"]["allocatable"] for n in nodes["items"]}
        assert len({w["spec"]["nodeName"] for w in workers}) == len(workers), "8 GPUs each: one DRA node each"
        for worker in workers:
            assert "nvidia.com/gpu" not in allocatable[worker["spec"]["nodeName"]], worker["spec"]["nodeName"]
            current = _with_extended_claim(cluster, worker)
            claim_status = current["status"]["extendedResourceClaimStatus"]
            assert {(m["resourceName"], m["containerName"]) for m in claim_status["requestMappings"]} == \
                {("nvidia.com/gpu", "pytorch")}, claim_status
            claim = _claim(cluster, claim_status["resourceClaimName"])
            assert claim["metadata"]["annotations"].get(EXTENDED_RESOURCE_CLAIM) == "true", claim["metadata"]
            _allocated_on(claim, current, devices=8)
    finally:
        clean_namespace(cluster, NAMESPACE, [fixture("pytorchjob-dra-extended.yaml", namespace=NAMESPACE)])


def test_mig_mixed_workers_bound_on_the_mig_nodes(admission: kube.Cluster, training_operator: Operator) -> None:
    cluster = admission
    try:
        chosen, bound = _run(cluster, "pytorchjob-mig.yaml", count=3, gpus=2)
        assert chosen == "zone-c", chosen
        _assert_together("mig mixed", cluster, chosen, bound)
        _, workers = _split(bound)
        nodes, _ = cluster.request("GET", "/api/v1/nodes")
        mig = {n["metadata"]["name"] for n in nodes["items"]
               if int(n["status"]["allocatable"].get("nvidia.com/mig-1g.10gb", "0")) > 0}
        for worker in workers:
            assert worker["spec"]["nodeName"] in mig, (worker["spec"]["nodeName"], mig)
    finally:
        clean_namespace(cluster, NAMESPACE, [fixture("pytorchjob-mig.yaml", namespace=NAMESPACE)])
