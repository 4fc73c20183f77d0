"""The seed lab on Cilium's real datapath: the "before" job is dropped, the job topoguard pinned connects.

Before: the lab's three CiliumNetworkPolicies, the PyTorchJob as the user wrote it (coordinator
zone=zone-b, workers zone=zone-a), its pods on the node. A worker's TCP connect to the coordinator's
rendezvous port 23456 is dropped by the agent's BPF programs, and the agent's monitor reports the drop
as a policy denial. While that job runs, `topoguard audit` on the live objects calls it blocked and
names the lab's policies.

After: the same PyTorchJob created through the apiserver with topoguard registered as its webhook
(zoneIdentityLabel=zone) is stored pinned with zone=zone-a on every replica; the pods created from
the stored templates connect.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.e2e.topoguard import TopoguardServer, clean_environment
from tests.e2e_datapath import datapath, lab
from tests.e2e_datapath.datapath import Monitor, PodNet, Server
from tests.e2e_datapath.node import DatapathNode

# A verdict change (new pod, policy, identity) reaches the BPF maps asynchronously: poll this long.
VERDICT_TIMEOUT_SECONDS = 60.0
WEBHOOK_ACTIVE_TIMEOUT_SECONDS = 30.0
ZONE = "zone"


@pytest.fixture(scope="module")
def lab_policies(node: DatapathNode) -> Iterator[list[dict[str, Any]]]:
    """The lab's namespace (its labels as the lab has them) and three CNPs; the CNPs go again afterwards."""
    namespace, policies = lab.lab_objects()
    name = namespace["metadata"]["name"]
    node.ensure_namespace(name)
    stored, _ = node.cluster.request("GET", f"/api/v1/namespaces/{name}")
    stored["metadata"]["labels"] = dict(namespace["metadata"]["labels"])
    node.cluster.request("PUT", f"/api/v1/namespaces/{name}", stored)
    for policy in policies:
        node.cluster.create(policy)
    try:
        yield policies
    finally:
        for policy in policies:
            node.cluster.delete(policy)


def create_job(node: DatapathNode, job: dict[str, Any]) -> dict[str, Any]:
    created, _ = node.cluster.create(job)
    return created


def start_pods(node: DatapathNode, job: dict[str, Any]) -> list[PodNet]:
    return [node.add_pod(pod) for pod in lab.replica_pods(job)]


@pytest.fixture(scope="module")
def before(node: DatapathNode, lab_policies: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[dict[str, Any], list[PodNet], Monitor]]:
    """The "before" job as written (no webhook registered yet), its pods running on the node."""
    monitor = Monitor(node.agent, tmp_path_factory.mktemp("monitor") / "drops.log")
    job = create_job(node, lab.lab_job("ml-training-before"))
    assert job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["labels"][ZONE] == "zone-b"
    pods = start_pods(node, job)
    try:
        yield job, pods, monitor
    finally:
        monitor.stop()
        for pod in pods:
            node.delete_pod(pod)


def test_before_the_worker_is_dropped_on_the_rendezvous_port_by_policy(
        before: tuple[dict[str, Any], list[PodNet], Monitor], node: DatapathNode) -> None:
    _, pods, monitor = before
    master, workers = pods[0], pods[1:]
    server = Server(master, lab.RENDEZVOUS_PORT)
    try:
        for worker in workers:
            reached = datapath.settle(lambda w=worker: datapath.probe(w, master.ip, lab.RENDEZVOUS_PORT),
                                      expect=False, timeout=VERDICT_TIMEOUT_SECONDS)
            assert not reached, f"{worker.name} reached the coordinator {master.ip}:{lab.RENDEZVOUS_PORT}"
        datapath.wait_for(lambda: bool(monitor.drops(dst=master.ip, port=lab.RENDEZVOUS_PORT)), timeout=30,
                          what="a drop of worker -> coordinator in the monitor", evidence=monitor.text)
        drops = monitor.drops(dst=master.ip, port=lab.RENDEZVOUS_PORT)
        print(f"datapath: before, monitor saw {len(drops)} drop(s), e.g.: {drops[0]}")
        assert all("Policy denied" in line for line in drops), drops
        # The drop is at the pods' own identities, not a missing endpoint: both sides have one from labels.
        for pod in (master, *workers):
            identity, labels = node.identity_of(pod)
            assert identity > 255 and "k8s:zone=" + ("zone-b" if pod is master else "zone-a") in labels, labels
    finally:
        server.stop()


def live_snapshot(node: DatapathNode, namespace: str, path: Path) -> Path:
    """The objects `topoguard audit` reads, as `kubectl get -o yaml` would write them, from the live apiserver."""
    items: list[dict[str, Any]] = []
    collections = (("/api/v1/nodes", "Node"), ("/api/v1/namespaces", "Namespace"),
                   (f"/api/v1/namespaces/{namespace}/pods", "Pod"),
                   (f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs", "PyTorchJob"),
                   (f"/apis/cilium.io/v2/namespaces/{namespace}/ciliumnetworkpolicies", "CiliumNetworkPolicy"))
    for collection, kind in collections:
        listed, _ = node.cluster.request("GET", collection)
        api_version = listed.get("apiVersion", "v1")
        for item in listed.get("items", []):
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
            items.append(item)
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def test_while_before_runs_the_audit_reports_it_blocked_naming_the_lab_policies(
        before: tuple[dict[str, Any], list[PodNet], Monitor], node: DatapathNode,
        tmp_path: Path) -> None:
    job, pods, monitor = before
    snapshot = live_snapshot(node, lab.LAB_NAMESPACE, tmp_path / "live.yaml")
    out = subprocess.run([sys.executable, "-m", "app", "audit", "--cluster", str(snapshot), "--config",
                          str(lab.LAB_CONFIG), "-o", "json"], capture_output=True, text=True, timeout=120,
                         env=clean_environment(), cwd=lab.REPO, check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    report = json.loads(out.stdout)
    text = json.dumps(report)
    print(f"datapath: audit of the live before state: {text[:600]}")
    jobs = [j for j in report.get("jobs", []) if j.get("name") == job["metadata"]["name"]]
    assert jobs, text
    findings = [f for j in jobs for f in j.get("findings", [])]
    blocked = [f for f in findings if f.get("type") == "blocked"]
    assert blocked, findings
    named = json.dumps(blocked)
    assert any(p in named for p in ("allow-intra-zone-a", "allow-intra-zone-b", "deny-cross-zone-gpu-traffic")), named
    # ... and the datapath agrees: the drops the monitor recorded are this job's worker -> coordinator flow.
    assert monitor.drops(dst=pods[0].ip, port=lab.RENDEZVOUS_PORT)


def wait_for_webhook(node: DatapathNode, job: dict[str, Any]) -> None:
    """Until a dry-run create of the job comes back mutated (the apiserver's informer has the hooks)."""
    deadline = time.monotonic() + WEBHOOK_ACTIVE_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        try:
            created, _ = node.cluster.create(job, dry_run=True)
            if (created["metadata"].get("annotations") or {}):
                return
        except ApiException:
            pass
        time.sleep(0.5)
    raise AssertionError("topoguard's webhook never answered a dry-run create")


@pytest.fixture(scope="module")
def after(before: tuple[dict[str, Any], list[PodNet], Monitor], node: DatapathNode,
          webhook: TopoguardServer) -> Iterator[tuple[dict[str, Any], list[PodNet]]]:
    """The same PyTorchJob created with topoguard registered, and the pods of its stored templates.

    Depends on `before` so that the "before" pods are gone (module teardown order) only after it."""
    job = lab.lab_job("ml-training-after")
    wait_for_webhook(node, job)
    stored = create_job(node, job)
    pods: list[PodNet] = []
    try:
        pods = start_pods(node, stored)
        yield stored, pods
    finally:
        for pod in pods:
            node.delete_pod(pod)
        node.cluster.delete(stored)


def test_after_the_job_through_topoguard_is_pinned_to_zone_a_and_its_pods_connect(
        after: tuple[dict[str, Any], list[PodNet]]) -> None:
    stored, pods = after
    for name, spec in stored["spec"]["pytorchReplicaSpecs"].items():
        assert spec["template"]["metadata"]["labels"][ZONE] == "zone-a", (name, spec["template"])
        terms = spec["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert any(e.get("key") == "topology.kubernetes.io/zone" and e.get("values") == ["zone-a"]
                   for t in terms for e in t.get("matchExpressions", [])), terms
    master, workers = pods[0], pods[1:]
    server = Server(master, lab.RENDEZVOUS_PORT)
    try:
        for worker in workers:
            reached = datapath.settle(lambda w=worker: datapath.probe(w, master.ip, lab.RENDEZVOUS_PORT),
                                      expect=True, timeout=VERDICT_TIMEOUT_SECONDS)
            assert reached, f"{worker.name} could not reach the coordinator {master.ip}:{lab.RENDEZVOUS_PORT}"
        print(f"datapath: after, {len(workers)} workers connected to the coordinator on {lab.RENDEZVOUS_PORT}")
    finally:
        server.stop()


# --- a real framework's rendezvous and collective (JAX on CPU, Gloo) ---

PROGRAM = Path(__file__).parent / "programs" / "jax_allgather.py"
# jax.distributed.initialize's own timeout: how long a process waits for the rendezvous.
RENDEZVOUS_TIMEOUT_SECONDS = 30
PROCESS_TIMEOUT_SECONDS = 240.0


def run_framework(pods: list[PodNet], python: str) -> list[tuple[str, int, str]]:
    """One JAX process per pod (process 0 on the coordinator, serving the rendezvous on 23456), each in
    its pod's netns; (pod, exit code, output) per process. Each process gets a UTS namespace whose
    hostname is its pod IP, as a pod's hostname resolves to its IP (Gloo binds to what it resolves)."""
    master = pods[0]
    procs = []
    for index, pod in enumerate(pods):
        argv = pod.argv(["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', pod.ip,
                         python, str(PROGRAM), f"{master.ip}:{lab.RENDEZVOUS_PORT}", str(len(pods)), str(index),
                         str(RENDEZVOUS_TIMEOUT_SECONDS)])
        procs.append((pod, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                            stdin=subprocess.DEVNULL, start_new_session=True)))
    results = []
    deadline = time.monotonic() + PROCESS_TIMEOUT_SECONDS
    for pod, proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        results.append((pod.name, proc.returncode, out))
    return results


def test_before_the_framework_never_completes_its_rendezvous(
        before: tuple[dict[str, Any], list[PodNet], Monitor], framework_python: str) -> None:
    _, pods, monitor = before
    started = time.monotonic()
    results = run_framework(pods, framework_python)
    took = time.monotonic() - started
    for name, code, out in results:
        print(f"datapath: before, {name} exited {code}: {out.strip().splitlines()[-1:] if out.strip() else ''}")
    assert all(code != 0 and "collective ok" not in out for _, code, out in results), results
    workers = results[1:]
    assert all("rendezvous ok" not in out for _, _, out in workers), workers
    print(f"datapath: before, the JAX job gave up after {took:.0f}s (rendezvous timeout "
          f"{RENDEZVOUS_TIMEOUT_SECONDS}s); monitor drops to 23456: "
          f"{len(monitor.drops(dst=pods[0].ip, port=lab.RENDEZVOUS_PORT))}")
    assert monitor.drops(dst=pods[0].ip, port=lab.RENDEZVOUS_PORT)


def test_after_the_framework_completes_its_rendezvous_and_a_collective(
        after: tuple[dict[str, Any], list[PodNet]], framework_python: str) -> None:
    _, pods = after
    started = time.monotonic()
    results = run_framework(pods, framework_python)
    for name, code, out in results:
        print(f"datapath: after, {name} exited {code}: {out.strip().splitlines()[-1:] if out.strip() else ''}")
    expected = f"collective ok {list(range(1, len(pods) + 1))}"
    assert all(code == 0 and expected in out for _, code, out in results), results
    print(f"datapath: after, JAX rendezvous + all-gather across {len(pods)} pods in {time.monotonic() - started:.0f}s")


def test_the_host_is_unchanged_while_the_agent_runs(node: DatapathNode, host_before: datapath.HostState) -> None:
    assert node.agent.popen is not None and node.agent.popen.poll() is None
    assert not host_before.differences(datapath.HostState.capture())

