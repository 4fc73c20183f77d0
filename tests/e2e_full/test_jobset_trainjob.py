"""A JobSet and a TrainJob through the real controllers: JobSet v0.12.0 turns a JobSet into batch Jobs,
kube-controller-manager's job controller turns those into Pods, Trainer v2.3.0 turns a TrainJob on the
upstream torch runtime into a JobSet (merging the runtime with every runtimePatch, topoguard's
included). Every pod must be bound in the zone topoguard chose and still carry every toleration its
template (for the TrainJob: the runtime) had, since Trainer's merge treats `tolerations` as atomic.

The JobSet and TrainJob pods have no `role` label, so the lab's `deny-cross-zone-gpu-traffic` does not
select them and zone-c (the most free GPUs) is open: the zone is whatever topoguard annotated, and
the test checks the scheduler followed it.
"""

from __future__ import annotations

import pytest

from tests.e2e import kube
from tests.e2e_full.components import Operator
from tests.e2e_full.conftest import clean_namespace, fixture, record, wait_bound

pytestmark = pytest.mark.e2e

GPU_TOLERATION = {"key": "gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
MAINTENANCE_TOLERATION = {"key": "example.com/maintenance", "operator": "Exists", "effect": "NoSchedule"}


def _check(cluster: kube.Cluster, test: str, stored: kube.RawObject, bound: list[kube.RawObject]) -> str:
    chosen: str = stored["metadata"]["annotations"]["topoguard.io/zone"]
    zones = record(test, cluster, bound)
    assert zones == {p["metadata"]["name"]: chosen for p in bound}, (chosen, zones)
    for pod in bound:
        tolerations = pod["spec"].get("tolerations") or []
        for wanted in (GPU_TOLERATION, MAINTENANCE_TOLERATION):
            assert wanted in tolerations, (pod["metadata"]["name"], tolerations)
        assert pod["metadata"]["labels"].get("zone") == chosen, pod["metadata"]["name"]
    return chosen


def test_jobset_pods_bound_in_the_chosen_zone(admission: kube.Cluster, jobset_controller: Operator) -> None:
    cluster, namespace = admission, "jobset"
    job = fixture("jobset-gpu.yaml", namespace=namespace)
    try:
        cluster.create(job)
        stored = cluster.get(job)
        assert stored is not None
        bound = wait_bound(cluster, namespace, "jobset.sigs.k8s.io/jobset-name=pytorch", count=2)
        _check(cluster, "jobset", stored, bound)
    finally:
        clean_namespace(cluster, namespace, [job])


def test_trainjob_on_the_upstream_torch_runtime_keeps_the_runtime_tolerations(
    admission: kube.Cluster, trainer_controller: Operator,
) -> None:
    """The runtime (fixtures/torch-distributed-runtime.yaml) is created with the cluster, before topoguard
    starts, so topoguard's watch cache holds it when the TrainJob arrives."""
    cluster, namespace = admission, "trainjob"
    job = fixture("trainjob-torch.yaml", namespace=namespace)
    try:
        cluster.create(job)
        stored = cluster.get(job)
        assert stored is not None
        bound = wait_bound(cluster, namespace, "jobset.sigs.k8s.io/jobset-name=train", count=2)
        _check(cluster, "trainjob", stored, bound)
        for pod in bound:
            # The platform team's patch (before topoguard's) survived the merge too.
            assert pod["metadata"]["labels"].get("team") == "ml-platform", pod["metadata"]["name"]
    finally:
        clean_namespace(cluster, namespace, [job])
