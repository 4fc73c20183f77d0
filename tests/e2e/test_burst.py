"""Two `topoguard serve` replicas behind the real apiserver, a burst of jobs asking 320 GPUs of 96.

Each replica watches the apiserver (`--kubeconfig`), so it sees the jobs the other admitted once
they are stored (the reservation ledger), and holds its own in flight until then. Busy is not
blocked: every job is admitted; the first twelve fill the zones, the rest wait, spread over them.
No kubelet runs, so no pod ever binds and every admitted job keeps its whole reservation.

Isolation from the rest of the suite: the GPUs are `example.com/gpu` (the replicas' only GPU
resource), offered by this test's nodes alone, in zones of their own; the jobs live in namespace
`topoguard`, which the session's webhook configuration leaves out by name (as the chart leaves out
its own namespace), and each replica's configuration selects its half of the jobs by a label.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.e2e import kube, webhooks
from tests.e2e.controlplane import ControlPlane
from tests.e2e.topoguard import TopoguardServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

GPU = "example.com/gpu"
ZONES = ("burst-a", "burst-b", "burst-c")
NODES_PER_ZONE = 4  # x 8 GPUs: 32 per zone, 96 in all
JOBS = 40  # x 8 GPUs: 320 asked
NAMESPACE = webhooks.RELEASE_NAMESPACE
REPLICA_LABEL = "topoguard.io/e2e-replica"


def gpu_node(name: str, zone: str) -> kube.RawObject:
    resources = {"cpu": "64", "memory": "512Gi", GPU: "8", "pods": "110"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}},
        "status": {"allocatable": resources, "capacity": resources,
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "e2e: no kubelet, status written by the test"}]},
    }


def pytorchjob(name: str, replica: str) -> kube.RawObject:
    template = {"spec": {"containers": [{"name": "pytorch", "image": "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
                                         "resources": {"limits": {GPU: 4}}}]}}
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {REPLICA_LABEL: replica}},
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template},
                                         "Worker": {"replicas": 1, "template": template}}},
    }


def scoped(configuration: kube.RawObject, replica: str) -> kube.RawObject:
    for hook in configuration["webhooks"]:
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
        hook["objectSelector"] = {"matchLabels": {REPLICA_LABEL: replica}}
    return configuration


@pytest.fixture
def replicas(cluster: kube.Cluster, control_plane: ControlPlane, tmp_path: Path) -> Iterator[list[TopoguardServer]]:
    cluster.create({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": NAMESPACE, "labels": {"topoguard.io/enabled": "true"}}})
    for zone in ZONES:
        for i in range(NODES_PER_ZONE):
            cluster.create(gpu_node(f"{zone}-gpu-{i}", zone))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"gpuResources": [GPU]}))
    servers = []
    for replica in ("r1", "r2"):
        serving = control_plane.ca.issue_serving(f"burst-{replica}", common_name="topoguard-e2e")
        server = TopoguardServer(
            ["--kubeconfig", str(control_plane.kubeconfig), "--config", str(config),
             "--tls-cert", str(serving.cert_path), "--tls-key", str(serving.key_path)],
            tmp_path / f"topoguard-{replica}.log", ca_file=control_plane.ca.pair.cert_path,
        )
        server.start(wait_for="/readyz")
        servers.append(server)
        ca_pem = control_plane.ca.cert_pem
        cluster.create(scoped(webhooks.mutating_configuration(f"burst-{replica}", server.url, ca_pem), replica))
        cluster.create(scoped(webhooks.validating_configuration(f"burst-{replica}", server.url, ca_pem), replica))
    try:
        wait_until_both_answer(cluster)
        yield servers
    finally:
        for server in servers:
            server.stop()


def wait_until_both_answer(cluster: kube.Cluster) -> None:
    """Until each replica's configuration is live (a dry run reserves nothing)."""
    for replica in ("r1", "r2"):
        probe = pytorchjob(f"probe-{replica}", replica)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                created, _ = cluster.create(probe, dry_run=True)
                if created["metadata"].get("annotations"):
                    break
            except ApiException:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"replica {replica}'s webhook never answered")


def test_a_burst_over_two_replicas_is_admitted_and_spread(cluster: kube.Cluster, replicas: Any) -> None:
    names = [f"burst-{i:02}" for i in range(JOBS)]
    errors: list[str] = []

    def submit(chunk: list[str]) -> None:
        for name in chunk:
            replica = "r1" if int(name[-2:]) % 2 == 0 else "r2"
            try:
                cluster.create(pytorchjob(name, replica))
            except Exception as e:  # the test reports every refusal
                errors.append(f"{name}: {e}")

    threads = [threading.Thread(target=submit, args=(names[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    stored = [cluster.get(pytorchjob(name, "r1")) for name in names]
    zones = [(job or {}).get("metadata", {}).get("annotations", {}).get("topoguard.io/zone") for job in stored]
    decisions = [(job or {}).get("metadata", {}).get("annotations", {}).get("topoguard.io/decision", "")
                 for job in stored]
    per_zone = Counter(zones)
    imbalance = max(per_zone.values()) - min(per_zone.values())
    print(f"\ne2e burst: jobs per zone {dict(per_zone)}, worst imbalance {imbalance} jobs, "
          f"{sum('capacity=now' in d for d in decisions)} fit now, {sum('capacity=wait' in d for d in decisions)} wait")
    assert set(per_zone) == set(ZONES)
    # Exactly 12 fit now with an exact ledger; the cross-replica window can only add to them.
    assert sum("capacity=now" in d for d in decisions) >= 12
    # 40 jobs over 3 equal zones: 13 or 14 each when the ledger is exact; the window may add a few.
    assert imbalance <= 4
