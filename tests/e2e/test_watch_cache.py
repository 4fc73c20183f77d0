"""`topoguard serve --kubeconfig` (the watch-based cache, no --cluster) against the real apiserver.

Readiness must mean "the cache has listed the cluster", and a change in the cluster (a Node in a
new zone, a new policy) must reach the next decision by watch, without a restart.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e import kube
from tests.e2e.conftest import FIXTURES, load_job
from tests.e2e.controlplane import ControlPlane, free_port
from tests.e2e.topoguard import TopoguardServer, response_patch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# Generous on a shared 2-core machine; a watch event normally lands in well under a second.
PROPAGATION_TIMEOUT_SECONDS = 30.0
SYNC_TIMEOUT_SECONDS = 60.0
UNSYNCED_SAMPLES = 6


def poll(what: str, probe: Callable[[], tuple[bool, Any]], *, timeout: float = PROPAGATION_TIMEOUT_SECONDS) -> Any:
    """probe() -> (done, seen) until done; fail showing the last thing seen."""
    deadline = time.monotonic() + timeout
    seen: Any = None
    while time.monotonic() < deadline:
        done, seen = probe()
        if done:
            return seen
        time.sleep(0.5)
    pytest.fail(f"{what}: not seen within {timeout:.0f}s (last seen: {seen!r})")


def serve_kubeconfig(kubeconfig: Path, log: Path) -> TopoguardServer:
    args = ["--kubeconfig", str(kubeconfig), "--self-signed", "--config", str(FIXTURES / "config.yaml")]
    return TopoguardServer(args, log)


@pytest.fixture
def unreachable_kubeconfig(control_plane: ControlPlane, tmp_path: Path) -> Path:
    """The suite's kubeconfig, pointed at a port where no apiserver listens."""
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def watching_server(cluster: kube.Cluster, control_plane: ControlPlane, tmp_path: Path) -> Iterator[TopoguardServer]:
    server = serve_kubeconfig(control_plane.kubeconfig, tmp_path / "topoguard.log")
    server.start(wait_for="/healthz")
    try:
        yield server
    finally:
        server.stop()


def test_readyz_is_503_while_the_cache_cannot_sync(unreachable_kubeconfig: Path, tmp_path: Path) -> None:
    server = serve_kubeconfig(unreachable_kubeconfig, tmp_path / "topoguard.log")
    server.start(wait_for="/healthz")
    try:
        statuses = []
        for _ in range(UNSYNCED_SAMPLES):
            statuses.append(server.get_status("/readyz"))
            time.sleep(0.5)
    finally:
        server.stop()
    assert statuses == [503] * UNSYNCED_SAMPLES


def gpu_node(name: str, zone: str, gpus: int) -> kube.RawObject:
    resources = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus), "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone,
                                              "gpu": "true", "node-type": "gpu"}},
        "status": {"allocatable": resources, "capacity": resources,
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "e2e: no kubelet, status written by the test"}]},
    }


def test_new_zone_node_then_policy_change_the_next_decision(
    cluster: kube.Cluster, watching_server: TopoguardServer
) -> None:
    namespace = f"ml-watch-{uuid.uuid4().hex[:6]}"
    cluster.create({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": {"topoguard.io/enabled": "true"}}})
    job = load_job("lab-pytorchjob.yaml", namespace=namespace, job_name="big")
    # 2 workers x 8 GPUs: no lab node (4 GPUs each) fits one, so no zone can take the job yet.
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    worker["replicas"] = 2
    worker["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    ref = cluster.ref(job)

    def readyz() -> tuple[bool, int | None]:
        status = watching_server.get_status("/readyz")
        return status == 200, status

    poll("/readyz 200 after the first list", readyz, timeout=SYNC_TIMEOUT_SECONDS)
    before = watching_server.review("mutate", job, ref)
    assert before["allowed"] is False, before

    cluster.create(gpu_node("gpu-c-1", "zone-c", 8))
    cluster.create(gpu_node("gpu-c-2", "zone-c", 8))

    def pinned_to_zone_c() -> tuple[bool, Any]:
        response = watching_server.review("mutate", job, ref)
        return bool(response["allowed"] and "zone-c" in str(response_patch(response))), response

    poll("the job allowed and pinned to the new zone-c", pinned_to_zone_c)

    cluster.create({"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
                    "metadata": {"name": "lock-down", "namespace": namespace},
                    "spec": {"endpointSelector": {},
                             "ingress": [{"fromEndpoints": [{"matchLabels": {"app": "nothing-runs-here"}}]}]}})

    def denied_by_lock_down() -> tuple[bool, Any]:
        response = watching_server.review("mutate", job, ref)
        message = str(response.get("status", {}).get("message", ""))
        return bool(not response["allowed"] and "lock-down" in message), response

    poll("the job denied by the new policy lock-down", denied_by_lock_down)


def test_cluster_network_policy_counts_as_the_agent_config_says(
    cluster: kube.Cluster, watching_server: TopoguardServer
) -> None:
    """A ClusterNetworkPolicy (the network-policy-api CRD) denying the job's namespace: `unknown` while
    topoguard cannot tell whether the agent enforces it, denied once kube-system/cilium-config says
    enable-k8s-cluster-network-policy, allowed again when it says false; all by watch."""
    namespace = f"ml-kcnp-{uuid.uuid4().hex[:6]}"
    cluster.create({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": {"topoguard.io/enabled": "true"}}})
    job = load_job("lab-pytorchjob.yaml", namespace=namespace, job_name="kcnp")
    ref = cluster.ref(job)
    poll("/readyz 200", lambda: (watching_server.get_status("/readyz") == 200, None), timeout=SYNC_TIMEOUT_SECONDS)
    assert watching_server.review("mutate", job, ref)["allowed"] is True

    quarantine = {"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
                  "metadata": {"name": f"quarantine-{namespace}"},
                  "spec": {"tier": "Admin", "priority": 10,
                           "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
                           "ingress": [{"name": "nobody", "action": "Deny", "from": [{"namespaces": {}}]}]}}
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "cilium-config", "namespace": "kube-system"},
              "data": {"enable-k8s-cluster-network-policy": "true"}}
    cluster.create(quarantine)
    try:
        def refused(word: str) -> Callable[[], tuple[bool, Any]]:
            def probe() -> tuple[bool, Any]:
                response = watching_server.review("mutate", job, ref)
                message = str(response.get("status", {}).get("message", ""))
                return bool(not response["allowed"] and word in message), response
            return probe

        poll("refused: whether the agent enforces ClusterNetworkPolicy is not known",
             refused("enable-k8s-cluster-network-policy"))
        cluster.create(config)
        poll("refused by the Admin Deny the agent enforces", refused(f"quarantine-{namespace}"))
        cluster.replace({**(cluster.get(config) or config), "data": {"enable-k8s-cluster-network-policy": "false"}})

        def allowed() -> tuple[bool, Any]:
            response = watching_server.review("mutate", job, ref)
            return bool(response["allowed"]), response

        poll("allowed once the agent does not enforce ClusterNetworkPolicy", allowed)
    finally:
        for obj in (config, quarantine):
            if cluster.get(obj) is not None:
                cluster.delete(obj)
