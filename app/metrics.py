"""Every Prometheus metric topoguard exports, declared in one place, with `record_*` helpers.

One `Metrics` per app, each with its own CollectorRegistry (tests build many apps in one process;
a global registry would refuse the second registration). Prefix `topoguard_`; counters end in
`_total`; label names are fixed (jobset pkg/metrics, kueue metric guidelines).
Must not import app.tls (import-linter "independence"): callers pass the certificate's notAfter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "topoguard"

# The apiserver's own webhook-latency histogram has edges at 5 ms, 25 ms and 100 ms
# (apiserver_admission_webhook_admission_duration_seconds, research/perf-rel-sec.md A.2); keeping
# them lets the two views be compared bucket by bucket. 8 s is the app-side deadline.
REVIEW_DURATION_BUCKETS_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 8.0)
PUBLISH_BUCKETS_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# Every value of `topoguard_reviews_total{outcome}`: the admission pipeline's outcomes
# (app.admission.pipeline.OutcomeName), then the two only the server answers with (app.http.routes).
REVIEW_OUTCOMES = ("patched", "unchanged", "denied", "warned", "skipped", "error", "bad-request", "timeout", "shed")
# Every value of `topoguard_reviews_shed_total{reason}` (app.http.workers.ShedReason, plus the memory budget's).
SHED_REASONS = ("namespace-share", "no-worker", "memory")
# Every value of `topoguard_decision_reasons_total{reason}` (app.http.routes classifies): per zone
# that could not take a job, capacity / network-deny / network-unknown, or placement when neither
# applies; once per refused job, split when its replicas share no zone or could run split across zones.
REASON_CLASSES = ("capacity", "network-deny", "network-unknown", "placement", "split")
# Every value of `topoguard_skip_requests_total{result}`: a job's topoguard.io/skip honoured (its namespace is
# labelled topoguard.io/allow-skip=true) or ignored with a warning (app.admission.pipeline.Outcome.skip).
SKIP_RESULTS = ("honoured", "ignored")
# Most labelled series a per-review metric keeps a handle to (the callers bound the label values:
# operations, KNOWN_KINDS, outcomes, reason classes, zones); past it `.labels()` is asked every time.
MAX_CACHED_SERIES = 1024
# Every value of `topoguard_audit_findings{type}` (app.engine.audit.AUDIT_FINDING_TYPES; app.metrics may not
# import the engine's types, a test checks the two agree).
AUDIT_FINDING_TYPES = ("split", "blocked", "unknown", "zone-closed")
# Jobs with findings that get per-job series (`topoguard_audit_job_findings`); the rest are counted in
# `topoguard_audit_job_series_dropped`. Bounded so a policy that breaks every job cannot blow up the TSDB.
MAX_AUDIT_JOB_SERIES = 500
# Every value of `topoguard_audit_gpu_seconds_total{finding}`: the findings whose GPUs are wasted while they last
# (the job cannot train, or trains with its collectives across zones). `topoguard_audit_blocked_gpus` has every type.
AUDIT_WASTE_FINDINGS = ("blocked", "split")
# Namespaces that get their own `topoguard_audit_blocked_gpus` / `_gpu_seconds_total` series, most GPUs first; the
# others are added up under OTHER_NAMESPACE (a name no namespace can have: DNS-1123 labels have no underscore), so
# the totals stay right however many namespaces break.
MAX_AUDIT_NAMESPACE_SERIES = 200
OTHER_NAMESPACE = "_other"
# Bound GPU pods of audited jobs that get a `topoguard_audit_gpu_pod` series (the join to DCGM's per-pod
# utilisation), pods of broken jobs first; the rest are counted in `topoguard_audit_pod_series_dropped`.
MAX_AUDIT_POD_SERIES = 5000
# An audit pass over 2,000 jobs takes about a second on one core (issue 12's benchmark).
AUDIT_PASS_BUCKETS_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# Every value of `topoguard_audit_passes_total{outcome}` and of `topoguard_audit_writes_total{resource}`.
AUDIT_PASS_OUTCOMES = ("done", "error", "skipped")
AUDIT_WRITE_RESOURCES = ("event", "policyreport")

_Key = TypeVar("_Key", bound=Hashable)


class Metrics:
    """The metrics of one app instance."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reviews = Counter(
            f"{PREFIX}_reviews_total", f"AdmissionReviews answered, by outcome ({', '.join(REVIEW_OUTCOMES)}).",
            ["operation", "kind", "outcome"], registry=r,
        )
        self.decision_reasons = Counter(
            f"{PREFIX}_decision_reasons_total",
            f"Why jobs were refused: per zone that could not take one, split per job ({', '.join(REASON_CLASSES)}).",
            ["reason"], registry=r,
        )
        self.review_duration = Histogram(
            f"{PREFIX}_review_duration_seconds", "Time from the request's arrival to the answer being ready.",
            ["operation"], buckets=REVIEW_DURATION_BUCKETS_SECONDS, registry=r,
        )
        self.cache_objects = Gauge(f"{PREFIX}_cache_objects", "Objects in the current snapshot.", ["kind"], registry=r)
        self.cache_age = Gauge(f"{PREFIX}_cache_age_seconds", "Seconds since the snapshot was published.", registry=r)
        self.snapshot_publish = Histogram(
            f"{PREFIX}_snapshot_publish_seconds",
            "Time to publish a snapshot from the watch cache: build it and warm its indexes (publisher thread).",
            buckets=PUBLISH_BUCKETS_SECONDS, registry=r,
        )
        self.cache_synced = Gauge(f"{PREFIX}_cache_synced", "1 when every watched kind has synced.", registry=r)
        self.zone_free_gpus = Gauge(
            f"{PREFIX}_zone_free_gpus", "Unallocated GPUs on Ready, schedulable nodes per zone.", ["zone"], registry=r,
        )
        self.zone_reserved_gpus = Gauge(
            f"{PREFIX}_zone_reserved_gpus",
            "GPUs that admitted, pinned jobs will take in the zone but whose pods are not bound yet (the ledger).",
            ["zone"], registry=r,
        )
        self.zone_blocked_flows = Gauge(
            f"{PREFIX}_zone_blocked_flows", "Required flows denied in the zone by the last decision that checked it.",
            ["zone"], registry=r,
        )
        self.reviews_shed = Counter(
            f"{PREFIX}_reviews_shed_total",
            "Reviews answered without a decision because no worker (or memory) was free for them in time, "
            f"by reason ({', '.join(SHED_REASONS)}).",
            ["reason"], registry=r,
        )
        self.skip_requests = Counter(
            f"{PREFIX}_skip_requests_total",
            f"Jobs annotated topoguard.io/skip=true, by result ({', '.join(SKIP_RESULTS)}): honoured only in "
            "namespaces labelled topoguard.io/allow-skip=true.",
            ["result"], registry=r,
        )
        self.workers_stuck = Gauge(
            f"{PREFIX}_workers_stuck", "Review tasks running far past the deadline (/healthz fails while > 0).",
            registry=r,
        )
        self.cert_expiry = Gauge(
            f"{PREFIX}_tls_certificate_expiry_timestamp_seconds", "notAfter of the serving certificate.", registry=r,
        )
        self.tls_connections = Counter(
            f"{PREFIX}_tls_connections",
            "TLS connections accepted (handshake done), by the serial number (hex) of the serving certificate "
            "loaded when they were accepted; the current and the previous certificate only.",
            ["serial"], registry=r,
        )
        self.serving_serials: list[str] = []  # the previous and the current certificate's serial
        self.audit_findings = Gauge(
            f"{PREFIX}_audit_findings",
            f"Findings of the last audit pass over running jobs, by type ({', '.join(AUDIT_FINDING_TYPES)}); "
            "exported by the audit leader only.",
            ["type"], registry=r,
        )
        self.audit_job_findings = Gauge(
            f"{PREFIX}_audit_job_findings",
            f"Findings per job and type, only for jobs with findings (at most {MAX_AUDIT_JOB_SERIES} jobs).",
            ["namespace", "kind", "name", "type"], registry=r,
        )
        self.audit_job_series_dropped = Gauge(
            f"{PREFIX}_audit_job_series_dropped",
            "Jobs with findings left without per-job series by the bound.", registry=r,
        )
        self.audit_jobs = Gauge(f"{PREFIX}_audit_jobs", "Training jobs the last audit pass looked at.", registry=r)
        self.audit_pass_duration = Histogram(
            f"{PREFIX}_audit_pass_duration_seconds", "Time one audit pass took (the audit and its writes).",
            buckets=AUDIT_PASS_BUCKETS_SECONDS, registry=r,
        )
        self.audit_last_pass = Gauge(
            f"{PREFIX}_audit_last_pass_timestamp_seconds", "When the last audit pass finished (Unix time).",
            registry=r,
        )
        self.audit_passes = Counter(
            f"{PREFIX}_audit_passes_total",
            f"Audit passes, by outcome ({', '.join(AUDIT_PASS_OUTCOMES)}); skipped: no healthy snapshot.",
            ["outcome"], registry=r,
        )
        self.audit_writes = Counter(
            f"{PREFIX}_audit_writes_total",
            f"Writes of the audit to the API, by resource ({', '.join(AUDIT_WRITE_RESOURCES)}) and result.",
            ["resource", "result"], registry=r,
        )
        self.audit_blocked_gpus = Gauge(
            f"{PREFIX}_audit_blocked_gpus",
            "GPUs held by the bound pods of running jobs, per namespace and the job's most severe finding "
            f"({', '.join(AUDIT_FINDING_TYPES)}); each job counted once. Exported by the audit leader only.",
            ["namespace", "finding"], registry=r,
        )
        self.audit_gpu_seconds = Counter(
            f"{PREFIX}_audit_gpu_seconds",
            f"GPU-seconds held by the bound pods of running jobs whose most severe finding is "
            f"{' or '.join(AUDIT_WASTE_FINDINGS)}: the GPUs one pass saw, times the time until the next pass.",
            ["namespace", "finding"], registry=r,
        )
        self.audit_split_pods = Gauge(
            f"{PREFIX}_audit_split_pods",
            "Bound pods of jobs split across zones, per pair of zones the job spans (zone_a < zone_b): the pods "
            "whose collective traffic crosses between the two.",
            ["zone_a", "zone_b"], registry=r,
        )
        self.audit_gpu_pod = Gauge(
            f"{PREFIX}_audit_gpu_pod",
            "GPUs held by one bound pod of an audited job, labelled with its job and the job's most severe finding "
            f"(none: healthy); for joining per-pod GPU metrics (DCGM). At most {MAX_AUDIT_POD_SERIES} pods, "
            "broken jobs' first.",
            ["namespace", "pod", "kind", "name", "finding"], registry=r,
        )
        self.audit_pod_series_dropped = Gauge(
            f"{PREFIX}_audit_pod_series_dropped",
            "Bound GPU pods of audited jobs left without a topoguard_audit_gpu_pod series by the bound.", registry=r,
        )
        self.audit_leader = Gauge(
            f"{PREFIX}_audit_leader", "1 while this replica holds the audit Lease and runs the audit.", registry=r,
        )
        # The labelled series recorded per review, by label values: `.labels()` checks and converts its
        # arguments on every call, several times the cost of the increment itself (issue 4).
        # NB: a metric whose series are ever removed (`.remove()`, `.clear()`) must drop its cache too,
        # or the handles kept here would count into series no longer exported.
        self._review_counts: dict[tuple[str, str, str], Any] = {}
        self._review_durations: dict[str, Any] = {}
        self._reason_counts: dict[str, Any] = {}
        self._zone_blocked_flows: dict[str, Any] = {}
        self._blocked_last: dict[str, int] = {}  # the value last set per zone (of the series kept above)

    def record_review(self, *, operation: str, kind: str, outcome: str, duration_seconds: float) -> None:
        key = (operation, kind, outcome)
        count = self._review_counts.get(key)
        if count is None:
            series = self.reviews.labels(operation=operation, kind=kind, outcome=outcome)
            count = _kept(self._review_counts, key, series)
        count.inc()
        duration = self._review_durations.get(operation)
        if duration is None:
            duration = _kept(self._review_durations, operation, self.review_duration.labels(operation=operation))
        duration.observe(duration_seconds)

    def record_reasons(self, reasons: Mapping[str, int]) -> None:
        """`reasons`: reason class (one of REASON_CLASSES) → count (e.g. {"network-deny": 2, "capacity": 1})."""
        for reason, count in reasons.items():
            series = self._reason_counts.get(reason)
            if series is None:
                series = _kept(self._reason_counts, reason, self.decision_reasons.labels(reason=reason))
            series.inc(count)

    def record_cache(self, *, synced: bool, age_seconds: float, objects: Mapping[str, int]) -> None:
        self.cache_synced.set(1 if synced else 0)
        self.cache_age.set(age_seconds)
        for kind, count in objects.items():
            self.cache_objects.labels(kind=kind).set(count)

    def record_publish(self, seconds: float) -> None:
        self.snapshot_publish.observe(seconds)

    def record_reserved(self, reserved_gpus: Mapping[str, int]) -> None:
        """Replace the per-zone reserved-GPU series (the stored jobs' reservations of the last snapshot)."""
        self.zone_reserved_gpus.clear()
        for zone, reserved in reserved_gpus.items():
            self.zone_reserved_gpus.labels(zone=zone).set(reserved)

    def record_zones(self, free_gpus: Mapping[str, int]) -> None:
        """Replace the per-zone free-GPU series (zones that disappeared are dropped)."""
        self.zone_free_gpus.clear()
        for zone, free in free_gpus.items():
            self.zone_free_gpus.labels(zone=zone).set(free)

    def record_blocked_flows(self, blocked: Mapping[str, int]) -> None:
        for zone, count in blocked.items():
            if self._blocked_last.get(zone) == count:
                continue  # the series holds it already (a gauge set takes a lock: skipped per review)
            series = self._zone_blocked_flows.get(zone)
            if series is None:
                series = _kept(self._zone_blocked_flows, zone, self.zone_blocked_flows.labels(zone=zone))
            series.set(count)
            if zone in self._zone_blocked_flows:
                self._blocked_last[zone] = count

    def record_skip(self, result: str) -> None:
        """`result`: one of SKIP_RESULTS."""
        self.skip_requests.labels(result=result).inc()

    def record_shed(self, reason: str) -> None:
        self.reviews_shed.labels(reason=reason).inc()

    def record_certificate(self, not_after: float, serial: str = "") -> None:
        """The certificate being served; after a rotation, the connections series of the one before the
        previous goes (one series per certificate would grow with every rotation)."""
        self.cert_expiry.set(not_after)
        if serial and serial not in self.serving_serials[-1:]:
            self.serving_serials.append(serial)
            for gone in self.serving_serials[:-2]:
                with contextlib.suppress(KeyError):
                    self.tls_connections.remove(gone)
            del self.serving_serials[:-2]

    def record_connection(self) -> None:
        """A TLS connection was accepted; it carries the certificate being served now."""
        self.tls_connections.labels(serial=self.serving_serials[-1] if self.serving_serials else "").inc()

    def record_audit(
        self,
        *,
        jobs: int,
        findings: Mapping[str, int],
        job_findings: Mapping[tuple[str, str, str], Mapping[str, int]],
        duration_seconds: float,
        finished_at: float,
    ) -> None:
        """One audit pass: `findings` by type; `job_findings` (namespace, kind, name) -> type -> count for the
        jobs with findings, most important first (only the first MAX_AUDIT_JOB_SERIES get series)."""
        for kind in AUDIT_FINDING_TYPES:
            self.audit_findings.labels(type=kind).set(findings.get(kind, 0))
        self.audit_job_findings.clear()  # a job whose findings cleared loses its series
        kept = list(job_findings.items())[:MAX_AUDIT_JOB_SERIES]
        for (namespace, kind, name), counts in kept:
            for finding_type, count in counts.items():
                self.audit_job_findings.labels(namespace=namespace, kind=kind, name=name, type=finding_type).set(count)
        self.audit_job_series_dropped.set(len(job_findings) - len(kept))
        self.audit_jobs.set(jobs)
        self.audit_pass_duration.observe(duration_seconds)
        self.audit_last_pass.set(finished_at)
        self.audit_passes.labels(outcome="done").inc()

    def record_audit_waste(
        self,
        *,
        gpus: Mapping[tuple[str, str], int],
        gpu_seconds: Mapping[tuple[str, str], float],
        split_pods: Mapping[tuple[str, str], int],
        gpu_pods: Sequence[tuple[str, str, str, str, str, int]],
    ) -> None:
        """One audit pass's waste: `gpus` (namespace, finding) -> GPUs held now; `gpu_seconds` (namespace,
        finding) -> GPU-seconds held since the previous pass; `split_pods` (zone_a, zone_b) -> pods; `gpu_pods`
        (namespace, pod, kind, name, finding, gpus), most important first."""
        held = _folded(gpus)
        self.audit_blocked_gpus.clear()
        for (namespace, finding), count in held.items():
            self.audit_blocked_gpus.labels(namespace=namespace, finding=finding).set(count)
        for (namespace, finding), seconds in _folded(gpu_seconds).items():
            if seconds > 0:
                self.audit_gpu_seconds.labels(namespace=namespace, finding=finding).inc(seconds)
        for namespace, finding in held:
            if finding in AUDIT_WASTE_FINDINGS:
                # Exported at 0 from the pass that first sees the waste, so increase() knows where it began.
                self.audit_gpu_seconds.labels(namespace=namespace, finding=finding)
        self.audit_split_pods.clear()
        for (zone_a, zone_b), count in split_pods.items():
            self.audit_split_pods.labels(zone_a=zone_a, zone_b=zone_b).set(count)
        self.audit_gpu_pod.clear()
        kept = gpu_pods[:MAX_AUDIT_POD_SERIES]
        for namespace, pod, kind, name, finding, count in kept:
            self.audit_gpu_pod.labels(namespace=namespace, pod=pod, kind=kind, name=name, finding=finding).set(count)
        self.audit_pod_series_dropped.set(len(gpu_pods) - len(kept))

    def record_audit_pass(self, outcome: str) -> None:
        """A pass that did not finish (`error`, `skipped`)."""
        self.audit_passes.labels(outcome=outcome).inc()

    def record_audit_writes(self, resource: str, *, ok: int, failed: int) -> None:
        if ok:
            self.audit_writes.labels(resource=resource, result="ok").inc(ok)
        if failed:
            self.audit_writes.labels(resource=resource, result="error").inc(failed)

    def record_audit_leader(self, leader: bool) -> None:
        """Leadership changed. A replica that does not lead exports no findings (the leader's are the truth)."""
        self.audit_leader.set(1 if leader else 0)
        if not leader:
            self.audit_findings.clear()
            self.audit_job_findings.clear()
            self.audit_job_series_dropped.set(0)
            self.audit_blocked_gpus.clear()
            self.audit_split_pods.clear()
            self.audit_gpu_pod.clear()
            self.audit_pod_series_dropped.set(0)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its Content-Type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


_Number = TypeVar("_Number", int, float)


def _folded(values: Mapping[tuple[str, str], _Number]) -> dict[tuple[str, str], _Number]:
    """(namespace, finding) -> value, the namespaces past the MAX_AUDIT_NAMESPACE_SERIES largest (by their total)
    added up under OTHER_NAMESPACE."""
    totals: dict[str, float] = {}
    for (namespace, _), value in values.items():
        totals[namespace] = totals.get(namespace, 0) + value
    if len(totals) <= MAX_AUDIT_NAMESPACE_SERIES:
        return dict(values)
    kept = set(sorted(totals, key=lambda ns: (-totals[ns], ns))[:MAX_AUDIT_NAMESPACE_SERIES])
    out: dict[tuple[str, str], _Number] = {}
    for (namespace, finding), value in values.items():
        key = (namespace if namespace in kept else OTHER_NAMESPACE, finding)
        out[key] = out.get(key, 0) + value
    return out


def _kept(cache: dict[_Key, Any], key: _Key, series: Any) -> Any:
    """`series`, remembered under `key` while `cache` holds fewer than MAX_CACHED_SERIES."""
    if len(cache) < MAX_CACHED_SERIES:
        cache[key] = series
    return series
