"""The reservation ledger: GPUs that admitted jobs will take in their zone but do not hold yet.

PURE (DESIGN.md "Round 2", Reservations). A stored training job that topoguard pinned
(`topoguard.io/zone`) and that is neither suspended nor finished reserves, in that zone, its GPU
demand minus the GPUs its pods already bound hold (those count as bound pods already). Free GPUs
of a zone = allocatable - bound pods - reservations. Every replica reads the same stored jobs, so
replicas agree without talking to each other.

A job's pods are told apart by the operators' own labels: `training.kubeflow.org/job-name` (with
`training.kubeflow.org/operator-name` naming the kind's operator, when the pod carries it) for the
Kubeflow kinds, `jobset.sigs.k8s.io/jobset-name` for JobSet and TrainJob (Trainer creates a JobSet
named after the TrainJob); or by their controller ownerReference naming the job (the Kubeflow
operators own their pods directly; JobSet pods are owned by a batch Job, hence the label). A job
deleted before its pods appear reserves nothing (it is no longer stored); pods that outlive their
job still count as bound.

The stored part (`Ledger`) is built once per snapshot. What one decision counts (`Reserved`) is that
ledger without the job under review (its own reservation, on a re-review) plus the replica's
in-flight holds (jobs it admitted that its watch has not shown yet), which the caller passes in as
a value: their number is bounded by the in-flight window, never by the jobs in the cluster.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from app.models.cluster import JobInfo, PodInfo, Snapshot, freeze
from app.models.labels import JOBSET_NAME_LABEL, KF_JOB_NAME, KF_OPERATOR_NAME

LEDGER_MEMO_KEY = "engine.ledger"

JobKey = tuple[str, str, str]  # (kind, namespace, name)


@dataclass(frozen=True)
class Hold:
    """GPUs one job reserves in one zone."""

    job: str  # "PyTorchJob research/train" (in-flight holds too)
    key: JobKey
    zone: str
    gpus: Mapping[str, int]  # still reserved per GPU resource (> 0)
    in_flight: bool = False  # admitted by this replica, not stored yet
    created: str = ""

    @property
    def total(self) -> int:
        return sum(self.gpus.values())

    def form(self) -> tuple[Hashable, ...]:
        """Plain, hashable form (for a decision's memo key)."""
        return (self.key, self.zone, tuple(sorted(self.gpus.items())))


@dataclass(frozen=True)
class Ledger:
    """The stored jobs' reservations of one snapshot."""

    holds: tuple[Hold, ...]  # by zone, then job
    by_zone: Mapping[str, Mapping[str, int]]  # zone -> GPU resource -> reserved
    by_job: Mapping[JobKey, Hold]
    stored: frozenset[JobKey]  # every stored job, pinned or not (in-flight holds end when theirs appears)

    def holders(self, zone: str) -> tuple[Hold, ...]:
        return tuple(h for h in self.holds if h.zone == zone)


OWNER_PREFIX = "owner:"  # the controller ownerReference's kind, in `_by_job`'s keys
# The operators' job-name pod labels (`JobInfo.pod_label` is one of these).
JOB_POD_LABELS = frozenset({KF_JOB_NAME, JOBSET_NAME_LABEL})


def _by_job(pods: Iterable[PodInfo], label_keys: frozenset[str]) -> dict[tuple[str, str, str], list[PodInfo]]:
    """Non-terminal pods (bound or pending) per (namespace, label key, value) for the operators' job-name
    labels, and per (namespace, OWNER_PREFIX + kind, name) for the pods whose controller is the job itself."""
    out: dict[tuple[str, str, str], list[PodInfo]] = defaultdict(list)
    for pod in pods:
        if pod.terminal:
            continue
        keys = [(key, value) for key in label_keys if (value := pod.labels.get(key))]
        if pod.owner[0]:
            keys.append((OWNER_PREFIX + pod.owner[0], pod.owner[1]))
        for key, value in keys:
            out[(pod.namespace, key, value)].append(pod)
    return out


def _belongs(pod: PodInfo, job: JobInfo) -> bool:
    operator = pod.labels.get(KF_OPERATOR_NAME)
    return not job.operators or not operator or operator in job.operators


def match_pods(jobs: Iterable[JobInfo], pods: Iterable[PodInfo]) -> dict[JobKey, tuple[PodInfo, ...]]:
    """Each job's non-terminal pods, bound or pending (see the module docstring), in the snapshot's order;
    a pod matched both by label and by owner counts once."""
    jobs = list(jobs)
    by_job = _by_job(pods, frozenset(j.pod_label for j in jobs))
    out: dict[JobKey, tuple[PodInfo, ...]] = {}
    for job in jobs:
        by_label = [p for p in by_job.get((job.namespace, job.pod_label, job.name), ()) if _belongs(p, job)]
        by_owner = by_job.get((job.namespace, OWNER_PREFIX + job.kind, job.name), [])
        out[(job.kind, job.namespace, job.name)] = tuple({id(p): p for p in (*by_label, *by_owner)}.values())
    return out


def job_pods(snapshot: Snapshot) -> Mapping[JobKey, tuple[PodInfo, ...]]:
    """`match_pods` over every stored job of the snapshot, built once per snapshot."""
    return snapshot.memo(f"{LEDGER_MEMO_KEY}/pods", lambda s: MappingProxyType(match_pods(s.jobs, s.pods)))


def is_job_pod(pod: PodInfo, job_kinds: Iterable[str]) -> bool:
    """Whether the pod may belong to a training job: it carries an operator's job-name label, or its
    controller is a job of one of `job_kinds` (what `match_pods` can match it by, before the job is seen)."""
    return any(pod.labels.get(k) for k in JOB_POD_LABELS) or pod.owner[0] in job_kinds


def reserves(job: JobInfo) -> bool:
    """Whether a stored job holds a reservation at all (pinned, not suspended, not finished)."""
    return bool(job.zone) and not job.suspended and not job.finished


def build_ledger(
    snapshot: Snapshot, *, gpu_resources: Sequence[str], stored: frozenset[JobKey] | None = None
) -> Ledger:
    """Every stored job's reservation (see the module docstring); `stored`: `stored_jobs(snapshot)`."""
    holding = [j for j in snapshot.jobs if reserves(j)]
    pods = match_pods(holding, snapshot.pods)
    holds: list[Hold] = []
    for job in holding:
        bound: dict[str, int] = defaultdict(int)
        for pod in pods[(job.kind, job.namespace, job.name)]:
            if not pod.node_name:
                continue  # a pending pod holds nothing yet: the reservation covers it
            for resource, count in pod.requests.items():
                bound[resource] += count
        left = {r: job.demand.get(r, 0) - bound[r] for r in gpu_resources}
        left = {r: n for r, n in left.items() if n > 0}
        if left:
            key = (job.kind, job.namespace, job.name)
            holds.append(Hold(job.ref, key, job.zone, freeze(left), created=job.created))
    holds.sort(key=lambda h: (h.zone, h.job))
    by_zone: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for hold in holds:
        for resource, count in hold.gpus.items():
            by_zone[hold.zone][resource] += count
    return Ledger(
        holds=tuple(holds),
        by_zone=freeze({z: freeze(dict(per)) for z, per in by_zone.items()}),
        by_job=MappingProxyType({h.key: h for h in holds}),
        stored=frozenset((j.kind, j.namespace, j.name) for j in snapshot.jobs) if stored is None else stored,
    )


def stored_jobs(snapshot: Snapshot) -> frozenset[JobKey]:
    """Every job the snapshot stores, by (kind, namespace, name); built once per snapshot."""
    return snapshot.memo(
        f"{LEDGER_MEMO_KEY}/stored", lambda s: frozenset((j.kind, j.namespace, j.name) for j in s.jobs)
    )


def ledger_of(snapshot: Snapshot, *, gpu_resources: Sequence[str]) -> Ledger:
    """The memoised `build_ledger` of this snapshot."""
    key = f"{LEDGER_MEMO_KEY}/{','.join(gpu_resources)}"
    # NB: built first: a memo builder must not build another memo (the lock is not reentrant).
    stored = stored_jobs(snapshot)
    return snapshot.memo(key, lambda s: build_ledger(s, gpu_resources=gpu_resources, stored=stored))


@dataclass(frozen=True)
class Reserved:
    """The reservations one decision counts: the snapshot's ledger, minus the job itself, plus in-flight holds."""

    by_zone: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: freeze({}))
    in_flight: tuple[Hold, ...] = ()
    # What sets this apart from the snapshot's own ledger, for the decision memo's key: the job's own
    # stored reservation left out (or None) and the in-flight holds counted.
    key: tuple[Hashable, ...] = ()

    def in_zone(self, zone: str, resources: Iterable[str]) -> int:
        per = self.by_zone.get(zone)
        return sum(per.get(r, 0) for r in resources) if per else 0


def reserved_for(
    snapshot: Snapshot, *, gpu_resources: Sequence[str], job: JobKey, in_flight: Sequence[Hold] = ()
) -> Reserved:
    """What the decision for `job` counts as reserved.

    Cost: the zones of the ledger plus the in-flight holds; independent of the stored jobs' number.
    """
    ledger = ledger_of(snapshot, gpu_resources=gpu_resources)
    own = ledger.by_job.get(job)
    flying = tuple(h for h in in_flight if h.key != job and h.key not in ledger.stored)
    if own is None and not flying:
        return Reserved(ledger.by_zone)
    totals = {z: dict(per) for z, per in ledger.by_zone.items()}
    if own is not None:
        for resource, count in own.gpus.items():
            totals[own.zone][resource] -= count
    for hold in flying:
        per = totals.setdefault(hold.zone, {})
        for resource, count in hold.gpus.items():
            if resource in gpu_resources:
                per[resource] = per.get(resource, 0) + count
    key = (own.form() if own else None, tuple(h.form() for h in flying))
    return Reserved(freeze({z: freeze(per) for z, per in totals.items()}), flying, key)
