"""The seed lab's PyTorchJob through the real control plane: topoguard patches it at admission, the real
training-operator v1.9.4 creates its pods, the real kube-scheduler binds them. Every pod, the CPU-only
Master included, must be bound to a node of the zone topoguard chose, and carry the zone identity label
the lab's policies key on.

zone-a is the only zone that works: zone-b has no GPUs, and in zone-c (more free GPUs than zone-a)
the lab's `deny-cross-zone-gpu-traffic` lets the GPU workers send only to `zone=zone-a` pods. Left
alone the scheduler would put the Master (labelled zone-b, no GPU toleration) in zone-b or zone-c.
"""

from __future__ import annotations

import pytest

from tests.e2e import kube
from tests.e2e_full.components import Operator
from tests.e2e_full.conftest import clean_namespace, lab_job, record, wait_bound

pytestmark = pytest.mark.e2e

JOB_PODS = "training.kubeflow.org/job-name={name}"
GPU_TOLERATION = {"key": "gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}


def _run_lab_job(cluster: kube.Cluster, namespace: str, name: str) -> tuple[kube.RawObject, list[kube.RawObject]]:
    job = lab_job(namespace, name)
    cluster.create(job)
    stored = cluster.get(job)
    assert stored is not None
    bound = wait_bound(cluster, namespace, JOB_PODS.format(name=name), count=5)
    return stored, bound


def _roles(bound: list[kube.RawObject]) -> list[str]:
    return sorted(p["metadata"]["labels"].get("training.kubeflow.org/replica-type", "?") for p in bound)


def test_lab_pytorchjob_every_pod_bound_in_the_chosen_zone(
    admission: kube.Cluster, training_operator: Operator,
) -> None:
    cluster, namespace, name = admission, "lab-pin", "ml-training"
    try:
        stored, bound = _run_lab_job(cluster, namespace, name)
        chosen = stored["metadata"]["annotations"]["topoguard.io/zone"]
        assert chosen == "zone-a", stored["metadata"]["annotations"]
        zones = record("lab pin", cluster, bound)
        assert _roles(bound) == ["master", "worker", "worker", "worker", "worker"]
        assert zones == {p["metadata"]["name"]: chosen for p in bound}, zones
        for pod in bound:
            assert pod["metadata"]["labels"]["zone"] == chosen, pod["metadata"]["name"]
            # The Master reached a tainted GPU node of zone-a only through the toleration topoguard added.
            assert GPU_TOLERATION in pod["spec"].get("tolerations", []), pod["metadata"]["name"]
    finally:
        clean_namespace(cluster, namespace, [lab_job(namespace, name)])


def test_lab_pytorchjob_colocate_mode_keeps_every_pod_in_one_open_zone(
    admission: kube.Cluster, training_operator: Operator,
) -> None:
    """mode: colocate writes no zone name: required podAffinity on the job's group (topologyKey = the zone
    label) plus nodeAffinity to the open zones. The scheduler then puts the first pod in an open zone and
    every later one beside it."""
    cluster, namespace, name = admission, "lab-colocate", "ml-training"
    try:
        _, bound = _run_lab_job(cluster, namespace, name)
        zones = record("lab colocate", cluster, bound)
        assert _roles(bound) == ["master", "worker", "worker", "worker", "worker"]
        assert set(zones.values()) == {"zone-a"}, zones
        for pod in bound:
            affinity = pod["spec"].get("affinity") or {}
            assert affinity.get("podAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution"), \
                pod["metadata"]["name"]
            assert pod["metadata"]["labels"]["zone"] == "zone-a", pod["metadata"]["name"]
    finally:
        clean_namespace(cluster, namespace, [lab_job(namespace, name)])


def test_colocate_mode_with_two_open_zones_keeps_the_job_together(
    admission: kube.Cluster, training_operator: Operator,
) -> None:
    """Without the lab's policies zone-a and zone-c both fit the job (zone-b has no GPUs), and without a
    zone identity label (fixtures/config-colocate-anyzone.yaml) no zone name is written: colocate
    restricts every replica to those two zones and the podAffinity on the job's group does the rest,
    so the scheduler, not topoguard, picks the zone, and every pod follows the first one bound."""
    cluster, namespace, name = admission, "open-colocate", "ml-training"
    try:
        _, bound = _run_lab_job(cluster, namespace, name)
        zones = record("colocate, two open zones", cluster, bound)
        assert len(set(zones.values())) == 1, zones
        assert set(zones.values()) <= {"zone-a", "zone-c"}, zones
        for pod in bound:
            terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert all({"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a", "zone-c"]}
                       in term["matchExpressions"] for term in terms["nodeSelectorTerms"]), terms
    finally:
        clean_namespace(cluster, namespace, [lab_job(namespace, name)])
