"""`wgpolicyk8s.io/v1alpha2` PolicyReports: one per namespace (name `topoguard`), pass/fail per job and rule.

The format is the Policy WG's (kubernetes-sigs/wg-policy-prototypes, policy-report/crd/v1alpha2),
the one Kyverno writes and Policy Reporter reads. Each audited job gets one result per finding type
(`rule` = split | blocked | unknown | zone-closed, `policy` = topoguard, `source` = topoguard):
`fail` with the findings' messages when the job has that finding, `pass` otherwise, so a finding
that clears turns its own result from fail to pass. `summary` counts the results in the report.

Written only when the CRD is served: discovery is asked once and again every
DISCOVERY_RECHECK_SECONDS; an absent CRD is skipped with one log line (when that changes). A report
is written only when its results changed (a result keeps the timestamp of its last change), and
a namespace whose audited jobs are all gone has its report deleted. Reports are found again after
a restart or a change of leader by listing them with the `app.kubernetes.io/managed-by` label.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.cache.errors import ApiError
from app.controller.api import Api, RawObject
from app.engine.audit import AUDIT_FINDING_TYPES, JobAudit

log = logging.getLogger(__name__)

GROUP_VERSION = "wgpolicyk8s.io/v1alpha2"
DISCOVERY_PATH = f"/apis/{GROUP_VERSION}"
REPORT_NAME = "topoguard"
POLICY = "topoguard"
SOURCE = "topoguard"
CATEGORY = "Topology"
MANAGED_BY = {"app.kubernetes.io/managed-by": "topoguard"}
SEVERITY = {"split": "high", "blocked": "high", "zone-closed": "medium", "unknown": "low"}
DISCOVERY_RECHECK_SECONDS = 300.0
# etcd takes objects up to 1.5 MiB; a result is a few hundred bytes. Past this, failing results are
# kept first and the rest dropped (logged), like Gatekeeper's --constraint-violations-limit.
MAX_RESULTS_PER_REPORT = 2000
MESSAGE_LIMIT = 1024
HTTP_CONFLICT = 409


def _result_key(result: Mapping[str, Any]) -> tuple[str, str, str]:
    resource = (result.get("resources") or [{}])[0]
    return str(result.get("rule")), str(resource.get("kind")), str(resource.get("name"))


def build_results(audits: Iterable[JobAudit], *, api_version_of: Callable[[str], str]) -> list[RawObject]:
    """The results (without timestamps) for the jobs of one namespace, failing results first."""
    fails: list[RawObject] = []
    passes: list[RawObject] = []
    for job in audits:
        resource = {"apiVersion": api_version_of(job.kind), "kind": job.kind, "namespace": job.namespace,
                    "name": job.name}
        if job.uid:
            resource["uid"] = job.uid
        properties = {"zones": ",".join(f"{zone}={pods}" for zone, pods in sorted(job.zones.items())),
                      "pending": str(job.pending)}
        for rule in AUDIT_FINDING_TYPES:
            messages = [f.message for f in job.findings if f.type == rule]
            result: RawObject = {
                "policy": POLICY, "rule": rule, "category": CATEGORY, "severity": SEVERITY[rule],
                "source": SOURCE, "scored": True, "resources": [resource], "properties": properties,
            }
            if messages:
                result["result"] = "fail"
                result["message"] = "; ".join(messages)[:MESSAGE_LIMIT]
                fails.append(result)
            else:
                result["result"] = "pass"
                result["message"] = f"no {rule} finding"
                passes.append(result)
    return fails + passes


def build_report(namespace: str, results: list[RawObject]) -> RawObject:
    summary = {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}
    for result in results:
        summary[str(result["result"])] += 1
    return {
        "apiVersion": GROUP_VERSION, "kind": "PolicyReport",
        "metadata": {"name": REPORT_NAME, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "summary": summary,
        "results": results,
    }


@dataclass
class ReportStats:
    written: int = 0
    deleted: int = 0
    unchanged: int = 0
    errors: int = 0
    truncated: int = 0  # results left out of full reports
    served: bool = True


@dataclass
class _Known:
    resource_version: str
    results: list[RawObject] = field(default_factory=list)  # as written, timestamps included


class PolicyReportWriter:
    """Keeps one PolicyReport per audited namespace in step with the findings (module docstring)."""

    def __init__(
        self,
        api: Api,
        *,
        api_version_of: Callable[[str], str],
        recheck_seconds: float = DISCOVERY_RECHECK_SECONDS,
        max_results: int = MAX_RESULTS_PER_REPORT,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._api_version_of = api_version_of
        self._recheck = recheck_seconds
        self._max_results = max_results
        self._clock = clock
        self._wall = wall
        self._served: bool | None = None
        self._checked_at = 0.0
        self._known: dict[str, _Known] | None = None  # namespace -> our report; None until listed

    def forget(self) -> None:
        """Leadership lost: the next time, list the reports again (another leader may have written)."""
        self._known = None

    def served(self) -> bool:
        """Whether the apiserver serves PolicyReports (asked at most every `recheck_seconds`)."""
        now = self._clock()
        if self._served is not None and now - self._checked_at < self._recheck:
            return self._served
        self._checked_at = now
        try:
            found = self._api.request("GET", DISCOVERY_PATH)
            resources = found.get("resources") or []
            served = any(isinstance(r, dict) and r.get("name") == "policyreports" for r in resources)
        except ApiError as e:
            if not e.not_found:
                log.warning("audit: cannot discover PolicyReports, trying again later", extra={"error": str(e)})
                return bool(self._served)
            served = False
        if served != self._served:
            if served:
                log.info("audit: PolicyReports are served: writing one per namespace", extra={"api": GROUP_VERSION})
            else:
                log.info("audit: the PolicyReport CRD is not served: no PolicyReports written",
                         extra={"api": GROUP_VERSION})
            self._known = None
        self._served = served
        return served

    def sync(self, audits: Iterable[JobAudit]) -> ReportStats:
        stats = ReportStats()
        if not self.served():
            stats.served = False
            return stats
        if self._known is None and not self._list():
            stats.errors += 1
            return stats
        known = self._known
        assert known is not None
        by_namespace: dict[str, list[JobAudit]] = {}
        for job in audits:
            by_namespace.setdefault(job.namespace, []).append(job)
        now = int(self._wall())
        for namespace, jobs in sorted(by_namespace.items()):
            results = build_results(jobs, api_version_of=self._api_version_of)
            if len(results) > self._max_results:
                stats.truncated += len(results) - self._max_results
                log.warning("audit: PolicyReport results truncated", extra={
                    "namespace": namespace, "results": len(results), "kept": self._max_results})
                results = results[: self._max_results]
            previous = known.get(namespace)
            stamped = _stamp(results, previous.results if previous else [], now)
            if previous is not None and stamped == previous.results:
                stats.unchanged += 1
                continue
            self._write(namespace, stamped, previous, stats)
        for namespace in sorted(set(known) - set(by_namespace)):
            self._delete(namespace, stats)
        return stats

    def _list(self) -> bool:
        try:
            listed = self._api.request("GET", f"{DISCOVERY_PATH}/policyreports",
                                       query=[("labelSelector", "app.kubernetes.io/managed-by=topoguard")])
        except ApiError as e:
            log.warning("audit: cannot list PolicyReports", extra={"error": str(e)})
            return False
        known: dict[str, _Known] = {}
        for item in listed.get("items") or []:
            meta = item.get("metadata") or {}
            if meta.get("name") == REPORT_NAME:
                known[str(meta.get("namespace"))] = _Known(str(meta.get("resourceVersion", "")),
                                                           list(item.get("results") or []))
        self._known = known
        return True

    def _path(self, namespace: str, name: str = "") -> str:
        base = f"{DISCOVERY_PATH}/namespaces/{namespace}/policyreports"
        return f"{base}/{name}" if name else base

    def _write(self, namespace: str, results: list[RawObject], previous: _Known | None, stats: ReportStats) -> None:
        assert self._known is not None
        body = build_report(namespace, results)
        try:
            if previous is None:
                try:
                    stored = self._api.request("POST", self._path(namespace), body)
                except ApiError as e:
                    if e.status != HTTP_CONFLICT:
                        raise
                    current = self._api.request("GET", self._path(namespace, REPORT_NAME))
                    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                    stored = self._api.request("PUT", self._path(namespace, REPORT_NAME), body)
            else:
                body["metadata"]["resourceVersion"] = previous.resource_version
                try:
                    stored = self._api.request("PUT", self._path(namespace, REPORT_NAME), body)
                except ApiError as e:
                    if e.not_found:
                        del body["metadata"]["resourceVersion"]
                        stored = self._api.request("POST", self._path(namespace), body)
                    elif e.status == HTTP_CONFLICT:  # written by someone else since: take theirs, write ours
                        current = self._api.request("GET", self._path(namespace, REPORT_NAME))
                        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                        stored = self._api.request("PUT", self._path(namespace, REPORT_NAME), body)
                    else:
                        raise
        except ApiError as e:
            stats.errors += 1
            log.warning("audit: cannot write a PolicyReport", extra={"namespace": namespace, "error": str(e)})
            return
        self._known[namespace] = _Known(str((stored.get("metadata") or {}).get("resourceVersion", "")), results)
        stats.written += 1

    def _delete(self, namespace: str, stats: ReportStats) -> None:
        assert self._known is not None
        try:
            self._api.request("DELETE", self._path(namespace, REPORT_NAME))
        except ApiError as e:
            if not e.not_found:
                stats.errors += 1
                log.warning("audit: cannot delete a PolicyReport", extra={"namespace": namespace, "error": str(e)})
                return
        del self._known[namespace]
        stats.deleted += 1


def _stamp(results: list[RawObject], previous: list[RawObject], now: int) -> list[RawObject]:
    """`results` with timestamps: a result that is the same as before keeps its timestamp."""
    before = {_result_key(r): r for r in previous}
    out = []
    for result in results:
        old = before.get(_result_key(result))
        if old is not None and {k: v for k, v in old.items() if k != "timestamp"} == result:
            out.append(old)
        else:
            out.append({**result, "timestamp": {"seconds": now, "nanos": 0}})
    return out
