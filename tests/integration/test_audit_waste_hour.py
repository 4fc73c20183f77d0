"""The audit loop over the seed lab's "before" state for a simulated hour (an injected clock, no sleeping):
`topoguard_audit_gpu_seconds_total` is the GPUs the broken job holds times the time that passed, and a gap
the audit did not see (a skipped pass) is not counted."""

from __future__ import annotations

from pathlib import Path

from app.cache.files import load_snapshot
from app.cache.store import StaticStore
from app.config import load_settings
from app.controller.loop import AuditController, build_controller
from app.metrics import Metrics
from tests.integration.conftest import ControlledStore
from tests.integration.controller_helpers import FakeClock, fake_api
from tests.integration.test_controller_loop import samples

DATA = Path(__file__).resolve().parents[1] / "data" / "clusters"
SECONDS = ("topoguard_audit_gpu_seconds_total", (("finding", "blocked"), ("namespace", "ml-demo")))
GPUS = ("topoguard_audit_blocked_gpus", (("finding", "blocked"), ("namespace", "ml-demo")))
# Passes as the loop runs them: on the interval and soon after changes, so not evenly spaced.
GAPS = [60.0] * 30 + [1.5, 4.0, 54.5] + [120.0] * 10 + [30.0] * 6 + [7.5, 52.5] + [60.0] * 5


def lab_controller(api: object, store: object, metrics: Metrics, clock: FakeClock) -> AuditController:
    settings = load_settings(DATA / "lab-config.yaml")
    ctl = build_controller(settings, store, metrics, kubeconfig=None, api=api,  # type: ignore[arg-type]
                           environ={"POD_NAMESPACE": "topoguard-system", "POD_NAME": "pod-a"})
    ctl._clock = clock
    assert ctl.elector.try_acquire_or_renew()
    ctl.elector._set_leading(True)  # what the elector's thread does after a successful attempt
    return ctl


def test_an_hour_of_the_lab_before_state_is_four_gpu_hours() -> None:
    assert sum(GAPS) == 3600.0
    settings = load_settings(DATA / "lab-config.yaml")
    store = StaticStore(load_snapshot(DATA / "lab-audit-before.yaml", gpu_resources=settings.gpu_resources))
    metrics, clock = Metrics(), FakeClock()
    with fake_api() as (_, api):
        ctl = lab_controller(api, store, metrics, clock)
        assert ctl.run_pass() is not None
        got = samples(metrics)
        assert (got[GPUS], got[SECONDS]) == (4, 0), "the first pass has seen nothing held for any time yet"
        for gap in GAPS:
            clock.advance(gap)
            assert ctl.run_pass() is not None
        got = samples(metrics)
    assert got[SECONDS] == 4 * 3600.0  # 4 Worker GPUs held for the hour: 4 GPU-hours
    assert got[GPUS] == 4
    assert got[("topoguard_audit_split_pods", (("zone_a", "zone-a"), ("zone_b", "zone-b")))] == 5
    assert not any(name == "topoguard_audit_gpu_seconds_total" and ("finding", "split") in labels
                   for name, labels in got), "the job is counted once, under blocked"


def test_a_pass_that_saw_nothing_reliable_is_not_counted() -> None:
    settings = load_settings(DATA / "lab-config.yaml")
    before = load_snapshot(DATA / "lab-audit-before.yaml", gpu_resources=settings.gpu_resources)
    after = load_snapshot(DATA / "lab-audit-after.yaml", gpu_resources=settings.gpu_resources)
    store = ControlledStore(current=before, synced=True)
    metrics, clock = Metrics(), FakeClock()
    with fake_api() as (_, api):
        ctl = lab_controller(api, store, metrics, clock)
        ctl.run_pass()
        clock.advance(600)
        ctl.run_pass()  # 10 minutes of 4 GPUs
        store.stale = True
        clock.advance(600)
        assert ctl.run_pass() is None  # skipped: the cache went stale
        store.stale = False
        clock.advance(600)
        ctl.run_pass()  # sees the job again: the 20 minutes since the last pass it trusted are not counted
        clock.advance(300)
        store.current = after  # fixed: nothing broken from here on
        ctl.run_pass()  # the 5 minutes until it saw the fix count
        clock.advance(900)
        ctl.run_pass()
        got = samples(metrics)
    assert got[SECONDS] == 4 * (600 + 300)
    assert not any(name == "topoguard_audit_blocked_gpus" for name, _ in got)
