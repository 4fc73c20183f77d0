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
from tests.e2e_full.conftest import clean_namespace, lab_job, record, wait_bound, wait_for

pytestmark = pytest.mark.e2e

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
ZONE_LABEL = "topology.kubernetes.io/zone"
# zone-c first: a queue that ignored the job's pin would hand out zone-c.
FLAVOR_ORDER = ("zone-c", "zone-a", "zone-b")


def _kueue_objects(namespace: str) -> list[tuple[str, kube.RawObject]]:
    flavors = [(f"{KUEUE}/resourceflavors", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": zone},
        "spec": {"nodeLabels": {ZONE_LABEL: zone}},
    }) for zone in FLAVOR_ORDER]
    quota = [{"name": "cpu", "nominalQuota": "100"}, {"name": "memory", "nominalQuota": "1000Gi"},
             {"name": "nvidia.com/gpu", "nominalQuota": "32"}]
    queue = (f"{KUEUE}/clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "gpu-zones"},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
            "flavors": [{"name": zone, "resources": quota} for zone in FLAVOR_ORDER],
        }]},
    })
    local = (f"{KUEUE}/namespaces/{namespace}/localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "training", "namespace": namespace}, "spec": {"clusterQueue": "gpu-zones"},
    })
    return [*flavors, queue, local]


def test_kueue_admits_the_queued_pytorchjob_into_the_zone_topoguard_chose(
    kueue_controller: Operator, admission: kube.Cluster, training_operator: Operator,
) -> None:
    cluster, namespace, name = admission, "kueue", "ml-training"
    created: list[str] = []
    job = lab_job(namespace, name)
    job["metadata"].setdefault("labels", {})["kueue.x-k8s.io/queue-name"] = "training"
    try:
        for collection, obj in _kueue_objects(namespace):
            cluster.request("POST", collection, obj)
            created.append(f"{collection}/{obj['metadata']['name']}")
        cluster.create(job)
        stored = cluster.get(job)
        assert stored is not None
        chosen = stored["metadata"]["annotations"]["topoguard.io/zone"]
        assert chosen == "zone-a"
        # Kueue's webhook suspended it at creation (topoguard's patch is on the same object).
        assert stored["spec"]["runPolicy"].get("suspend") is True, stored["spec"].get("runPolicy")

        workload: dict[str, kube.RawObject] = {}

        def admitted() -> bool:
            body, _ = cluster.request("GET", f"{KUEUE}/namespaces/{namespace}/workloads")
            for item in body.get("items") or []:
                conditions = item.get("status", {}).get("conditions") or []
                if any(c["type"] == "Admitted" and c["status"] == "True" for c in conditions):
                    workload["admitted"] = item
                    return True
            return False

        wait_for(admitted, f"Kueue to admit the Workload of {namespace}/{name}")
        flavors = {ps["name"]: ps["flavors"] for ps in workload["admitted"]["status"]["admission"]["podSetAssignments"]}
        # Every resource of both pod sets (Master: cpu, memory; Worker: nvidia.com/gpu) got the zone-a flavor.
        assert set(flavors) == {"master", "worker"}, flavors
        assert {flavor for assigned in flavors.values() for flavor in assigned.values()} == {chosen}, flavors

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
