"""The lead sentence of every answer: what will go wrong (or where the job goes) and the smallest fix.

PURE, built only from the decision's own data (the per-zone reports, their flow checks and the
reasons the policy engine gave, the capacity notes). Every surface shows this sentence first and
none writes its own: the webhook's refusal and warnings (admission/pipeline.py), `topoguard explain`
and `topoguard review`. Flows are named by what the framework uses them for (jobs/flows.py:
rendezvous, NCCL/Gloo collectives, ...) and by their ports (`TCP 23456`, the collectives' range
`TCP 32768-60999`) and the ports the policies actually open; one finding shared by several flows or
zones is said once.

`lead_for` returns the sentence and the zone problems it states, so a surface listing the remaining
reasons (`remaining_reasons`) does not say the same thing twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from app.engine.flows import blocking_reasons, describe_check
from app.models.decision import Decision, FlowCheck, ZoneReport
from app.models.job import Flow, JobGroup
from app.models.network import Reason, SideVerdict

# What each flow purpose is to an ML engineer (jobs/flows.py builds them).
PURPOSES = {
    "rendezvous": "rendezvous traffic",
    "collective": "NCCL/Gloo collective traffic",
    "all-to-all": "all-to-all traffic (TF_CONFIG)",
    "launcher": "MPI launcher traffic",
}
STATIC_LABEL_HINT = "carries the static label"
CAPACITY_PREFIX = "needs "  # every capacity problem starts with this (engine/decide.py builds them)


@dataclass(frozen=True)
class Finding:
    """One blocked (or unknown) flow shape, over the zones where it blocks."""

    checks: tuple[FlowCheck, ...]  # the flows it covers, one per purpose/port (same pair, same cause)
    zones: tuple[str, ...]
    problems: tuple[str, ...]  # the zone problems (describe_check) it states


def _ports(flow: Flow) -> str:
    return f"{flow.protocol} {flow.ports}"


def _pods(key: str, group: JobGroup) -> str:
    replica = next((r for r in group.replicas if r.key == key), None)
    return f"the {key} pod" if replica is not None and replica.count == 1 else f"the {key} pods"


def _between(checks: Sequence[FlowCheck], group: JobGroup) -> str:
    flow = checks[0].flow
    if flow.src == flow.dst:
        return f"between {_pods(flow.src, group)}"
    if any(c.flow.src == flow.dst for c in checks):  # both directions
        return f"between {_pods(flow.src, group)} and {_pods(flow.dst, group)}"
    return f"from {_pods(flow.src, group)} to {_pods(flow.dst, group)}"


def _what(checks: Sequence[FlowCheck], group: JobGroup) -> str:
    """`NCCL/Gloo collective traffic (TCP 32768-60999) and rendezvous traffic (TCP 23456) from A to B`."""
    parts = dict.fromkeys(f"{PURPOSES.get(c.flow.purpose, c.flow.purpose)} ({_ports(c.flow)})" for c in checks)
    return f"{' and '.join(parts)} {_between(checks, group)}"


def _refs(reasons: Sequence[Reason]) -> str:
    by_kind: dict[str, dict[str, None]] = {}
    for r in reasons:
        by_kind.setdefault(r.kind or "policy", {})[r.policy] = None
    return "; ".join(f"{kind} {', '.join(names)}" for kind, names in by_kind.items())


def _blocking_sides(check: FlowCheck) -> list[tuple[str, SideVerdict]]:
    """The sides that decide a failing flow, ingress first (it names the destination's policy, usually
    where the fix goes). Both when both fail: opening one side alone would not open the flow."""
    verdict = check.verdict
    both = (("ingress", verdict.ingress), ("egress", verdict.egress))
    sides = [(name, side) for name, side in both if side.verdict == verdict.verdict]
    return sides or [("ingress", verdict.ingress)]


def _cause(check: FlowCheck, group: JobGroup) -> str:
    """What the policies do to the flow, naming every policy that decides it, on each side that fails."""
    return "; ".join(_side_cause(check, name, side, group) for name, side in _blocking_sides(check))


def _side_cause(check: FlowCheck, side_name: str, side: SideVerdict, group: JobGroup) -> str:
    owner = check.flow.dst if side_name == "ingress" else check.flow.src
    where = f"{side_name} of {_pods(owner, group)}"
    denying = [r for r in side.reasons if r.policy and r.effect == "deny"]
    if denying:
        rules = ", ".join(dict.fromkeys(f"{r.policy} {r.rule}".strip() for r in denying))
        return f"{denying[0].kind} {rules} denies it ({where})"
    enforcing = [r for r in side.reasons if r.policy and r.effect == "default-deny"]
    if enforcing:
        opened = next((r.open_ports for r in enforcing if r.open_ports), "")
        if opened:
            return f"{_refs(enforcing)} allows them only {opened} ({where})"
        return f"no rule of {_refs(enforcing)} allows it ({where})"
    if side.verdict == "deny":
        return f"policy enforcement is always and no rule allows it ({where})"
    return "; ".join(blocking_reasons(check.verdict)) or "it cannot be evaluated"


def _fix(finding: Finding, reports: Sequence[ZoneReport], group: JobGroup) -> str:
    """The smallest change that opens the finding's flows."""
    hints = [p for r in reports if r.zone in finding.zones for p in r.problems if STATIC_LABEL_HINT in p]
    if hints:
        return hints[0]
    check = finding.checks[0]
    flow = check.flow
    if check.verdict.verdict == "unknown":
        return ("make the policy evaluable (see the reasons below), or run `topoguard reach` on the flow; "
                "under enforcement warn the job is admitted unchanged")
    flows = [c.flow for c in finding.checks]
    widest = [f for f in flows if not any(_covers(o, f) for o in flows)]  # a port inside a range is said once
    ports = ", ".join(dict.fromkeys(_ports(f) for f in widest))
    return " and ".join(_side_fix(side_name, side, flow, ports, group) for side_name, side in _blocking_sides(check))


def _covers(wide: Flow, flow: Flow) -> bool:
    """Whether `wide` holds every port of `flow` and more."""
    return (wide.protocol == flow.protocol and wide.ports != flow.ports
            and wide.ports.first <= flow.ports.first and flow.ports.last <= wide.ports.last)


def _side_fix(side_name: str, side: SideVerdict, flow: Flow, ports: str, group: JobGroup) -> str:
    denying = [r for r in side.reasons if r.policy and r.effect == "deny"]
    if denying:
        return f"narrow {denying[0].kind} {denying[0].policy} {denying[0].rule} so it no longer denies {ports}"
    if side_name == "ingress":
        return (f"a policy selecting {_pods(flow.dst, group)} must allow ingress from {_pods(flow.src, group)} "
                f"on {ports}")
    return f"a policy selecting {_pods(flow.src, group)} must allow egress to {_pods(flow.dst, group)} on {ports}"


def _findings(reports: Sequence[ZoneReport]) -> list[Finding]:
    """Failing flows grouped by pair of replicas and verdict, over the zones; most zones first."""
    grouped: dict[tuple[str, str, str], tuple[dict[Flow, FlowCheck], dict[str, None], dict[str, None]]] = {}
    for report in reports:
        for check in report.flows:
            if check.verdict.verdict == "allow":
                continue
            # One finding per pair of replicas (both directions) and verdict: what the user must open.
            pair = tuple(sorted((check.flow.src, check.flow.dst)))
            key = (pair[0], pair[-1], check.verdict.verdict)
            flows, zones, problems = grouped.setdefault(key, ({}, {}, {}))
            flows.setdefault(check.flow, check)
            zones[report.zone] = None
            problems[describe_check(check)] = None
    found = [Finding(tuple(f.values()), tuple(z), tuple(p)) for f, z, p in grouped.values()]
    # Deny before unknown, then the finding blocking the most zones, then the most flows.
    return sorted(found, key=lambda f: (f.checks[0].verdict.verdict != "deny", -len(f.zones), -len(f.checks)))


def _covered(finding: Finding, reports: Sequence[ZoneReport]) -> tuple[str, ...]:
    """The problems a network lead states: its flows, and the static-label hint it gives as the fix."""
    hints = [p for r in reports if r.zone in finding.zones for p in r.problems if STATIC_LABEL_HINT in p]
    return finding.problems + tuple(hints[:1])


def _network_lead(finding: Finding, reports: Sequence[ZoneReport], group: JobGroup) -> str:
    state = "is blocked" if finding.checks[0].verdict.verdict == "deny" else "cannot be evaluated"
    if len(reports) == 1:
        where = f"in {reports[0].zone}, the only zone with GPUs for it"
    elif len(finding.zones) == len(reports):
        where = "in every GPU zone"
    else:
        where = f"in {', '.join(finding.zones)}"
    what = _what(finding.checks, group)
    if len({c.flow.purpose for c in finding.checks}) > 1:
        state = state.replace("is ", "are ") if state.startswith("is ") else state
    firsts: dict[tuple[str, str], FlowCheck] = {}
    for check in finding.checks:
        firsts.setdefault((check.flow.src, check.flow.dst), check)  # the first check per direction
    causes = ", ".join(dict.fromkeys(_cause(c, group) for c in firsts.values()))
    text = f"{what[0].upper()}{what[1:]} {state} {where}: {causes}"
    return f"{text}; smallest fix: {_fix(finding, reports, group)}"


def _capacity_lead(reports: Sequence[ZoneReport], decision: Decision) -> tuple[str, tuple[str, ...]]:
    shortfalls = [(r.zone, p) for r in reports for p in r.problems if p.startswith(CAPACITY_PREFIX)]
    zone, problem = min(shortfalls, key=lambda zp: zp[1])
    never = all("allocatable on the nodes it can use" in p and " free" not in p for _, p in shortfalls)
    fix = ("ask for fewer GPUs, or add GPU nodes the pods can use" if never
           else "set capacityPolicy: wait to let it wait Pending for GPUs, or ask for fewer GPUs")
    text = f"There are not enough GPUs for the job in any open zone ({zone}: the job {problem}); smallest fix: {fix}"
    return text, tuple(p for _, p in shortfalls)


def lead_for(group: JobGroup, decision: Decision) -> tuple[str, tuple[str, ...]]:
    """The lead sentence for `decision` and the zone problems it states (see the module docstring).

    Order when refused: replicas that share no zone; no candidate zone at all; a flow blocked in a
    zone where the GPUs fit (the network is what to fix); a GPU shortfall in a zone whose paths are
    open; any remaining blocked flow; else the first reason.
    """
    if decision.allowed:
        return _admitted(group, decision), ()
    reports = decision.zones
    if decision.split or not reports:
        first = decision.reasons[0] if decision.reasons else "no zone qualifies"
        text = f"No zone can run the job's GPU pods: {first}" if not reports else first[:1].upper() + first[1:]
        return text, (decision.reasons[0],) if decision.reasons else ()
    fitting = [r for r in reports if r.fits]
    findings = _findings(fitting)
    if findings:
        return _network_lead(findings[0], fitting, group), _covered(findings[0], fitting)
    if any(p.startswith(CAPACITY_PREFIX) for r in reports if r.network == "allow" for p in r.problems):
        return _capacity_lead([r for r in reports if r.network == "allow"], decision)
    findings = _findings(reports)
    if findings:
        return _network_lead(findings[0], reports, group), _covered(findings[0], reports)
    first = decision.reasons[0] if decision.reasons else "no zone qualifies"
    return f"No zone can take the job: {first}", (decision.reasons[0],) if decision.reasons else ()


def _admitted(group: JobGroup, decision: Decision) -> str:
    chosen = None if decision.zone is None else next((r for r in decision.zones if r.zone == decision.zone), None)
    return admitted(group, decision.zone, chosen, decision.capacity, decision.open_zones)


def admitted(group: JobGroup, zone: str | None, chosen: ZoneReport | None, capacity: str,
             open_zones: Sequence[str]) -> str:
    """The lead of an admitted job (what `lead_for` says of it), from the decision's parts: `chosen` is the
    chosen zone's report (None when the decision has none). The decision being built need not exist yet."""
    flows = len(group.flows)
    if zone is None:
        return f"The job as written stays in zones whose paths are open ({', '.join(open_zones)})"
    if chosen is None:
        return f"The job goes to {zone}"
    open_text = f"all {flows} required flows are open there" if flows else "it needs no network path"
    if capacity == "wait":
        return (f"The job goes to {zone} and waits Pending for GPUs there: {open_text}, "
                f"but {chosen.capacity_note or 'its GPUs are busy'}")
    return (f"The job goes to {zone}: {open_text} and {chosen.gpus_free - chosen.gpus_reserved} "
            f"free GPUs cover the {chosen.gpus_needed} it needs")


def with_lead(group: JobGroup, decision: Decision) -> Decision:
    """`decision` with its `lead` and `lead_covers` filled in."""
    text, covers = lead_for(group, decision)
    return replace(decision, lead=text, lead_covers=covers)


def remaining_reasons(decision: Decision) -> list[str]:
    """The decision's reasons without those the lead sentence already states."""
    covered = set(decision.lead_covers)
    return [r for r in decision.reasons if r not in covered and r.split(": ", 1)[-1] not in covered]
