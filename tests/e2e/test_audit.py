"""The audit of running jobs against the real kube-apiserver: two `topoguard serve --kubeconfig` replicas elect
a leader on a Lease; the leader writes Events on the jobs, a PolicyReport per namespace and /metrics; a policy
change shows up as a new finding within the interval and clears when the policy goes; killing the leader hands
the audit to the other replica within the Lease duration.

Jobs and pods are created as an operator and a scheduler would leave them (no webhook registered here: these
are jobs that ran before topoguard): the seed lab's broken "before" state (Master in zone-b, Workers in zone-a)
and its fixed "after" state, from tests/data/clusters/lab-audit-{before,after}.yaml.
"""

from __future__ import annotations

import copy
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.e2e import kube
from tests.e2e.conftest import FIXTURES
from tests.e2e.controlplane import ControlPlane
from tests.e2e.topoguard import TopoguardServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

DATA = Path(__file__).resolve().parents[1] / "data" / "clusters"
INTERVAL_SECONDS = 3.0
LEASE_DURATION_SECONDS = 15.0
# A shared 2-core machine: a pass normally lands a second or two after a change.
SLACK_SECONDS = 20.0
EVENTS = "/apis/events.k8s.io/v1"
REPORTS = "/apis/wgpolicyk8s.io/v1alpha2"


def poll(what: str, probe: Callable[[], tuple[bool, Any]], *, timeout: float) -> tuple[Any, float]:
    """probe() -> (done, seen) until done; returns (seen, seconds it took)."""
    start = time.monotonic()
    seen: Any = None
    while time.monotonic() - start < timeout:
        done, seen = probe()
        if done:
            return seen, time.monotonic() - start
        time.sleep(0.25)
    pytest.fail(f"{what}: not seen within {timeout:.0f}s (last seen: {seen!r})")


def metric(text: str, series: str, /, **labels: str) -> float | None:
    """The value of the first sample of `series` carrying `labels` in exposition text, None when none."""
    for line in text.splitlines():
        if not line.startswith(series + "{") and not line.startswith(series + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def create_namespaced(cluster: kube.Cluster, source: Path, namespace: str) -> dict[str, Any]:
    """The job, its policies and its pods from a lab snapshot, in `namespace`; pods bound (spec.nodeName) and
    Running (status subresource), owned by the job as created. Returns the job as stored."""
    docs = [d for d in kube.load_documents(source) if d["kind"] not in ("Namespace", "Node")]
    stored_job: dict[str, Any] = {}
    for doc in sorted(docs, key=lambda d: ["CiliumNetworkPolicy", "PyTorchJob", "Pod"].index(d["kind"])):
        obj = copy.deepcopy(doc)
        obj["metadata"]["namespace"] = namespace
        obj["metadata"].pop("uid", None)
        if obj["kind"] != "Pod":
            obj.pop("status", None)
            created, _ = cluster.create(obj)
            if obj["kind"] == "PyTorchJob":
                stored_job = created
            continue
        for ref in obj["metadata"].get("ownerReferences", []):
            ref["uid"] = stored_job["metadata"]["uid"]
        status = obj.pop("status")
        path = f"/api/v1/namespaces/{namespace}/pods"
        pod, _ = cluster.request("POST", path, obj)
        pod["status"] = {**pod.get("status", {}), **status}
        cluster.request("PUT", f"{path}/{obj['metadata']['name']}/status", pod)
    return stored_job


def events(cluster: kube.Cluster, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.request("GET", f"{EVENTS}/namespaces/{namespace}/events")[0]["items"]
    return [e for e in items if e.get("reportingController") == "topoguard.io/audit"]


def report(cluster: kube.Cluster, namespace: str) -> dict[str, Any] | None:
    try:
        return cluster.request("GET", f"{REPORTS}/namespaces/{namespace}/policyreports/topoguard")[0]
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def results(found: dict[str, Any] | None, job: str) -> dict[str, str]:
    return {r["rule"]: r["result"] for r in (found or {}).get("results", []) if r["resources"][0]["name"] == job}


@pytest.fixture(scope="module")
def audited(cluster: kube.Cluster, api_client: client.ApiClient) -> Iterator[tuple[kube.Cluster, str, str, str]]:
    """The PolicyReport CRD, the release namespace, and two opted-in namespaces: `broken` with the lab's
    before state, `healthy` with its after state."""
    crds = kube.crds_by_name(FIXTURES / "audit")
    cluster.refs.update(kube.install_crds(api_client, crds.values()))
    suffix = uuid.uuid4().hex[:6]
    release, broken, healthy = f"topoguard-{suffix}", f"audit-broken-{suffix}", f"audit-healthy-{suffix}"
    for name in (release, broken, healthy):
        labels = {} if name == release else {"topoguard.io/enabled": "true"}
        cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
        cluster.request("POST", f"/api/v1/namespaces/{name}/serviceaccounts",
                        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
    create_namespaced(cluster, DATA / "lab-audit-before.yaml", broken)
    create_namespaced(cluster, DATA / "lab-audit-after.yaml", healthy)
    yield cluster, release, broken, healthy


@pytest.fixture(scope="module")
def replicas(audited: tuple[kube.Cluster, str, str, str], control_plane: ControlPlane,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[TopoguardServer]]:
    _, release, _, _ = audited
    work = tmp_path_factory.mktemp("audit")
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load((FIXTURES / "config.yaml").read_text()),
                                      "audit": {"intervalSeconds": INTERVAL_SECONDS}}))
    servers = [
        TopoguardServer(["--kubeconfig", str(control_plane.kubeconfig), "--self-signed", "--config", str(config)],
                        work / f"{name}.log", env={"POD_NAMESPACE": release, "POD_NAME": name})
        for name in ("replica-a", "replica-b")
    ]
    try:
        for server in servers:
            server.start(wait_for="/readyz")
        yield servers
    finally:
        for server in servers:
            server.stop()


def leader_of(cluster: kube.Cluster, release: str) -> str:
    try:
        lease = cluster.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{release}/leases/topoguard-audit")[0]
    except client.ApiException:
        return ""
    return str(lease.get("spec", {}).get("holderIdentity") or "")


def test_the_leader_writes_events_a_policy_report_and_metrics(
        audited: tuple[kube.Cluster, str, str, str], replicas: list[TopoguardServer]) -> None:
    cluster, release, broken, healthy = audited
    holder, _ = poll("a leader", lambda: (bool(h := leader_of(cluster, release)), h), timeout=SLACK_SECONDS)
    leader = next(s for s in replicas if s.env["POD_NAME"] == holder)
    other = next(s for s in replicas if s is not leader)

    def split_and_blocked() -> tuple[bool, list[dict[str, Any]]]:
        found = events(cluster, broken)
        return {"TopoguardSplit", "TopoguardBlocked"} <= {e["reason"] for e in found}, found

    seen, took = poll("Events for the split and blocked job", split_and_blocked,
                      timeout=SLACK_SECONDS + INTERVAL_SECONDS)
    print(f"audit e2e: first Events {took:.1f}s after the leader was seen")
    by_reason = {e["reason"]: e for e in seen}
    blocked = by_reason["TopoguardBlocked"]
    assert blocked["type"] == "Warning"
    assert blocked["regarding"]["kind"] == "PyTorchJob" and blocked["regarding"]["name"] == "ml-training"
    assert "allow-intra-zone" in blocked["note"], blocked["note"]
    assert blocked["reportingInstance"] == holder
    assert events(cluster, healthy) == []

    found, _ = poll("the broken namespace's PolicyReport", lambda: (
        (r := report(cluster, broken)) is not None and results(r, "ml-training").get("blocked") == "fail", r),
        timeout=SLACK_SECONDS)
    assert results(found, "ml-training")["split"] == "fail"
    assert found["summary"]["fail"] >= 2
    healthy_report, _ = poll("the healthy namespace's PolicyReport", lambda: (
        (r := report(cluster, healthy)) is not None, r), timeout=SLACK_SECONDS)
    assert set(results(healthy_report, "ml-training").values()) == {"pass"}

    text = leader.get_text("/metrics")
    assert metric(text, "topoguard_audit_leader") == 1
    assert (metric(text, "topoguard_audit_findings", type="blocked") or 0) >= 1
    assert (metric(text, "topoguard_audit_job_findings", namespace=broken, name="ml-training", type="split")
            or 0) >= 1
    assert metric(text, "topoguard_audit_job_findings", namespace=healthy, name="ml-training", type="blocked") is None
    other_text = other.get_text("/metrics")
    assert metric(other_text, "topoguard_audit_leader") == 0
    assert metric(other_text, "topoguard_audit_findings", type="blocked") is None

    # More passes: the same Events, refreshed as a series, not new ones.
    count = len(events(cluster, broken))
    time.sleep(3 * INTERVAL_SECONDS)
    later = events(cluster, broken)
    assert len(later) == count
    assert all(e.get("series", {}).get("count", 0) >= 2 for e in later), [e.get("series") for e in later]


def test_a_policy_change_is_a_new_finding_within_the_interval_and_clears_when_undone(
        audited: tuple[kube.Cluster, str, str, str], replicas: list[TopoguardServer]) -> None:
    cluster, release, _, healthy = audited
    poll("the healthy namespace's PolicyReport", lambda: ((r := report(cluster, healthy)) is not None, r),
         timeout=SLACK_SECONDS + INTERVAL_SECONDS)
    deny = {
        "apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
        "metadata": {"name": "deny-rendezvous", "namespace": healthy},
        "spec": {"endpointSelector": {"matchLabels": {"role": "coordinator"}},
                 "ingressDeny": [{"fromEndpoints": [{}],
                                  "toPorts": [{"ports": [{"port": "23456", "protocol": "TCP"}]}]}]},
    }
    cluster.create(deny)
    def blocked_event() -> tuple[bool, list[dict[str, Any]]]:
        found = events(cluster, healthy)
        return any(e["reason"] == "TopoguardBlocked" for e in found), found

    events_seen, took = poll("a blocked Event after the deny policy", blocked_event,
                             timeout=INTERVAL_SECONDS + SLACK_SECONDS)
    print(f"audit e2e: blocked finding {took:.1f}s after the policy was created (interval {INTERVAL_SECONDS}s)")
    assert any("deny-rendezvous" in e["note"] for e in events_seen), [e["note"] for e in events_seen]
    poll("the PolicyReport result to fail", lambda: (
        results(r := report(cluster, healthy), "ml-training").get("blocked") == "fail", r), timeout=SLACK_SECONDS)

    cluster.delete(deny)
    _, took = poll("the PolicyReport result to pass again", lambda: (
        results(r := report(cluster, healthy), "ml-training").get("blocked") == "pass", r),
        timeout=INTERVAL_SECONDS + SLACK_SECONDS)
    print(f"audit e2e: cleared {took:.1f}s after the policy was deleted")
    holder = leader_of(cluster, release)
    leader = next(s for s in replicas if s.env["POD_NAME"] == holder)
    poll("the job's metric series to go", lambda: (
        metric(t := leader.get_text("/metrics"), "topoguard_audit_job_findings", namespace=healthy) is None, t),
        timeout=SLACK_SECONDS)
    count = len(events(cluster, healthy))
    time.sleep(2 * INTERVAL_SECONDS)
    assert len(events(cluster, healthy)) == count  # no new Events for a cleared finding


def test_killing_the_leader_hands_the_audit_over_within_the_lease_duration(
        audited: tuple[kube.Cluster, str, str, str], replicas: list[TopoguardServer]) -> None:
    cluster, release, broken, _ = audited
    holder, _ = poll("a leader", lambda: (bool(h := leader_of(cluster, release)), h), timeout=SLACK_SECONDS)
    leader = next(s for s in replicas if s.env["POD_NAME"] == holder)
    survivor = next(s for s in replicas if s is not leader)
    before = {e["metadata"]["name"] for e in events(cluster, broken)}
    popen = leader.process.popen
    assert popen is not None
    popen.kill()  # no graceful release: the survivor must wait the Lease out
    popen.wait(10)
    killed = time.monotonic()
    poll("the survivor to take the Lease", lambda: (leader_of(cluster, release) == survivor.env["POD_NAME"],
                                                    leader_of(cluster, release)),
         timeout=LEASE_DURATION_SECONDS + SLACK_SECONDS)
    took = time.monotonic() - killed
    print(f"audit e2e: takeover {took:.1f}s after the leader was killed (lease {LEASE_DURATION_SECONDS:.0f}s)")
    # 15 s from the survivor's last observation of a renewal, plus at most one jittered retry (2 x 2.2 s).
    assert took <= LEASE_DURATION_SECONDS + 2 * 2.0 * 2.2 + 2.0
    poll("the survivor's metrics", lambda: (
        metric(t := survivor.get_text("/metrics"), "topoguard_audit_leader") == 1
        and (metric(t, "topoguard_audit_findings", type="split") or 0) >= 1, t), timeout=SLACK_SECONDS)
    time.sleep(2 * INTERVAL_SECONDS)
    assert {e["metadata"]["name"] for e in events(cluster, broken)} == before  # continued, not duplicated
