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

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, cast, get_args

from app.models.cilium import CiliumAgent, Version
from app.models.cluster import BoundedMemo, ContainerPort, Snapshot
from app.models.network import (
    Endpoint,
    PolicyEnforcement,
    PortRange,
    Reason,
    SideVerdict,
    Verdict,
    VerdictKind,
)
from app.policy import agent as agents
from app.policy import identity, tiers
from app.policy import ports as portsets
from app.policy.cilium import CCNP, CNP
from app.policy.identity import LabelFilter, describe, identity_labels
from app.policy.index import PolicyIndex, build_index
from app.policy.kcnp import KIND as KCNP
from app.policy.knp import KIND as KNP
from app.policy.rules import Direction, Entry, Rule
from app.policy.selectors import NODE_IDENTITIES

FLOW_PROTOCOLS = ("TCP", "UDP", "SCTP", "ANY")
ENFORCEMENT_MODES: tuple[str, ...] = get_args(PolicyEnforcement)


_Hit = tiers.Hit


@dataclass
class _Coverage:
    """A side's entries that apply to the peer: the Normal tier's by kind, the other tiers' whole."""

    deny: list[_Hit] = field(default_factory=list)
    deny_maybe: list[_Hit] = field(default_factory=list)
    allow: list[_Hit] = field(default_factory=list)
    allow_conditional: list[_Hit] = field(default_factory=list)
    admin: list[_Hit] = field(default_factory=list)
    baseline: list[_Hit] = field(default_factory=list)


@dataclass(frozen=True)
class _Side:
    direction: Direction
    subject: Endpoint
    peer: Endpoint
    rules: tuple[Rule, ...]
    enforcement: PolicyEnforcement
    port_names: Mapping[str, frozenset[int]]
    peer_node: str = ""  # host | remote-node: the peer is a hostNetwork pod seen as that identity
    version: Version | None = None  # the agent's; None when not known
    cidr_pods: bool = False  # policy-cidr-match-mode pods: CIDR peers are matched against pod addresses
    cidr_nodes: bool = False  # policy-cidr-match-mode nodes: CIDR peers may match node addresses

    def peer_ranges(self) -> tuple[str, ...] | None:
        """Where the peer's address lies, for CIDR peers; None when the agent never matches them to pods."""
        if not self.cidr_pods:
            return None
        return self.peer.ips or self.peer.ranges

    @property
    def title(self) -> str:
        peer = describe(self.peer)
        if self.peer_node:
            where = "the same node" if self.peer_node == "host" else "another node"
            peer = f"hostNetwork {peer} as entity {self.peer_node} (on {where})"
        if self.direction == "egress":
            return f"egress of {describe(self.subject)} to {peer}"
        return f"ingress of {describe(self.subject)} from {peer}"


def check_flow(
    snapshot: Snapshot,
    src: Endpoint,
    dst: Endpoint,
    ports: PortRange,
    protocol: str,
    *,
    enforcement: PolicyEnforcement = "default",
    agent: CiliumAgent | None = None,
) -> Verdict:
    """`evaluate_flow`, memoized per snapshot on exactly what the verdict depends on (`flow_key`)."""
    _validate(ports, protocol, enforcement)
    agent = agent if agent is not None else snapshot_agent(snapshot)
    if enforcement == "never":
        return evaluate_flow(snapshot, src, dst, ports, protocol, enforcement=enforcement, agent=agent)
    index = build_index(snapshot)
    key = (flow_key(index, src), flow_key(index, dst), ports.first, ports.last, protocol, enforcement, agent)
    memo = snapshot.memo(VERDICT_MEMO_KEY, lambda _: VerdictMemo(), network=True)
    found = memo.get(key)
    if found is None:
        found = evaluate_flow(snapshot, src, dst, ports, protocol, enforcement=enforcement, agent=agent)
        memo.put(key, found)
    return found


AGENT_MEMO_KEY = "policy.agent"


def snapshot_agent(snapshot: Snapshot, version: str = "", policy_enforcement: str = "") -> CiliumAgent:
    """The agent the snapshot describes (cilium-config, agent image), `version` (settings `ciliumVersion`)
    and `policy_enforcement` (settings `policyEnforcement`) winning when set; memoized per snapshot and
    settings. An unusable cilium-config or version gives an agent of unknown version (its problem is in
    `policy_problems`), with the explicit enforcement mode if there is one."""
    def build(s: Snapshot) -> CiliumAgent:
        try:
            return agents.agent_settings(s, version=version, policy_enforcement=policy_enforcement)
        except agents.AgentConfigError:
            return CiliumAgent(policy_enforcement=policy_enforcement or "default")
    return snapshot.memo(f"{AGENT_MEMO_KEY}/{version}/{policy_enforcement}", build, network=True)


def evaluate_flow(
    snapshot: Snapshot,
    src: Endpoint,
    dst: Endpoint,
    ports: PortRange,
    protocol: str,
    *,
    enforcement: PolicyEnforcement = "default",
    agent: CiliumAgent | None = None,
) -> Verdict:
    """Whether `src` can open connections to `dst` on every port of `ports` over `protocol`.

    Args:
        snapshot: the cluster; its policies are compiled once (`build_index`).
        src, dst: pods as policy sees them (labels as they will be after placement).
        ports: the destination ports; every one must be allowed.
        protocol: TCP | UDP | SCTP | ANY (ANY: every one of TCP, UDP and SCTP must be allowed).
        enforcement: the agent's policy-enforcement mode.
        agent: the agent's version and settings (`app.policy.agent`); default: what the snapshot
            says (`snapshot_agent`). Of unknown version, a verdict that the version decides
            (the identity label filter) is `unknown`.

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
    agent = agent if agent is not None else snapshot_agent(snapshot)
    index = build_index(snapshot)
    protocols = ("TCP", "UDP", "SCTP") if protocol == "ANY" else (protocol,)
    span = (ports.first, ports.last)

    relax = agent.non_default_deny and agent.at_least(*NON_DEFAULT_DENY_SINCE) is not False

    def judged(kinds: frozenset[str]) -> Verdict:
        skip = _View(kinds, relax, "pods" in agent.cidr_match_mode, "nodes" in agent.cidr_match_mode)
        label_filter = agents.identity_filter(agent)
        if label_filter is None:
            older, newer = agents.version_filters(agent)
            if _filter_matters(index, src, dst):
                before = _evaluate(index, src, dst, span, protocols, enforcement, older, agent.cluster_name, None, skip)
                after = _evaluate(index, src, dst, span, protocols, enforcement, newer, agent.cluster_name, None, skip)
                return _by_version(before, after)
            label_filter = older
        return _evaluate(index, src, dst, span, protocols, enforcement, label_filter, agent.cluster_name,
                         agent.version, skip)

    off = frozenset(k for k in agent.kinds_off if index.has_kind(k))
    maybe = sorted(k for k in agent.kinds_unknown if k not in off and index.has_kind(k))
    if maybe:
        verdict = _by_setting(judged(off), judged(off | set(maybe)), lambda d, a, b: _kind_unknown(d, a, b, maybe))
    else:
        verdict = judged(off)
    return _audited(verdict) if agent.audit_mode else verdict


AUDIT_PREFIX = "policy audit mode"
# enableDefaultDeny exists from Cilium 1.16 (PR #30572); before, the CRD prunes it (§3.2).
NON_DEFAULT_DENY_SINCE = (1, 16)


def _audited(verdict: Verdict) -> Verdict:
    """Under policy-audit-mode the agent only logs the drops it would make (§3.6): a denied side is allowed,
    with a reason saying it would be denied; `unknown` stays unknown (L7 proxies still apply their rules)."""
    sides = []
    for side in (verdict.egress, verdict.ingress):
        if side.verdict != "deny":
            sides.append(side)
            continue
        direction = side.reasons[0].side if side.reasons else "egress"
        message = (f"{AUDIT_PREFIX} (cilium-config policy-audit-mode=true): Cilium only logs this {direction} drop "
                   f"and lets the flow through; without audit mode it would be {_brief(side)}")
        sides.append(SideVerdict("allow", (Reason(direction, "allow", message), *side.reasons)))
    return _combine(sides[0], sides[1])


def _evaluate(
    index: PolicyIndex, src: Endpoint, dst: Endpoint, span: portsets.Interval, protocols: Sequence[str],
    enforcement: PolicyEnforcement, label_filter: LabelFilter, cluster_name: str, version: Version | None,
    skip: _View | None = None,
) -> Verdict:
    """`skip`: which rules the agent uses (`_View`)."""
    skip = skip or _View()
    if src.host_network or dst.host_network:
        return _host_network(index, src, dst, span, protocols, enforcement, label_filter, cluster_name, skip)
    src_identity = identity_labels(src, label_filter, cluster_name=cluster_name)
    dst_identity = identity_labels(dst, label_filter, cluster_name=cluster_name)
    sides = (
        _Side("egress", src, dst, _rules(index, src_identity, src.namespace, skip), enforcement, index.port_names,
              version=version, cidr_pods=skip.cidr_pods),
        _Side("ingress", dst, src, _rules(index, dst_identity, dst.namespace, skip), enforcement, index.port_names,
              version=version, cidr_pods=skip.cidr_pods),
    )
    peer_identities = (dst_identity, src_identity)
    egress, ingress = (
        _merge([_judge(side, identity, dst.ports, span, p) for p in protocols])
        for side, identity in zip(sides, peer_identities, strict=True)
    )
    return _combine(egress, ingress)


# Label keys whose place in the identity depends on the Cilium version (identity.TOPOLOGY_EXCLUSION).
VERSION_DEPENDENT_PREFIX = "topology.kubernetes.io/"


def _filter_matters(index: PolicyIndex, src: Endpoint, dst: Endpoint) -> bool:
    """Whether a pod carries a label that only some versions keep AND some selector reads it."""
    read = {k for k in index.keys_read if k.startswith(VERSION_DEPENDENT_PREFIX)}
    return bool(read) and any(k in read for e in (src, dst) for k in e.labels)


@dataclass(frozen=True)
class _View:
    """Which rules the agent uses: kinds it does not enforce are left out; without non-default-deny policies
    (enable-non-default-deny-policies=false, or Cilium before 1.16) `enableDefaultDeny: false` is ignored."""

    skip: frozenset[str] = frozenset()
    relax: bool = True
    cidr_pods: bool = False
    cidr_nodes: bool = False


def _rules(index: PolicyIndex, identity: Mapping[str, str], namespace: str, view: _View) -> tuple[Rule, ...]:
    rules = [r for r in index.rules_for(identity, namespace) if r.kind not in view.skip]
    if not view.relax:
        rules = [replace(r, enforces=r.directions) if r.kind in (CNP, CCNP) else r for r in rules]
    return tuple(rules)


def _kind_unknown(direction: str, enforced: SideVerdict, ignored: SideVerdict, kinds: Sequence[str]) -> str:
    """No silent skip: the agent may or may not enforce these kinds, and they change this side."""
    flags = ", ".join(f"{agents.KIND_FLAGS[k][0]}" for k in kinds)
    since = ".".join(map(str, agents.KCNP_SINCE))
    return (f"{direction}: depends on whether the Cilium agent enforces {', '.join(kinds)}, which is not known "
            f"(Cilium >= {since} with cilium-config {flags}=true does): enforced it is {_brief(enforced)}, "
            f"not enforced {_brief(ignored)}; let topoguard read the cilium-config ConfigMap (setting "
            "ciliumConfig)")


def _by_setting(first: Verdict, second: Verdict, describe: Callable[[str, SideVerdict, SideVerdict], str]) -> Verdict:
    """One verdict for an agent setting that is not known: each side as both values agree, else unknown."""
    sides = []
    for direction, one, other in (("egress", first.egress, second.egress), ("ingress", first.ingress, second.ingress)):
        if one.verdict == other.verdict:
            sides.append(one)
            continue
        side = cast(Direction, direction)
        reason = Reason(side, "unknown", describe(direction, one, other))
        sides.append(SideVerdict("unknown", (reason, *one.reasons, *other.reasons)))
    return _combine(sides[0], sides[1])


def _by_version(before: Verdict, after: Verdict) -> Verdict:
    """One verdict for an agent of unknown version: each side as both versions agree, else unknown."""
    sides = []
    for direction, old, new in (("egress", before.egress, after.egress), ("ingress", before.ingress, after.ingress)):
        if old.verdict == new.verdict:
            sides.append(old)
            continue
        since = ".".join(map(str, identity.TOPOLOGY_EXCLUSION_SINCE))
        message = (f"{direction}: depends on the Cilium version, which is not known: before {since} the "
                   f"topology.kubernetes.io/* pod labels are part of the identity and it is {_brief(old)}; from "
                   f"{since} they are not (pkg/labelsfilter) and it is {_brief(new)}; set ciliumVersion, or let "
                   "topoguard read the cilium DaemonSet")
        side = cast(Direction, direction)
        sides.append(SideVerdict("unknown", (Reason(side, "unknown", message), *old.reasons, *new.reasons)))
    return _combine(sides[0], sides[1])


VERDICT_MEMO_KEY = "policy.verdicts"
# Verdicts kept per snapshot. A decision asks a handful per zone; the bound only caps memory when
# many different jobs are reviewed against one long-lived snapshot.
VERDICT_MEMO_SIZE = 4096

EndpointKey = tuple[object, ...]


def flow_key(index: PolicyIndex, endpoint: Endpoint) -> EndpointKey:
    """Everything about `endpoint` a verdict can depend on: two endpoints with equal keys get equal verdicts.

    Every field but the pod labels is kept whole (namespace and its labels, service account, ports
    — named ports resolve against the destination's — hostNetwork, IPs, name). Pod labels are kept
    only for the keys some compiled selector reads (`PolicyIndex.keys_read`; `{}` selectors,
    entities and namespace scoping read no label), in their own order, since the order of an
    identity's keys orders the rules found for it and so the reasons. Identity keys Cilium derives
    (namespace, its labels, service account, cluster) follow from fields kept whole, and the
    label filter drops any pod label that would collide with them. Without a name, messages
    describe the endpoint by all its labels, so then they are all kept.
    """
    if endpoint.name:
        read = index.keys_read
        labels = tuple((k, v) for k, v in endpoint.labels.items() if k in read)
    else:
        labels = tuple(endpoint.labels.items())
    return (
        endpoint.namespace,
        tuple(endpoint.namespace_labels.items()),
        endpoint.service_account,
        endpoint.ports,
        endpoint.host_network,
        endpoint.ips,
        endpoint.name,
        labels,
        endpoint.ranges,
    )


class VerdictMemo(BoundedMemo[tuple[object, ...], Verdict]):
    """The bounded verdict cache of one snapshot."""

    def __init__(self, size: int = VERDICT_MEMO_SIZE) -> None:
        super().__init__(size)


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


def _host_network(
    index: PolicyIndex, src: Endpoint, dst: Endpoint, span: portsets.Interval, protocols: Sequence[str],
    enforcement: PolicyEnforcement, label_filter: LabelFilter, cluster_name: str, skip: _View,
) -> Verdict:
    """A flow from or to a hostNetwork pod (§1.4, §4.5).

    Such a pod is not a Cilium endpoint: its own side is the host's, governed only by host policies
    (CCNP `nodeSelector`, host firewall); its traffic reaches the pod on the other side as entity
    `host` from the same node and `remote-node` from another. Where the pods will run is not
    known, so the pod's side must agree for both identities, or it is `unknown`.
    """
    egress = (_host_side(index, "egress", src, enforcement) if src.host_network
              else _toward_node(index, "egress", src, dst, dst.ports, span, protocols, enforcement,
                                label_filter, cluster_name, skip))
    ingress = (_host_side(index, "ingress", dst, enforcement) if dst.host_network
               else _toward_node(index, "ingress", dst, src, dst.ports, span, protocols, enforcement,
                                 label_filter, cluster_name, skip))
    return _combine(egress, ingress)


def _host_side(index: PolicyIndex, direction: Direction, pod: Endpoint, enforcement: PolicyEnforcement) -> SideVerdict:
    """The hostNetwork pod's own side: host traffic, enforced only by host policies."""
    title = f"{direction} of hostNetwork {describe(pod)} is host traffic"
    host_rules = index.host_rules.get(direction, ())
    if host_rules:
        message = (f"{title}, which host policies (CiliumClusterwideNetworkPolicy nodeSelector) govern "
                   f"when the host firewall is on; host policies are not evaluated")
        return SideVerdict("unknown", tuple(Reason(direction, "unknown", message, ref, CCNP, path)
                                            for ref, path in host_rules))
    if enforcement == "always":
        message = (f"{title}: under policy enforcement mode always the host is default-deny if the host firewall "
                   "is on, which the snapshot does not tell")
        return SideVerdict("unknown", (Reason(direction, "unknown", message),))
    message = f"{title} and no host policy (CiliumClusterwideNetworkPolicy nodeSelector) exists: not enforced"
    return SideVerdict("allow", (Reason(direction, "allow", message),))


def _toward_node(
    index: PolicyIndex, direction: Direction, subject: Endpoint, peer: Endpoint, dst_ports: Sequence[ContainerPort],
    span: portsets.Interval, protocols: Sequence[str], enforcement: PolicyEnforcement,
    label_filter: LabelFilter, cluster_name: str, skip: _View,
) -> SideVerdict:
    """A pod's side toward a hostNetwork peer: judged for the peer as entity host and as remote-node."""
    identity_of_subject = identity_labels(subject, label_filter, cluster_name=cluster_name)
    rules = _rules(index, identity_of_subject, subject.namespace, skip)
    same, other = (
        _merge([
            _judge(_Side(direction, subject, peer, rules, enforcement, index.port_names, node,
                         cidr_nodes=skip.cidr_nodes), {}, dst_ports, span, p)
            for p in protocols
        ])
        for node in NODE_IDENTITIES
    )
    if same.verdict == other.verdict:
        return SideVerdict(same.verdict, tuple(dict.fromkeys(same.reasons + other.reasons)))
    message = (f"{direction} of {describe(subject)} {'to' if direction == 'egress' else 'from'} hostNetwork "
               f"{describe(peer)} is {_brief(same)} from the same node (entity host) but {_brief(other)} from "
               "another node (entity remote-node); which applies depends on the nodes the pods run on, which is "
               "not known")
    return SideVerdict("unknown", (Reason(direction, "unknown", message), *same.reasons, *other.reasons))


def _brief(verdict: SideVerdict) -> str:
    """`denied (CiliumNetworkPolicy ml/a ingressDeny[0])`: the verdict and the policies that decide it."""
    effects = {"allow": ("allow",), "deny": ("deny", "default-deny"), "unknown": ("unknown",)}[verdict.verdict]
    refs = dict.fromkeys(" ".join(p for p in (r.kind, r.policy, r.rule) if p)
                         for r in verdict.reasons if r.policy and r.effect in effects)
    word = {"allow": "allowed", "deny": "denied", "unknown": "unknown"}[verdict.verdict]
    return f"{word} ({'; '.join(refs)})" if refs else word


def _collect(
    side: _Side, peer_identity: Mapping[str, str], dst_ports: Sequence[ContainerPort], protocol: str
) -> _Coverage:
    coverage = _Coverage()
    for rule in side.rules:
        if rule.uncertain:
            continue
        for entry in rule.entries(side.direction):
            if side.peer_node:
                match, why = entry.peers.match_node(side.peer_node, pod_selectors=rule.kind != KNP,
                                                    cidr_nodes=side.cidr_nodes)
            else:
                match, why = entry.peers.match(peer_identity, side.peer.namespace, version=side.version,
                                               ranges=side.peer_ranges())
            if match == "no":
                continue
            why += _named_port_note(side, entry)
            if entry.ports is None:
                spans = [portsets.ALL]
            else:
                spans = [s for spec in entry.ports for s in spec.intervals(protocol, dst_ports)]
            for span in spans:
                if entry.tier != "Normal":
                    tiered = coverage.admin if entry.tier == "Admin" else coverage.baseline
                    tiered.append(_Hit(span, entry, rule, why, match))
                elif entry.deny:
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
    """The side on `span` of one protocol, tier by tier: ClusterNetworkPolicy Admin, then the Normal tier
    (CNP/CCNP/NetworkPolicy), whose undecided ports fall to ClusterNetworkPolicy Baseline."""
    coverage = _collect(side, peer_identity, dst_ports, protocol)
    uncertain = [r for r in side.rules if r.uncertain and r.kind == KCNP and side.direction in r.directions]
    if uncertain:
        # NB: its tier and actions are not known, so it may decide any port before every other policy.
        return SideVerdict("unknown", tuple(_uncertain_reason(side, r) for r in _unique_policies(uncertain)))
    if not coverage.admin:
        return _judge_normal(side, coverage, span, protocol)
    decided, rest = tiers.resolve([span], coverage.admin)
    pieces = [_tier_verdict(side, piece, protocol) for piece in decided]
    pieces += [_judge_normal(side, coverage, sub, protocol) for sub in rest]
    return _merge(pieces)


def _judge_normal(side: _Side, coverage: _Coverage, span: portsets.Interval, protocol: str) -> SideVerdict:
    """The Normal tier on the ports no Admin entry decided; what it leaves goes to the Baseline tier."""
    denied = _hits_in(span, coverage.deny)
    if denied:
        return SideVerdict("deny", tuple(_hit_reason(side, h, part, protocol, "deny") for h, part in denied))
    uncertain = [r for r in side.rules if r.uncertain and side.direction in r.directions]
    if uncertain:
        return SideVerdict("unknown", tuple(_uncertain_reason(side, r) for r in _unique_policies(uncertain)))
    if side.direction == "ingress" and side.peer_node == "host":
        return _from_local_host(side, span, coverage, protocol)
    enforcing = [r for r in side.rules if side.direction in r.enforces]
    enforced = side.enforcement == "always" or bool(enforcing)
    # Ports no Normal allow covers: the Baseline tier decides them, else the default does (default-deny
    # when the side is enforced, allow when not). NB: Cilium consults Baseline even for a side a
    # NetworkPolicy isolates (its default-deny is the absence of an entry, after every tier).
    uncovered = portsets.subtract(span, [h.span for h in coverage.allow + coverage.allow_conditional])
    baseline, still = tiers.resolve(uncovered, coverage.baseline) if coverage.baseline else ([], uncovered)
    pieces = [_tier_verdict(side, piece, protocol) for piece in baseline]
    if enforced and still:
        opened = portsets.intersect(span, [h.span for h in coverage.allow + coverage.allow_conditional])
        pieces.append(SideVerdict("deny", _default_deny_reasons(side, enforcing, still, protocol, opened)))
    if any(p.verdict == "deny" for p in pieces):
        return _merge(pieces)
    unsure = _hits_in(span, coverage.deny_maybe)
    # Ports only a conditional entry allows. NB: L7 rules redirect matching traffic to the proxy
    # even where the direction is not enforced (enableDefaultDeny: false does not relax them, §4.10),
    # unless a plain allow covers the same port.
    open_gaps = portsets.subtract(span, [h.span for h in coverage.allow])
    unsure += [
        (h, part)
        for gap in open_gaps
        for h, part in _hits_in(gap, coverage.allow_conditional)
        if enforced or h.entry.conditions or coverage.baseline
    ]
    if unsure:
        pieces.append(SideVerdict("unknown", tuple(_hit_reason(side, h, part, protocol, "unknown")
                                                   for h, part in unsure)))
    elif not enforced:
        pieces.append(SideVerdict("allow", _not_enforced_reasons(side)))
    else:
        allowed = _hits_in(span, coverage.allow)
        pieces.append(SideVerdict("allow", tuple(_hit_reason(side, h, part, protocol, "allow") for h, part in allowed)))
    return _merge(pieces)


def _tier_verdict(side: _Side, piece: tiers.Piece, protocol: str) -> SideVerdict:
    """A ClusterNetworkPolicy entry's decision on some ports, as a side verdict naming its tier and priority."""
    hit, ports = piece.hit, portsets.show(list(piece.parts), protocol)
    if piece.outcome == "unknown":
        why = hit.why if hit.match != "yes" else "; ".join(hit.entry.conditions)
        message = f"{side.title} on {ports} depends on what cannot be evaluated ({hit.entry.label}): {why}"
    else:
        word = "denied" if piece.outcome == "deny" else "allowed"
        message = f"{side.title} on {ports} is {word} by this rule ({hit.entry.label}; {hit.why})"
    reason = Reason(side.direction, piece.outcome, message, hit.rule.policy, hit.rule.kind, hit.entry.path)
    return SideVerdict(piece.outcome, (reason,))


def _from_local_host(side: _Side, span: portsets.Interval, coverage: _Coverage, protocol: str) -> SideVerdict:
    """Ingress from the pod's own node is always allowed (allow-localhost, Cilium's default, §1.4)
    unless denied; a deny that may apply, or an L7 rule that redirects the port, leaves it unknown."""
    open_gaps = portsets.subtract(span, [h.span for h in coverage.allow])
    unsure = _hits_in(span, coverage.deny_maybe) + [
        (h, part) for gap in open_gaps for h, part in _hits_in(gap, coverage.allow_conditional) if h.entry.conditions
    ]
    if unsure:
        return SideVerdict("unknown", tuple(_hit_reason(side, h, part, protocol, "unknown") for h, part in unsure))
    message = f"{side.title}: the local host may always reach its pods (allow-localhost, Cilium's default)"
    return SideVerdict("allow", (Reason(side.direction, "allow", message),))


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
    side: _Side, enforcing: list[Rule], gaps: list[portsets.Interval], protocol: str,
    opened: list[portsets.Interval],
) -> tuple[Reason, ...]:
    """`opened`: the flow's ports some rule does allow this peer (`Reason.open_ports`, "" when none), so a
    message can say "allows them only 23456/TCP" instead of naming the whole closed range."""
    closed = portsets.show(gaps, protocol)
    open_ports = portsets.show(opened, protocol) if opened else ""
    if not enforcing:
        message = f"{side.title}: policy enforcement mode is always and no rule allows {closed}"
        return (Reason(side.direction, "default-deny", message, open_ports=open_ports),)
    return tuple(
        Reason(side.direction, "default-deny",
               f"{side.title}: this rule puts {side.direction} into default-deny and no rule allows {closed}",
               rule.policy, rule.kind, rule.path, open_ports=open_ports)
        for rule in enforcing
    )


def _not_enforced_reasons(side: _Side) -> tuple[Reason, ...]:
    message = f"{side.title}: no policy enforces {side.direction} of {describe(side.subject)}, so it is allowed"
    reasons = [Reason(side.direction, "not-enforced", message)]
    for rule in side.rules:
        if rule.kind == KCNP:
            continue  # it never enforces; what it decides is said by its own reasons
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
