"""The audit loop of `topoguard serve`: one replica (the Lease holder) audits the running jobs and writes
what it finds as Events, PolicyReports and metrics.

When: every `audit.intervalSeconds`, and soon after a change: the store publishes a snapshot after
every change of a node, policy, pod, job or namespace; the first publication after a pass arms a
pass DEBOUNCE_SECONDS later, and everything published until then lands in that one pass. A pass
that follows a change also waits CHANGE_GAP_FACTOR times the last pass's duration after the
previous one, so a cluster that changes all the time costs at most a fraction of a core.

Where: in a thread of its own, never on the event loop that answers admission reviews; the Lease
is renewed by another thread (lease.py), so a long pass cannot cost the leadership. The audit
itself is app.engine.audit.audit (pure): a snapshot in, one JobAudit per job out.

Skipped when the cache has no healthy snapshot (not synced yet, or watches failing past
cacheStaleSeconds): the findings of a stale cache would be wrong in both directions.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from app.cache.resources import JOB_RESOURCES
from app.cache.store import Store
from app.config import Settings
from app.controller.api import Api, build_api
from app.controller.events import EventRecorder, EventStats
from app.controller.lease import LeaderElector, LeaseTiming
from app.controller.reports import PolicyReportWriter, ReportStats
from app.engine import audit as engine_audit
from app.engine.audit import JobAudit
from app.metrics import AUDIT_WASTE_FINDINGS, Metrics
from app.models.cluster import Snapshot

log = logging.getLogger(__name__)

DEBOUNCE_SECONDS = 1.5
CHANGE_GAP_FACTOR = 4.0
# When a pass was skipped (no healthy snapshot), try again this soon rather than a whole interval later.
RETRY_SKIPPED_SECONDS = 5.0
IDLE_WAIT_SECONDS = 5.0
STOP_TIMEOUT_SECONDS = 5.0  # each: the pass in progress, then the release; inside the pod's grace period
# Metric series are kept for the most important jobs first when there are too many.
SEVERITY_ORDER = engine_audit.SEVERITY_ORDER

AuditFunction = Callable[[Snapshot, Settings], Sequence[JobAudit]]
_API_VERSIONS = {kind: versions[0] for kind, _, versions in JOB_RESOURCES}


def job_api_version(kind: str) -> str:
    """The apiVersion of a job kind, for Event `regarding` and PolicyReport `resources`.

    NB: JobAudit carries no apiVersion; every kind has one served version except MPIJob
    (kubeflow.org/v2beta1 from mpi-operator, or v1 from the old training-operator), named by the first.
    """
    return _API_VERSIONS.get(kind, "")


@dataclass(frozen=True)
class PassResult:
    jobs: int
    findings: Mapping[str, int]
    duration_seconds: float
    events: EventStats
    reports: ReportStats | None


def count_findings(audits: Sequence[JobAudit]) -> tuple[dict[str, int], dict[tuple[str, str, str], dict[str, int]]]:
    """(findings by type, per job with findings: type -> count), jobs ordered most important first."""
    totals = {kind: 0 for kind in engine_audit.AUDIT_FINDING_TYPES}
    per_job: list[tuple[int, tuple[str, str, str], dict[str, int]]] = []
    for job in audits:
        if not job.findings:
            continue
        counts: dict[str, int] = {}
        for finding in job.findings:
            counts[finding.type] = counts.get(finding.type, 0) + 1
            totals[finding.type] = totals.get(finding.type, 0) + 1
        rank = min(SEVERITY_ORDER.index(t) if t in SEVERITY_ORDER else len(SEVERITY_ORDER) for t in counts)
        per_job.append((rank, (job.namespace, job.kind, job.name), counts))
    per_job.sort(key=lambda item: (item[0], item[1]))
    return totals, {key: counts for _, key, counts in per_job}


@dataclass(frozen=True)
class Waste:
    """What one pass's running jobs hold while they cannot train well (app.metrics record_audit_waste)."""

    # (namespace, finding) -> GPUs held by the bound pods of the jobs whose most severe finding it is
    gpus: Mapping[tuple[str, str], int]
    # (zone_a, zone_b), zone_a < zone_b -> bound pods of split jobs in either zone, per pair of zones a job spans
    split_pods: Mapping[tuple[str, str], int]
    # (namespace, pod, kind, name, finding or "none", GPUs) per bound GPU pod, broken jobs' first
    gpu_pods: tuple[tuple[str, str, str, str, str, int], ...]


def count_waste(audits: Sequence[JobAudit]) -> Waste:
    """The GPUs each finding holds (every job once, under its most severe finding), split jobs' pods per zone
    pair, and every bound GPU pod with its job's finding."""
    gpus: dict[tuple[str, str], int] = {}
    split: dict[tuple[str, str], int] = {}
    ranked: list[tuple[int, tuple[str, str, str, str, str, int]]] = []
    for job in audits:
        worst = job.worst()
        if worst:
            gpus[(job.namespace, worst)] = gpus.get((job.namespace, worst), 0) + job.gpus
        if any(f.type == "split" for f in job.findings):
            zones = sorted(job.zones)
            for i, zone_a in enumerate(zones):
                for zone_b in zones[i + 1:]:
                    pair = (zone_a, zone_b)
                    split[pair] = split.get(pair, 0) + job.zones[zone_a] + job.zones[zone_b]
        rank = SEVERITY_ORDER.index(worst) if worst else len(SEVERITY_ORDER)
        for pod in job.pods:
            if pod.bound and pod.gpus:
                ranked.append((rank, (job.namespace, pod.name, job.kind, job.name, worst or "none", pod.gpus)))
    ranked.sort(key=lambda item: (item[0], item[1][:4]))
    return Waste(gpus, split, tuple(row for _, row in ranked))


class AuditController:
    """Runs the elector and the audit loop (module docstring). `start()`/`stop()` from the app's lifespan."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        metrics: Metrics,
        *,
        elector: LeaderElector,
        events: EventRecorder,
        reports: PolicyReportWriter | None,
        audit_fn: AuditFunction = engine_audit.audit,
        debounce_seconds: float = DEBOUNCE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.elector = elector
        self.events = events
        self.reports = reports
        self._audit = audit_fn
        self._debounce = debounce_seconds
        self._clock = clock
        self._wall = wall
        self._wake = threading.Event()
        self._stop = threading.Event()  # the audit loop
        self._stop_electing = threading.Event()  # the elector: stopped after the loop, so no write outlives the Lease
        self._changed_at: float | None = None
        self._leading = False
        # (clock, GPUs per (namespace, finding)) as the last pass saw them: the next pass adds them times the
        # time between the two to topoguard_audit_gpu_seconds_total. None after a pass that saw nothing reliable
        # (skipped, failed, leadership lost): a gap is never counted.
        self._held: tuple[float, Mapping[tuple[str, str], int]] | None = None
        self._threads: list[threading.Thread] = []
        self.passes = 0
        metrics.record_audit_leader(False)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._threads:
            raise RuntimeError("AuditController already started")
        self.store.subscribe(self._on_snapshot)
        self._threads = [
            threading.Thread(target=self.elector.run, args=(self._stop_electing,), name="topoguard-lease", daemon=True),
            threading.Thread(target=self._run, name="topoguard-audit", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        log.info("audit: started", extra={
            "lease": self.elector.path, "identity": self.elector.identity,
            "interval_seconds": self.settings.audit.interval_seconds, "scope": self.settings.audit.scope,
            "policy_reports": self.reports is not None,
        })

    async def stop(self) -> None:
        """Finish the pass in progress, then stop electing and release the Lease (bounded)."""
        await asyncio.to_thread(self._stop_threads)

    def _stop_threads(self) -> None:
        self._stop.set()
        self._wake.set()
        elector, loop = self._threads or (None, None)
        if loop is not None:
            loop.join(STOP_TIMEOUT_SECONDS)
        self._stop_electing.set()
        if elector is not None:
            elector.join(STOP_TIMEOUT_SECONDS)

    # -- signals -----------------------------------------------------------------------------

    def _on_snapshot(self, _: Snapshot) -> None:
        # Runs on the store's publisher thread: only note the time and wake the loop.
        if self._changed_at is None:
            self._changed_at = self._clock()
        self._wake.set()

    def on_leadership(self, _: bool) -> None:
        self._wake.set()

    # -- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        interval = self.settings.audit.interval_seconds
        next_due = self._clock()
        last_end = float("-inf")
        last_duration = 0.0
        while not self._stop.is_set():
            self._wake.clear()
            now = self._clock()
            if self.elector.is_leader != self._leading:
                self._leadership_changed(self.elector.is_leader)
                next_due = now
            if not self._leading:
                self._wake.wait(IDLE_WAIT_SECONDS)
                continue
            due = next_due
            changed_at = self._changed_at
            if changed_at is not None:
                due = min(due, max(changed_at + self._debounce, last_end + CHANGE_GAP_FACTOR * last_duration))
            if now < due:
                self._wake.wait(due - now)
                continue
            self._changed_at = None  # a change published from now on arms the next pass
            started = self._clock()
            try:
                done = self.run_pass() is not None
            except Exception:
                log.exception("audit pass failed")
                self.metrics.record_audit_pass("error")
                self._held = None
                done = True
            last_end = self._clock()
            last_duration = last_end - started
            next_due = last_end + (interval if done else min(interval, RETRY_SKIPPED_SECONDS))
        if self._leading:
            self._leadership_changed(False)

    def _leadership_changed(self, leading: bool) -> None:
        self._leading = leading
        self._held = None
        self.metrics.record_audit_leader(leading)
        if not leading:
            self.events.forget()
            if self.reports is not None:
                self.reports.forget()

    def run_pass(self) -> PassResult | None:
        """One audit pass with its writes; None when skipped (no healthy snapshot, or not leading)."""
        snapshot = self.store.healthy_snapshot()
        if snapshot is None:
            status = self.store.status()
            log.info("audit pass skipped: the cache is not synced or is stale",
                     extra={"synced": status.synced, "stale": status.stale})
            self.metrics.record_audit_pass("skipped")
            self._held = None
            return None
        started = self._clock()
        audits = self._audit(snapshot, self.settings)
        if not self.elector.is_leader:  # lost while auditing: write nothing
            self._held = None
            return None
        events = self.events.record(audits)
        self.metrics.record_audit_writes("event", ok=events.created + events.patched, failed=events.errors)
        reports = None
        if self.reports is not None:
            reports = self.reports.sync(audits)
            self.metrics.record_audit_writes("policyreport", ok=reports.written + reports.deleted,
                                             failed=reports.errors)
        totals, per_job = count_findings(audits)
        self._record_waste(count_waste(audits), started)
        duration = self._clock() - started
        self.metrics.record_audit(jobs=len(audits), findings=totals, job_findings=per_job,
                                  duration_seconds=duration, finished_at=self._wall())
        self.passes += 1
        log.info("audit pass", extra={
            "revision": snapshot.revision, "jobs": len(audits), "jobs_with_findings": len(per_job),
            **{f"findings_{k.replace('-', '_')}": v for k, v in totals.items()},
            "events_created": events.created, "events_patched": events.patched, "events_deferred": events.deferred,
            "reports_written": reports.written if reports else 0, "seconds": round(duration, 3),
        })
        return PassResult(len(audits), totals, duration, events, reports)


    def _record_waste(self, waste: Waste, seen_at: float) -> None:
        """Export the pass's waste; the GPUs the previous pass saw are counted as held until this one saw
        the cluster (`seen_at`: when it read its snapshot)."""
        seconds: dict[tuple[str, str], float] = {}
        if self._held is not None:
            then, held = self._held
            elapsed = max(0.0, seen_at - then)
            seconds = {key: n * elapsed for key, n in held.items() if key[1] in AUDIT_WASTE_FINDINGS}
        self._held = (seen_at, waste.gpus)
        self.metrics.record_audit_waste(gpus=waste.gpus, gpu_seconds=seconds, split_pods=waste.split_pods,
                                        gpu_pods=waste.gpu_pods)


def pod_identity(environ: Mapping[str, str]) -> tuple[str, str]:
    """(namespace, holder identity): the chart's POD_NAMESPACE and POD_NAME; outside a pod, `default`
    and hostname_uuid (client-go's convention for a process without a pod name)."""
    namespace = environ.get("POD_NAMESPACE") or "default"
    identity = environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4()}"
    return namespace, identity


def build_controller(
    settings: Settings,
    store: Store,
    metrics: Metrics,
    *,
    kubeconfig: str | None,
    environ: Mapping[str, str] | None = None,
    api: Api | None = None,
    timing: LeaseTiming | None = None,
    audit_fn: AuditFunction = engine_audit.audit,
) -> AuditController:
    """The controller `topoguard serve` runs (raises ClientConfigError when no client can be configured)."""
    namespace, identity = pod_identity(os.environ if environ is None else environ)
    client = api if api is not None else build_api(kubeconfig)
    controller: AuditController | None = None

    def changed(leading: bool) -> None:
        if controller is not None:
            controller.on_leadership(leading)

    elector = LeaderElector(client, namespace=namespace, name=settings.audit.lease_name, identity=identity,
                            timing=timing, on_change=changed)
    events = EventRecorder(client, instance=identity, api_version_of=job_api_version)
    reports = PolicyReportWriter(client, api_version_of=job_api_version) if settings.audit.policy_reports else None
    controller = AuditController(settings, store, metrics, elector=elector, events=events, reports=reports,
                                 audit_fn=audit_fn)
    return controller
