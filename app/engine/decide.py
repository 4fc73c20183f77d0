"""The placement decision: which zone a training group goes to, or why none can take it.

PURE: every input is an argument (group, snapshot, settings); the same arguments give the same
`Decision`. Steps (DESIGN.md "The decision, in order", 2-5):

1. Candidate zones are anchored on the GPU replicas (zones.fit_zone); a CPU-only coordinator
   never anchors, it follows the workers and gets the GPU-pool tolerations it lacks.
2. Capacity: free GPUs per zone on the nodes the GPU replicas can use, with per-node fit, less what
   admitted jobs reserve there (engine/ledger.py); a zone where the job fits only once running work
   ends still takes it under capacityPolicy wait (`fit_capacity`, `rank_key`).
3. Network: every flow of the group simulated with the pods as they will be labelled in the zone.
4. Choice among zones that fit and are open (`zoneStrategy`); user pins restrict the candidates.

`decide_fresh` is the mutating path (topoguard may add tolerations and the zone identity label);
`validation.validate_fresh` judges the job as written with the same building blocks (`start_run`,
`report_zone`, ...). Neither applies deny/warn enforcement: they return allowed=False with reasons
and the HTTP layer decides what to do with them. `engine.decide` / `engine.validate` are these two,
memoized per snapshot (engine/cached.py).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from app import policy
from app.config import Settings
from app.engine import capacity, lead, ledger, memo, nodes, zones
from app.engine.flows import FlowChecker, describe_check
from app.engine.gpus import Devices, gpu_kinds, with_devices
from app.models.cluster import IdentityMemo, Snapshot, Taint
from app.models.decision import Decision, FlowCheck, ZoneReport
from app.models.dra import COMPUTE_DOMAIN_LABEL
from app.models.job import JobGroup, Replica
from app.models.network import PolicyEnforcement


@dataclass
class Shape:
    """What every job of one shape shares on a snapshot (`memo.per_shape`): the flow checker with its
    verdicts, and the zones' fits per strictness. Neither reads capacity."""

    checker: FlowChecker
    # The snapshot's zone index for the settings (`capacity.zone_index`): the shape's key holds the settings
    # and the shape lives with the snapshot, so a review of a known shape does not look it up again.
    index: capacity.ZoneIndex
    fits: dict[bool, tuple[zones.ZoneFit, ...]] = field(default_factory=dict)
    # Per (strictness, zone): what a zone's row owes to the shape and the snapshot alone, never to the
    # reservations (`_zone_basis`); only the reservations change from one review of the shape to the next.
    rows: dict[tuple[bool, str], _ZoneBasis] = field(default_factory=dict)
    # Per (strictness, suspended, zone): the same for the zone's capacity (`_capacity_basis`).
    capacity: dict[tuple[bool, bool, str], _CapacityBasis] = field(default_factory=dict)
    # Per strictness: the candidate zones and what `_decide` says whatever the reservations (`_plan`).
    plans: dict[bool, _Plan] = field(default_factory=dict)
    # (strictness, suspended) of the decisions made on this shape that read nothing but the above and the
    # reservations (no DRA devices to resolve, no NVLink cliques): another one costs microseconds (`is_warm`).
    warm: set[tuple[bool, bool]] = field(default_factory=set)
    # `warnings_for`, with how many replicas the checker had truncated when it was worked out (`truncated`
    # only gains entries, one per replica key: flows.py `_enumerate`); the rest it reads is the snapshot's.
    warnings: tuple[int, tuple[str, ...]] | None = None


def mark_warm(run: Run, group: JobGroup) -> None:
    """Note that a decision for `group` was made on `run`'s shape: the next one under other reservations only
    counts them, unless the group's devices had to be resolved (`gpus.with_devices` gave another group)."""
    if run.devices is not None and run.devices.group is group and not run.problems:
        run.shape.warm.add((run.strict, run.suspended))


@dataclass
class Run:
    """One evaluation: the inputs, the zone index and what the group's shape shares."""

    group: JobGroup
    snapshot: Snapshot
    settings: Settings
    strict: bool
    index: capacity.ZoneIndex
    shape: Shape
    reserved: ledger.Reserved = field(default_factory=ledger.Reserved)  # GPUs admitted jobs will take
    suspended: bool = False  # held by a queue manager: placed by network and total allocatable only
    # Why some replica's devices cannot be judged (a claim template that does not exist, a selector that
    # cannot be evaluated): the job is then not placed blind (engine/gpus.py with_devices).
    problems: tuple[str, ...] = ()
    devices: Devices | None = None  # the group as resolved by `gpus.with_devices` (its ComputeDomain)

    @property
    def checker(self) -> FlowChecker:
        return self.shape.checker

    def ranges(self, zone: str) -> tuple[str, ...]:
        """The pod CIDRs of the zone's nodes when the agent matches CIDR peers against pods
        (policy-cidr-match-mode pods), else (); () too when some node of the zone has none (then unknown)."""
        agent = self.checker.agent
        if agent is None or "pods" not in agent.cidr_match_mode:
            return ()
        nodes = [n for n in self.snapshot.nodes if n.labels.get(self.settings.zone_label) == zone]
        if not nodes or any(not n.pod_cidrs for n in nodes):
            return ()
        return tuple(dict.fromkeys(c for n in nodes for c in n.pod_cidrs))

    def overrides(self, zone: str) -> dict[str, str]:
        """Labels every pod carries in `zone`: the identity label, unless judging the job as written."""
        if self.settings.zone_identity_label and not self.strict:
            return {self.settings.zone_identity_label: zone}
        return {}


def prepare(snapshot: Snapshot, settings: Settings) -> None:
    """Build the per-snapshot indexes a decision reads, so the first request does not pay for them."""
    capacity.zone_index(snapshot, zone_label=settings.zone_label, gpu_resources=settings.gpu_resources,
                        gpu_device_classes=settings.gpu_device_classes)
    capacity.pack_memo(snapshot)
    ledger.ledger_of(snapshot, gpu_resources=settings.gpu_resources)
    policy.build_index(snapshot)
    policy.label_keys_mentioned(snapshot)
    memo.keys_read(snapshot)
    unreadable_gpus(snapshot, settings.gpu_resources)


def job_key(group: JobGroup) -> ledger.JobKey:
    """The group's identity in the reservation ledger."""
    return (group.kind, group.namespace, group.name)


def start_run(
    group: JobGroup,
    snapshot: Snapshot,
    settings: Settings,
    *,
    strict: bool,
    reserved: ledger.Reserved | None = None,
    suspended: bool = False,
    shape_key: memo.DecisionKey | None = None,
) -> Run:
    """Begin one evaluation on the snapshot's memoised zone index, with the flow checker (and its
    verdicts) every job of the group's shape shares on this snapshot (`memo.shared_checker`).

    `reserved` defaults to the snapshot's stored reservations without the group's own. The group's replicas
    get the GPUs their DRA claims and mapped extended resources ask for (`gpus.with_devices`). `shape_key`:
    the group's `network_key`, when the caller has it (`engine.pending` does).
    """
    resolved = with_devices(group, snapshot, settings.gpu_resources, settings.gpu_device_classes)
    return _run(resolved.group, snapshot, settings, strict=strict, reserved=reserved, suspended=suspended,
                devices=resolved, shape_key=shape_key if resolved.group is group else None)


def _run(group: JobGroup, snapshot: Snapshot, settings: Settings, *, strict: bool, reserved: ledger.Reserved | None,
         suspended: bool, devices: Devices, shape_key: memo.DecisionKey | None = None) -> Run:
    """`start_run` for a group whose devices are resolved already."""
    shape = memo.per_shape(group, snapshot, settings, lambda: _new_shape(group, snapshot, settings), key=shape_key)
    if reserved is None:
        reserved = ledger.reserved_for(snapshot, gpu_resources=settings.gpu_resources, job=job_key(group))
    return Run(group, snapshot, settings, strict, shape.index, shape, reserved, suspended, devices.problems, devices)


def _new_shape(group: JobGroup, snapshot: Snapshot, settings: Settings) -> Shape:
    index = capacity.zone_index(snapshot, zone_label=settings.zone_label, gpu_resources=settings.gpu_resources,
                                gpu_device_classes=settings.gpu_device_classes)
    agent = policy.snapshot_agent(snapshot, settings.cilium_version, settings.explicit_policy_enforcement())
    # NB: the checker is kept in the snapshot's own memo, so it refers to the snapshot weakly: a strong
    # reference would be a cycle, and a replaced snapshot would wait for a full collection (the server
    # freezes the heap after each publish: app/http/app.py settle_heap) instead of going at once.
    checker = FlowChecker(
        group=group,
        snapshot=weakref.proxy(snapshot),
        enforcement=cast(PolicyEnforcement, agent.policy_enforcement),
        mentioned=policy.label_keys_mentioned(snapshot),
        index_values_limit=settings.limits.policy_index_values_per_job,
        agent=agent,
    )
    return Shape(checker, index)


def fit_zones(run: Run) -> tuple[zones.ZoneFit, ...]:
    """Every zone of the index fitted for the run's group (once per shape, snapshot and strictness)."""
    found = run.shape.fits.get(run.strict)
    if found is None:
        found = run.shape.fits[run.strict] = tuple(
            zones.fit_zone(
                run.group,
                run.index,
                z,
                strict=run.strict,
                extended_resource_toleration=run.settings.extended_resource_toleration,
            )
            for z in run.index.zones
        )
    return found


def _gpu_breakdown(group: JobGroup) -> str:
    return " + ".join(f"{r.count}×{r.gpus_per_pod}" for r in group.replicas if r.gpus_per_pod)  # noqa: RUF001


# Every capacity problem starts with this, so validate() can tell a shortfall from a blocked path.
CAPACITY_PREFIX = lead.CAPACITY_PREFIX


def gpus_needed(group: JobGroup) -> int:
    """GPUs the whole group asks for (every pod of every replica type)."""
    return sum(r.count * r.gpus_per_pod for r in group.replicas)


class CapacityFit(NamedTuple):
    """How the group's GPUs fit one zone: now, once running work ends, or never. (A named tuple: one is made
    per zone and review, and a frozen dataclass's __init__ sets each field through object.__setattr__.)"""

    state: str  # "now" | "wait" | "never" ("" when a replica cannot run in the zone at all)
    reserved: int  # GPUs of the group's kinds that admitted jobs reserve in the zone
    text: str  # the shortfall in words, starting with CAPACITY_PREFIX ("" when it fits now)


def _demands(run: Run, fit: zones.ZoneFit) -> list[capacity.PodDemand]:
    return [
        capacity.PodDemand(r.key, r.count, r.gpus, fit.replicas[r.key].pools)
        for r in run.group.replicas
        if r.gpus_per_pod and fit.replicas[r.key].can_run
    ]


def _gpu_kinds(group: JobGroup) -> frozenset[str]:
    return frozenset(k for r in group.replicas for k, n in r.gpus.items() if n > 0)


@dataclass(frozen=True)
class _CapacityBasis:
    """What `fit_capacity` reads of the group's shape and the snapshot, worked out once per shape."""

    fit: zones.ZoneFit  # the fit it was worked out for (a basis serves that fit only)
    kinds: frozenset[str]  # the GPU resources the group asks for
    needed: int
    head: str  # "<prefix>N GPUs (breakdown)"; "" when no pod asks for GPUs
    never: str  # the text when not even the allocatable GPUs take the pods, else ""
    packs_now: bool  # the pods fit the free GPUs node by node
    largest: int  # the most GPUs free on one node of the pools


def _capacity_basis(run: Run, fit: zones.ZoneFit) -> _CapacityBasis:
    key = (run.strict, run.suspended, fit.zone)
    found = run.shape.capacity.get(key)
    if found is not None and found.fit is fit:
        return found
    demands = _demands(run, fit)
    kinds = _gpu_kinds(run.group)
    if not demands:
        basis = _CapacityBasis(fit, kinds, 0, "", "", True, 0)
    else:
        needed = gpus_needed(run.group)
        head = f"{CAPACITY_PREFIX}{needed} GPUs ({_gpu_breakdown(run.group)})"
        never = ""
        if capacity.pack_memoized(run.snapshot, demands, basis="allocatable") is not None:
            never = f"{head}, {fit.gpus_allocatable} allocatable on the nodes it can use"
            if fit.gpus_allocatable >= needed:
                most = max((sum(n for _, n in s.total_shape) for d in demands for p in d.pools for s in p.nodes),
                           default=0)
                never += f", but they do not fit node by node even with nothing running (at most {most} on one node)"
        packs_now = not never and not run.suspended and capacity.pack_memoized(run.snapshot, demands) is None
        largest = capacity.largest_free(pool for d in demands for pool in d.pools)
        basis = _CapacityBasis(fit, kinds, needed, head, never, packs_now, largest)
    run.shape.capacity[key] = basis
    return basis


def fit_capacity(run: Run, fit: zones.ZoneFit) -> CapacityFit:
    """The zone's capacity for the group (DESIGN.md "Busy is not blocked").

    now: the pods fit the free GPUs node by node, and the zone's free GPUs less its reservations
    cover the job; wait: they fit the allocatable GPUs of the nodes they can use (once running work
    ends); never: not even that. A suspended group is judged on allocatable GPUs only (it waits for
    its queue and reserves nothing until it runs). Only the reservations are read per call; the rest
    is the shape's (`_capacity_basis`).
    """
    basis = _capacity_basis(run, fit)
    return _fit_capacity(run, fit, basis, run.reserved.in_zone(fit.zone, basis.kinds))


def _fit_capacity(run: Run, fit: zones.ZoneFit, basis: _CapacityBasis, reserved: int) -> CapacityFit:
    """`fit_capacity` with `reserved`, the GPUs of the group's kinds reserved in the zone."""
    if not basis.head:
        return CapacityFit("now", reserved, "")
    if basis.never:
        return CapacityFit("never", reserved, basis.never)
    if run.suspended:
        note = (f"{basis.head}: suspended, so placed by the {fit.gpus_allocatable} allocatable GPUs; "
                "it reserves nothing")
        return CapacityFit("wait", reserved, note)
    left = fit.gpus_free - reserved
    if basis.packs_now and left >= basis.needed:
        return CapacityFit("now", reserved, "")
    text = f"{basis.head}, {max(left, 0)} free"
    if reserved:
        text += f" ({fit.gpus_free} on the nodes, {reserved} reserved by admitted jobs)"
    if left >= basis.needed:
        text += f", but they do not fit node by node (at most {basis.largest} free on one node)"
    return CapacityFit("wait", reserved, text)


def _takes(run: Run, fit: CapacityFit) -> bool:
    """Whether a zone with this capacity may take the job under `capacityPolicy`."""
    if fit.state == "now":
        return True
    return fit.state == "wait" and (run.suspended or run.settings.capacity_policy == "wait")


def _static_label_hints(run: Run, zone: str, overrides: Mapping[str, str]) -> list[str]:
    """For a blocked zone: template labels holding another zone's name that, set to this zone, open the path."""
    zone_names = set(run.index.zones)
    stale = sorted(
        (r.key, k, v)
        for r in run.group.replicas
        for k, v in {**r.pod_labels, **overrides}.items()
        if v in zone_names and v != zone and k in run.checker.mentioned
    )
    if not stale:
        return []
    fixed = {**overrides, **{k: zone for _, k, _ in stale}}
    _, worst = run.checker.check(fixed, run.ranges(zone))
    if worst != "allow":
        return []
    configured = run.settings.zone_identity_label
    return [
        f"{key} carries the static label {k}={v}, which the policies read: "
        + (
            f"set zoneIdentityLabel: {k} in the topoguard config, or change the label to {k}={zone}"
            if not configured or configured == k
            else f"change the label to {k}={zone} (zoneIdentityLabel is {configured}, the policies read {k})"
        )
        for key, k, v in stale
    ]


@dataclass(frozen=True)
class _ZoneBasis:
    """What a zone's row reads of the group's shape and the snapshot (not of the reservations)."""

    fit: zones.ZoneFit  # the fit it was worked out for (a basis serves that fit only)
    checks: tuple[FlowCheck, ...]
    network: str
    flow_problems: tuple[str, ...]  # the flows not allowed, and the label hints of a blocked zone
    sorted_problems: tuple[str, ...]  # the same, sorted: the row's problems when the group fits the zone
    placement_problems: tuple[str, ...]  # the fit's: a replica that cannot run in the zone
    needed: int  # GPUs the whole group asks for
    # The row when it does not depend on the reservations at all (a replica cannot run here), else None.
    fixed: ZoneReport | None


def _zone_basis(run: Run, fit: zones.ZoneFit) -> _ZoneBasis:
    key = (run.strict, fit.zone)
    found = run.shape.rows.get(key)
    if found is not None and found.fit is fit:
        return found
    overrides = run.overrides(fit.zone)
    checks, network = run.checker.check(overrides, run.ranges(fit.zone))
    problems = [describe_check(c) for c in checks if c.verdict.verdict != "allow"]
    if network == "deny":
        problems += _static_label_hints(run, fit.zone, overrides)
    placement = fit.problems
    needed = gpus_needed(run.group)
    basis = _ZoneBasis(fit, tuple(checks), network, tuple(problems), tuple(sorted(problems)), placement, needed, None)
    if placement:
        basis = dataclasses.replace(basis, fixed=_row(basis, CapacityFit("", 0, ""), placement))
    run.shape.rows[key] = basis
    return basis


def report_zone(run: Run, fit: zones.ZoneFit) -> ZoneReport:
    """One zone's row of the map: placement problems, capacity, every flow's verdict, eligibility."""
    basis = _zone_basis(run, fit)
    if basis.fixed is not None:
        return basis.fixed
    capacity_basis = _capacity_basis(run, fit)
    return _report(run, basis, capacity_basis, run.reserved.in_zone(fit.zone, capacity_basis.kinds))


def _report(run: Run, basis: _ZoneBasis, capacity_basis: _CapacityBasis, reserved: int) -> ZoneReport:
    """`report_zone` of a zone the group can run in, from its bases, with `reserved` GPUs of its kinds reserved."""
    cap = _fit_capacity(run, basis.fit, capacity_basis, reserved)
    return _row(basis, cap, () if _takes(run, cap) else (cap.text,))


class _Candidate:
    """A candidate zone of a plan, for the reviews of one suspension state: its bases and the last row made.

    The row and its rank read nothing a review changes but the GPUs reserved in the zone (the rest is the
    plan's; the run's settings and suspension are the plan's key), so they are made again only when those
    differ from the last row's. A burst admits into one zone at a time: the other zones' rows repeat.
    """

    __slots__ = ("basis", "capacity", "last")

    def __init__(self, basis: _ZoneBasis, capacity: _CapacityBasis | None) -> None:
        self.basis = basis
        self.capacity = capacity  # None: the row is `basis.fixed`
        # (GPUs reserved, the row made with them, its `rank_key`)
        self.last: tuple[int, ZoneReport, RankKey] | None = None

    def report(self, run: Run) -> tuple[ZoneReport, RankKey | None]:
        """The zone's row for the run, and its rank (None for a `fixed` row, which is never eligible)."""
        capacity = self.capacity
        if capacity is None:
            return cast(ZoneReport, self.basis.fixed), None
        reserved = run.reserved.in_zone(self.basis.fit.zone, capacity.kinds)
        last = self.last  # NB: read once; another review may replace it meanwhile
        if last is None or last[0] != reserved:
            made = _report(run, self.basis, capacity, reserved)
            last = self.last = (reserved, made, rank_key(made, run.settings.zone_strategy, suspended=run.suspended))
        return last[1], last[2]


def _row(basis: _ZoneBasis, cap: CapacityFit, problems: tuple[str, ...]) -> ZoneReport:
    """The zone's row: `problems` are why the group does not fit there (placement or capacity)."""
    fit, network = basis.fit, basis.network
    fits = not problems
    return ZoneReport(
        zone=fit.zone,
        gpu_nodes=fit.gpu_nodes,
        gpus_free=fit.gpus_free,
        gpus_needed=basis.needed,
        fits=fits,
        network=network,
        flows=basis.checks,
        problems=tuple(sorted((*problems, *basis.flow_problems))) if problems else basis.sorted_problems,
        eligible=fits and network == "allow",
        capacity=cap.state,
        gpus_allocatable=fit.gpus_allocatable,
        gpus_reserved=cap.reserved,
        capacity_note=cap.text if fits else "",
    )


def _no_candidates(run: Run, fits: Sequence[zones.ZoneFit]) -> tuple[str, ...]:
    """Why no zone can anchor the GPU replicas."""
    if not run.index.zones and "Node" in run.snapshot.missing_kinds:
        return ("the cluster snapshot has no Node objects, so no zone can be judged: add them "
                "(kubectl get nodes -o yaml)",)
    if not run.index.zones:
        return (f"no Ready, schedulable node carries the zone label {run.settings.zone_label}",)
    reasons = []
    gpu_keys = {r.key for r in run.group.replicas if r.gpus_per_pod}
    for fit in fits:
        for key, rf in fit.replicas.items():
            if key in gpu_keys and rf.problem and "no Ready, schedulable" not in rf.problem:
                reasons.append(f"{fit.zone}: {rf.problem}")
    for replica in run.group.replicas:
        explained = any(f"{replica.key} cannot run here" in r for r in reasons)
        if replica.gpus_per_pod and not explained and not any(f.replicas[replica.key].can_run for f in fits):
            resources = "+".join(sorted(replica.gpus))
            reasons.append(f"no zone has a Ready, schedulable {resources} node for {replica.key}")
    return tuple(reasons)


def conflict_reason(run: Run, fits: Sequence[zones.ZoneFit]) -> str:
    """The "replicas share no zone" reason, or "" when some zone admits every replica."""
    zones_of = zones.replica_zones(fits)
    if any(all(f.zone in zones_of[r.key] for r in run.group.replicas) for f in fits):
        return ""
    return zones.describe_conflict(run.group, zones_of, run.settings.zone_label)


class _Share:
    """`num / den` (den > 0), compared exactly by cross-multiplying: what `rank_key` falls back on when two
    shares round to the same float. (A Fraction would do, but it normalizes by a gcd when made, and a
    burst of waiting jobs ranks every zone of every review by it.)"""

    __slots__ = ("den", "num")

    def __init__(self, num: int, den: int) -> None:
        self.num, self.den = num, den

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Share):
            return NotImplemented
        return self.num * other.den == other.num * self.den

    def __lt__(self, other: _Share) -> bool:
        return self.num * other.den < other.num * self.den

    def __gt__(self, other: _Share) -> bool:
        return self.num * other.den > other.num * self.den

    __hash__ = None  # type: ignore[assignment]


RankKey = tuple[int, float, "_Share | int", str]


def rank_key(report: ZoneReport, strategy: str, *, suspended: bool = False) -> RankKey:
    """Order of the eligible zones, best first: fits now before waits; among zones that fit now the
    strategy (`most-free` or `binpack` on free GPUs less reservations); among zones where the job
    waits, the most free relative to the zone's size: free less reservations (below zero once
    admitted jobs wait) over allocatable, so a burst of waiting jobs spreads over the zones in
    proportion to their GPUs and each zone's backlog drains in about the same time. A suspended job
    ranks by allocatable GPUs.

    The share is exact: ranked by the float quotient (correctly rounded, so a smaller float is a smaller
    share), and by the share itself only where two floats are equal (`_Share`).
    """
    if suspended:
        size = report.gpus_allocatable
        return (0, size if strategy == "binpack" else -size, 0, report.zone)
    value = report.gpus_free - report.gpus_reserved
    if report.capacity == "now":
        return (0, value if strategy == "binpack" else -value, 0, report.zone)
    size = max(report.gpus_allocatable, 1)
    try:
        share = -value / size
    except OverflowError:  # beyond a float (a snapshot can say anything): infinity, and `_Share` decides
        share = math.inf if value < 0 else -math.inf
    return (1, share, _Share(-value, size), report.zone)


def _tolerations(
    run: Run, fits: Mapping[str, zones.ZoneFit], chosen: Iterable[str]
) -> dict[str, tuple[Mapping[str, Any], ...]]:
    out: dict[str, tuple[Mapping[str, Any], ...]] = {}
    for replica in run.group.replicas:
        taints: dict[Taint, None] = {}
        for zone in chosen:
            taints.update(dict.fromkeys(fits[zone].replicas[replica.key].add_tolerations))
        if taints:
            out[replica.key] = tuple(nodes.toleration_for(t) for t in sorted(taints, key=zones.taint_order))
    return out


def warnings_for(run: Run) -> tuple[str, ...]:
    """What the caller should know even when a zone was chosen (partial enumeration, missing kinds); worked
    out again only when the checker has truncated another replica since (`Shape.warnings`)."""
    truncated = len(run.checker.truncated)  # NB: read before the warnings, so a later entry is never missed
    known = run.shape.warnings
    if known is not None and known[0] == truncated:
        return known[1]
    out = []
    out += [run.checker.truncated[key] for key in sorted(run.checker.truncated)]
    if run.snapshot.missing_kinds:
        out.append(f"the cluster snapshot has no {', '.join(sorted(run.snapshot.missing_kinds))}")
    out += unreadable_gpus(run.snapshot, run.settings.gpu_resources)
    if run.checker.agent is not None and run.checker.agent.audit_mode:
        out.append("the Cilium agent runs in policy audit mode (cilium-config policy-audit-mode=true): flows its "
                   "policies would deny are only logged, so they count as allowed here")
    found = tuple(out)
    run.shape.warnings = (truncated, found)
    return found


def unreadable_gpus(snapshot: Snapshot, gpu_resources: Sequence[str]) -> list[str]:
    """Nodes whose allocatable GPUs are not a quantity: counted as none, and said so (a pass over the nodes,
    once per tuple of nodes: the watch cache keeps the tuple while no node changes)."""
    kinds = gpu_kinds(snapshot, gpu_resources)

    def build() -> tuple[str, ...]:
        return tuple(
            f"node {node.name}: allocatable {resource}={value!r} is not a quantity, so it counts as 0 GPUs"
            for node in snapshot.nodes if node.unparsable
            for resource, value in sorted(node.unparsable.items())
            if resource in kinds
        )

    return list(_UNREADABLE.get((snapshot.nodes, kinds), build))


_UNREADABLE: IdentityMemo[tuple[str, ...]] = IdentityMemo(8)


def zone_reasons(reports: Iterable[ZoneReport], keep: Callable[[str], bool] = lambda problem: True) -> list[str]:
    """`zone-a, zone-c: <problem>`: a problem shared by several zones (policies that do not depend on the
    zone) is said once, naming every zone it applies to."""
    zones_of: dict[str, list[str]] = {}
    for report in reports:
        for problem in filter(keep, report.problems):
            zones_of.setdefault(problem, []).append(report.zone)
    return [f"{', '.join(where)}: {problem}" for problem, where in zones_of.items()]


def summarize(zone: str | None, run: Run, checks: Sequence[FlowCheck], *, capacity_state: str = "") -> str:
    """The short `topoguard.io/decision` annotation value; stable for the same job and snapshot.

    `capacity=now` when the job fits its zone's free GPUs now, `capacity=wait` when it waits there.
    """
    if zone is None:
        return "denied: no zone fits with open paths"
    shown = f" capacity={capacity_state}" if capacity_state else ""
    return (
        f"zone={zone} strategy={run.settings.zone_strategy} gpus={gpus_needed(run.group)} "
        f"flows={len(checks)} network=allow{shown}"
    )


def capacity_warnings(chosen: ZoneReport, run: Run) -> tuple[str, ...]:
    """What a job admitted to wait should be told (capacity=wait)."""
    if chosen.capacity != "wait" or not chosen.capacity_note:
        return ()
    if run.suspended:
        return (f"{chosen.zone}: {chosen.capacity_note}",)
    return (
        f"{chosen.zone}: {chosen.capacity_note}; pinned there anyway: its pods wait Pending where their "
        "network is open until GPUs free up (capacity=wait, capacityPolicy wait)",
    )


def decide_fresh(
    group: JobGroup,
    snapshot: Snapshot,
    settings: Settings,
    *,
    reserved: ledger.Reserved | None = None,
    suspended: bool = False,
    shape_key: memo.DecisionKey | None = None,
) -> Decision:
    """The zone the group should be pinned to (mutating path), with the per-zone table, computed now
    (`engine.decide` is this, memoized per snapshot).

    `reserved`: the reservations to count (default: the snapshot's stored ones, without the group's
    own); `suspended`: the job waits for a queue manager. Returns allowed=False with sorted, per-zone
    reasons when no zone is open and could ever hold the job (or, under capacityPolicy refuse, fits now).
    """
    run = start_run(group, snapshot, settings, strict=False, reserved=reserved, suspended=suspended,
                    shape_key=shape_key)
    if run.devices is not None and run.devices.domain and not run.problems:
        return lead.with_lead(group, _decide_clique(run))
    decision = _decide(run)
    mark_warm(run, group)
    return decision


# Cliques tried per zone for a ComputeDomain job, most usable nodes first (an NVL72 rack is one clique of 18 nodes).
MAX_CLIQUES_PER_ZONE = 32


def _cliques(run: Run) -> list[tuple[str, str, int]]:
    """(zone, clique, usable nodes) of every clique the index's nodes carry: nodes of another ComputeDomain are
    not usable (a node serves at most one)."""
    assert run.devices is not None
    label, uid = run.settings.clique_label, run.devices.domain_uid
    counted: dict[tuple[str, str], int] = {}
    for zone in run.index.zones:
        for cls in run.index.classes_in(zone):
            for slot in cls.nodes:
                clique = slot.labels.get(label)
                owner = slot.labels.get(COMPUTE_DOMAIN_LABEL)
                if clique and (not owner or owner == uid):
                    counted[(zone, clique)] = counted.get((zone, clique), 0) + 1
    per_zone: dict[str, list[tuple[str, str, int]]] = {}
    for (zone, clique), n in sorted(counted.items(), key=lambda kv: (-kv[1], kv[0])):
        per_zone.setdefault(zone, []).append((zone, clique, n))
    return [c for cs in per_zone.values() for c in cs[:MAX_CLIQUES_PER_ZONE]]


def _in_clique(replica: Replica, label: str, clique: str, uid: str) -> Replica:
    """The replica confined to the clique's nodes that no other ComputeDomain holds (for fitting only)."""
    placement = replica.placement
    owner: list[dict[str, Any]] = [{"key": COMPUTE_DOMAIN_LABEL, "operator": "DoesNotExist"}]
    if uid:
        owner.append({"key": COMPUTE_DOMAIN_LABEL, "operator": "In", "values": [uid]})
    terms = placement.node_selector_terms or ({},)
    narrowed = tuple({**t, "matchExpressions": [*t.get("matchExpressions", []), o]} for t in terms for o in owner)
    return dataclasses.replace(replica, placement=dataclasses.replace(
        placement, node_selector={**placement.node_selector, label: clique}, node_selector_terms=narrowed))


def _decide_clique(run: Run) -> Decision:
    """A ComputeDomain job: the best zone as `_decide` chooses it, within one NVLink clique (DESIGN.md Round 3)."""
    devices = run.devices
    assert devices is not None
    label, pinned = run.settings.clique_label, devices.domain_replicas
    cliques = _cliques(run)
    best: tuple[RankKey, Decision, str] | None = None
    for zone, clique, _ in cliques:
        group = dataclasses.replace(run.group, replicas=tuple(
            _in_clique(r, label, clique, devices.domain_uid) if r.key in pinned else r for r in run.group.replicas))
        sub = _run(group, run.snapshot, run.settings, strict=run.strict, reserved=run.reserved,
                   suspended=run.suspended, devices=devices._replace(group=group))
        decision = _decide(sub)
        if not decision.allowed or decision.zone != zone:
            continue
        chosen = next(r for r in decision.zones if r.zone == zone)
        rank = rank_key(chosen, run.settings.zone_strategy, suspended=run.suspended)
        if best is None or rank < best[0]:
            best = (rank, decision, clique)
    if best is None:
        largest = max(cliques, key=lambda c: c[2], default=None)
        size = (f"the largest, {largest[1]} in {largest[0]}, has {largest[2]} usable node(s)" if largest
                else f"no Ready, schedulable node carries the {label} label")
        reason = (f"its pods join ComputeDomain {devices.domain}, so they must run in one NVLink clique "
                  f"({label}); no clique can hold them: {size}")
        refused = _decide(run)
        return dataclasses.replace(refused, allowed=False, zone=None, reasons=(reason, *refused.reasons),
                                   open_zones=(), tolerations={})
    _, decision, clique = best
    return dataclasses.replace(decision, clique=clique, clique_replicas=tuple(sorted(pinned)),
                               summary=f"{decision.summary} clique={clique}")


@dataclass(frozen=True)
class _Plan:
    """What `_decide` reads of the group's shape and the snapshot alone, worked out once per shape and strictness:
    the zones' fits, the candidates, the conflict; only the reservations change between two reviews of a shape.
    (The warnings are read after the flows are checked: the checker notes there what it could not enumerate.)"""

    fits: tuple[zones.ZoneFit, ...]
    candidates: tuple[zones.ZoneFit, ...]
    excluded: dict[str, tuple[str, ...]]
    conflict: str
    # Tolerations per tuple of zones the pods may spread over (one or two tuples per shape in practice).
    tolerations: dict[tuple[str, ...], dict[str, tuple[Mapping[str, Any], ...]]] = field(default_factory=dict)
    # Per suspended: the candidates with their bases (`_candidates`), so a review does not look them up zone by zone.
    rows: dict[bool, tuple[_Candidate, ...]] = field(default_factory=dict)
    # Per (chosen zone, its capacity state): the summary (`summarize` reads nothing else that a review changes).
    summaries: dict[tuple[str, str], str] = field(default_factory=dict)


def _plan(run: Run) -> _Plan:
    found = run.shape.plans.get(run.strict)
    if found is not None:
        return found
    fits = fit_zones(run)
    plan = _Plan(
        fits=fits,
        candidates=tuple(f for f in fits if f.anchored),
        excluded={f.zone: f.problems for f in fits if not f.anchored},
        conflict=conflict_reason(run, fits),
    )
    run.shape.plans[run.strict] = plan
    return plan


def _candidates(run: Run, plan: _Plan) -> tuple[_Candidate, ...]:
    """The plan's candidates for the run's suspension state, in order, with their bases."""
    found = plan.rows.get(run.suspended)
    if found is None:
        rows = []
        for fit in plan.candidates:
            basis = _zone_basis(run, fit)
            rows.append(_Candidate(basis, None if basis.fixed is not None else _capacity_basis(run, fit)))
        found = plan.rows[run.suspended] = tuple(rows)
    return found


def _decide(run: Run) -> Decision:
    """The decision with its lead (engine/lead.py); only the reservations are read when the shape's plan is known."""
    settings = run.settings
    if run.problems:
        unjudged = tuple(f"cannot judge where its GPUs are: {p}" for p in run.problems)
        return lead.with_lead(run.group, Decision(False, None, (), unjudged, warnings=warnings_for(run),
                                                  summary=summarize(None, run, ())))
    plan = _plan(run)
    fits, candidates, excluded, conflict = plan.fits, plan.candidates, plan.excluded, plan.conflict
    if not candidates:
        reasons = {*_no_candidates(run, fits), *([conflict] if conflict else [])}
        return lead.with_lead(run.group, Decision(
            False,
            None,
            (),
            tuple(sorted(reasons)),
            warnings=warnings_for(run),
            summary=summarize(None, run, ()),
            excluded_zones=excluded,
            split=bool(conflict),
        ))
    made = [candidate.report(run) for candidate in _candidates(run, plan)]
    reports = tuple([report for report, _ in made])
    # (rank, row) of the eligible rows: the least rank is the chosen zone (ranks end with the zone: no two tie)
    eligible = [(rank, report) for report, rank in made if report.eligible]
    if not eligible:
        reasons = {*zone_reasons(reports), *([conflict] if conflict else [])}
        return lead.with_lead(run.group, Decision(
            False,
            None,
            reports,
            tuple(sorted(reasons)),
            warnings=warnings_for(run),
            summary=summarize(None, run, ()),
            excluded_zones=excluded,
            split=bool(conflict),
        ))
    chosen = min(eligible)[1]
    if settings.zone_identity_label:
        # Pods carry the chosen zone's identity label, so only that zone is open for them.
        open_zones: tuple[str, ...] = (chosen.zone,)
    else:
        open_zones = tuple(sorted([r.zone for _, r in eligible]))
    spread_over = open_zones if settings.mode == "colocate" else (chosen.zone,)
    tolerations = plan.tolerations.get(spread_over)
    if tolerations is None:
        tolerations = plan.tolerations[spread_over] = _tolerations(run, {f.zone: f for f in fits}, spread_over)
    summary = plan.summaries.get((chosen.zone, chosen.capacity))
    if summary is None:
        summary = plan.summaries[(chosen.zone, chosen.capacity)] = summarize(
            chosen.zone, run, chosen.flows, capacity_state=chosen.capacity)
    # NB: built once, its lead with it (`lead.admitted` is what `lead_for` says of an admitted job): a
    # `dataclasses.replace` afterwards would run __init__ again through the fields' introspection.
    return Decision(
        allowed=True,
        zone=chosen.zone,
        zones=reports,
        reasons=(),
        tolerations=tolerations,
        labels={settings.zone_identity_label: chosen.zone} if settings.zone_identity_label else {},
        open_zones=open_zones,
        warnings=capacity_warnings(chosen, run) + warnings_for(run),
        summary=summary,
        excluded_zones=excluded,
        capacity=chosen.capacity,
        lead=lead.admitted(run.group, chosen.zone, chosen, chosen.capacity, open_zones),
    )
