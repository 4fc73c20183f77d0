"""The placement decision: which zone a training group goes to, or why none can take it.

PURE: every input is an argument (group, snapshot, settings); the same arguments give the same
`Decision`. Steps (DESIGN.md "The decision, in order", 2-5):

1. Candidate zones are anchored on the GPU replicas (zones.fit_zone); a CPU-only coordinator
   never anchors, it follows the workers and gets the GPU-pool tolerations it lacks.
2. Capacity: free GPUs per zone on the nodes the GPU replicas can use, with per-node fit.
3. Network: every flow of the group simulated with the pods as they will be labelled in the zone.
4. Choice among zones that fit and are open (`zoneStrategy`); user pins restrict the candidates.

`decide_fresh` is the mutating path (topoguard may add tolerations and the zone identity label);
`validation.validate_fresh` judges the job as written with the same building blocks (`start_run`,
`report_zone`, ...). Neither applies deny/warn enforcement: they return allowed=False with reasons
and the HTTP layer decides what to do with them. `engine.decide` / `engine.validate` are these two,
memoized per snapshot (engine/cached.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app import policy
from app.config import Settings
from app.engine import capacity, memo, nodes, zones
from app.engine.flows import FlowChecker, describe_check
from app.models.cluster import Snapshot, Taint
from app.models.decision import Decision, FlowCheck, ZoneReport
from app.models.job import JobGroup


@dataclass
class Run:
    """One evaluation: the inputs, the zone index and the shared flow checker."""

    group: JobGroup
    snapshot: Snapshot
    settings: Settings
    strict: bool
    index: capacity.ZoneIndex
    checker: FlowChecker

    def overrides(self, zone: str) -> dict[str, str]:
        """Labels every pod carries in `zone`: the identity label, unless judging the job as written."""
        if self.settings.zone_identity_label and not self.strict:
            return {self.settings.zone_identity_label: zone}
        return {}


def prepare(snapshot: Snapshot, settings: Settings) -> None:
    """Build the per-snapshot indexes a decision reads, so the first request does not pay for them."""
    capacity.zone_index(snapshot, zone_label=settings.zone_label, gpu_resources=settings.gpu_resources)
    capacity.pack_memo(snapshot)
    policy.build_index(snapshot)
    policy.label_keys_mentioned(snapshot)
    memo.keys_read(snapshot)


def start_run(group: JobGroup, snapshot: Snapshot, settings: Settings, *, strict: bool) -> Run:
    """Begin one evaluation on the snapshot's memoised zone index with a fresh verdict cache."""
    index = capacity.zone_index(snapshot, zone_label=settings.zone_label, gpu_resources=settings.gpu_resources)
    checker = FlowChecker(
        group=group,
        snapshot=snapshot,
        enforcement=settings.policy_enforcement,
        mentioned=policy.label_keys_mentioned(snapshot),
        index_values_limit=settings.limits.policy_index_values_per_job,
    )
    return Run(group, snapshot, settings, strict, index, checker)


def _gpu_breakdown(group: JobGroup) -> str:
    return " + ".join(f"{r.count}×{r.gpus_per_pod}" for r in group.replicas if r.gpus_per_pod)  # noqa: RUF001


# Every capacity problem starts with this, so validate() can tell a shortfall from a blocked path.
CAPACITY_PREFIX = "needs "


def gpus_needed(group: JobGroup) -> int:
    """GPUs the whole group asks for (every pod of every replica type)."""
    return sum(r.count * r.gpus_per_pod for r in group.replicas)


def _capacity_problem(run: Run, fit: zones.ZoneFit) -> str:
    """The GPU shortfall in words, or an empty string when the pods fit the zone node by node."""
    demands = [
        capacity.PodDemand(r.key, r.count, r.gpus, fit.replicas[r.key].pools)
        for r in run.group.replicas
        if r.gpus_per_pod and fit.replicas[r.key].can_run
    ]
    if not demands or capacity.pack_memoized(run.snapshot, demands) is None:
        return ""
    needed = f"{CAPACITY_PREFIX}{gpus_needed(run.group)} GPUs ({_gpu_breakdown(run.group)}), {fit.gpus_free} free"
    if fit.gpus_free < gpus_needed(run.group):
        return needed
    largest = capacity.largest_free(pool for d in demands for pool in d.pools)
    return f"{needed}, but they do not fit node by node (at most {largest} free on one node)"


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
    _, worst = run.checker.check(fixed)
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


def report_zone(run: Run, fit: zones.ZoneFit) -> ZoneReport:
    """One zone's row of the map: placement problems, capacity, every flow's verdict, eligibility."""
    overrides = run.overrides(fit.zone)
    checks, network = run.checker.check(overrides)
    problems = list(fit.problems)
    shortfall = _capacity_problem(run, fit) if not problems else ""
    if shortfall:
        problems.append(shortfall)
    fits = not problems
    problems += [describe_check(c) for c in checks if c.verdict.verdict != "allow"]
    if network == "deny":
        problems += _static_label_hints(run, fit.zone, overrides)
    return ZoneReport(
        zone=fit.zone,
        gpu_nodes=fit.gpu_nodes,
        gpus_free=fit.gpus_free,
        gpus_needed=gpus_needed(run.group),
        fits=fits,
        network=network,
        flows=checks,
        problems=tuple(sorted(problems)),
        eligible=fits and network == "allow",
    )


def _no_candidates(run: Run, fits: Sequence[zones.ZoneFit]) -> tuple[str, ...]:
    """Why no zone can anchor the GPU replicas."""
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


def _choose(reports: Sequence[ZoneReport], strategy: str) -> ZoneReport:
    if strategy == "binpack":
        return min(reports, key=lambda r: (r.gpus_free, r.zone))
    return min(reports, key=lambda r: (-r.gpus_free, r.zone))


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
    """What the caller should know even when a zone was chosen (partial enumeration, missing kinds)."""
    out = []
    out += [run.checker.truncated[key] for key in sorted(run.checker.truncated)]
    if run.snapshot.missing_kinds:
        out.append(f"the cluster snapshot has no {', '.join(sorted(run.snapshot.missing_kinds))}")
    return tuple(out)


def zone_reasons(reports: Iterable[ZoneReport], keep: Callable[[str], bool] = lambda problem: True) -> list[str]:
    """`zone-a, zone-c: <problem>`: a problem shared by several zones (policies that do not depend on the
    zone) is said once, naming every zone it applies to."""
    zones_of: dict[str, list[str]] = {}
    for report in reports:
        for problem in filter(keep, report.problems):
            zones_of.setdefault(problem, []).append(report.zone)
    return [f"{', '.join(where)}: {problem}" for problem, where in zones_of.items()]


def summarize(zone: str | None, run: Run, checks: Sequence[FlowCheck]) -> str:
    """The short `topoguard.io/decision` annotation value; stable for the same job and snapshot."""
    if zone is None:
        return "denied: no zone fits with open paths"
    return (
        f"zone={zone} strategy={run.settings.zone_strategy} gpus={gpus_needed(run.group)} "
        f"flows={len(checks)} network=allow"
    )


def decide_fresh(group: JobGroup, snapshot: Snapshot, settings: Settings) -> Decision:
    """The zone the group should be pinned to (mutating path), with the per-zone table, computed now
    (`engine.decide` is this, memoized per snapshot).

    Returns allowed=False with sorted, per-zone reasons when no zone fits and is open.
    """
    run = start_run(group, snapshot, settings, strict=False)
    fits = [zones.fit_zone(group, run.index, z, strict=False) for z in run.index.zones]
    candidates = [f for f in fits if f.anchored]
    excluded = {f.zone: f.problems for f in fits if not f.anchored}
    conflict = conflict_reason(run, fits)
    if not candidates:
        reasons = {*_no_candidates(run, fits), *([conflict] if conflict else [])}
        return Decision(
            False,
            None,
            (),
            tuple(sorted(reasons)),
            warnings=warnings_for(run),
            summary=summarize(None, run, ()),
            excluded_zones=excluded,
            split=bool(conflict),
        )
    reports = tuple(report_zone(run, f) for f in candidates)
    eligible = [r for r in reports if r.eligible]
    if not eligible:
        reasons = {*zone_reasons(reports), *([conflict] if conflict else [])}
        return Decision(
            False,
            None,
            reports,
            tuple(sorted(reasons)),
            warnings=warnings_for(run),
            summary=summarize(None, run, ()),
            excluded_zones=excluded,
            split=bool(conflict),
        )
    chosen = _choose(eligible, settings.zone_strategy)
    open_zones = tuple(sorted(r.zone for r in eligible))
    if settings.zone_identity_label:
        # Pods carry the chosen zone's identity label, so only that zone is open for them.
        open_zones = (chosen.zone,)
    spread_over = open_zones if settings.mode == "colocate" else (chosen.zone,)
    by_zone = {f.zone: f for f in fits}
    return Decision(
        allowed=True,
        zone=chosen.zone,
        zones=reports,
        reasons=(),
        tolerations=_tolerations(run, by_zone, spread_over),
        labels={settings.zone_identity_label: chosen.zone} if settings.zone_identity_label else {},
        open_zones=open_zones,
        warnings=warnings_for(run),
        summary=summarize(chosen.zone, run, chosen.flows),
        excluded_zones=excluded,
    )
