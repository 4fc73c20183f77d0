"""Events for policy changes that break training jobs: one Warning Event on each job a stored change breaks.

The validating webhook on policy objects (app/admission/policy_changes.py) admits a breaking change under `warn`
with warnings, which GitOps tools may hide (Argo CD logs admission warnings without showing them): the job's
owner then sees the Event on the job (`kubectl describe`, `kubectl events`) the moment the change is stored,
not at the audit's next pass. Never for a dry run (the webhook is `sideEffects: None`).

Deduplicated as the audit's Events are (app/controller/events.py, the same recorder): the Event's name is
derived from (job uid, reason, note), so the same change judged again (a re-apply, another replica) continues
the Event's series instead of adding one. Reason `TopoguardPolicyChange`, action `PolicyChange`, reporting
controller `topoguard.io/policy-changes`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence

from app.controller.api import Api, build_api
from app.controller.events import EventRecorder, EventStats
from app.controller.loop import job_api_version, pod_identity
from app.engine.audit import AuditFinding, JobAudit
from app.engine.whatif import Change, JobImpact

REPORTING_CONTROLLER = "topoguard.io/policy-changes"
ACTION = "PolicyChange"
FLOWS_NAMED = 3


def finding(change: Change, job: JobImpact) -> AuditFinding:
    """What the Event says: the change, then the flows it breaks (before → after, the deciding rule)."""
    broken = [f for f in job.flows if f.breaks]
    more = f" (+{len(broken) - FLOWS_NAMED} more)" if len(broken) > FLOWS_NAMED else ""
    message = (f"{change.action.capitalize()} of {change.ref} breaks connections this job needs: "
               + "; ".join(f.describe() for f in broken[:FLOWS_NAMED]) + more)
    policies = tuple(dict.fromkeys(f.policy for f in broken if f.policy))
    return AuditFinding("policy-change", message, flows=tuple(f.to_json(job.namespace) for f in broken),
                        policies=policies)


def build_policy_events(*, kubeconfig: str | None, environ: Mapping[str, str] | None = None) -> PolicyChangeEvents:
    """The recorder `topoguard serve` wires into the webhook (raises ClientConfigError when no client can be
    configured)."""
    _, identity = pod_identity(os.environ if environ is None else environ)
    return PolicyChangeEvents(build_api(kubeconfig), instance=identity)


class PolicyChangeEvents:
    """Called by the webhook, off the event loop, for each stored change that breaks jobs."""

    def __init__(self, api: Api, *, instance: str) -> None:
        self._recorder = EventRecorder(api, instance=instance, api_version_of=job_api_version,
                                       controller=REPORTING_CONTROLLER, action=ACTION)
        self._lock = threading.Lock()  # one change at a time: the recorder keeps series state

    def __call__(self, change: Change, jobs: Sequence[JobImpact]) -> EventStats:
        audits = [JobAudit(kind=j.kind, namespace=j.namespace, name=j.name, uid=j.uid, zones={}, pending=0,
                           findings=(finding(change, j),)) for j in jobs]
        with self._lock:
            return self._recorder.record(audits)
