"""The audit of running training jobs: the live map (DESIGN.md "Round 2", Audit; issue 12).

PURE: snapshot in, findings out. The loop that runs it, leader election and everything that
writes to the API (Events, PolicyReports, metrics) live above the cache (app/controller).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.config import Settings
from app.models.cluster import Snapshot

AUDIT_FINDING_TYPES = ("split", "blocked", "unknown", "zone-closed")

_REASONS: Mapping[str, str] = {
    "split": "TopoguardSplit",
    "blocked": "TopoguardBlocked",
    "unknown": "TopoguardUnknown",
    "zone-closed": "TopoguardZoneClosed",
}


@dataclass(frozen=True)
class AuditFinding:
    """One thing that goes wrong with a running job, deduplicated per (type, role pair)."""

    type: str  # one of AUDIT_FINDING_TYPES
    # One sentence an ML engineer understands, leading with what goes wrong, e.g. "Worker pods in
    # zone-a cannot reach Master in zone-b on TCP 23456: CiliumNetworkPolicy ml-demo/allow-intra-zone-b".
    message: str
    flows: tuple[Mapping[str, Any], ...] = ()  # JSON-ready flow descriptions (src, dst, port, verdict, policies)
    policies: tuple[str, ...] = ()  # refs of the policies involved ("CiliumNetworkPolicy ml-demo/x")

    @property
    def reason(self) -> str:
        """The Kubernetes Event reason: TopoguardSplit | TopoguardBlocked | TopoguardUnknown | TopoguardZoneClosed."""
        return _REASONS[self.type]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "flows": [dict(f) for f in self.flows]}


@dataclass(frozen=True)
class JobAudit:
    """One training job as the audit sees it."""

    kind: str
    namespace: str
    name: str
    uid: str
    zones: Mapping[str, int]  # zone -> number of bound, non-terminal pods of the job
    pending: int  # unbound, non-terminal pods of the job
    findings: tuple[AuditFinding, ...]

    @property
    def ref(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "zones": dict(self.zones),
            "pending": self.pending,
            "findings": [f.to_json() for f in self.findings],
        }


def audit(snapshot: Snapshot, settings: Settings) -> tuple[JobAudit, ...]:
    """Every training job in settings.audit.scope (opted-in namespaces | all), sorted by (namespace, kind, name);
    jobs without findings are included with findings=()."""
    raise NotImplementedError("audit: interface only; the engine follows on branch audit-engine")
