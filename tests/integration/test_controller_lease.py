"""Leader election on a coordination.k8s.io/v1 Lease (app/controller/lease.py) against the fake apiserver."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from app.cache.errors import ApiError
from app.controller.api import Api, RawObject
from app.controller.lease import LeaderElector, LeaseTiming
from tests.integration.controller_helpers import FakeClock, fake_api
from tests.integration.fakeapi import wait_until

NAMESPACE = "topoguard-system"


def elector(api: Api, identity: str, clock: FakeClock, **kwargs: Any) -> LeaderElector:
    return LeaderElector(api, namespace=NAMESPACE, name="topoguard-audit", identity=identity, clock=clock, **kwargs)


def test_first_replica_creates_the_lease_and_the_second_waits_for_it_to_expire() -> None:
    clock = FakeClock()
    with fake_api() as (server, api):
        a, b = elector(api, "pod-a", clock), elector(api, "pod-b", clock)
        assert a.try_acquire_or_renew()
        lease = server.get("Lease", "topoguard-audit", NAMESPACE)
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "pod-a"
        assert lease["spec"]["leaseDurationSeconds"] == 15
        assert lease["spec"]["leaseTransitions"] == 0
        assert lease["spec"]["renewTime"].endswith("Z")

        assert not b.try_acquire_or_renew()  # held and fresh
        clock.advance(10)
        assert a.try_acquire_or_renew()  # renewed: b sees a changed record
        clock.advance(10)
        assert not b.try_acquire_or_renew()  # b observes the renewal only now: its 15 s start here
        clock.advance(14)
        assert not b.try_acquire_or_renew()
        clock.advance(1.5)
        assert b.try_acquire_or_renew()  # 15.5 s without a change: expired, taken over
        lease = server.get("Lease", "topoguard-audit", NAMESPACE)
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "pod-b"
        assert lease["spec"]["leaseTransitions"] == 1
        assert not a.try_acquire_or_renew()  # the old leader finds itself replaced


def test_expiry_is_judged_on_the_observers_clock_not_the_written_renew_time() -> None:
    clock = FakeClock()
    with fake_api() as (_, api):
        a = elector(api, "pod-a", clock, wall=lambda: 0.0)  # a writes renewTime 1970: a skewed clock
        assert a.try_acquire_or_renew()
        b = elector(api, "pod-b", clock)
        assert not b.try_acquire_or_renew()  # b has just observed the record: it is fresh to b
        clock.advance(14)
        assert not b.try_acquire_or_renew()


def test_release_lets_the_next_replica_take_over_at_once() -> None:
    clock = FakeClock()
    with fake_api() as (server, api):
        a, b = elector(api, "pod-a", clock), elector(api, "pod-b", clock)
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
        assert a.release()
        lease = server.get("Lease", "topoguard-audit", NAMESPACE)
        assert lease is not None
        assert "holderIdentity" not in lease["spec"]
        assert lease["spec"]["leaseDurationSeconds"] == 1
        assert b.try_acquire_or_renew()  # no waiting for the 15 s
        assert not a.release()  # not the holder any more: nothing written
        lease = server.get("Lease", "topoguard-audit", NAMESPACE)
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "pod-b"


class RacingApi:
    """An Api that lets another elector write between this one's GET and PUT."""

    def __init__(self, api: Api, before_put: Any) -> None:
        self.api = api
        self.before_put = before_put

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
                query: Sequence[tuple[str, str]] = (), content_type: str = "application/json") -> RawObject:
        if method == "PUT" and self.before_put is not None:
            hook, self.before_put = self.before_put, None
            hook()
        return self.api.request(method, path, body, query=query, content_type=content_type)


def test_updates_are_guarded_by_resource_version_so_one_of_two_racers_wins() -> None:
    clock = FakeClock()
    with fake_api() as (server, api):
        old = elector(api, "pod-old", clock)
        assert old.try_acquire_or_renew()
        b = elector(api, "pod-b", clock)
        a = elector(RacingApi(api, None), "pod-a", clock)
        assert not a.try_acquire_or_renew() and not b.try_acquire_or_renew()  # both observe the record
        clock.advance(16)  # expired for both
        a._api = RacingApi(api, lambda: b.try_acquire_or_renew())  # b writes between a's read and write
        assert not a.try_acquire_or_renew()  # 409 Conflict: a's resourceVersion is stale
        lease = server.get("Lease", "topoguard-audit", NAMESPACE)
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "pod-b"
        assert lease["spec"]["leaseTransitions"] == 1


def test_a_leader_that_cannot_renew_stops_leading_within_the_renew_deadline() -> None:
    timing = LeaseTiming(lease_duration_seconds=3.0, renew_deadline_seconds=1.0, retry_period_seconds=0.1)
    changes: list[bool] = []
    stop = threading.Event()
    with fake_api() as (server, api):
        a = LeaderElector(api, namespace=NAMESPACE, name="topoguard-audit", identity="pod-a", timing=timing,
                          on_change=changes.append)
        thread = threading.Thread(target=a.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_until(lambda: a.is_leader, what="pod-a to lead")
            server.fail("Lease", status=500, methods=("GET", "PUT"))
            wait_until(lambda: not a.is_leader, what="pod-a to stop leading")
            server.clear_failures()
            wait_until(lambda: a.is_leader, what="pod-a to lead again")
        finally:
            stop.set()
            thread.join(5)
        assert changes == [True, False, True, False]  # and False again at stop
        lease = server.get("Lease", "topoguard-audit", NAMESPACE)
        assert lease is not None
        assert "holderIdentity" not in lease["spec"]  # released on stop


def test_timing_must_leave_the_leader_time_to_step_down_before_expiry() -> None:
    with pytest.raises(ValueError, match="lease duration > renew deadline"):
        LeaseTiming(lease_duration_seconds=10, renew_deadline_seconds=10)


def test_an_apiserver_error_is_not_leadership() -> None:
    clock = FakeClock()
    with fake_api() as (server, api):
        server.fail("Lease", status=403, methods=("GET", "POST"))
        a = elector(api, "pod-a", clock)
        assert not a.try_acquire_or_renew()
        assert server.get("Lease", "topoguard-audit", NAMESPACE) is None
        with pytest.raises(ApiError):
            api.request("GET", a.path)
