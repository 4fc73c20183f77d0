"""In-flight reservations: held on a real admission, never on dry-run or validate, released when the
job is stored or after the window."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.admission import pipeline
from app.admission.inflight import InFlight
from app.cache import projections
from app.config import Settings
from app.engine import ledger
from app.models.cluster import Snapshot
from tests.builders import (
    GPU,
    in_flight_totals,
    make_namespace,
    make_node,
    make_pytorchjob,
    make_snapshot,
    make_template,
)

NS = "ml"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
ENABLED = {"kubernetes.io/metadata.name": NS, "topoguard.io/enabled": "true"}
TOLERATE = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cluster(jobs: list[Any] = ()) -> Snapshot:  # type: ignore[assignment]
    """zone-a: two 8-GPU nodes, zone-c: one 8-GPU node."""
    return make_snapshot(
        [make_node("a-1", zone="zone-a", gpus=8, taints=[GPU_TAINT]),
         make_node("a-2", zone="zone-a", gpus=8, taints=[GPU_TAINT]),
         make_node("c-1", zone="zone-c", gpus=8, taints=[GPU_TAINT])],
        namespaces=[make_namespace(NS, ENABLED)],
        jobs=jobs,
    )


def job(name: str, *, suspend: bool = False) -> dict[str, Any]:
    worker = make_template(gpus=4, tolerations=TOLERATE)
    raw = make_pytorchjob(name, namespace=NS, workers=2, worker=worker)  # 8 GPUs
    if suspend:
        raw["spec"]["runPolicy"] = {"suspend": True}
    return raw


def review(obj: dict[str, Any], *, dry_run: bool = False, uid: str = "u") -> pipeline.ReviewRequest:
    gvk = {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob"}
    return pipeline.parse_review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": gvk, "resource": {**gvk, "resource": "pytorchjobs"}, "name": obj["metadata"]["name"],
        "namespace": NS, "operation": "CREATE", "object": obj, "dryRun": dry_run}})


def zone_of(outcome: pipeline.Outcome) -> str | None:
    return outcome.decision.zone if outcome.decision else None


def admit(flight: InFlight, snapshot: Snapshot, obj: dict[str, Any], *, operation: str = "mutate",
          dry_run: bool = False) -> str | None:
    outcome = pipeline.answer(review(obj, dry_run=dry_run), snapshot=snapshot, settings=Settings(),
                               operation=operation, in_flight=flight)  # type: ignore[arg-type]
    return zone_of(outcome)


@pytest.mark.parametrize(
    "first, want_held, second_zone",
    [
        pytest.param({}, 1, "zone-a", id="an admitted job holds 8 of zone-a's 16: 8 left there, as in zone-c"),
        pytest.param({"dry_run": True}, 0, "zone-a", id="a dry-run review reserves nothing"),
        pytest.param({"operation": "validate"}, 0, "zone-a", id="the validating path never reserves"),
    ],
)
def test_what_holds(first: dict[str, Any], want_held: int, second_zone: str) -> None:
    flight, snapshot = InFlight(clock=Clock()), cluster()
    admit(flight, snapshot, job("first"), **first)

    assert len(flight) == want_held
    assert admit(flight, snapshot, job("second")) == second_zone
    assert admit(flight, snapshot, job("third")) == ("zone-c" if want_held else "zone-a")


def test_a_suspended_job_holds_nothing() -> None:
    flight, snapshot = InFlight(clock=Clock()), cluster()
    admit(flight, snapshot, job("queued", suspend=True))

    assert len(flight) == 0


def test_a_hold_expires_after_the_window() -> None:
    clock = Clock()
    flight, snapshot = InFlight(clock=clock, ttl_seconds=60), cluster()
    admit(flight, snapshot, job("first"))
    clock.now += 59.0
    assert len(flight.current(snapshot)) == 1
    clock.now += 1.0

    assert flight.current(snapshot) == ()
    assert admit(flight, snapshot, job("second")) == "zone-a"


def test_a_hold_ends_when_the_watch_shows_the_job_whose_stored_reservation_then_counts() -> None:
    flight = InFlight(clock=Clock())
    first = job("first")
    assert admit(flight, cluster(), first) == "zone-a"
    assert admit(flight, cluster(), job("second")) == "zone-a"
    stored = dict(first, metadata={**first["metadata"], "annotations": {"topoguard.io/zone": "zone-a"}})
    snapshot = cluster([projections.project_job(stored)])

    assert [h.job for h in flight.current(snapshot)] == ["PyTorchJob ml/second"]
    assert admit(flight, snapshot, job("third")) == "zone-c"


def test_a_reinvocation_does_not_count_its_own_hold() -> None:
    flight, snapshot = InFlight(clock=Clock()), cluster()
    obj = job("first")
    assert admit(flight, snapshot, obj) == "zone-a"

    assert admit(flight, snapshot, obj) == "zone-a"
    assert len(flight) == 1


def test_a_burst_spreads_over_the_zones_in_proportion_to_their_gpus() -> None:
    # 72 GPUs asked of 24 (zone-a 16, zone-c 8): three fill the zones now, the rest wait, two in
    # zone-a for one in zone-c.
    flight, snapshot = InFlight(clock=Clock()), cluster()
    zones = [admit(flight, snapshot, job(f"j{i}")) for i in range(9)]

    assert zones[:3] == ["zone-a", "zone-a", "zone-c"]
    assert (zones.count("zone-a"), zones.count("zone-c")) == (6, 3)
    assert all(h.in_flight for h in flight.current(snapshot))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["hold", "tick", "store"]), st.integers(0, 5),
                          st.sampled_from(["zone-a", "zone-c"]), st.integers(0, 16)), max_size=40))
def test_kept_totals_equal_the_totals_of_the_live_holds(steps: list[tuple[str, int, str, int]]) -> None:
    # The incrementally kept totals are exactly in_flight_totals of the holds current() lists,
    # whatever the order of holds, replacements, expiries and jobs appearing in the watch.
    clock = Clock()
    flight, snapshot = InFlight(clock=clock, ttl_seconds=60), cluster()
    stored: list[Any] = []
    for action, n, zone, gpus in steps:
        key = ("PyTorchJob", NS, f"j{n}")
        if action == "hold":
            flight.hold(key, zone, {GPU: gpus})
        elif action == "tick":
            clock.now += 13.0 * n
        else:
            raw = job(f"j{n}")
            stored.append(projections.project_job(dict(raw, metadata={**raw["metadata"],
                                                                      "annotations": {"topoguard.io/zone": zone}})))
            snapshot = cluster(stored)
        for mine in (key, ("PyTorchJob", NS, "nobody")):
            live = flight.current(snapshot)
            want = in_flight_totals(live, job=mine, stored=ledger.stored_jobs(snapshot))
            assert _nonzero(flight.totals(snapshot, job=mine)) == _nonzero(want)


def _nonzero(totals: ledger.ZoneTotals) -> dict[str, dict[str, int]]:
    return {z: {r: n for r, n in per.items() if n} for z, per in totals.items() if any(per.values())}


def test_two_reviews_that_count_the_same_gpus_share_a_decision() -> None:
    # The memo key holds the in-flight totals, not the holds: another job holding the same GPUs in
    # the same zone leaves the decision as it was.
    from app import engine
    from app.jobs import parse_job

    snapshot = cluster()
    group = parse_job(job("newcomer"), gpu_resources=(GPU,), namespace=NS)
    one = in_flight_totals([ledger.Hold("x", ("PyTorchJob", NS, "x"), "zone-a", {GPU: 8})], job=("", "", ""))
    other = in_flight_totals([ledger.Hold("y", ("PyTorchJob", NS, "y"), "zone-a", {GPU: 8})], job=("", "", ""))
    first = engine.pending("decide", group, snapshot, Settings(), in_flight=one)
    first.result()

    assert engine.pending("decide", group, snapshot, Settings(), in_flight=other).known is not None


def test_a_published_snapshot_that_stores_the_job_ends_its_hold_even_if_no_review_reads_it() -> None:
    # The job is created, seen in one published snapshot, and deleted before the next review: the hold must
    # not outlive it for the whole window (app.http.app._settle runs for every published snapshot).
    from types import SimpleNamespace

    from app.http.app import _settle
    flight = InFlight(clock=Clock())
    first = job("first")
    admit(flight, cluster(), first)
    stored = dict(first, metadata={**first["metadata"], "annotations": {"topoguard.io/zone": "zone-a"}})
    state = SimpleNamespace(in_flight=flight, settings=None, metrics=None, store=None, last_full_gc=float("inf"))
    _settle(state, cluster([projections.project_job(stored)]))  # type: ignore[arg-type]
    assert len(flight) == 0
    assert admit(flight, cluster(), job("second")) == "zone-a"
