"""In-flight reservations: held on a real admission, never on dry-run or validate, released when the
job is stored or after the window."""

from __future__ import annotations

from typing import Any

import pytest

from app.cache import projections
from app.config import Settings
from app.http import admission
from app.http.inflight import InFlight
from app.models.cluster import Snapshot
from tests.builders import GPU, make_namespace, make_node, make_pytorchjob, make_snapshot, make_template

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


def review(obj: dict[str, Any], *, dry_run: bool = False, uid: str = "u") -> admission.ReviewRequest:
    gvk = {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob"}
    return admission.parse_review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": gvk, "resource": {**gvk, "resource": "pytorchjobs"}, "name": obj["metadata"]["name"],
        "namespace": NS, "operation": "CREATE", "object": obj, "dryRun": dry_run}})


def zone_of(outcome: admission.Outcome) -> str | None:
    return outcome.decision.zone if outcome.decision else None


def admit(flight: InFlight, snapshot: Snapshot, obj: dict[str, Any], *, operation: str = "mutate",
          dry_run: bool = False) -> str | None:
    outcome = admission.answer(review(obj, dry_run=dry_run), snapshot=snapshot, settings=Settings(),
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
