"""The validating webhook on policy objects: POST /validate-policy (DESIGN.md "Round 3", What-if).

PURE like admission.py: a parsed AdmissionReview for a CiliumNetworkPolicy, CiliumClusterwideNetworkPolicy,
NetworkPolicy or ClusterNetworkPolicy (CREATE, UPDATE, DELETE) in, the response AdmissionReview out, computed
from the cached snapshot only (never the API) by the what-if engine (app/engine/whatif.py).

- `warn` (the default, `policyChanges.enforcement`): a change that would break a training job's required flow
  is admitted with warnings naming the jobs and the flows; one that would make some `unknown`, too.
- `deny`: the breaking change is refused (403) naming them. Per namespace, the label
  `topoguard.io/policy-changes=deny|warn` overrides the setting for namespaced policies. A policy annotated
  `topoguard.io/break-glass: "true"` is admitted with its warnings even then: security must always be able
  to isolate a workload.
- A namespaced policy can only select pods of its own namespace, so its answer names only that namespace's
  jobs: never another tenant's.
- A change to a policy that selects topoguard's own pods always warns: a policy that cuts the apiserver's
  path to the webhook turns it off (failurePolicy Ignore admits everything unchecked), one that cuts
  topoguard's path to the apiserver freezes its cache.
- Whatever cannot be judged (cache not synced, the deadline, an unreadable object) is admitted with a warning
  saying so: this webhook never blocks a policy change it did not judge.

`dry_run` reviews (kubectl apply --dry-run=server) get the same answer: that is the preview. The caller
leaves Events on the broken jobs only for changes that are stored (`PolicyOutcome.events`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from app.admission import responses
from app.cache import projections
from app.config import Settings
from app.engine import whatif
from app.engine.whatif import Change, JobImpact, WhatIf
from app.models.admission import ReviewRequest
from app.models.cluster import PodInfo, Snapshot
from app.models.labels import BREAK_GLASS_ANNOTATION, POLICY_CHANGES_LABEL

OutcomeName = Literal["unchanged", "warned", "denied", "skipped", "error"]
JOBS_NAMED = 5  # jobs named one by one in a refusal or in the warnings; the rest are counted


@dataclass(frozen=True)
class PolicyOutcome:
    review: dict[str, Any]
    outcome: OutcomeName
    result: WhatIf | None = None
    dry_run: bool = False

    @property
    def events(self) -> tuple[JobImpact, ...]:
        """The jobs to leave an Event on: broken by a change that is stored (not a dry run, not refused)."""
        if self.result is None or self.dry_run or self.outcome == "denied":
            return ()
        return self.result.broken


def change_of(request: ReviewRequest) -> Change | None:
    """The change a review asks for; None for what is not a policy change topoguard judges (another kind, a
    subresource, CONNECT)."""
    kind = request.kind.kind
    if kind not in whatif.POLICY_KINDS or request.sub_resource:
        return None
    if request.operation == "DELETE":
        obj = request.old_object or {}
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
        namespace = request.namespace or str((meta or {}).get("namespace") or "")
        name = request.name or str((meta or {}).get("name") or "")
        return Change.delete(kind, namespace, name) if name else None
    if request.operation not in ("CREATE", "UPDATE") or request.obj is None:
        return None
    obj = dict(request.obj)
    if request.namespace and kind not in whatif.CLUSTER_SCOPED_KINDS:
        meta = dict(obj.get("metadata") or {})
        meta.setdefault("namespace", request.namespace)
        obj["metadata"] = meta
    return Change.apply(projections.project_policy(obj))


def enforcement(snapshot: Snapshot, settings: Settings, change: Change) -> str:
    if change.namespace:
        value = snapshot.namespace_labels(change.namespace).get(POLICY_CHANGES_LABEL, "")
        if value in ("warn", "deny"):
            return value
    return settings.policy_changes.enforcement


def own_pods(snapshot: Snapshot, namespace: str, name: str) -> tuple[PodInfo, ...]:
    """topoguard's own pods in the snapshot: this pod (POD_NAMESPACE/POD_NAME) and its siblings (the pods of its
    namespace carrying its `app.kubernetes.io/instance` and `name` labels); () outside a cluster."""
    if not namespace or not name:
        return ()
    pods = [p for p in snapshot.pods if p.namespace == namespace]
    me = next((p for p in pods if p.name == name), None)
    if me is None:
        return ()
    keys = ("app.kubernetes.io/name", "app.kubernetes.io/instance")
    mine = {k: me.labels.get(k) for k in keys}
    return tuple(p for p in pods if all(p.labels.get(k) == v for k, v in mine.items()))


def answer(request: ReviewRequest, *, snapshot: Snapshot, settings: Settings, cache_problem: str | None = None,
           own: Sequence[PodInfo] = ()) -> PolicyOutcome:
    """The response AdmissionReview for one policy review (see the module docstring)."""
    dry_run = bool(request.dry_run)
    change = change_of(request)
    uid = request.uid
    if change is None:
        return PolicyOutcome(responses.allowed(uid), "skipped", dry_run=dry_run)
    subject = f"{change.ref}"
    if cache_problem is not None:
        text = f"topoguard: {subject} was not checked against the training jobs: {cache_problem}"
        return PolicyOutcome(responses.allowed(uid, warnings=[text]), "warned", dry_run=dry_run)
    try:
        result = whatif.what_if(snapshot, settings, [change],
                                namespaces={change.namespace} if change.namespace else None)
    except whatif.ChangeError:
        # A delete of an object the cache does not hold yet (just created): nothing it held can break.
        return PolicyOutcome(responses.allowed(uid), "unchanged", dry_run=dry_run)
    warnings = _self_warnings(snapshot, settings, change, own)
    if result.outcome == "clean":
        if warnings:
            return PolicyOutcome(responses.allowed(uid, warnings=warnings), "warned", result, dry_run)
        return PolicyOutcome(responses.allowed(uid, audit={"whatIf": "clean"}), "unchanged", result, dry_run)
    mode = enforcement(snapshot, settings, change)
    glass = _break_glass(request)
    if result.broken and mode == "deny" and not glass:
        message = (f"topoguard: {subject} would break the required connections of {_flows(result.broken)}. "
                   f"`topoguard what-if` shows every flow; annotate the policy {BREAK_GLASS_ANNOTATION}=\"true\" "
                   "to apply it anyway")
        review = responses.refused(uid, code=403, message=message, warnings=warnings,
                                   audit={"whatIf": "breaks", "outcome": "denied"})
        return PolicyOutcome(review, "denied", result, dry_run)
    head = _summary(subject, result, mode, glass)
    lines = [head, *(line for j in (*result.broken, *result.unknown)[:JOBS_NAMED] for line in _job_lines(j))]
    review = responses.allowed(uid, warnings=[*warnings, *lines], audit={"whatIf": result.outcome})
    return PolicyOutcome(review, "warned", result, dry_run)


def _break_glass(request: ReviewRequest) -> bool:
    meta = (request.obj or {}).get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return isinstance(annotations, Mapping) and annotations.get(BREAK_GLASS_ANNOTATION) == "true"


def _flows(jobs: Sequence[JobImpact]) -> str:
    """`PyTorchJob ml/a: Worker → Master ...; PyTorchJob ml/b: ...` (the first JOBS_NAMED jobs, the rest counted)."""
    named = "; ".join(f"{j.ref}: " + ", ".join(f.describe() for f in j.flows if f.breaks) for j in jobs[:JOBS_NAMED])
    more = len(jobs) - JOBS_NAMED
    return f"{named}; and {more} more job{'s' if more != 1 else ''}" if more > 0 else named


def _summary(subject: str, result: WhatIf, mode: str, glass: bool) -> str:
    broken, unknown = len(result.broken), len(result.unknown)
    parts = []
    if broken:
        parts.append(f"would break the required connections of {broken} training job{'s' if broken != 1 else ''}")
    if unknown:
        parts.append(f"makes the connections of {unknown} job{'s' if unknown != 1 else ''} impossible to judge")
    why = " (break-glass)" if glass and mode == "deny" else f" (policyChanges.enforcement={mode})"
    return f"topoguard: {subject} {' and '.join(parts)}; admitted{why}; the next warnings name them"


def _job_lines(job: JobImpact) -> list[str]:
    """One warning per flow that breaks (or becomes unknown), the first two of the job (a warning holds 256
    characters)."""
    flows = [f for f in job.flows if f.breaks] or [f for f in job.flows if f.after == "unknown"]
    return [f"{job.ref}: {f.describe()}" for f in flows[:2]]


def _self_warnings(snapshot: Snapshot, settings: Settings, change: Change, own: Sequence[PodInfo]) -> list[str]:
    """A warning when the change's rules select topoguard's own pods: it may cut the apiserver's path to the
    webhook or topoguard's path to the apiserver."""
    if not own or not whatif.selects_pods(snapshot, settings, [change], own):
        return []
    pod = own[0]
    return [f"topoguard: {change.ref} selects topoguard's own pods ({pod.namespace}/{pod.name}): make sure it still "
            "allows ingress from the kube-apiserver to the webhook port and egress to the kube-apiserver; a cut "
            "webhook admits everything unchecked (failurePolicy Ignore)"]
