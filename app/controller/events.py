"""Kubernetes Events for audit findings: one Event per finding, refreshed while it lasts, never one per pass.

API: `events.k8s.io/v1`, not core v1. It is the API client-go's current recorder
(k8s.io/client-go/tools/events) writes, the one with `regarding`, `reportingController` /
`reportingInstance`, `action` and a structured `series` {count, lastObservedTime} for an event
that keeps happening; the apiserver stores both APIs as the same objects, so `kubectl describe`
and `kubectl events` on the job show these too (core v1 sees `regarding` as `involvedObject` and
`note` as `message`).

The series rules follow client-go's events broadcaster (tools/events/event_broadcaster.go):
the first observation of a finding creates the Event; the second patches `series` {count: 2};
later ones are counted here and written every REFRESH_SECONDS (30 min, client-go's refreshTime),
which also keeps the Event alive past the apiserver's event TTL (1 h by default; an update renews
it). A finding that is gone from a pass is forgotten: nothing more is written and the Event ages
out by that TTL, as the issue asks ("Events age out naturally").

What is our own: the Event's name is derived from (job uid, reason, note), so a new leader that
sees the same finding gets 409 AlreadyExists on create and continues the series the old leader
started instead of adding a duplicate, without needing list or get on events. Writes per pass are
bounded (MAX_WRITES_PER_PASS); what is left waits for the next pass.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from app.cache.errors import ApiError
from app.controller.api import MERGE_PATCH, Api, RawObject, micro_time
from app.engine.audit import AuditFinding, JobAudit

log = logging.getLogger(__name__)

EVENTS_API = "/apis/events.k8s.io/v1"
REPORTING_CONTROLLER = "topoguard.io/audit"
ACTION = "Audit"
EVENT_TYPE = "Warning"
# events.k8s.io/v1 validation: `note` at most 1 kB, reportingInstance and action at most 128 characters.
NOTE_LIMIT_BYTES = 1024
INSTANCE_LIMIT = 128
REFRESH_SECONDS = 30 * 60.0
MAX_WRITES_PER_PASS = 200
HTTP_CONFLICT = 409
HTTP_INVALID = 422
NAME_PREFIX_LIMIT = 200  # of a DNS-subdomain name's 253, leaving room for the digest

EventKey = tuple[str, str, str, str]  # namespace, job uid (or name), reason, note


@dataclass
class _Series:
    name: str
    namespace: str
    count: int  # observations of the finding (1 until the series starts)
    written_at: float  # our clock at the last write


@dataclass
class EventStats:
    created: int = 0
    patched: int = 0
    counted: int = 0  # observations counted without a write
    deferred: int = 0  # left for the next pass (MAX_WRITES_PER_PASS)
    errors: int = 0


def truncate_utf8(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


def event_name(job: JobAudit, finding: AuditFinding, note: str) -> str:
    digest = hashlib.sha256("\x00".join((job.uid or job.name, finding.reason, note)).encode()).hexdigest()[:16]
    return f"{job.name[:NAME_PREFIX_LIMIT]}.{digest}"


def build_event(job: JobAudit, finding: AuditFinding, *, api_version: str, instance: str, now: float,
                controller: str = REPORTING_CONTROLLER, action: str = ACTION) -> RawObject:
    """The events.k8s.io/v1 Event for one finding on its job."""
    note = truncate_utf8(finding.message, NOTE_LIMIT_BYTES)
    regarding = {"apiVersion": api_version, "kind": job.kind, "namespace": job.namespace, "name": job.name}
    if job.uid:
        regarding["uid"] = job.uid
    return {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": event_name(job, finding, note), "namespace": job.namespace},
        "eventTime": micro_time(now),
        "reportingController": controller,
        "reportingInstance": instance[:INSTANCE_LIMIT],
        "action": action,
        "reason": finding.reason,
        "type": EVENT_TYPE,
        "note": note,
        "regarding": regarding,
    }


class EventRecorder:
    """Turns each pass's findings into Event creates and series patches (see the module docstring)."""

    def __init__(
        self,
        api: Api,
        *,
        instance: str,
        api_version_of: Callable[[str], str],
        refresh_seconds: float = REFRESH_SECONDS,
        max_writes_per_pass: int = MAX_WRITES_PER_PASS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        controller: str = REPORTING_CONTROLLER,
        action: str = ACTION,
    ) -> None:
        self._api = api
        self._controller = controller
        self._action = action
        self._instance = instance
        self._api_version_of = api_version_of
        self._refresh = refresh_seconds
        self._max_writes = max_writes_per_pass
        self._clock = clock
        self._wall = wall
        self._series: dict[EventKey, _Series] = {}

    def forget(self) -> None:
        """Drop what is known (leadership lost: the next leader continues the series by name)."""
        self._series.clear()

    @property
    def active(self) -> int:
        """Findings with an Event this recorder keeps refreshing."""
        return len(self._series)

    def record(self, audits: Iterable[JobAudit]) -> EventStats:
        """One pass's findings. New findings are written before series updates, so a burst of new ones
        is not starved by refreshes of old ones."""
        stats = EventStats()
        seen: set[EventKey] = set()
        new: list[tuple[EventKey, JobAudit, AuditFinding]] = []
        due: list[tuple[EventKey, _Series]] = []
        for job in audits:
            for finding in job.findings:
                note = truncate_utf8(finding.message, NOTE_LIMIT_BYTES)
                key = (job.namespace, job.uid or job.name, finding.reason, note)
                if key in seen:
                    continue  # the same finding twice in one pass is one observation
                seen.add(key)
                series = self._series.get(key)
                if series is None:
                    new.append((key, job, finding))
                    continue
                series.count += 1
                if series.count > 2 and self._clock() - series.written_at < self._refresh:
                    stats.counted += 1
                else:
                    due.append((key, series))
        for key in [k for k in self._series if k not in seen]:
            del self._series[key]  # cleared: no more writes; the Event ages out
        budget = self._max_writes
        for key, job, finding in new:
            if budget <= 0:
                stats.deferred += 1  # not remembered: created on a later pass
                continue
            budget -= 1
            self._create(key, job, finding, stats)
        for key, series in due:
            if budget <= 0:
                stats.deferred += 1
                series.count -= 1  # observed again on a later pass
                continue
            budget -= 1
            self._patch_series(key, series, stats)
        return stats

    def _create(self, key: EventKey, job: JobAudit, finding: AuditFinding, stats: EventStats) -> None:
        body = build_event(job, finding, api_version=self._api_version_of(job.kind), instance=self._instance,
                           now=self._wall(), controller=self._controller, action=self._action)
        name, namespace = body["metadata"]["name"], job.namespace
        try:
            self._api.request("POST", f"{EVENTS_API}/namespaces/{namespace}/events", body)
        except ApiError as e:
            if e.status != HTTP_CONFLICT:
                stats.errors += 1
                log.warning("audit: cannot create an Event", extra={"job": job.ref, "reason": finding.reason,
                                                                     "error": str(e)})
                return
            # Created earlier (by us before a restart, or by the previous leader): continue its series.
            series = _Series(name, namespace, count=1, written_at=self._clock())
            self._series[key] = series
            self._continue_existing(key, series, stats)
            return
        stats.created += 1
        self._series[key] = _Series(name, namespace, count=1, written_at=self._clock())

    def _continue_existing(self, key: EventKey, series: _Series, stats: EventStats) -> None:
        path = f"{EVENTS_API}/namespaces/{series.namespace}/events/{series.name}"
        now = micro_time(self._wall())
        try:
            # Keeps the stored count when the Event already has a series; 422 when it has none.
            stored = self._api.request("PATCH", path, {"series": {"lastObservedTime": now}}, content_type=MERGE_PATCH)
        except ApiError as e:
            if e.status == HTTP_INVALID:
                series.count = 1
                self._patch_series(key, series, stats, observed=True)
                return
            self._failed(key, series, e, stats)
            return
        stored_series = stored.get("series") if isinstance(stored.get("series"), dict) else {}
        count = stored_series.get("count") if isinstance(stored_series, dict) else None
        series.count = count + 1 if isinstance(count, int) and count >= 2 else 2
        series.written_at = self._clock()
        stats.patched += 1

    def _patch_series(self, key: EventKey, series: _Series, stats: EventStats, *, observed: bool = False) -> None:
        if observed:
            series.count += 1
        path = f"{EVENTS_API}/namespaces/{series.namespace}/events/{series.name}"
        body = {"series": {"count": max(series.count, 2), "lastObservedTime": micro_time(self._wall())}}
        try:
            self._api.request("PATCH", path, body, content_type=MERGE_PATCH)
        except ApiError as e:
            self._failed(key, series, e, stats)
            return
        series.count = max(series.count, 2)
        series.written_at = self._clock()
        stats.patched += 1

    def _failed(self, key: EventKey, series: _Series, error: ApiError, stats: EventStats) -> None:
        if error.not_found:
            # Aged out (TTL) or deleted while the finding lasted: the next pass creates it again.
            del self._series[key]
            return
        stats.errors += 1
        log.warning("audit: cannot update an Event's series", extra={"event": f"{series.namespace}/{series.name}",
                                                                      "error": str(error)})
