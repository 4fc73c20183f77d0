"""What-if: a network-policy change judged against the training jobs before it lands (DESIGN.md "Round 3").

PURE: (snapshot, change set) in, per-job flow verdicts before and after out. Three surfaces read it: the
CLI `topoguard what-if`, the validating webhook on policy objects (POST /validate-policy) and the Events
it leaves on the jobs a stored change breaks.

One flow model, the audit's (app/engine/audit.py): a job's pods are the ledger's, grouped into classes
no policy can tell apart, and each required flow is judged between classes with `policy.check_flow` —
once on the snapshot as it is and once on the snapshot with the change applied (`apply_changes`: the
same nodes, pods, jobs and namespaces, other policies). Running jobs are judged on their bound pods,
pending pods on the labels they carry (those of the zone topoguard pinned them to), exactly as the
audit judges them; a job with no pods yet (suspended, queued, not started) has nothing to judge here,
and is counted (`jobsWithoutPods`): admission judges it when its pods are created.

Which jobs a change can affect (the inverse index): a flow's verdict reads only the rules whose subject
selects its source (egress) or its destination (ingress), and every required flow runs between two pods
of one job. So a change can affect a job only if a rule of an old or new version of a changed policy
selects one of the job's pod classes as its subject: a namespaced policy (CNP, NetworkPolicy) only jobs
of its own namespace, a clusterwide one (CCNP, ClusterNetworkPolicy of either tier) any job, checked
class by class. A CCNP may hold host policies (nodeSelector), which govern hostNetwork pods: a job with
such pods is judged on any CCNP change. A CiliumCIDRGroup change is a change of every policy that names
it (`cidrGroupRef`) or selects groups by label (`cidrGroupSelector`).

Verdicts are never guessed: a change the evaluator cannot judge (a ClusterNetworkPolicy while the agent's
`enable-k8s-cluster-network-policy` switch is unknown, an L7 rule, an invalid policy) makes the flows it
may decide `unknown`, and those jobs are reported as such, never as fine.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from app import policy
from app.config import Settings
from app.engine import budget, memo
from app.engine.audit import AuditPass, PodGroup, in_scope
from app.engine.flows import SEVERITY, blocking_reasons
from app.models.cluster import CIDRGroup, JobInfo, NetworkMemo, PodInfo, PolicyObject, Snapshot, pod_index
from app.models.job import Flow, JobShape
from app.models.network import Endpoint, Reason, Verdict, VerdictKind
from app.policy import agent as agents
from app.policy.identity import identity_labels
from app.policy.rules import Rule

POLICY_KINDS = ("CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy", "NetworkPolicy", "ClusterNetworkPolicy")
CIDR_GROUP_KIND = "CiliumCIDRGroup"
CHANGE_KINDS = (*POLICY_KINDS, CIDR_GROUP_KIND)
CLUSTER_SCOPED_KINDS = frozenset({"CiliumClusterwideNetworkPolicy", "ClusterNetworkPolicy", CIDR_GROUP_KIND})
HOST_POLICY_KIND = "CiliumClusterwideNetworkPolicy"

Action = Literal["apply", "delete"]


class ChangeError(ValueError):
    """A change that cannot be applied to the snapshot (deleting an object it does not hold)."""


@dataclass(frozen=True)
class Change:
    """One object created or replaced (`apply`, with its projection) or deleted (`delete`)."""

    action: Action
    kind: str
    namespace: str  # "" for cluster-scoped kinds
    name: str
    policy: PolicyObject | None = None  # apply of a policy kind
    cidr_group: CIDRGroup | None = None  # apply of a CiliumCIDRGroup

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.namespace, self.name)

    @property
    def ref(self) -> str:
        """`CiliumNetworkPolicy ml/lock`, `ClusterNetworkPolicy isolate`."""
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"

    def to_json(self) -> dict[str, str]:
        return {"action": self.action, "kind": self.kind, "namespace": self.namespace, "name": self.name}

    @classmethod
    def apply(cls, obj: PolicyObject | CIDRGroup, kind: str = "") -> Change:
        if isinstance(obj, PolicyObject):
            return cls("apply", obj.kind, obj.namespace, obj.name, policy=obj)
        return cls("apply", kind or CIDR_GROUP_KIND, "", obj.name, cidr_group=obj)

    @classmethod
    def delete(cls, kind: str, namespace: str, name: str) -> Change:
        return cls("delete", kind, "" if kind in CLUSTER_SCOPED_KINDS else namespace, name)


# --- the snapshot after the change --------------------------------------------------------------


def apply_changes(snapshot: Snapshot, changes: Sequence[Change]) -> tuple[Snapshot, tuple[PolicyObject, ...]]:
    """The snapshot with `changes` applied in order, and every policy object they touch (old and new versions).

    Everything but the policies and CIDR groups is `snapshot`'s own (the same objects, the same pod index);
    the memos are new. Its policy index is built from `snapshot`'s (`policy.build_index_after`).

    Raises:
        ChangeError: a delete of an object the snapshot (with the earlier changes) does not hold.
    """
    policies: dict[tuple[str, str, str], PolicyObject] = {(p.kind, p.namespace, p.name): p for p in snapshot.policies}
    groups = dict(snapshot.cidr_groups)
    groups_changed = False
    touched: list[PolicyObject] = []
    for change in changes:
        if change.kind == CIDR_GROUP_KIND:
            if change.action == "delete" and change.name not in groups:
                raise ChangeError(f"cannot delete {change.ref}: the snapshot holds no such object")
            if change.action == "delete":
                del groups[change.name]
            elif change.cidr_group is not None:
                groups[change.name] = change.cidr_group
            groups_changed = True
            continue
        old = policies.get(change.key)
        if change.action == "delete":
            if old is None:
                raise ChangeError(f"cannot delete {change.ref}: the snapshot holds no such object")
            del policies[change.key]
        elif change.policy is not None:
            policies[change.key] = change.policy
            touched.append(change.policy)
        if old is not None:
            touched.append(old)
    if groups_changed:
        named = {c.name for c in changes if c.kind == CIDR_GROUP_KIND}
        touched += [p for p in policies.values() if _reads_groups(p.body, named)]
        touched += [p for p in snapshot.policies if _reads_groups(p.body, named)]
    index = pod_index(snapshot)
    after = dataclasses.replace(
        snapshot,
        policies=tuple(policies.values()),
        cidr_groups=MappingProxyType(groups) if groups_changed else snapshot.cidr_groups,
        revision=f"{snapshot.revision}+what-if",
        _memo={},
        _memo_lock=threading.Lock(),
        _memo_building={},
        network_memo=NetworkMemo(index.named_ports),
        pod_index=index,
    )
    policy.build_index_after(snapshot, after, touched)
    return after, tuple({id(p): p for p in touched}.values())


def _reads_groups(node: Any, names: Collection[str]) -> bool:
    """Whether a raw policy body names one of the CIDR groups `names` (cidrGroupRef) or selects groups by label."""
    if isinstance(node, Mapping):
        if "cidrGroupSelector" in node or node.get("cidrGroupRef") in names:
            return True
        return any(_reads_groups(v, names) for v in node.values())
    if isinstance(node, list):
        return any(_reads_groups(v, names) for v in node)
    return False


# --- the answer -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlowChange:
    """A required flow of a job whose verdict the change turns from `before` to `after`."""

    flow: Flow
    before: VerdictKind
    after: VerdictKind
    policy: str  # `CiliumNetworkPolicy ml/lock` — what decides the new verdict ("" when nothing does)
    rule: str  # `ingressDeny[0]` ("" for a default-deny or when no rule decides)
    reasons: tuple[str, ...]  # the new verdict's deciding sides, in words
    example: tuple[str, str]  # a source and a destination pod
    pairs: int  # pairs of pod classes that change so

    @property
    def breaks(self) -> bool:
        return self.after == "deny" and self.before != "deny"

    @property
    def port(self) -> str:
        return f"{self.flow.protocol}/{self.flow.ports}"

    def describe(self) -> str:
        """`Worker → Master TCP/23456 (rendezvous): allow → deny by CiliumNetworkPolicy ml/lock ingressDeny[0]`."""
        by = " ".join(p for p in (self.policy, self.rule) if p)
        why = f" by {by}" if by and self.after != "unknown" else ""
        if self.after == "unknown":
            why = f": {'; '.join(self.reasons)}" if self.reasons else ""
        elif self.after == "deny" and not self.rule:
            why = f": {'; '.join(self.reasons)}" if self.reasons else why
        return f"{self.flow.src} → {self.flow.dst} {self.port} ({self.flow.purpose}): {self.before} → {self.after}{why}"

    def to_json(self, namespace: str) -> dict[str, Any]:
        return {
            "from": self.flow.src,
            "to": self.flow.dst,
            "port": self.port,
            "purpose": self.flow.purpose,
            "before": self.before,
            "after": self.after,
            "policy": self.policy,
            "rule": self.rule,
            "reasons": list(self.reasons),
            "example": {"from": f"{namespace}/{self.example[0]}", "to": f"{namespace}/{self.example[1]}"},
        }


@dataclass(frozen=True)
class JobImpact:
    kind: str
    namespace: str
    name: str
    uid: str
    flows: tuple[FlowChange, ...]

    @property
    def ref(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def broken(self) -> bool:
        """A required flow that is open (or undecided) now would be denied."""
        return any(f.breaks for f in self.flows)

    @property
    def unknown(self) -> bool:
        """A required flow would become `unknown`."""
        return any(f.after == "unknown" for f in self.flows)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "namespace": self.namespace, "name": self.name,
                "flows": [f.to_json(self.namespace) for f in self.flows]}


@dataclass(frozen=True)
class WhatIf:
    changes: tuple[Change, ...]
    jobs: tuple[JobImpact, ...]  # only jobs whose verdicts change, sorted by (namespace, kind, name)
    checked: int  # jobs in scope with pods: every one is either judged or proven out of the change's reach
    judged: int  # of them, the ones the inverse index could not rule out (judged before and after)
    without_pods: int  # jobs in scope with no pods yet: nothing to judge

    @property
    def broken(self) -> tuple[JobImpact, ...]:
        return tuple(j for j in self.jobs if j.broken)

    @property
    def unknown(self) -> tuple[JobImpact, ...]:
        return tuple(j for j in self.jobs if j.unknown and not j.broken)

    @property
    def outcome(self) -> Literal["clean", "breaks", "unknown"]:
        if self.broken:
            return "breaks"
        return "unknown" if self.unknown else "clean"

    def summary(self) -> dict[str, int]:
        return {"jobsChecked": self.checked, "jobsBroken": len(self.broken), "jobsUnknown": len(self.unknown),
                "jobsJudged": self.judged, "jobsWithoutPods": self.without_pods}

    def to_json(self) -> dict[str, Any]:
        return {"changes": [c.to_json() for c in self.changes], "jobs": [j.to_json() for j in self.jobs],
                "summary": self.summary()}


# --- the engine -------------------------------------------------------------------------------------


def what_if(
    snapshot: Snapshot,
    settings: Settings,
    changes: Sequence[Change],
    *,
    namespaces: Collection[str] | None = None,
) -> WhatIf:
    """Every job in `settings.audit.scope` (and in `namespaces`, when given) whose required flows `changes`
    would turn, with each such flow before and after.

    Raises:
        ChangeError: a delete of an object the snapshot does not hold.
    """
    after, touched = apply_changes(snapshot, changes)
    rules = _rules_of(after, touched)
    reach = {r.namespace for r in rules}  # None: clusterwide
    host_policies = any(p.kind == HOST_POLICY_KIND for p in touched)
    scoped = [
        j for j in snapshot.jobs
        if (namespaces is None or j.namespace in namespaces) and not j.finished and in_scope(snapshot, settings, j)
    ]
    base: _Base | None = None
    selected: dict[int, bool] = {}  # pod-class id -> some changed rule may select it
    diffs: dict[tuple[Any, ...], tuple[_Changed, ...]] = {}
    impacts: list[JobImpact] = []
    checked = judged = without_pods = 0
    for job in scoped:
        budget.check()  # a webhook answer given up stops here, within one job's time
        if base is None:
            base = _base(snapshot, settings, memo.keys_read(after))
            run = base.run
            later = dataclasses.replace(run, snapshot=after, verdicts={}, agent=policy.snapshot_agent(
                after, settings.cilium_version, settings.explicit_policy_enforcement()))
            filters = _filters(run.agent)
        pods = run.pods.get((job.kind, job.namespace, job.name), ())
        if not pods:
            without_pods += 1
            continue
        checked += 1
        if None not in reach and job.namespace not in reach:
            continue
        shape = run.shape(job)
        if shape.problem:
            continue  # no flows to judge (the audit reports it as unknown, change or not)
        classes, before = base.job(job, shape, pods)
        for c in classes:
            if c.policy_id not in selected:
                selected[c.policy_id] = _selected(run, c, rules, filters, host_policies)
        if not any(selected[c.policy_id] for c in classes):
            continue
        judged += 1
        # Jobs whose classes policy cannot tell apart (same roles, pod-class ids, one pod or more) have the same
        # verdicts before and after: their change is worked out once (most jobs of a namespace look alike).
        signature = (shape.flows, tuple((c.role, c.policy_id, c.count > 1) for c in classes))
        found = diffs.get(signature)
        if found is None:
            found = diffs[signature] = _diff(shape.flows, classes, before, later.pair_verdicts(shape, classes))
        if found:
            impacts.append(JobImpact(job.kind, job.namespace, job.name, job.uid,
                                     _flow_changes(found, classes, job.name)))
    impacts.sort(key=lambda j: (j.namespace, j.kind, j.name))
    return WhatIf(tuple(changes), tuple(impacts), checked, judged, without_pods)


PairKey = tuple[Flow, int, int]  # (flow, id(source class), id(destination class))
BASE_MEMO_KEY = "engine.whatif.base"
BASES_KEPT = 8  # per snapshot: one per (settings, label keys read) seen, the oldest dropped


@dataclass
class _Base:
    """What every what-if on one snapshot shares: the audit's pass (its pod-class ids and verdict cache) and,
    per job, its pod classes and their verdicts as the snapshot stands. Classes are told apart by the label
    keys the snapshot's policies read and those a change adds (`read`), so a change that reads no new key (most)
    finds its jobs' classes and "before" verdicts computed by an earlier one."""

    run: AuditPass
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    jobs: dict[tuple[str, str, str], tuple[tuple[PodInfo, ...], list[PodGroup], dict[PairKey, Verdict]]] = (
        dataclasses.field(default_factory=dict))

    def job(self, job: JobInfo, shape: JobShape, pods: tuple[PodInfo, ...]
            ) -> tuple[list[PodGroup], dict[PairKey, Verdict]]:
        key = (job.kind, job.namespace, job.name)
        found = self.jobs.get(key)
        if found is None or found[0] is not pods:
            with self.lock:  # the pass's class ids are handed out one at a time
                classes = self.run.classes(shape, pods)
                before = {(f, id(s), id(d)): v for f, s, d, v in self.run.pair_verdicts(shape, classes)}
                found = self.jobs[key] = (pods, classes, before)
        return found[1], found[2]


def _base(snapshot: Snapshot, settings: Settings, read_after: frozenset[str]) -> _Base:
    kept: dict[tuple[Settings, frozenset[str]], _Base] = snapshot.memo(BASE_MEMO_KEY, lambda _: {})
    read = memo.keys_read(snapshot) | read_after
    found = kept.get((settings, read))
    if found is None:
        run = AuditPass.start(snapshot, settings)
        run.read = read  # classes fine enough for both policy sets
        found = _Base(run)
        while len(kept) >= BASES_KEPT:
            kept.pop(next(iter(kept)), None)
        kept[(settings, read)] = found
    return found


def _rules_of(after: Snapshot, touched: Iterable[PolicyObject]) -> list[Rule]:
    """The compiled rules of every version (old and new) of the changed policies."""
    return [rule for p in touched for rule in policy.compiled_policy(p, after.cidr_groups).rules]


def _filters(agent: Any) -> tuple[Any, ...]:
    """The identity label filters a subject may be matched under (both versions' when the version is not known)."""
    found = agents.identity_filter(agent)
    return (found,) if found is not None else agents.version_filters(agent)


def _selected(run: AuditPass, cls: PodGroup, rules: Sequence[Rule], filters: Sequence[Any],
              host_policies: bool) -> bool:
    """Whether some rule may select the class's pods as its subject (hostNetwork pods: any host policy change)."""
    if cls.pod.host_network and host_policies:
        return True
    return _subject_of(run.endpoint(cls), rules, filters, run.agent.cluster_name)


def _subject_of(endpoint: Endpoint, rules: Sequence[Rule], filters: Sequence[Any], cluster: str) -> bool:
    for label_filter in filters:
        identity = identity_labels(endpoint, label_filter, cluster_name=cluster)
        if any(rule.selects(identity, endpoint.namespace) for rule in rules):
            return True
    return False


def selects_pods(snapshot: Snapshot, settings: Settings, changes: Sequence[Change], pods: Iterable[PodInfo]) -> bool:
    """Whether a rule of some version (old or new) of the changed policies selects one of `pods` as its subject
    (topoguard's own pods: a change that may cut its webhook or its API access).

    Raises:
        ChangeError: a delete of an object the snapshot does not hold.
    """
    after, touched = apply_changes(snapshot, changes)
    rules = _rules_of(after, touched)
    agent = policy.snapshot_agent(snapshot, settings.cilium_version, settings.explicit_policy_enforcement())
    filters = _filters(agent)
    return any(
        (pod.host_network and any(p.kind == HOST_POLICY_KIND for p in touched))
        or _subject_of(policy.endpoint_for_pod(snapshot, pod), rules, filters, agent.cluster_name)
        for pod in pods
    )


PairVerdicts = Iterable[tuple[Flow, PodGroup, PodGroup, Verdict]]


@dataclass(frozen=True)
class _Changed:
    """A flow's change as every job of one signature has it: the classes it was seen between by position."""

    flow: Flow
    before: VerdictKind
    after: VerdictKind
    policy: str
    rule: str
    reasons: tuple[str, ...]  # with JOB_PLACEHOLDER for the job's name
    example: tuple[int, int]  # positions of a source and a destination class
    pairs: int


def _diff(flows: Sequence[Flow], classes: Sequence[PodGroup], was: Mapping[PairKey, Verdict],
          after: PairVerdicts) -> tuple[_Changed, ...]:
    """The flows whose verdict changes between some two classes, one entry per (flow, before, after), the most
    severe change of a flow first, in the job's flow order."""
    changed: dict[tuple[Flow, VerdictKind, VerdictKind], list[tuple[Verdict, PodGroup, PodGroup]]] = {}
    for flow, src, dst, verdict in after:
        old = was.get((flow, id(src), id(dst)))
        if old is None or old.verdict == verdict.verdict:
            continue
        changed.setdefault((flow, old.verdict, verdict.verdict), []).append((verdict, src, dst))
    position = {flow: i for i, flow in reversed(list(enumerate(flows)))}
    at = {id(c): i for i, c in enumerate(classes)}
    out = []
    for (flow, old_kind, new_kind), seen in changed.items():
        verdict, src, dst = seen[0]
        by, rule = _deciding(verdict)
        out.append(_Changed(flow, old_kind, new_kind, by, rule, _reasons(verdict), (at[id(src)], at[id(dst)]),
                            len(seen)))
    out.sort(key=lambda f: (position[f.flow], -SEVERITY[f.after], SEVERITY[f.before]))
    return tuple(out)


def _flow_changes(changed: Sequence[_Changed], classes: Sequence[PodGroup], job_name: str) -> tuple[FlowChange, ...]:
    """The changes of one job: its own name in the reasons, its own pods as the example."""
    return tuple(FlowChange(
        flow=c.flow, before=c.before, after=c.after, policy=c.policy, rule=c.rule,
        reasons=tuple(memo.render(r, job_name) for r in c.reasons),
        example=(classes[c.example[0]].pod.name, classes[c.example[1]].pod.name), pairs=c.pairs,
    ) for c in changed)


def _reasons(verdict: Verdict) -> tuple[str, ...]:
    if verdict.verdict == "allow":
        return tuple(r.message for r in verdict.reasons if r.effect == "allow" and r.policy)[:2]
    return blocking_reasons(verdict)


def _deciding(verdict: Verdict) -> tuple[str, str]:
    """(policy, rule) that decides `verdict`: the denying rule, else a policy whose default-deny does, the
    allowing rule, or the rule that cannot be evaluated; ("", "") when none does (not enforced)."""
    sides = [s for s in (verdict.egress, verdict.ingress) if s.verdict == verdict.verdict]
    reasons: list[Reason] = [r for s in sides for r in s.reasons if r.policy]
    order = {"deny": ("deny", "default-deny"), "allow": ("allow",), "unknown": ("unknown", "deny", "default-deny")}
    for effect in order[verdict.verdict]:
        for r in reasons:
            if r.effect == effect:
                return f"{r.kind} {r.policy}".strip(), r.rule if effect != "default-deny" else ""
    return "", ""
