"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection package does it.

One replica at a time runs the audit; the others keep serving admission and keep trying. The rules
(client-go tools/leaderelection/leaderelection.go, with its defaults):

- A replica tries every `retry_period` (2 s, jittered by up to 1.2x so replicas do not move in
  step). It takes the Lease when nobody holds it (absent, or `holderIdentity` empty after a
  release), or when the record it last saw has not changed for `lease_duration` (15 s). Expiry is
  judged on this replica's own monotonic clock from the moment it *observed* the record change,
  never from the `renewTime` written by another machine, so clock skew between nodes cannot
  shorten a lease.
- Every write is an update guarded by the `resourceVersion` just read (or a create that fails if
  the Lease appeared meanwhile): of two replicas racing, the apiserver lets exactly one win (409
  Conflict for the other).
- The leader renews every `retry_period`; when no renewal succeeded for `renew_deadline` (10 s) it
  stops leading. That is before any other replica may take over (15 s after the last renewal it
  observed), so two leaders never write at once while the clocks tick at the same rate.
- On a graceful stop the leader releases: an update with `holderIdentity` cleared and
  `leaseDurationSeconds: 1`, so a successor takes over at its next try instead of after 15 s.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.cache.errors import ApiError
from app.controller.api import Api, RawObject, micro_time

log = logging.getLogger(__name__)

HTTP_CONFLICT = 409
LEASES_API = "/apis/coordination.k8s.io/v1"


@dataclass(frozen=True)
class LeaseTiming:
    """client-go's defaults (leaderelection.LeaderElectionConfig; kube-controller-manager uses the same)."""

    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0
    jitter_factor: float = 1.2

    def __post_init__(self) -> None:
        retry = self.retry_period_seconds * self.jitter_factor
        if not self.lease_duration_seconds > self.renew_deadline_seconds > retry:
            raise ValueError("lease timing: need lease duration > renew deadline > jitter x retry period")


class LeaderElector:
    """Acquire, renew and release one Lease (see the module docstring). Thread-safe reads of `is_leader`.

    `try_acquire_or_renew()` is one attempt (what the tests drive); `run(stop)` is the loop a thread runs.
    `on_change(leading)` is called on the electing thread whenever leadership starts or stops.
    """

    def __init__(
        self,
        api: Api,
        *,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming | None = None,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        if not identity:
            raise ValueError("leader election needs a holder identity")
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing or LeaseTiming()
        self._api = api
        self._on_change = on_change
        self._clock = clock
        self._wall = wall
        self._rng = rng or random.Random()
        self._leading = False
        self._observed: RawObject | None = None  # the Lease spec last read
        self._observed_at = 0.0  # our clock when that spec last changed
        self._last_renew = 0.0

    @property
    def path(self) -> str:
        return f"{LEASES_API}/namespaces/{self.namespace}/leases/{self.name}"

    @property
    def is_leader(self) -> bool:
        return self._leading

    @property
    def holder(self) -> str:
        """The holder identity last observed ("" when none or not read yet)."""
        return str((self._observed or {}).get("holderIdentity") or "")

    # -- one attempt -------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """Take or renew the Lease once; True when this replica holds it afterwards (the API said so)."""
        now_wall = micro_time(self._wall())
        duration = int(self.timing.lease_duration_seconds)
        try:
            stored = self._api.request("GET", self.path)
        except ApiError as e:
            if not e.not_found:
                log.warning("audit lease: cannot read", extra={"lease": self.path, "error": str(e)})
                return False
            return self._create(now_wall, duration)
        spec = stored.get("spec") if isinstance(stored.get("spec"), dict) else {}
        assert isinstance(spec, dict)
        self._observe(spec)
        holder = str(spec.get("holderIdentity") or "")
        if holder and holder != self.identity and not self._expired():
            return False
        transitions = _int(spec.get("leaseTransitions"))
        mine = holder == self.identity
        desired = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": duration,
            "acquireTime": spec.get("acquireTime") if mine and spec.get("acquireTime") else now_wall,
            "renewTime": now_wall,
            "leaseTransitions": transitions if mine else transitions + 1,
        }
        body = {**stored, "spec": desired}  # metadata (resourceVersion) as read: the update is guarded
        try:
            updated = self._api.request("PUT", self.path, body)
        except ApiError as e:
            if e.status != HTTP_CONFLICT:
                log.warning("audit lease: cannot update", extra={"lease": self.path, "error": str(e)})
            return False
        spec = updated.get("spec")
        self._observe(spec if isinstance(spec, dict) else desired)
        return True

    def _create(self, now_wall: str, duration: int) -> bool:
        body: RawObject = {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": duration,
                     "acquireTime": now_wall, "renewTime": now_wall, "leaseTransitions": 0},
        }
        try:
            created = self._api.request("POST", f"{LEASES_API}/namespaces/{self.namespace}/leases", body)
        except ApiError as e:
            if e.status != HTTP_CONFLICT:  # 409: another replica created it first
                log.warning("audit lease: cannot create", extra={"lease": self.path, "error": str(e)})
            return False
        spec = created.get("spec")
        self._observe(spec if isinstance(spec, dict) else body["spec"])
        return True

    def _observe(self, spec: RawObject) -> None:
        if spec != self._observed:
            self._observed = dict(spec)
            self._observed_at = self._clock()

    def _expired(self) -> bool:
        return self._clock() >= self._observed_at + self.timing.lease_duration_seconds

    def release(self) -> bool:
        """Give the Lease up if this replica holds it (graceful stop). True when released."""
        try:
            stored = self._api.request("GET", self.path)
        except ApiError as e:
            log.warning("audit lease: cannot read to release", extra={"lease": self.path, "error": str(e)})
            return False
        spec = stored.get("spec") if isinstance(stored.get("spec"), dict) else {}
        assert isinstance(spec, dict)
        if spec.get("holderIdentity") != self.identity:
            return False
        now_wall = micro_time(self._wall())
        released = {"leaseDurationSeconds": 1, "leaseTransitions": _int(spec.get("leaseTransitions")),
                    "acquireTime": now_wall, "renewTime": now_wall}
        try:
            self._api.request("PUT", self.path, {**stored, "spec": released})
        except ApiError as e:
            log.warning("audit lease: cannot release", extra={"lease": self.path, "error": str(e)})
            return False
        log.info("audit lease released", extra={"lease": self.path, "identity": self.identity})
        return True

    # -- the loop ----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Elect until `stop` is set; then stop leading and release the Lease."""
        try:
            while not stop.is_set():
                if not self._leading:
                    if self.try_acquire_or_renew():
                        self._last_renew = self._clock()
                        self._set_leading(True)
                        continue
                    stop.wait(self.timing.retry_period_seconds * (1 + self._rng.random() * self.timing.jitter_factor))
                    continue
                if stop.wait(self.timing.retry_period_seconds):
                    break
                if self.try_acquire_or_renew():
                    self._last_renew = self._clock()
                elif self._clock() - self._last_renew >= self.timing.renew_deadline_seconds:
                    log.warning("audit lease: not renewed within the renew deadline, stopping to lead", extra={
                        "lease": self.path, "renew_deadline_seconds": self.timing.renew_deadline_seconds})
                    self._set_leading(False)
        finally:
            if self._leading:
                self._set_leading(False)
                self.release()

    def _set_leading(self, leading: bool) -> None:
        self._leading = leading
        log.info("audit leadership " + ("acquired" if leading else "lost"),
                 extra={"lease": self.path, "identity": self.identity})
        if self._on_change is not None:
            try:
                self._on_change(leading)
            except Exception:  # a callback must not kill the election
                log.exception("audit leadership callback failed")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
