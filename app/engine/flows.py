"""The group's required flows simulated in one zone, under the cluster's network policies.

PURE. Every pod of the group is turned into a policy `Endpoint` as it will exist in the zone:
its namespace and namespace labels, its pod labels (plus per-zone overrides such as the zone
identity label), service account, container ports and hostNetwork. Each `Flow` of the group is
then checked with `policy.check_flow`, source egress AND destination ingress.

Cost control, exact:

- Pods of one replica type differ only in their index label and in the leader labels pod 0
  carries. A policy can tell two of them apart only through a selector on one of those keys,
  and then only by the values it names (`policy.label_values_mentioned`; `Exists` and
  `DoesNotExist` tell present from absent, nothing more). So the pods fall into classes — pod 0;
  each index some selector names; every other index — and one representative per class stands
  for all its pods: as many as policies name values, however many pods there are.
- Only when a selector uses the index label in a way whose values cannot be enumerated are
  indices enumerated, up to `MAX_ENUMERATED_PODS`; flows of pods beyond that are `unknown`.
- Verdicts are cached per (source, destination, ports, protocol), and a zone's whole result per
  the labels the zone adds: without a zone identity label the pods look the same in every zone, so
  each flow is evaluated once. A checker is shared by every job of one shape on a snapshot
  (`memo.shared_checker`; its inputs are the decision key's network part), so concurrent decisions
  may use it at once: its caches only ever gain entries that any of them would compute alike, and
  the pod classes (which count toward the index-values limit) are found once, under a lock.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from app import policy
from app.engine import budget
from app.engine.memo import JOB_PLACEHOLDER
from app.models.cilium import CiliumAgent
from app.models.cluster import Snapshot
from app.models.decision import FlowCheck
from app.models.job import Flow, JobGroup, Replica
from app.models.network import Endpoint, PolicyEnforcement, Reason, SideVerdict, Verdict, VerdictKind

MAX_ENUMERATED_PODS = 32  # only when a selector's values for the index label cannot be enumerated
SEVERITY: Mapping[str, int] = {"allow": 0, "unknown": 1, "deny": 2}
# How the operators write a pod index: a decimal number without leading zeros.
_INDEX_VALUE = re.compile(r"0|[1-9][0-9]*")

EndpointKey = tuple[object, ...]
CheckKey = tuple[tuple[tuple[str, str], ...], tuple[str, ...]]  # a zone's labels and pod CIDRs
DEFAULT_INDEX_VALUES_LIMIT = 64  # app.config.Limits.policy_index_values_per_job


class IndexValuesLimitError(Exception):
    """The policies name more of a job's pod indices one by one than a decision judges (a limit, not a verdict)."""


def endpoint_key(ep: Endpoint) -> EndpointKey:
    return (ep.namespace, tuple(sorted(ep.labels.items())), ep.service_account, ep.host_network, ep.ports, ep.ranges)


@dataclass(frozen=True)
class PodClass:
    """Pods of one replica type that every policy sees alike: `index` stands for `size` pods."""

    index: int
    size: int


@dataclass
class FlowChecker:
    """Simulates a group's flows; holds the verdicts of every job of its shape on one snapshot."""

    group: JobGroup
    snapshot: Snapshot
    enforcement: PolicyEnforcement
    mentioned: frozenset[str]  # label keys some policy reads (policy.label_keys_mentioned)
    # Most pod indices the policies name one by one that are judged, over the whole job (settings
    # `limits.policyIndexValuesPerJob`): each named index is a class of its own, and a flow's cost grows
    # with the product of its two ends' classes.
    index_values_limit: int = DEFAULT_INDEX_VALUES_LIMIT
    # The Cilium agent whose semantics decide (version, identity label filter; policy.snapshot_agent).
    agent: CiliumAgent | None = None
    cache: dict[tuple[EndpointKey, EndpointKey, int, int, str], Verdict] = field(default_factory=dict)
    # Replica key → why some of its pods were not checked (their flows are `unknown`).
    truncated: dict[str, str] = field(default_factory=dict)
    _classes: dict[str, tuple[PodClass, ...]] = field(default_factory=dict)
    _named: int = 0  # named indices judged so far, over every replica
    _checked: dict[CheckKey, tuple[tuple[FlowCheck, ...], VerdictKind]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def classes(self, replica: Replica) -> tuple[PodClass, ...]:
        """The replica's pods grouped into classes no policy can tell apart; pod 0 first.

        Raises:
            IndexValuesLimitError: the policies name more of the job's pod indices than `index_values_limit`.
        """
        found = self._classes.get(replica.key)
        if found is None:
            with self._lock:  # once per replica, so the limit counts each named index once
                found = self._classes.get(replica.key)
                if found is None:
                    found = self._classes[replica.key] = self._find_classes(replica)
        return found

    def _find_classes(self, replica: Replica) -> tuple[PodClass, ...]:
        count = max(replica.count, 1)
        index_read = bool(replica.index_label) and replica.index_label in self.mentioned
        leader_read = any(k in self.mentioned for k in replica.leader_labels)
        if count == 1 or not (index_read or leader_read):
            return (PodClass(0, count),)
        if not index_read:
            return PodClass(0, 1), PodClass(1, count - 1)  # the leader and everyone else
        values = policy.label_values_mentioned(self.snapshot, replica.index_label)
        if values is None:
            return self._enumerate(replica, count)
        named = sorted({int(v) for v in values if _INDEX_VALUE.fullmatch(v) and 0 < int(v) < count})
        self._named += len(named)
        if self._named > self.index_values_limit:
            raise IndexValuesLimitError(
                f"the cluster's policies name {self._named:,} values of {replica.index_label} that this job's pods "
                f"carry (each judged on its own); topoguard checks at most {self.index_values_limit:,} per job "
                "(limits.policyIndexValuesPerJob)"
            )
        out = [PodClass(0, 1), *(PodClass(i, 1) for i in named)]
        rest = count - 1 - len(named)
        if rest:
            taken = set(named)
            out.append(PodClass(next(i for i in range(1, count) if i not in taken), rest))
        return tuple(out)

    def _enumerate(self, replica: Replica, count: int) -> tuple[PodClass, ...]:
        """Fallback: the first indices and the last one, each on its own; the rest are not checked."""
        if count <= MAX_ENUMERATED_PODS:
            return tuple(PodClass(i, 1) for i in range(count))
        self.truncated[replica.key] = (
            f"{replica.key} has {count} pods and a policy selector uses {replica.index_label} in a way whose "
            f"values cannot be enumerated (an operator other than In, NotIn, Exists, DoesNotExist): "
            f"{MAX_ENUMERATED_PODS} of them were checked, the flows of the others cannot be evaluated"
        )
        return (*(PodClass(i, 1) for i in range(MAX_ENUMERATED_PODS - 1)), PodClass(count - 1, 1))

    def endpoint(self, replica: Replica, index: int, overrides: Mapping[str, str],
                 ranges: tuple[str, ...] = ()) -> Endpoint:
        """Pod `index` of the replica as policy sees it in the zone (labels after placement; `ranges`: the
        zone's pod CIDRs, where its address will come from)."""
        leader = replica.leader_labels if index == 0 else {}
        labels = {**replica.pod_labels, **leader, **overrides}
        if replica.index_label:
            labels[replica.index_label] = str(index)
        return Endpoint(
            namespace=self.group.namespace,
            labels=labels,
            namespace_labels=self.snapshot.namespace_labels(self.group.namespace),
            service_account=replica.service_account or "default",
            ports=replica.ports,
            host_network=replica.host_network,
            # The job's name is left out (memo.JOB_PLACEHOLDER), so the verdicts and the decision hold for
            # every job of the same shape; the surfaces put the name in (memo.render).
            name=f"{JOB_PLACEHOLDER}-{replica.role}-{index}",
            ranges=ranges,
        )

    def endpoints(self, replica: Replica, overrides: Mapping[str, str]) -> tuple[Endpoint, ...]:
        """One representative endpoint per class of the replica's pods."""
        return tuple(self.endpoint(replica, c.index, overrides) for c in self.classes(replica))

    def _pairs(self, flow: Flow, overrides: Mapping[str, str],
               ranges: tuple[str, ...]) -> Iterator[tuple[Endpoint, Endpoint]]:
        src, dst = self.group.replica(flow.src), self.group.replica(flow.dst)
        sources, destinations = self.classes(src), self.classes(dst)
        for s in sources:
            for d in destinations:
                # A pod does not need a network path to itself; a class of several pods does need
                # one between two of its members, which its representative stands for.
                if flow.src == flow.dst and s.index == d.index and s.size == 1:
                    continue
                yield self.endpoint(src, s.index, overrides, ranges), self.endpoint(dst, d.index, overrides, ranges)

    def verdict(self, src: Endpoint, dst: Endpoint, flow: Flow) -> Verdict:
        key = (endpoint_key(src), endpoint_key(dst), flow.ports.first, flow.ports.last, flow.protocol)
        found = self.cache.get(key)
        if found is None:
            budget.check()  # a decision given up stops here, within one verdict's time
            found = policy.check_flow(self.snapshot, src, dst, flow.ports, flow.protocol, enforcement=self.enforcement,
                                      agent=self.agent)
            self.cache[key] = found
        return found

    def check(self, overrides: Mapping[str, str],
              ranges: tuple[str, ...] = ()) -> tuple[tuple[FlowCheck, ...], VerdictKind]:
        """Every flow's worst verdict over its pod pairs, and the worst over all flows (`ranges`: the zone's
        pod CIDRs, read under policy-cidr-match-mode pods); kept per (`overrides`, `ranges`)."""
        key = (tuple(sorted(overrides.items())), ranges)
        found = self._checked.get(key)
        if found is None:
            found = self._checked[key] = self._check(overrides, ranges)
        return found

    def _check(self, overrides: Mapping[str, str],
               ranges: tuple[str, ...] = ()) -> tuple[tuple[FlowCheck, ...], VerdictKind]:
        checks: list[FlowCheck] = []
        worst: VerdictKind = "allow"
        for flow in self.group.flows:
            if flow.src == flow.dst and self.group.replica(flow.src).count <= 1:
                continue  # a single pod has no peer of its own type
            flow_worst: Verdict | None = None
            for s, d in self._pairs(flow, overrides, ranges):
                v = self.verdict(s, d, flow)
                if flow_worst is None or SEVERITY[v.verdict] > SEVERITY[flow_worst.verdict]:
                    flow_worst = v
                if v.verdict == "deny":
                    break
            if flow_worst is None:
                continue
            unchecked = [self.truncated[k] for k in dict.fromkeys((flow.src, flow.dst)) if k in self.truncated]
            if unchecked and flow_worst.verdict != "deny":
                flow_worst = _unchecked(unchecked)
            checks.append(FlowCheck(flow=flow, verdict=flow_worst))
            if SEVERITY[flow_worst.verdict] > SEVERITY[worst]:
                worst = flow_worst.verdict
        return tuple(checks), worst


def _unchecked(messages: Sequence[str]) -> Verdict:
    egress = SideVerdict("unknown", tuple(Reason("egress", "unknown", m) for m in messages))
    ingress = SideVerdict("unknown", tuple(Reason("ingress", "unknown", m) for m in messages))
    return Verdict("unknown", egress, ingress, egress.reasons + ingress.reasons)


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
        plain = [r.message for r in reasons if r.effect == "allow" and not r.policy]
        if plain:  # hostNetwork: host traffic nobody enforces, or allow-localhost
            return f"{side} allowed: {'; '.join(dict.fromkeys(plain))}"
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
