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

import functools
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from app.engine.gpus import gpu_kinds
from app.models import pods as pods_model
from app.models.cluster import IdentityMemo, JobInfo, PodInfo, Snapshot, add_counts, canonical, freeze, pod_index
from app.models.labels import KF_OPERATOR_NAME

LEDGER_MEMO_KEY = "engine.ledger"
LEDGER_BY_SETTING_MEMO_KEY = f"{LEDGER_MEMO_KEY}/by-setting"  # (`ledger_of`)

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

    by_zone: Mapping[str, Mapping[str, int]]  # zone -> GPU resource -> reserved
    by_job: Mapping[JobKey, Hold]
    stored: frozenset[JobKey]  # every stored job, pinned or not (in-flight holds end when theirs appears)

    # NB: sorted when first read (explain, holders): a decision reads the totals only, and a publish under
    # churn would otherwise sort thousands of holds it changed a few of.
    @functools.cached_property
    def holds(self) -> tuple[Hold, ...]:
        """Every hold, by zone, then job."""
        return tuple(sorted(self.by_job.values(), key=lambda h: (h.zone, h.job)))

    def holders(self, zone: str) -> tuple[Hold, ...]:
        return tuple(h for h in self.holds if h.zone == zone)


# How a pod is found to be a job's: models/pods.py keeps the groups (job-name labels, controller owner).
OWNER_PREFIX = pods_model.OWNER_PREFIX
JOB_POD_LABELS = frozenset(pods_model.JOB_POD_LABELS)


def _belongs(pod: PodInfo, job: JobInfo) -> bool:
    operator = pod.labels.get(KF_OPERATOR_NAME)
    return not job.operators or not operator or operator in job.operators


@dataclass(frozen=True, slots=True)
class JobPods:
    """One job's non-terminal pods (bound or pending, by namespace and name), and what the bound ones request."""

    pods: tuple[PodInfo, ...]
    bound: Mapping[str, int]


# A job's pods change only when one of its two groups does (models/pods.py replaces a group's tuple only
# when its members change), so the match is kept by the identity of the job and the groups: under pod
# churn, a publish matches again only the jobs whose pods changed.
_MATCHED: IdentityMemo[JobPods] = IdentityMemo(4096)


def _match(job: JobInfo, by_label: tuple[PodInfo, ...], by_owner: tuple[PodInfo, ...]) -> JobPods:
    labelled = [p for p in by_label if _belongs(p, job)]
    found = {id(p): p for p in (*labelled, *by_owner)}.values() if by_owner and labelled else (labelled or by_owner)
    pods = tuple(sorted(found, key=lambda p: (p.namespace, p.name)))
    bound: dict[str, int] = defaultdict(int)
    for pod in pods:
        if pod.node_name:  # a pending pod holds nothing yet: the reservation covers it
            for resource, count in pod.requests.items():
                bound[resource] += count
    return JobPods(pods, freeze(bound))


def _group_keys(job: JobInfo) -> tuple[pods_model.GroupKey, pods_model.GroupKey]:
    """The keys of the job's pod groups: by its operator's job-name label, and by controller owner."""
    return (job.namespace, job.pod_label, job.name), (job.namespace, OWNER_PREFIX + job.kind, job.name)


def _groups_of(
    job: JobInfo, groups: Mapping[pods_model.GroupKey, tuple[PodInfo, ...]]
) -> tuple[tuple[PodInfo, ...], tuple[PodInfo, ...]]:
    """The job's pod groups (`_group_keys`)."""
    by_label, by_owner = _group_keys(job)
    return groups.get(by_label, ()), groups.get(by_owner, ())


def matched(job: JobInfo, groups: Mapping[pods_model.GroupKey, tuple[PodInfo, ...]]) -> JobPods:
    """The job's pods (see the module docstring) from the pods' groups (`PodIndex.groups`); a pod matched
    both by label and by owner counts once."""
    by_label, by_owner = _groups_of(job, groups)
    return _MATCHED.get((job, by_label, by_owner), lambda: _match(job, by_label, by_owner))


def match_pods(
    jobs: Iterable[JobInfo], groups: Mapping[pods_model.GroupKey, tuple[PodInfo, ...]]
) -> dict[JobKey, tuple[PodInfo, ...]]:
    """Each job's non-terminal pods, bound or pending (`matched`)."""
    jobs = tuple(jobs)
    _MATCHED.fit(len(jobs))
    return {(job.kind, job.namespace, job.name): matched(job, groups).pods for job in jobs}


def job_pods(snapshot: Snapshot) -> Mapping[JobKey, tuple[PodInfo, ...]]:
    """`match_pods` over every stored job of the snapshot, built once per snapshot (its cost: the jobs' pods)."""
    return snapshot.memo(
        f"{LEDGER_MEMO_KEY}/pods", lambda s: MappingProxyType(match_pods(s.jobs, pod_index(s).groups))
    )


def is_job_pod(pod: PodInfo, job_kinds: Iterable[str]) -> bool:
    """Whether the pod may belong to a training job: it carries an operator's job-name label, or its
    controller is a job of one of `job_kinds` (what `match_pods` can match it by, before the job is seen)."""
    return any(pod.labels.get(k) for k in JOB_POD_LABELS) or pod.owner[0] in job_kinds


def reserves(job: JobInfo) -> bool:
    """Whether a stored job holds a reservation at all (pinned, not suspended, not finished)."""
    return bool(job.zone) and not job.suspended and not job.finished


@dataclass(frozen=True)
class _Built:
    """A ledger as last built for some GPU resources, and what it was built from."""

    jobs: tuple[JobInfo, ...]  # the snapshot's jobs (by identity)
    pods: int  # the serial of the pod index read (models/pods.py PodIndex.serial)
    ledger: Ledger


# Per GPU resources: the ledger last built. The next snapshot's starts from it when it has the same jobs and
# its pod index is the same or the next one (PodIndex.changes_since): only the jobs whose pod groups changed
# are held again, so a publish under pod churn costs the changes, not the stored jobs. Any other snapshot
# (jobs changed, a snapshot from files) starts from nothing: every holding job, through the same loop.
_LAST: IdentityMemo[list[_Built]] = IdentityMemo(16)
# Per tuple of holding jobs: which of them each pod group can hold (by job-name label, by owner).
_BY_GROUP: IdentityMemo[Mapping[pods_model.GroupKey, tuple[JobInfo, ...]]] = IdentityMemo(8)


def _jobs_by_group(holding: tuple[JobInfo, ...]) -> Mapping[pods_model.GroupKey, tuple[JobInfo, ...]]:
    def build() -> Mapping[pods_model.GroupKey, tuple[JobInfo, ...]]:
        found: dict[pods_model.GroupKey, list[JobInfo]] = defaultdict(list)
        for job in holding:
            for key in set(_group_keys(job)):
                found[key].append(job)
        return {key: tuple(jobs) for key, jobs in found.items()}
    return _BY_GROUP.get((holding,), build)


def build_ledger(snapshot: Snapshot, *, gpu_resources: Sequence[str]) -> Ledger:
    """Every stored job's reservation (see the module docstring)."""
    stored, holding = _stored(snapshot.jobs)
    index = pod_index(snapshot)
    resources = canonical(tuple(gpu_resources))
    box = _LAST.get((resources,), list)
    last = box[0] if box else None  # NB: read once; another thread may replace it meanwhile
    changed = index.changes_since(last.pods) if last is not None and last.jobs is snapshot.jobs else None
    if last is not None and changed is not None:
        if not changed.groups:
            return last.ledger
        by_group = _jobs_by_group(holding)
        again: Iterable[JobInfo] = {id(job): job for key in changed.groups for job in by_group.get(key, ())}.values()
        by_job, by_zone = dict(last.ledger.by_job), {zone: dict(per) for zone, per in last.ledger.by_zone.items()}
    else:
        again, by_job, by_zone = holding, {}, {}
    _MATCHED.fit(len(snapshot.jobs))
    _HOLDS.fit(len(holding))
    for job in again:
        key = (job.kind, job.namespace, job.name)
        old = by_job.pop(key, None)
        if old is not None:
            add_counts(by_zone[old.zone], old.gpus, -1)
        by_label, by_owner = _groups_of(job, index.groups)
        hold = _HOLDS.get((job, by_label, by_owner, resources),
                          functools.partial(_hold, job, by_label, by_owner, resources))
        if hold is not None:
            by_job[key] = hold
            add_counts(by_zone.setdefault(hold.zone, {}), hold.gpus, +1)
    made = Ledger(
        by_zone=freeze({z: freeze(per) for z, per in sorted(by_zone.items()) if per}),
        by_job=MappingProxyType(by_job),
        stored=stored,
    )
    box[:] = [_Built(snapshot.jobs, index.serial, made)]
    return made


# A stored job's hold reads the job and its two pod groups alone: kept by their identity, so a publish
# after pod churn recomputes only the holds of the jobs whose pods changed.
_HOLDS: IdentityMemo[Hold | None] = IdentityMemo(4096)


def _hold(job: JobInfo, by_label: tuple[PodInfo, ...], by_owner: tuple[PodInfo, ...],
          gpu_resources: tuple[str, ...]) -> Hold | None:
    """What the job still reserves: its demand less its bound pods' GPUs (None: nothing left)."""
    bound = _MATCHED.get((job, by_label, by_owner), lambda: _match(job, by_label, by_owner)).bound
    left = {r: job.demand.get(r, 0) - bound.get(r, 0) for r in gpu_resources}
    left = {r: n for r, n in left.items() if n > 0}
    if not left:
        return None
    return Hold(job.ref, (job.kind, job.namespace, job.name), job.zone, freeze(left), created=job.created)


# What reads the stored jobs alone, by the identity of the snapshot's jobs (the watch cache reuses the tuple
# while no job changes): the keys of every stored job, and the jobs that hold a reservation.
_STORED: IdentityMemo[tuple[frozenset[JobKey], tuple[JobInfo, ...]]] = IdentityMemo(8)


def _stored(jobs: tuple[JobInfo, ...]) -> tuple[frozenset[JobKey], tuple[JobInfo, ...]]:
    return _STORED.get((jobs,), lambda: (frozenset((j.kind, j.namespace, j.name) for j in jobs),
                                         tuple(j for j in jobs if reserves(j))))


def stored_jobs(snapshot: Snapshot) -> frozenset[JobKey]:
    """Every job the snapshot stores, by (kind, namespace, name)."""
    return _stored(snapshot.jobs)[0]


def ledger_of(snapshot: Snapshot, *, gpu_resources: Sequence[str]) -> Ledger:
    """The memoised `build_ledger` of this snapshot (`gpuResources` resolved by `gpus.gpu_kinds`)."""
    # NB: found by the setting as given first: every review asks, and resolving the names (`gpu_kinds`, an
    # identity memo over the nodes) and spelling the memo key cost more than the lookup.
    setting = gpu_resources if isinstance(gpu_resources, tuple) else tuple(gpu_resources)
    by_setting = snapshot.memo(LEDGER_BY_SETTING_MEMO_KEY, _by_setting)
    found = by_setting.get(setting)
    if found is None:
        found = by_setting[setting] = _ledger_of(snapshot, setting)
    return found


def _by_setting(_: Snapshot) -> dict[tuple[str, ...], Ledger]:
    return {}


def _ledger_of(snapshot: Snapshot, gpu_resources: Sequence[str]) -> Ledger:
    gpu_resources = gpu_kinds(snapshot, gpu_resources)
    key = f"{LEDGER_MEMO_KEY}/{','.join(gpu_resources)}"
    return snapshot.memo(key, lambda s: build_ledger(s, gpu_resources=gpu_resources))


ZoneTotals = Mapping[str, Mapping[str, int]]  # zone -> GPU resource -> GPUs
TotalsForm = tuple[tuple[str, tuple[tuple[str, int], ...]], ...]


def _form(totals: ZoneTotals) -> TotalsForm:
    """Plain, hashable form of per-zone totals (zero entries left out), for a decision's memo key."""
    form = []
    for zone in sorted(totals):  # NB: loops, not comprehensions (each a call in 3.11): once per review
        held = []
        for item in totals[zone].items():  # (resource, GPUs)
            if item[1]:
                held.append(item)
        if held:
            form.append((zone, tuple(held) if len(held) == 1 else tuple(sorted(held))))
    return tuple(form)


@dataclass(frozen=True)
class Reserved:
    """The reservations one decision counts: the snapshot's ledger, minus the job itself, plus in-flight holds."""

    by_zone: ZoneTotals = field(default_factory=lambda: freeze({}))
    # What sets this apart from the snapshot's own ledger, for the decision memo's key: the job's own
    # stored reservation left out (or None) and the in-flight totals counted. Its size is the zones',
    # never the holds': two reviews that count the same GPUs share a memo entry.
    key: tuple[Hashable, ...] = ()

    def in_zone(self, zone: str, resources: Iterable[str]) -> int:
        per = self.by_zone.get(zone)
        total = 0
        if per:
            for r in resources:  # NB: a loop, not sum() over a generator: called per zone and review
                total += per.get(r, 0)
        return total


def reserved_for(
    snapshot: Snapshot, *, gpu_resources: Sequence[str], job: JobKey, in_flight: ZoneTotals | None = None
) -> Reserved:
    """What the decision for `job` counts as reserved.

    `in_flight`: per zone, the GPUs the replica's in-flight holds keep for other jobs not stored yet
    (admission/inflight.py `InFlight.totals`).
    Cost: the zones of the ledger and of the in-flight totals; independent of the stored jobs' and
    the holds' number.
    """
    ledger = ledger_of(snapshot, gpu_resources=gpu_resources)
    own = ledger.by_job.get(job)
    flying: TotalsForm = _form(in_flight) if in_flight else ()
    if own is None and not flying:
        return Reserved(ledger.by_zone)
    # Only the zones the job's own hold or the in-flight totals change are copied; the others stay the ledger's.
    # (Each copy is made here and never handed out but read-only, so it is wrapped, not copied again by freeze.)
    totals: dict[str, Mapping[str, int]] = dict(ledger.by_zone)
    if own is not None:
        per = dict(totals[own.zone])
        for resource, count in own.gpus.items():
            per[resource] -= count
        totals[own.zone] = MappingProxyType(per)
    for zone, held in flying:
        stored = totals.get(zone)
        per = dict(stored) if stored else {}
        for resource, count in held:
            if resource in gpu_resources:
                per[resource] = per.get(resource, 0) + count
        totals[zone] = MappingProxyType(per)
    return Reserved(MappingProxyType(totals), (own.form() if own else None, flying))
