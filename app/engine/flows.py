"""The group's required flows simulated in one zone, under the cluster's network policies.

PURE. Every pod of the group is turned into a policy `Endpoint` as it will exist in the zone:
its namespace and namespace labels, its pod labels (plus per-zone overrides such as the zone
identity label), service account, container ports and hostNetwork. Each `Flow` of the group is
then checked with `policy.check_flow`, source egress AND destination ingress.

Cost control:

- Pods of one replica type differ only in their index label. When no policy mentions that key,
  one representative pod stands for all of them; otherwise indices are enumerated, up to
  `MAX_ENUMERATED_PODS` per replica type (beyond that, the decision carries a warning).
- Verdicts are cached per (source, destination, ports, protocol) for the whole decision: without
  a zone identity label the pods look the same in every zone, so each flow is evaluated once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from app import policy
from app.models.cluster import Snapshot
from app.models.decision import FlowCheck
from app.models.job import Flow, JobGroup, Replica
from app.models.network import Endpoint, PolicyEnforcement, Reason, SideVerdict, Verdict, VerdictKind

MAX_ENUMERATED_PODS = 32
SEVERITY: Mapping[str, int] = {"allow": 0, "unknown": 1, "deny": 2}

EndpointKey = tuple[object, ...]


def endpoint_key(ep: Endpoint) -> EndpointKey:
    return (ep.namespace, tuple(sorted(ep.labels.items())), ep.service_account, ep.host_network, ep.ports)


@dataclass
class FlowChecker:
    """Simulates a group's flows; holds the per-decision verdict cache."""

    group: JobGroup
    snapshot: Snapshot
    enforcement: PolicyEnforcement
    mentioned: frozenset[str]  # label keys some policy reads (policy.label_keys_mentioned)
    cache: dict[tuple[EndpointKey, EndpointKey, int, int, str], Verdict] = field(default_factory=dict)
    truncated: set[str] = field(default_factory=set)  # replica keys whose indices were not all enumerated

    def endpoints(self, replica: Replica, overrides: Mapping[str, str]) -> tuple[Endpoint, ...]:
        """The replica's pods as policy sees them: one representative, or one per index."""
        base = {**replica.pod_labels, **overrides}
        count = max(replica.count, 1)
        if replica.index_label and replica.index_label in self.mentioned:
            if count > MAX_ENUMERATED_PODS:
                self.truncated.add(replica.key)
            indices = list(range(min(count, MAX_ENUMERATED_PODS - 1)))
            if count > MAX_ENUMERATED_PODS:
                indices.append(count - 1)
        else:
            indices = [0]
        namespace_labels = self.snapshot.namespace_labels(self.group.namespace)
        out = []
        for i in indices:
            labels = {**base, replica.index_label: str(i)} if replica.index_label else base
            out.append(
                Endpoint(
                    namespace=self.group.namespace,
                    labels=labels,
                    namespace_labels=namespace_labels,
                    service_account=replica.service_account or "default",
                    ports=replica.ports,
                    host_network=replica.host_network,
                    name=f"{self.group.name}-{replica.role}-{i}",
                )
            )
        return tuple(out)

    def _pairs(self, flow: Flow, overrides: Mapping[str, str]) -> Iterator[tuple[Endpoint, Endpoint]]:
        src, dst = self.group.replica(flow.src), self.group.replica(flow.dst)
        sources, destinations = self.endpoints(src, overrides), self.endpoints(dst, overrides)
        for s in sources:
            for d in destinations:
                # A pod does not need a network path to itself.
                if flow.src == flow.dst and len(sources) > 1 and s.name == d.name:
                    continue
                yield s, d

    def verdict(self, src: Endpoint, dst: Endpoint, flow: Flow) -> Verdict:
        key = (endpoint_key(src), endpoint_key(dst), flow.ports.first, flow.ports.last, flow.protocol)
        found = self.cache.get(key)
        if found is None:
            found = policy.check_flow(self.snapshot, src, dst, flow.ports, flow.protocol, enforcement=self.enforcement)
            self.cache[key] = found
        return found

    def check(self, overrides: Mapping[str, str]) -> tuple[tuple[FlowCheck, ...], VerdictKind]:
        """Every flow's worst verdict over its pod pairs, and the worst over all flows."""
        checks: list[FlowCheck] = []
        worst: VerdictKind = "allow"
        for flow in self.group.flows:
            if flow.src == flow.dst and self.group.replica(flow.src).count <= 1:
                continue  # a single pod has no peer of its own type
            flow_worst: Verdict | None = None
            for s, d in self._pairs(flow, overrides):
                v = self.verdict(s, d, flow)
                if flow_worst is None or SEVERITY[v.verdict] > SEVERITY[flow_worst.verdict]:
                    flow_worst = v
                if v.verdict == "deny":
                    break
            if flow_worst is None:
                continue
            checks.append(FlowCheck(flow=flow, verdict=flow_worst))
            if SEVERITY[flow_worst.verdict] > SEVERITY[worst]:
                worst = flow_worst.verdict
        return tuple(checks), worst


def describe_flow(flow: Flow) -> str:
    """`Worker → Master TCP/23456` (ranges as `1-65535`)."""
    named = f" ({flow.port_name})" if flow.port_name else ""
    return f"{flow.src} → {flow.dst} {flow.protocol}/{flow.ports}{named}"


def describe_reason(reason: Reason) -> str:
    """One reason in full: side, effect, the policy and rule, and the evaluator's message (for -o json)."""
    who = " ".join(p for p in (reason.kind, reason.policy) if p)
    rule = f" {reason.rule}" if reason.rule else ""
    where = f" by {who}{rule}" if who else ""
    text = f"{reason.side} {reason.effect}{where}"
    return f"{text}: {reason.message}" if reason.message else text


def _refs(reasons: Iterable[Reason], *, with_rule: bool) -> str:
    """`CiliumNetworkPolicy ml/a egress[0], ml/b egress[1]; NetworkPolicy ml/c` (deduplicated, in order)."""
    by_kind: dict[str, dict[str, None]] = {}
    for r in reasons:
        ref = f"{r.policy} {r.rule}" if with_rule and r.rule else r.policy
        by_kind.setdefault(r.kind or "policy", {})[ref] = None
    return "; ".join(f"{kind} {', '.join(refs)}" for kind, refs in by_kind.items())


def describe_side(side: str, verdict: SideVerdict) -> str:
    """One side of a flow in a few words, naming the policies that decide it."""
    reasons = verdict.reasons
    named = [r for r in reasons if r.policy]
    if verdict.verdict == "allow":
        allowing = [r for r in named if r.effect == "allow"]
        if allowing:
            return f"{side} allowed by {_refs(allowing, with_rule=True)}"
        return f"{side} not enforced (no policy selects the pod in this direction)"
    if verdict.verdict == "deny":
        denying = [r for r in named if r.effect == "deny"]
        if denying:
            return f"{side} denied by {_refs(denying, with_rule=True)}"
        enforcing = [r for r in named if r.effect == "default-deny"]
        if enforcing:
            return f"{side} default-deny: no rule of {_refs(enforcing, with_rule=False)} allows it"
        plain = [r.message for r in reasons if r.effect == "default-deny"]
        return f"{side} default-deny: {'; '.join(plain) or 'no rule allows it'}"
    unknown = [r for r in reasons if r.effect == "unknown"]
    why = "; ".join(
        dict.fromkeys(f"{_refs([r], with_rule=True)}: {r.message}" if r.policy else r.message for r in unknown)
    )
    return f"{side} cannot be evaluated: {why or 'unknown'}"


def _say_once(sides: Sequence[tuple[str, SideVerdict]]) -> tuple[str, ...]:
    texts = [describe_side(name, side) for name, side in sides]
    if len(texts) == 2 and texts[0].removeprefix("egress") == texts[1].removeprefix("ingress"):
        return ("egress and ingress" + texts[0].removeprefix("egress"),)
    return tuple(texts)


def describe_sides(verdict: Verdict) -> tuple[str, ...]:
    """Both sides of a flow, one line each (one line in all when both say the same)."""
    return _say_once((("egress", verdict.egress), ("ingress", verdict.ingress)))


def blocking_reasons(verdict: Verdict) -> tuple[str, ...]:
    """The sides that made a flow deny or unknown (never the allowing side); said once when both agree."""
    sides = (("egress", verdict.egress), ("ingress", verdict.ingress))
    return _say_once([(name, side) for name, side in sides if side.verdict == verdict.verdict])


def describe_check(check: FlowCheck) -> str:
    """A failing flow: `Worker → Master TCP/23456 is blocked: ingress denied by ...`, or for an unknown
    verdict `Worker → Master TCP/23456: ingress cannot be evaluated: ...`."""
    why = "; ".join(blocking_reasons(check.verdict)) or check.verdict.verdict
    state = " is blocked" if check.verdict.verdict == "deny" else ""
    return f"{describe_flow(check.flow)}{state}: {why}"
