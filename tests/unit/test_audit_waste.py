"""Waste you can price (DESIGN.md "Round 3"): the GPUs each audited job's bound pods hold, per finding, the
GPU-seconds held by blocked or split jobs, split jobs' pods per zone pair, and the per-pod series that joins DCGM."""

from __future__ import annotations

from pathlib import Path

from app.cache.files import load_snapshot
from app.config import load_settings
from app.controller.loop import count_waste
from app.engine.audit import AuditFinding, AuditPod, JobAudit, audit
from app.metrics import MAX_AUDIT_NAMESPACE_SERIES, MAX_AUDIT_POD_SERIES, OTHER_NAMESPACE, Metrics
from tests.unit.test_metrics import samples

DATA = Path(__file__).resolve().parents[1] / "data" / "clusters"


def job(name: str, *types: str, namespace: str = "ml", gpus: int = 0, zones: dict[str, int] | None = None,
        pods: tuple[AuditPod, ...] = ()) -> JobAudit:
    return JobAudit(kind="PyTorchJob", namespace=namespace, name=name, uid=name, zones=zones or {"zone-a": 1},
                    pending=0, findings=tuple(AuditFinding(t, f"{t} message") for t in types), gpus=gpus, pods=pods)


def test_the_lab_before_state_holds_four_gpus_in_a_blocked_and_split_job() -> None:
    settings = load_settings(DATA / "lab-config.yaml")
    snapshot = load_snapshot(DATA / "lab-audit-before.yaml", gpu_resources=settings.gpu_resources)
    (found,) = audit(snapshot, settings)
    assert (found.gpus, found.worst()) == (4, "blocked")
    assert {(p.name, p.role, p.zone, p.bound, p.gpus) for p in found.pods} == {
        ("ml-training-master-0", "Master", "zone-b", True, 0),
        *{(f"ml-training-worker-{i}", "Worker", "zone-a", True, 1) for i in range(4)},
    }
    waste = count_waste([found])
    assert waste.gpus == {("ml-demo", "blocked"): 4}
    assert waste.split_pods == {("zone-a", "zone-b"): 5}
    assert [row[1] for row in waste.gpu_pods] == [f"ml-training-worker-{i}" for i in range(4)]
    assert {row[4] for row in waste.gpu_pods} == {"blocked"}

    (fixed,) = audit(load_snapshot(DATA / "lab-audit-after.yaml", gpu_resources=settings.gpu_resources), settings)
    assert (fixed.gpus, fixed.worst()) == (4, "")
    after = count_waste([fixed])
    assert (after.gpus, after.split_pods) == ({}, {})
    assert {row[4] for row in after.gpu_pods} == {"none"}, "healthy jobs' pods are joined too, as `none`"


def test_each_job_counts_once_under_its_most_severe_finding() -> None:
    waste = count_waste([
        job("a", "split", "blocked", gpus=8),
        job("b", "unknown", "split", gpus=2),
        job("c", "zone-closed", "unknown", gpus=1),
        job("d", gpus=16),
        job("e", "blocked", namespace="other", gpus=3),
    ])
    assert waste.gpus == {("ml", "blocked"): 8, ("ml", "split"): 2, ("ml", "zone-closed"): 1, ("other", "blocked"): 3}


def test_split_pods_per_pair_of_zones_a_split_job_spans() -> None:
    waste = count_waste([
        job("three", "split", zones={"zone-c": 1, "zone-a": 4, "zone-b": 2}),
        job("two", "split", "blocked", zones={"zone-a": 1, "zone-b": 1}),
        job("whole", "blocked", zones={"zone-a": 8}),
    ])
    assert waste.split_pods == {("zone-a", "zone-b"): 8, ("zone-a", "zone-c"): 5, ("zone-b", "zone-c"): 3}


def test_gpu_pods_list_broken_jobs_first_and_only_bound_gpu_pods() -> None:
    def pods(prefix: str) -> tuple[AuditPod, ...]:
        return (AuditPod(f"{prefix}-0", "Worker", "zone-a", True, 2), AuditPod(f"{prefix}-1", "Worker", "", False, 2),
                AuditPod(f"{prefix}-m", "Master", "zone-a", True, 0))
    waste = count_waste([job("healthy", pods=pods("h")), job("split", "split", pods=pods("s")),
                         job("blocked", "blocked", pods=pods("b"))])
    assert waste.gpu_pods == (("ml", "b-0", "PyTorchJob", "blocked", "blocked", 2),
                              ("ml", "s-0", "PyTorchJob", "split", "split", 2),
                              ("ml", "h-0", "PyTorchJob", "healthy", "none", 2))


def test_the_waste_series_and_their_bounds() -> None:
    m = Metrics()
    namespaces = MAX_AUDIT_NAMESPACE_SERIES + 5
    gpus = {(f"ns-{i:04d}", "blocked"): 1 + i for i in range(namespaces)}  # the 5 smallest are folded
    pods = [("ml", f"p{i}", "PyTorchJob", "j", "blocked", 1) for i in range(MAX_AUDIT_POD_SERIES + 3)]
    m.record_audit_waste(gpus=gpus, gpu_seconds={k: 60.0 * v for k, v in gpus.items()},
                         split_pods={("zone-a", "zone-b"): 5}, gpu_pods=pods)
    got = samples(m)
    blocked = {dict(labels)["namespace"]: v for (name, labels), v in got.items()
               if name == "topoguard_audit_blocked_gpus"}
    assert len(blocked) == MAX_AUDIT_NAMESPACE_SERIES + 1
    assert blocked[OTHER_NAMESPACE] == sum(range(1, 6)) and "ns-0004" not in blocked and blocked["ns-0005"] == 6
    seconds = {dict(labels)["namespace"]: v for (name, labels), v in got.items()
               if name == "topoguard_audit_gpu_seconds_total"}
    assert sum(seconds.values()) == 60.0 * sum(gpus.values()), "folding keeps the total"
    assert got[("topoguard_audit_split_pods", (("zone_a", "zone-a"), ("zone_b", "zone-b")))] == 5
    assert sum(1 for name, _ in got if name == "topoguard_audit_gpu_pod") == MAX_AUDIT_POD_SERIES
    assert got[("topoguard_audit_pod_series_dropped", ())] == 3

    # The next pass: the gauges follow it, the counter keeps adding.
    m.record_audit_waste(gpus={("ml", "split"): 2}, gpu_seconds={("ns-0010", "blocked"): 30.0}, split_pods={},
                         gpu_pods=[])
    got = samples(m)
    assert [(dict(labels), v) for (name, labels), v in got.items() if name == "topoguard_audit_blocked_gpus"] == [
        ({"namespace": "ml", "finding": "split"}, 2)]
    ns10 = ("topoguard_audit_gpu_seconds_total", (("finding", "blocked"), ("namespace", "ns-0010")))
    assert got[ns10] == 60 * 11 + 30
    assert not any(name in ("topoguard_audit_split_pods", "topoguard_audit_gpu_pod") for name, _ in got)

    m.record_audit_leader(False)  # a replica that stops leading exports no waste gauges; the counter stays
    got = samples(m)
    assert not any(name == "topoguard_audit_blocked_gpus" for name, _ in got)
    assert any(name == "topoguard_audit_gpu_seconds_total" for name, _ in got)
