"""The audit loop (app/controller/loop.py): only the leader audits, on its interval and soon after a change;
findings become metrics that go away when they clear or when leadership is lost."""

from __future__ import annotations

import argparse
import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from app.config import Settings
from app.controller.lease import LeaseTiming
from app.controller.loop import AuditController, build_controller, count_findings
from app.engine.audit import JobAudit
from app.metrics import MAX_AUDIT_JOB_SERIES, Metrics
from app.models.cluster import Snapshot
from tests.integration.conftest import ControlledStore
from tests.integration.controller_helpers import BLOCKED, SPLIT, fake_api, job
from tests.integration.fakeapi import wait_until

FAST = LeaseTiming(lease_duration_seconds=3.0, renew_deadline_seconds=1.0, retry_period_seconds=0.1)


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, _ = metrics.render()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


class Audits:
    """An audit() stand-in: what it returns depends on the snapshot's revision; counts its calls."""

    def __init__(self) -> None:
        self.by_revision: dict[str, Sequence[JobAudit]] = {}
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, snapshot: Snapshot, settings: Settings) -> Sequence[JobAudit]:
        with self.lock:
            self.calls.append(snapshot.revision)
        return self.by_revision.get(snapshot.revision, ())


def controller(api: object, store: ControlledStore, audits: Audits, metrics: Metrics, *, identity: str,
               interval: float = 3600.0) -> AuditController:
    settings = Settings.model_validate({"audit": {"intervalSeconds": interval}})
    built = build_controller(settings, store, metrics, kubeconfig=None, api=api,  # type: ignore[arg-type]
                             environ={"POD_NAMESPACE": "topoguard-system", "POD_NAME": identity},
                             timing=FAST, audit_fn=audits)
    built._debounce = 0.2
    return built


def test_the_leader_audits_a_change_soon_and_findings_clear_with_it() -> None:
    store = ControlledStore(current=Snapshot(revision="r1"), synced=True)
    audits = Audits()
    audits.by_revision["r1"] = [job("llama", ("split", SPLIT), ("blocked", BLOCKED)), job("clean")]
    audits.by_revision["r2"] = [job("llama"), job("clean")]
    metrics = Metrics()
    with fake_api() as (server, api):
        ctl = controller(api, store, audits, metrics, identity="pod-a")
        asyncio.run(ctl.start())
        try:
            wait_until(lambda: ctl.passes >= 1, what="the first pass")
            got = samples(metrics)
            assert got[("topoguard_audit_leader", ())] == 1
            assert got[("topoguard_audit_findings", (("type", "split"),))] == 1
            assert got[("topoguard_audit_findings", (("type", "zone-closed"),))] == 0
            series = (("kind", "PyTorchJob"), ("name", "llama"), ("namespace", "ml-demo"), ("type", "blocked"))
            assert got[("topoguard_audit_job_findings", series)] == 1
            assert not any(name == "topoguard_audit_job_findings" and ("name", "clean") in labels
                           for name, labels in got)
            assert got[("topoguard_audit_jobs", ())] == 2
            assert {e["reason"] for e in server.objects("Event")} == {"TopoguardSplit", "TopoguardBlocked"}
            lease = server.get("Lease", "topoguard-audit", "topoguard-system")
            assert lease is not None and lease["spec"]["holderIdentity"] == "pod-a"

            store.publish(Snapshot(revision="r2"))  # a change: audited long before the hour's interval
            wait_until(lambda: ctl.passes >= 2, what="a pass after the change")
            got = samples(metrics)
            assert got[("topoguard_audit_findings", (("type", "split"),))] == 0
            assert not any(name == "topoguard_audit_job_findings" for name, _ in got)  # cleared
            assert len(server.writes("Event", "POST")) == 2  # nothing new for cleared findings
        finally:
            asyncio.run(ctl.stop())
        lease = server.get("Lease", "topoguard-audit", "topoguard-system")
        assert lease is not None and "holderIdentity" not in lease["spec"]  # released at stop
        assert samples(metrics)[("topoguard_audit_leader", ())] == 0


def test_changes_in_a_burst_are_one_pass() -> None:
    store = ControlledStore(current=Snapshot(revision="r0"), synced=True)
    audits = Audits()
    metrics = Metrics()
    with fake_api() as (_, api):
        ctl = controller(api, store, audits, metrics, identity="pod-a")
        ctl._debounce = 1.0
        asyncio.run(ctl.start())
        try:
            wait_until(lambda: ctl.passes >= 1, what="the first pass")
            for i in range(1, 6):
                store.publish(Snapshot(revision=f"r{i}"))
            wait_until(lambda: ctl.passes >= 2, what="the pass after the burst")
            assert audits.calls[1:] == ["r5"]
        finally:
            asyncio.run(ctl.stop())


def test_a_replica_that_does_not_lead_audits_nothing_and_takes_over_when_the_leader_stops() -> None:
    store = ControlledStore(current=Snapshot(revision="r1"), synced=True)
    audits_a, audits_b = Audits(), Audits()
    audits_a.by_revision["r1"] = audits_b.by_revision["r1"] = [job("llama", ("split", SPLIT))]
    metrics_a, metrics_b = Metrics(), Metrics()
    with fake_api() as (server, api):
        a = controller(api, store, audits_a, metrics_a, identity="pod-a")
        asyncio.run(a.start())
        wait_until(lambda: a.passes >= 1, what="pod-a's first pass")
        b = controller(api, store, audits_b, metrics_b, identity="pod-b")
        asyncio.run(b.start())
        try:
            wait_until(lambda: b.elector.holder == "pod-a", what="pod-b to see pod-a lead")
            assert audits_b.calls == [] and b.passes == 0
            got = samples(metrics_b)
            assert got[("topoguard_audit_leader", ())] == 0
            assert not any(name == "topoguard_audit_findings" for name, _ in got)
            asyncio.run(a.stop())  # releases the Lease
            wait_until(lambda: b.passes >= 1, what="pod-b to take over")
            assert samples(metrics_b)[("topoguard_audit_leader", ())] == 1
            assert not any(name == "topoguard_audit_findings" for name, _ in samples(metrics_a))
            assert len(server.objects("Event")) == 1  # pod-b continued pod-a's Event
        finally:
            asyncio.run(b.stop())


def test_no_pass_on_a_cache_that_is_not_healthy() -> None:
    store = ControlledStore(current=Snapshot(revision="r1"), synced=False)
    audits = Audits()
    metrics = Metrics()
    with fake_api() as (_, api):
        ctl = controller(api, store, audits, metrics, identity="pod-a")
        assert ctl.elector.try_acquire_or_renew()
        assert ctl.run_pass() is None
        assert audits.calls == []
        assert samples(metrics)[("topoguard_audit_passes_total", (("outcome", "skipped"),))] == 1


def test_per_job_series_are_bounded_most_important_first() -> None:
    audits = [job(f"u{i:04d}", ("unknown", "unknown verdict")) for i in range(MAX_AUDIT_JOB_SERIES)]
    audits.append(job("zz-blocked", ("blocked", BLOCKED)))
    totals, per_job = count_findings(audits)
    assert totals == {"split": 0, "blocked": 1, "unknown": MAX_AUDIT_JOB_SERIES, "zone-closed": 0}
    assert next(iter(per_job)) == ("ml-demo", "PyTorchJob", "zz-blocked")
    metrics = Metrics()
    metrics.record_audit(jobs=len(audits), findings=totals, job_findings=per_job, duration_seconds=0.1,
                         finished_at=1.0)
    got = samples(metrics)
    kept = [labels for name, labels in got if name == "topoguard_audit_job_findings"]
    assert len(kept) == MAX_AUDIT_JOB_SERIES
    assert ("name", "zz-blocked") in kept[0] or any(("name", "zz-blocked") in k for k in kept)
    assert got[("topoguard_audit_job_series_dropped", ())] == 1


def test_serve_runs_the_audit_only_with_a_cluster_to_write_to(tmp_path: Path) -> None:
    from app.commands.serve import build_background

    store = ControlledStore()
    with_file = argparse.Namespace(cluster="snapshot.yaml", kubeconfig=None)
    assert build_background(with_file, Settings(), store, Metrics()) == []
    off = Settings.model_validate({"audit": {"enabled": False}})
    assert build_background(argparse.Namespace(cluster=None, kubeconfig=None), off, store, Metrics()) == []
    with fake_api() as (server, _):
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        (service,) = build_background(argparse.Namespace(cluster=None, kubeconfig=str(kubeconfig)), Settings(),
                                      store, Metrics())
        assert isinstance(service, AuditController)
        assert service.elector.name == "topoguard-audit" and service.reports is not None
