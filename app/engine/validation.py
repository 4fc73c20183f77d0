"""The validating decision: the job AS WRITTEN must stay in one zone whose paths are open.

PURE. Validating webhooks see the object after every mutation, so a job that went through
`decide` + the patch passes; one the mutating webhook did not touch (failurePolicy Ignore, a
reinvocation that raced, a later edit) is judged strictly: no tolerations or labels are added,
the group must not be able to split across zones, and every zone it can land in must be open.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.config import Settings
from app.engine import lead, ledger, nodes, zones
from app.engine.decide import (
    CAPACITY_PREFIX,
    Run,
    conflict_reason,
    fit_zones,
    mark_warm,
    report_zone,
    start_run,
    summarize,
    warnings_for,
    zone_reasons,
)
from app.engine.memo import DecisionKey
from app.models.cluster import Snapshot
from app.models.decision import Decision
from app.models.job import JobGroup


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _selects_group(selector: Mapping[str, Any], group: JobGroup) -> bool:
    match = _dict(selector.get("matchLabels"))
    expressions = [e for e in selector.get("matchExpressions") or [] if isinstance(e, Mapping)]
    if not match and not expressions:
        return False
    return all(
        all(r.pod_labels.get(str(k)) == str(v) for k, v in match.items())
        and all(nodes.match_requirement(e, r.pod_labels) for e in expressions)
        for r in group.replicas
    )


def is_colocated(group: JobGroup, zone_label: str) -> bool:
    """Whether every replica requires podAffinity to the whole group over the zone topology."""
    for replica in group.replicas:
        affinity = _dict(_dict(_dict(replica.template.get("spec")).get("affinity")).get("podAffinity"))
        terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if not isinstance(terms, list) or not any(
            isinstance(t, Mapping)
            and t.get("topologyKey") == zone_label
            and _selects_group(_dict(t.get("labelSelector")), group)
            for t in terms
        ):
            return False
    return True


def _split_reason(run: Run, zones_of: Mapping[str, Sequence[str]]) -> str:
    where = "; ".join(f"{k} can run in {', '.join(v)}" for k, v in sorted(zones_of.items()) if len(v) > 1)
    return (
        f"the group can be split across zones ({where}): pin every replica to one zone "
        f"({run.settings.zone_label}) or let the mutating webhook do it"
    )


def validate_fresh(
    group: JobGroup,
    snapshot: Snapshot,
    settings: Settings,
    *,
    reserved: ledger.Reserved | None = None,
    suspended: bool = False,
    shape_key: DecisionKey | None = None,
) -> Decision:
    """Judge the job as written (validating webhook): one zone for the whole group, and it is open.
    Computed now; `engine.validate` is this, memoized per snapshot.

    Strict: no tolerations or labels are added. The group must be unable to split across zones
    (every replica restricted to the same single zone, or podAffinity over the zone topology), every
    zone it can land in must have open paths, and every replica must be able to run there. A GPU
    shortfall is only a warning here: the pods would wait, not break.
    """
    run = start_run(group, snapshot, settings, strict=True, reserved=reserved, suspended=suspended,
                    shape_key=shape_key)
    decision = lead.with_lead(group, _validate(run))
    mark_warm(run, group)
    return decision


def _validate(run: Run) -> Decision:
    group, settings = run.group, run.settings
    fits = fit_zones(run)
    zones_of = zones.replica_zones(fits)
    common = [f for f in fits if all(f.zone in zones_of[r.key] for r in group.replicas)]
    if not common:
        conflict = conflict_reason(run, fits) or "no zone admits every replica"
        anchored = [report_zone(run, f) for f in fits if f.anchored]
        reasons = {conflict, *zone_reasons(anchored, lambda p: "cannot run here" in p)}
        return Decision(
            False, None, tuple(anchored), tuple(sorted(reasons)), summary="denied: replicas share no zone", split=True
        )
    pods = sum(r.count for r in group.replicas)
    reachable = {z for v in zones_of.values() for z in v}
    colocated = is_colocated(group, settings.zone_label)
    if len(reachable) > 1 and pods > 1 and not colocated:
        reports = tuple(report_zone(run, f) for f in common)
        return Decision(
            False, None, reports, (_split_reason(run, zones_of),), summary="denied: group can be split", split=True
        )
    reports = tuple(report_zone(run, f) for f in common)
    blocked = [r for r in reports if r.network != "allow"]
    if blocked:
        blocking = zone_reasons(blocked, lambda p: not p.startswith(CAPACITY_PREFIX))
        return Decision(
            False, None, reports, tuple(sorted(blocking)), warnings=warnings_for(run), summary="denied: paths not open"
        )
    short = [f"{r.zone}: {p}" for r in reports for p in r.problems]
    short += [f"{r.zone}: {r.capacity_note}" for r in reports if r.capacity_note]
    zone = reports[0].zone if len(reports) == 1 else None
    return Decision(
        allowed=True,
        zone=zone,
        zones=reports,
        reasons=(),
        open_zones=tuple(r.zone for r in reports),
        warnings=tuple(sorted(short)) + warnings_for(run),
        summary=(
            summarize(zone, run, reports[0].flows, capacity_state=reports[0].capacity)
            if zone
            else "colocated: " + ",".join(r.zone for r in reports)
        ),
        capacity=reports[0].capacity if zone else "",
    )
