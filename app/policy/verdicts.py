"""One flow's verdict: A→B on a port range is open only if A's egress AND B's ingress allow every port.

Owns: `check_flow` — per side, the enforcement decision (policy-enforcement mode, §3), explicit
denies (beat every allow from any policy kind, §5), default-deny gaps, conditional (L7) and
uncertain allows, and the `Reason`s that name the deciding policy and rule (cilium-semantics.md §6).
Must not: parse policies (the index holds them compiled) or do I/O.

Per side and protocol, in this order: a port certainly denied by a deny entry → deny; a rule
whose effect cannot be known selects the endpoint → unknown; an enforced side with a port no
allow covers → deny (default-deny); a port only conditionally allowed or maybe denied →
unknown; otherwise allow. Ports are handled as intervals, so 1-65535 costs what one port does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from app.models.cluster import ContainerPort, Snapshot
from app.models.network import (
    Endpoint,
    PolicyEnforcement,
    PortRange,
    Reason,
    SideVerdict,
    Verdict,
    VerdictKind,
)
from app.policy import ports as portsets
from app.policy.identity import describe, identity_labels
from app.policy.index import build_index
from app.policy.rules import Direction, Entry, Rule

FLOW_PROTOCOLS = ("TCP", "UDP", "SCTP", "ANY")
ENFORCEMENT_MODES: tuple[str, ...] = get_args(PolicyEnforcement)


@dataclass(frozen=True)
class _Hit:
    span: portsets.Interval
    entry: Entry
    rule: Rule
    why: str


@dataclass
class _Coverage:
    deny: list[_Hit] = field(default_factory=list)
    deny_maybe: list[_Hit] = field(default_factory=list)
    allow: list[_Hit] = field(default_factory=list)
    allow_conditional: list[_Hit] = field(default_factory=list)


@dataclass(frozen=True)
class _Side:
    direction: Direction
    subject: Endpoint
    peer: Endpoint
    rules: tuple[Rule, ...]
    enforcement: PolicyEnforcement
    port_names: Mapping[str, frozenset[int]]

    @property
    def title(self) -> str:
        if self.direction == "egress":
            return f"egress of {describe(self.subject)} to {describe(self.peer)}"
        return f"ingress of {describe(self.subject)} from {describe(self.peer)}"


def check_flow(
    snapshot: Snapshot,
    src: Endpoint,
    dst: Endpoint,
    ports: PortRange,
    protocol: str,
    *,
    enforcement: PolicyEnforcement = "default",
) -> Verdict:
    """Whether `src` can open connections to `dst` on every port of `ports` over `protocol`.

    Args:
        snapshot: the cluster; its policies are compiled once (`build_index`).
        src, dst: pods as policy sees them (labels as they will be after placement).
        ports: the destination ports; every one must be allowed.
        protocol: TCP | UDP | SCTP | ANY (ANY: every one of TCP, UDP and SCTP must be allowed).
        enforcement: the agent's policy-enforcement mode.

    Returns:
        A Verdict whose reasons are the egress reasons followed by the ingress reasons.

    Raises:
        ValueError: an impossible port range, protocol or mode (caller bugs, not cluster data).
    """
    _validate(ports, protocol, enforcement)
    if enforcement == "never":
        egress = SideVerdict("allow", (Reason("egress", "not-enforced", "policy enforcement mode is never"),))
        ingress = SideVerdict("allow", (Reason("ingress", "not-enforced", "policy enforcement mode is never"),))
        return _combine(egress, ingress)
    if src.host_network or dst.host_network:
        return _host_network(src, dst)
    index = build_index(snapshot)
    src_identity, dst_identity = identity_labels(src), identity_labels(dst)
    sides = (
        _Side("egress", src, dst, tuple(index.rules_for(src_identity, src.namespace)), enforcement, index.port_names),
        _Side("ingress", dst, src, tuple(index.rules_for(dst_identity, dst.namespace)), enforcement, index.port_names),
    )
    peer_identities = (dst_identity, src_identity)
    protocols = ("TCP", "UDP", "SCTP") if protocol == "ANY" else (protocol,)
    egress, ingress = (
        _merge([_judge(side, identity, dst.ports, (ports.first, ports.last), p) for p in protocols])
        for side, identity in zip(sides, peer_identities, strict=True)
    )
    return _combine(egress, ingress)


def _validate(ports: PortRange, protocol: str, enforcement: str) -> None:
    if not 0 <= ports.first <= ports.last <= portsets.MAX_PORT:
        raise ValueError(f"port range {ports.first}-{ports.last} is not within 0-{portsets.MAX_PORT}")
    if protocol not in FLOW_PROTOCOLS:
        raise ValueError(f"protocol {protocol!r} is not one of {', '.join(FLOW_PROTOCOLS)}")
    if enforcement not in ENFORCEMENT_MODES:
        raise ValueError(f"policy enforcement {enforcement!r} is not one of {', '.join(ENFORCEMENT_MODES)}")


def _combine(egress: SideVerdict, ingress: SideVerdict) -> Verdict:
    kinds = (egress.verdict, ingress.verdict)
    verdict: VerdictKind = "deny" if "deny" in kinds else "unknown" if "unknown" in kinds else "allow"
    return Verdict(verdict, egress, ingress, egress.reasons + ingress.reasons)


def _host_network(src: Endpoint, dst: Endpoint) -> Verdict:
    who = ", ".join(describe(e) for e in (src, dst) if e.host_network)
    message = (f"{who} uses hostNetwork: it is not a Cilium endpoint (host or remote-node identity, host "
               "policies only), which this checker does not evaluate")
    egress = SideVerdict("unknown", (Reason("egress", "unknown", message),))
    ingress = SideVerdict("unknown", (Reason("ingress", "unknown", message),))
    return _combine(egress, ingress)


def _collect(
    side: _Side, peer_identity: Mapping[str, str], dst_ports: Sequence[ContainerPort], protocol: str
) -> _Coverage:
    coverage = _Coverage()
    for rule in side.rules:
        if rule.uncertain:
            continue
        for entry in rule.entries(side.direction):
            match, why = entry.peers.match(peer_identity, side.peer.namespace)
            if match == "no":
                continue
            why += _named_port_note(side, entry)
            if entry.ports is None:
                spans = [portsets.ALL]
            else:
                spans = [s for spec in entry.ports for s in spec.intervals(protocol, dst_ports)]
            for span in spans:
                if entry.deny:
                    (coverage.deny if match == "yes" else coverage.deny_maybe).append(_Hit(span, entry, rule, why))
                elif match == "yes" and not entry.conditions:
                    coverage.allow.append(_Hit(span, entry, rule, why))
                else:
                    reason = why if match == "maybe" else "; ".join(entry.conditions)
                    coverage.allow_conditional.append(_Hit(span, entry, rule, reason))
    return coverage


def _named_port_note(side: _Side, entry: Entry) -> str:
    """§4.8: before 2026 Cilium resolved egress port names node-wide, not per destination."""
    if side.direction != "egress" or not entry.ports:
        return ""
    ambiguous = sorted(
        f"{spec.name}={'/'.join(map(str, sorted(side.port_names[spec.name])))}"
        for spec in entry.ports
        if spec.name and len(side.port_names.get(spec.name, ())) > 1
    )
    if not ambiguous:
        return ""
    return (f"; NB: approximate, port name(s) {', '.join(ambiguous)} map to several numbers in this cluster and "
            "older Cilium resolves egress port names node-wide")


def _judge(
    side: _Side, peer_identity: Mapping[str, str], dst_ports: Sequence[ContainerPort],
    span: portsets.Interval, protocol: str,
) -> SideVerdict:
    coverage = _collect(side, peer_identity, dst_ports, protocol)
    denied = _hits_in(span, coverage.deny)
    if denied:
        return SideVerdict("deny", tuple(_hit_reason(side, h, part, protocol, "deny") for h, part in denied))
    uncertain = [r for r in side.rules if r.uncertain and side.direction in r.directions]
    if uncertain:
        return SideVerdict("unknown", tuple(_uncertain_reason(side, r) for r in _unique_policies(uncertain)))
    enforcing = [r for r in side.rules if side.direction in r.enforces]
    enforced = side.enforcement == "always" or bool(enforcing)
    if enforced:
        gaps = portsets.subtract(span, [h.span for h in coverage.allow + coverage.allow_conditional])
        if gaps:
            return SideVerdict("deny", _default_deny_reasons(side, enforcing, gaps, protocol))
    unsure = _hits_in(span, coverage.deny_maybe)
    # Ports only a conditional entry allows. NB: L7 rules redirect matching traffic to the proxy
    # even where the direction is not enforced (enableDefaultDeny: false does not relax them, §4.10),
    # unless a plain allow covers the same port.
    open_gaps = portsets.subtract(span, [h.span for h in coverage.allow])
    unsure += [
        (h, part)
        for gap in open_gaps
        for h, part in _hits_in(gap, coverage.allow_conditional)
        if enforced or h.entry.conditions
    ]
    if unsure:
        return SideVerdict("unknown", tuple(_hit_reason(side, h, part, protocol, "unknown") for h, part in unsure))
    if not enforced:
        return SideVerdict("allow", _not_enforced_reasons(side))
    allowed = _hits_in(span, coverage.allow)
    return SideVerdict("allow", tuple(_hit_reason(side, h, part, protocol, "allow") for h, part in allowed))


def _hits_in(span: portsets.Interval, hits: Iterable[_Hit]) -> list[tuple[_Hit, list[portsets.Interval]]]:
    out = []
    for hit in hits:
        part = portsets.intersect(span, [hit.span])
        if part:
            out.append((hit, part))
    return out


def _unique_policies(rules: Iterable[Rule]) -> list[Rule]:
    seen: dict[tuple[str, str], Rule] = {}
    for rule in rules:
        seen.setdefault((rule.kind, rule.policy), rule)
    return list(seen.values())


def _hit_reason(side: _Side, hit: _Hit, part: list[portsets.Interval], protocol: str,
                effect: Literal["allow", "deny", "unknown"]) -> Reason:
    ports = portsets.show(part, protocol)
    if effect == "deny":
        message = f"{side.title} on {ports} is denied by this deny entry ({hit.why})"
    elif effect == "allow":
        message = f"{side.title} on {ports} is allowed by this entry ({hit.why})"
    else:
        message = f"{side.title} on {ports} depends on what cannot be evaluated: {hit.why}"
    return Reason(side.direction, effect, message, hit.rule.policy, hit.rule.kind, hit.entry.path)


def _uncertain_reason(side: _Side, rule: Rule) -> Reason:
    message = (f"policy selects {describe(side.subject)} for {side.direction} but its effect is not known: "
               f"{rule.uncertain}")
    return Reason(side.direction, "unknown", message, rule.policy, rule.kind, rule.path)


def _default_deny_reasons(
    side: _Side, enforcing: list[Rule], gaps: list[portsets.Interval], protocol: str
) -> tuple[Reason, ...]:
    closed = portsets.show(gaps, protocol)
    if not enforcing:
        message = f"{side.title}: policy enforcement mode is always and no rule allows {closed}"
        return (Reason(side.direction, "default-deny", message),)
    return tuple(
        Reason(side.direction, "default-deny",
               f"{side.title}: this rule puts {side.direction} into default-deny and no rule allows {closed}",
               rule.policy, rule.kind, rule.path)
        for rule in enforcing
    )


def _not_enforced_reasons(side: _Side) -> tuple[Reason, ...]:
    message = f"{side.title}: no policy enforces {side.direction} of {describe(side.subject)}, so it is allowed"
    reasons = [Reason(side.direction, "not-enforced", message)]
    for rule in side.rules:
        if side.direction in rule.directions and side.direction not in rule.enforces:
            reasons.append(Reason(side.direction, "not-enforced",
                                  f"selects {describe(side.subject)} with enableDefaultDeny.{side.direction}=false",
                                  rule.policy, rule.kind, rule.path))
    return tuple(reasons)


def _merge(verdicts: list[SideVerdict]) -> SideVerdict:
    """One side over several protocols: deny if any denies, else unknown if any is unknown."""
    kinds = [v.verdict for v in verdicts]
    verdict: VerdictKind = "deny" if "deny" in kinds else "unknown" if "unknown" in kinds else "allow"
    reasons: dict[Reason, None] = {}
    for v in verdicts:
        if v.verdict == verdict:
            reasons.update(dict.fromkeys(v.reasons))
    return SideVerdict(verdict, tuple(reasons))
