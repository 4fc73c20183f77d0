"""Events for audit findings (app/controller/events.py): created once, refreshed as a series, never per pass."""

from __future__ import annotations

from app.controller.api import Api
from app.controller.events import REFRESH_SECONDS, EventRecorder, build_event
from app.controller.loop import job_api_version
from tests.integration.controller_helpers import BLOCKED, SPLIT, FakeClock, fake_api, job


def recorder(api: Api, clock: FakeClock, **kwargs: object) -> EventRecorder:
    return EventRecorder(api, instance="topoguard-7d9f-abcde", api_version_of=job_api_version, clock=clock,
                         **kwargs)  # type: ignore[arg-type]


def test_the_event_names_the_job_the_reason_and_the_finding() -> None:
    broken = job("llama", ("blocked", BLOCKED))
    event = build_event(broken, broken.findings[0], api_version="kubeflow.org/v1", instance="pod-a", now=0.0)
    assert event["apiVersion"] == "events.k8s.io/v1"
    assert event["regarding"] == {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "namespace": "ml-demo",
                                  "name": "llama", "uid": "uid-ml-demo-llama"}
    assert (event["reason"], event["type"], event["note"]) == ("TopoguardBlocked", "Warning", BLOCKED)
    assert event["metadata"]["namespace"] == "ml-demo"
    assert event["metadata"]["name"].startswith("llama.")
    assert event["eventTime"] == "1970-01-01T00:00:00.000000Z"


def test_one_event_per_finding_then_a_series_not_one_event_per_pass() -> None:
    clock = FakeClock()
    with fake_api() as (server, api):
        events = recorder(api, clock)
        audits = [job("llama", ("split", SPLIT), ("blocked", BLOCKED)), job("clean")]
        stats = events.record(audits)
        assert stats.created == 2
        stored = {e["reason"]: e for e in server.objects("Event")}
        assert set(stored) == {"TopoguardSplit", "TopoguardBlocked"}
        assert stored["TopoguardBlocked"]["note"] == BLOCKED
        assert "series" not in stored["TopoguardBlocked"]

        clock.advance(30)
        assert events.record(audits).patched == 2  # the second observation starts the series
        assert {e["series"]["count"] for e in server.objects("Event")} == {2}
        writes = len(server.writes("Event"))
        for _ in range(5):  # later passes are counted, not written
            clock.advance(30)
            assert events.record(audits).counted == 2
        assert len(server.writes("Event")) == writes
        clock.advance(REFRESH_SECONDS)
        stats = events.record(audits)
        assert stats.patched == 2
        assert {e["series"]["count"] for e in server.objects("Event")} == {8}
        assert len(server.objects("Event")) == 2


def test_a_cleared_finding_writes_nothing_and_a_new_leader_continues_the_series() -> None:
    clock = FakeClock()
    with fake_api() as (server, api):
        first = recorder(api, clock)
        broken = [job("llama", ("blocked", BLOCKED))]
        first.record(broken)
        first.record(broken)
        writes = len(server.writes("Event"))
        assert first.record([job("llama")]).created == 0  # cleared
        assert len(server.writes("Event")) == writes and first.active == 0

        successor = recorder(api, clock)  # another replica took over: it knows nothing
        stats = successor.record(broken)
        assert (stats.created, stats.patched, stats.errors) == (0, 1, 0)
        (event,) = server.objects("Event")  # the same Event, not a duplicate
        assert event["series"]["count"] == 2  # kept what was stored
        successor.record(broken)
        clock.advance(REFRESH_SECONDS)
        successor.record(broken)
        (event,) = server.objects("Event")
        assert event["series"]["count"] == 5


def test_an_event_recreated_by_name_without_a_series_starts_one() -> None:
    clock = FakeClock()
    with fake_api() as (server, api):
        broken = [job("llama", ("split", SPLIT))]
        recorder(api, clock).record(broken)  # created, no series yet
        stats = recorder(api, clock).record(broken)  # a restart: 409, the stored Event has no series (422)
        assert (stats.patched, stats.errors) == (1, 0)
        (event,) = server.objects("Event")
        assert event["series"]["count"] == 2


def test_an_event_that_aged_out_while_the_finding_lasts_is_created_again() -> None:
    clock = FakeClock()
    with fake_api() as (server, api):
        events = recorder(api, clock)
        broken = [job("llama", ("blocked", BLOCKED))]
        events.record(broken)
        events.record(broken)
        (event,) = server.objects("Event")
        server.delete("Event", event["metadata"]["name"], "ml-demo")  # the apiserver's event TTL
        clock.advance(REFRESH_SECONDS)
        events.record(broken)  # the refresh finds it gone
        assert server.objects("Event") == []
        assert events.record(broken).created == 1
        assert len(server.objects("Event")) == 1


def test_writes_per_pass_are_bounded_and_the_rest_follow() -> None:
    clock = FakeClock()
    with fake_api() as (server, api):
        events = recorder(api, clock, max_writes_per_pass=2)
        audits = [job(f"j{i}", ("split", SPLIT)) for i in range(3)]
        stats = events.record(audits)
        assert (stats.created, stats.deferred) == (2, 1)
        stats = events.record(audits)
        assert stats.created == 1  # the deferred one
        assert len(server.objects("Event")) == 3


def test_a_failed_write_is_retried_on_the_next_pass() -> None:
    clock = FakeClock()
    with fake_api() as (server, api):
        events = recorder(api, clock)
        server.fail("Event", status=500, methods=("POST",), times=1)
        broken = [job("llama", ("blocked", BLOCKED))]
        assert events.record(broken).errors == 1
        assert server.objects("Event") == []
        assert events.record(broken).created == 1


def test_a_long_message_is_cut_to_the_note_limit() -> None:
    clock = FakeClock()
    with fake_api() as (server, api):
        recorder(api, clock).record([job("llama", ("unknown", "é" * 2000))])
        (event,) = server.objects("Event")
        assert len(event["note"].encode()) <= 1024 and event["note"].endswith("...")
