"""Kueue v0.19.0 and topoguard on the same PyTorchJob: how they compose.

At CREATE both mutating webhooks run: Kueue's (`mpytorchjob.kb.io`) suspends the job, topoguard's pins
it (required nodeAffinity `topology.kubernetes.io/zone In [zone-a]` on every replica). Kueue then
assigns ResourceFlavors. Its flavor assigner matches a pod set's required nodeAffinity against each
flavor's `nodeLabels` (only the label keys the flavor names), so with one flavor per zone, keyed on
the zone label, only the zone-a flavor fits, although the ClusterQueue lists zone-c first and zone-c
has quota and free GPUs. Admission unsuspends the job and adds the flavor's nodeLabels to each pod
template's nodeSelector (`zone-a`, agreeing with topoguard's pin; topoguard's validating webhook
sees that UPDATE and lets it through). The training-operator then creates the pods and the
scheduler binds them in zone-a.
"""

from __future__ import annotations

import pytest

from tests.e2e import kube
from tests.e2e_full.components import Operator
from tests.e2e_full.conftest import clean_namespace, fixture, lab_job, record, wait_bound, wait_for
from tests.e2e_full.test_jobset_trainjob import GPU_TOLERATION, MAINTENANCE_TOLERATION

pytestmark = pytest.mark.e2e

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
ZONE_LABEL = "topology.kubernetes.io/zone"
# zone-c first: a queue that ignored the job's pin would hand out zone-c.
FLAVOR_ORDER = ("zone-c", "zone-a", "zone-b")


def _kueue_objects(namespace: str, prefix: str) -> list[tuple[str, kube.RawObject]]:
    """One ResourceFlavor per zone (named <prefix>-<zone>, nodeLabels on the zone label), a ClusterQueue
    listing them zone-c first with quota to spare, and a LocalQueue `training` in namespace. Names are
    per test: Kueue's finalizers keep deleted flavors and queues around for a while."""
    flavors = [(f"{KUEUE}/resourceflavors", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": f"{prefix}-{zone}"},
        "spec": {"nodeLabels": {ZONE_LABEL: zone}},
    }) for zone in FLAVOR_ORDER]
    quota = [{"name": "cpu", "nominalQuota": "100"}, {"name": "memory", "nominalQuota": "1000Gi"},
             {"name": "nvidia.com/gpu", "nominalQuota": "32"}]
    queue = (f"{KUEUE}/clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": prefix},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
            "flavors": [{"name": f"{prefix}-{zone}", "resources": quota} for zone in FLAVOR_ORDER],
        }]},
    })
    local = (f"{KUEUE}/namespaces/{namespace}/localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "training", "namespace": namespace}, "spec": {"clusterQueue": prefix},
    })
    return [*flavors, queue, local]


def _admitted_flavors(cluster: kube.Cluster, namespace: str, what: str) -> dict[str, set[str]]:
    """Wait until Kueue admits the namespace's Workload; pod set name -> the flavors it was given."""
    workload: dict[str, kube.RawObject] = {}

    def admitted() -> bool:
        body, _ = cluster.request("GET", f"{KUEUE}/namespaces/{namespace}/workloads")
        for item in body.get("items") or []:
            conditions = item.get("status", {}).get("conditions") or []
            if any(c["type"] == "Admitted" and c["status"] == "True" for c in conditions):
                workload["admitted"] = item
                return True
        return False

    wait_for(admitted, f"Kueue to admit the Workload of {what}")
    assignments = workload["admitted"]["status"]["admission"]["podSetAssignments"]
    return {ps["name"]: set(ps["flavors"].values()) for ps in assignments}


def _queued(cluster: kube.Cluster, namespace: str, prefix: str) -> list[str]:
    created = []
    for collection, obj in _kueue_objects(namespace, prefix):
        cluster.request("POST", collection, obj)
        created.append(f"{collection}/{obj['metadata']['name']}")
    return created


def test_kueue_admits_the_queued_pytorchjob_into_the_zone_topoguard_chose(
    kueue_controller: Operator, admission: kube.Cluster, training_operator: Operator,
) -> None:
    cluster, namespace, name = admission, "kueue", "ml-training"
    created: list[str] = []
    job = lab_job(namespace, name)
    job["metadata"].setdefault("labels", {})["kueue.x-k8s.io/queue-name"] = "training"
    try:
        created = _queued(cluster, namespace, "pytorch")
        cluster.create(job)
        stored = cluster.get(job)
        assert stored is not None
        chosen = stored["metadata"]["annotations"]["topoguard.io/zone"]
        assert chosen == "zone-a"
        # Kueue's webhook suspended it at creation (topoguard's patch is on the same object).
        assert stored["spec"]["runPolicy"].get("suspend") is True, stored["spec"].get("runPolicy")
        flavors = _admitted_flavors(cluster, namespace, f"{namespace}/{name}")
        # Every resource of both pod sets (Master: cpu, memory; Worker: nvidia.com/gpu) got the zone-a flavor.
        assert flavors == {"master": {f"pytorch-{chosen}"}, "worker": {f"pytorch-{chosen}"}}, flavors

        bound = wait_bound(cluster, namespace, f"training.kubeflow.org/job-name={name}", count=5)
        zones = record("kueue + lab pin", cluster, bound)
        assert set(zones.values()) == {chosen}, zones
        for pod in bound:
            assert pod["spec"].get("nodeSelector", {}).get(ZONE_LABEL) == chosen, pod["metadata"]["name"]
            assert pod["metadata"]["labels"]["zone"] == chosen
    finally:
        clean_namespace(cluster, namespace, [job])
        for path in reversed(created):
            cluster.request("DELETE", path)


def test_kueue_admits_the_queued_trainjob_into_the_zone_topoguard_chose(
    kueue_controller: Operator, admission: kube.Cluster, trainer_controller: Operator,
) -> None:
    """A TrainJob through Kueue's trainjob integration: Kueue computes its pod sets by running Trainer's
    own runtime code over the runtime and every runtimePatch (topoguard's included), and at admission
    appends a runtimePatch of its own (manager kueue.x-k8s.io/manager) with the flavor's nodeLabels.
    Trainer merges them all; the pods land in topoguard's zone and keep the runtime's tolerations
    (these flavors carry none, so Kueue's patch writes no toleration list that could replace them)."""
    cluster, namespace = admission, "kueue-trainjob"
    created: list[str] = []
    job = fixture("trainjob-torch.yaml", namespace=namespace)
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "training"}
    try:
        created = _queued(cluster, namespace, "trainjob")
        cluster.create(job)
        stored = cluster.get(job)
        assert stored is not None
        chosen = stored["metadata"]["annotations"]["topoguard.io/zone"]
        assert stored["spec"].get("suspend") is True, stored["spec"]
        flavors = _admitted_flavors(cluster, namespace, f"{namespace}/train")
        assert {f for assigned in flavors.values() for f in assigned} == {f"trainjob-{chosen}"}, flavors

        bound = wait_bound(cluster, namespace, "jobset.sigs.k8s.io/jobset-name=train", count=2)
        admitted = cluster.get(job)
        assert admitted is not None
        managers = [p["manager"] for p in admitted["spec"]["runtimePatches"]]
        # The user's patch first; topoguard's and Kueue's (added by its webhook, filled in at admission) follow.
        assert managers[0] == "example.io/platform-team", managers
        assert "kueue.x-k8s.io/manager" in managers and any("topoguard" in m for m in managers), managers
        zones = record("kueue + trainjob", cluster, bound)
        assert set(zones.values()) == {chosen}, zones
        for pod in bound:
            tolerations = pod["spec"].get("tolerations") or []
            for wanted in (GPU_TOLERATION, MAINTENANCE_TOLERATION):
                assert wanted in tolerations, (pod["metadata"]["name"], tolerations)
            assert pod["metadata"]["labels"].get("zone") == chosen, pod["metadata"]["name"]
    finally:
        clean_namespace(cluster, namespace, [job])
        for path in reversed(created):
            cluster.request("DELETE", path)
