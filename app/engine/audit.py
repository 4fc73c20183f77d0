"""The audit of running training jobs: the live map (DESIGN.md "Round 2", Audit; issue 12).

PURE: snapshot in, findings out. The loop that runs it, leader election and everything that
writes to the API (Events, PolicyReports, metrics) live above the cache (app/controller).

For each stored training job in `audit.scope` that has not finished:

- its pods are the ledger's (`ledger.job_pods`: the operators' job-name labels, or the job as their
  controller), each matched to its replica type by the operator's labels (`JobShape.role_of`);
- a bound pod is in the zone of its node (the node's `zoneLabel`); unbound pods are pending;
- the flows the job needs are the ones admission derives from it (`parse_job` → `JobShape`, parsed
  when the job is stored; a TrainJob's composed here from the snapshot's runtimes), checked between
  its ACTUAL pods (their own labels, namespace, service account, ports, hostNetwork) with admission's
  evaluator (`policy.check_flow`, the same enforcement mode and Cilium agent as `decide.start_run`).

Findings, one per (type, replica-type pair), never one per pod pair:

- `split`: bound pods in more than one zone;
- `blocked`: a required flow between bound pods is denied (or one with a pending end, when the job
  is not pinned to a zone), naming the policies that deny it;
- `unknown`: a flow cannot be evaluated, the job's flows cannot be derived, or a pod's node has no zone;
- `zone-closed`: the job is pinned (`topoguard.io/zone`, the zone topoguard wrote into its pods'
  node affinity) and it has pending pods that could not work there: a required flow of a pending pod
  is denied, or the zone has no ready, schedulable node left, or fewer allocatable GPUs on them than
  the pending pods need (beside what the job's own bound pods hold there). A zone that is merely
  busy is not closed: those pods wait, as they would without topoguard.

Cost: pods are grouped per job into classes no policy can tell apart — (replica type, zone or
pending, namespace, service account, ports, hostNetwork and the labels some policy reads) — and each
required flow is evaluated once per pair of classes; verdicts are shared by every job of the pass
whose classes look the same to policy (the endpoints are named `<job>-<role>`, JOB_PLACEHOLDER,
and the messages put the job's name in), and by every later pass on the snapshot (check_flow's memo).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app import jobs, policy
from app.config import Settings
from app.engine import capacity, ledger, memo
from app.engine.flows import blocking_reasons
from app.engine.gpus import gpu_kinds
from app.models import pods as pods_model
from app.models.cluster import JobInfo, PodInfo, Snapshot, pod_index
from app.models.job import Flow, JobShape, RoleShape
from app.models.network import Endpoint, PortRange, Verdict

AUDIT_FINDING_TYPES = ("split", "blocked", "unknown", "zone-closed")
# Most severe first: what stops training (a denied flow), then what slows it (split), then what may stop the pods
# still pending, then what cannot be judged. A job's waste is counted once, under its most severe finding.
SEVERITY_ORDER = ("blocked", "split", "zone-closed", "unknown")

_REASONS: Mapping[str, str] = {
    "split": "TopoguardSplit",
    "blocked": "TopoguardBlocked",
    "unknown": "TopoguardUnknown",
    "zone-closed": "TopoguardZoneClosed",
    # Not an audit finding: a stored policy change that breaks the job's required flows (app/engine/whatif.py).
    "policy-change": "TopoguardPolicyChange",
}


@dataclass(frozen=True)
class AuditFinding:
    """One thing that goes wrong with a running job, deduplicated per (type, role pair)."""

    type: str  # one of AUDIT_FINDING_TYPES
    # One sentence an ML engineer understands, leading with what goes wrong, e.g. "Worker pods in
    # zone-a cannot reach Master in zone-b on TCP 23456: CiliumNetworkPolicy ml-demo/allow-intra-zone-b".
    message: str
    flows: tuple[Mapping[str, Any], ...] = ()  # JSON-ready flow descriptions (src, dst, port, verdict, policies)
    policies: tuple[str, ...] = ()  # refs of the policies involved ("CiliumNetworkPolicy ml-demo/x")

    @property
    def reason(self) -> str:
        """The Kubernetes Event reason: TopoguardSplit | TopoguardBlocked | TopoguardUnknown | TopoguardZoneClosed."""
        return _REASONS[self.type]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "flows": [dict(f) for f in self.flows]}


@dataclass(frozen=True, slots=True)
class AuditPod:
    """One non-terminal pod of an audited job: where it runs and the GPUs it holds there."""

    name: str
    role: str  # its replica type ("" when the job's shape does not name it)
    zone: str  # "" when pending or on a node without a zone
    bound: bool
    gpus: int  # GPUs it requests (gpus.gpu_kinds), held once bound


@dataclass(frozen=True)
class JobAudit:
    """One training job as the audit sees it."""

    kind: str
    namespace: str
    name: str
    uid: str
    zones: Mapping[str, int]  # zone -> number of bound, non-terminal pods of the job
    pending: int  # unbound, non-terminal pods of the job
    findings: tuple[AuditFinding, ...]
    # GPUs the job's bound pods hold: the ledger's count of them (ledger.matched(...).bound), over gpu_resources.
    gpus: int = 0
    pods: tuple[AuditPod, ...] = ()  # its non-terminal pods, by name (the map; per-pod metrics)

    @property
    def ref(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    def worst(self) -> str:
        """The type of its most severe finding (SEVERITY_ORDER), "" without findings."""
        types = {f.type for f in self.findings}
        return next((t for t in SEVERITY_ORDER if t in types), "")

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "zones": dict(self.zones),
            "pending": self.pending,
            "findings": [f.to_json() for f in self.findings],
        }


AUDIT_MEMO_KEY = "engine.audit"


def audit(snapshot: Snapshot, settings: Settings) -> tuple[JobAudit, ...]:
    """Every training job in settings.audit.scope (opted-in namespaces | all), sorted by (namespace, kind, name);
    jobs without findings are included with findings=()."""
    scoped = [j for j in snapshot.jobs if not j.finished and _in_scope(snapshot, settings, j)]
    if not scoped:
        return ()
    run = _Pass.start(snapshot, settings)
    return tuple(sorted((run.job(j) for j in scoped), key=lambda a: (a.namespace, a.kind, a.name)))


def audit_memoized(snapshot: Snapshot, settings: Settings) -> tuple[JobAudit, ...]:
    """`audit`, kept with the snapshot per settings (the /map JSON reads it on every request)."""
    # NB: keyed by the settings, which a memo's string key cannot hold: the memo holds a plain dict that is
    # filled outside its lock (two racing callers both compute it; either answer is right).
    kept: dict[Settings, tuple[JobAudit, ...]] = snapshot.memo(AUDIT_MEMO_KEY, lambda _: {})
    found = kept.get(settings)
    if found is None:
        found = kept[settings] = audit(snapshot, settings)
    return found


def _in_scope(snapshot: Snapshot, settings: Settings, job: JobInfo) -> bool:
    return settings.audit.scope == "all" or snapshot.opted_in(job.namespace)


in_scope = _in_scope  # the what-if judges the same jobs (app/engine/whatif.py)


# --- one pass ---------------------------------------------------------------------------------

Place = tuple[bool, str]  # (bound, zone): (False, "") is pending; (True, "") a node without a zone


@dataclass
class _Class:
    """Pods of one job that policy cannot tell apart, of one replica type and in one place."""

    role: RoleShape
    place: Place
    policy_id: int
    pod: PodInfo  # the first of them, standing for all
    count: int = 0


@dataclass
class _Found:
    """One finding being gathered: its failing flows, in the job's flow order."""

    type: str
    src: str
    dst: str
    flows: dict[Flow, _FlowSeen] = field(default_factory=dict)


@dataclass
class _FlowSeen:
    flow: Flow
    verdict: Verdict
    src: set[Place] = field(default_factory=set)
    dst: set[Place] = field(default_factory=set)
    example: tuple[str, str] = ("", "")


@dataclass
class _Pass:
    snapshot: Snapshot
    settings: Settings
    node_zones: Mapping[str, str]
    read: frozenset[str]
    pods: Mapping[ledger.JobKey, tuple[PodInfo, ...]]
    groups: Mapping[pods_model.GroupKey, tuple[PodInfo, ...]]
    agent: Any
    index: capacity.ZoneIndex
    kinds: tuple[str, ...]  # the GPU resources, as the ledger counts them (gpus.gpu_kinds)
    policy_ids: dict[tuple[Any, ...], int] = field(default_factory=dict)
    verdicts: dict[tuple[Any, ...], Verdict] = field(default_factory=dict)

    @classmethod
    def start(cls, snapshot: Snapshot, settings: Settings) -> _Pass:
        label = settings.zone_label
        return cls(
            snapshot=snapshot,
            settings=settings,
            node_zones={n.name: n.labels.get(label, "") for n in snapshot.nodes},
            read=memo.keys_read(snapshot),
            pods=ledger.job_pods(snapshot),
            groups=pod_index(snapshot).groups,
            agent=policy.snapshot_agent(snapshot, settings.cilium_version, settings.explicit_policy_enforcement()),
            index=capacity.zone_index(snapshot, zone_label=label, gpu_resources=settings.gpu_resources,
                                      gpu_device_classes=settings.gpu_device_classes),
            kinds=gpu_kinds(snapshot, settings.gpu_resources),
        )

    def shape(self, job: JobInfo) -> JobShape:
        if job.shape is not None:
            return job.shape
        if job.source is None:
            return JobShape(problem="the job was stored without its spec")
        return jobs.job_shape(
            dict(job.source),
            gpu_resources=self.settings.gpu_resources,
            limits=self.settings.limits,
            runtimes=self.snapshot.training_runtimes,
            collective_ports=self.settings.collective_ports,
        )

    def job(self, job: JobInfo) -> JobAudit:
        pods = self.pods.get((job.kind, job.namespace, job.name), ())
        shape = self.shape(job)
        findings: list[AuditFinding] = []
        if shape.problem:
            findings.append(AuditFinding("unknown", f"Cannot check the connections this job needs: {shape.problem}"))
        zones: Counter[str] = Counter()
        per_role: dict[str, Counter[str]] = defaultdict(Counter)
        unzoned: dict[str, list[str]] = defaultdict(list)  # node -> pods on it
        pending = 0
        placed: list[AuditPod] = []
        for pod in pods:
            role = shape.role_of(pod.labels)
            role_key = role.key if role is not None else ""
            zone = self.node_zones.get(pod.node_name, "") if pod.node_name else ""
            placed.append(AuditPod(pod.name, role_key, zone, bool(pod.node_name), self._gpus(pod)))
            if not pod.node_name:
                pending += 1
                continue
            if zone:
                zones[zone] += 1
                per_role[role_key][zone] += 1
            else:
                unzoned[pod.node_name].append(pod.name)
        classes = self.classes(shape, pods)
        if len(zones) > 1:
            findings.append(_split(zones, per_role))
        if unzoned:
            findings.append(self._unzoned(unzoned))
        findings += self._flows(job, shape, classes)
        if job.zone and pending:
            closed = self._zone_gone(job, pods, shape)
            if closed is not None:
                findings.append(closed)
        bound = ledger.matched(job, self.groups).bound
        return JobAudit(
            kind=job.kind,
            namespace=job.namespace,
            name=job.name,
            uid=job.uid,
            zones=dict(sorted(zones.items())),
            pending=pending,
            findings=tuple(findings),
            gpus=sum(bound.get(r, 0) for r in self.kinds),
            pods=tuple(placed),
        )

    def _gpus(self, pod: PodInfo) -> int:
        """The GPUs a pod requests (held once it is bound): its requests of the GPU resources, as the ledger
        and the zone index count them."""
        return sum(pod.requests.get(r, 0) for r in self.kinds)

    def place(self, pod: PodInfo) -> Place:
        """Where a pod is: (True, its node's zone) when bound, (False, "") when pending."""
        return (True, self.node_zones.get(pod.node_name, "")) if pod.node_name else (False, "")

    def classes(self, shape: JobShape, pods: Iterable[PodInfo]) -> list[_Class]:
        """The job's pods grouped into classes no policy can tell apart (pods of no replica type left out)."""
        classes: dict[tuple[str, Place, int], _Class] = {}
        for pod in pods:
            role = shape.role_of(pod.labels)
            if role is None:
                continue
            place = self.place(pod)
            pid = self._policy_id(pod)
            found = classes.get((role.key, place, pid))
            if found is None:
                found = classes[(role.key, place, pid)] = _Class(role, place, pid, pod)
            found.count += 1
        return list(classes.values())

    def _policy_id(self, pod: PodInfo) -> int:
        """Equal for pods every policy sees alike (memo.keys_read: the label keys a verdict can read)."""
        read = self.read
        key = (
            pod.namespace,
            pod.service_account or "default",
            pod.ports,
            pod.host_network,
            tuple(sorted((k, v) for k, v in pod.labels.items() if k in read)),
        )
        found = self.policy_ids.get(key)
        if found is None:
            found = self.policy_ids[key] = len(self.policy_ids)
        return found

    def endpoint(self, cls: _Class) -> Endpoint:
        """The class's pod as policy sees it (named `<job>-<role>`, JOB_PLACEHOLDER)."""
        return self._endpoint(cls)

    def _endpoint(self, cls: _Class) -> Endpoint:
        pod = cls.pod
        return Endpoint(
            namespace=pod.namespace,
            labels=pod.labels,
            namespace_labels=self.snapshot.namespace_labels(pod.namespace),
            service_account=pod.service_account or "default",
            ports=pod.ports,
            host_network=pod.host_network,
            name=f"{memo.JOB_PLACEHOLDER}-{cls.role.role}",
        )

    def _verdict(self, src: _Class, dst: _Class, flow: Flow) -> Verdict:
        key = (src.policy_id, dst.policy_id, src.role.role, dst.role.role, flow.ports, flow.protocol)
        found = self.verdicts.get(key)
        if found is None:
            found = self.verdicts[key] = policy.check_flow(
                self.snapshot,
                self._endpoint(src),
                self._endpoint(dst),
                flow.ports,
                flow.protocol,
                enforcement=self.agent.policy_enforcement,
                agent=self.agent,
            )
        return found

    def pair_verdicts(self, shape: JobShape,
                      classes: Sequence[_Class]) -> Iterator[tuple[Flow, _Class, _Class, Verdict]]:
        """Every required flow's verdict between every two classes of its ends, widest port ranges first: a
        range is allowed only when every port in it is (PortRange), so a flow inside a range already allowed
        between the same two classes is allowed without evaluating it (the rendezvous port inside the
        collectives' range, such as a JobSet coordinator's declared port); it is given the wider range's verdict."""
        by_role: dict[str, list[_Class]] = defaultdict(list)
        for cls in classes:
            by_role[cls.role.key].append(cls)
        position = {flow: i for i, flow in reversed(list(enumerate(shape.flows)))}
        allowed: dict[tuple[int, int, str], list[tuple[PortRange, Verdict]]] = defaultdict(list)
        for flow in sorted(shape.flows, key=lambda f: (f.ports.first - f.ports.last, position[f])):
            ports = flow.ports
            for src in by_role.get(flow.src, ()):
                for dst in by_role.get(flow.dst, ()):
                    if src is dst and src.count == 1:
                        continue  # a pod needs no path to itself
                    opened = allowed.get((id(src), id(dst), flow.protocol), ())
                    wider = next((v for r, v in opened if r.first <= ports.first and ports.last <= r.last), None)
                    if wider is not None:
                        yield flow, src, dst, wider
                        continue
                    verdict = self._verdict(src, dst, flow)
                    if verdict.verdict == "allow":
                        allowed[(id(src), id(dst), flow.protocol)].append((ports, verdict))
                    yield flow, src, dst, verdict

    def _flows(self, job: JobInfo, shape: JobShape, classes: Sequence[_Class]) -> list[AuditFinding]:
        position = {flow: i for i, flow in reversed(list(enumerate(shape.flows)))}
        gathered: dict[tuple[str, str, str], _Found] = {}
        for flow, src, dst, verdict in self.pair_verdicts(shape, classes):
            if verdict.verdict == "allow":
                continue
            kind = self._type(job, verdict, src, dst)
            found = gathered.get((kind, flow.src, flow.dst))
            if found is None:
                found = gathered[(kind, flow.src, flow.dst)] = _Found(kind, flow.src, flow.dst)
            seen = found.flows.get(flow)
            if seen is None:
                seen = found.flows[flow] = _FlowSeen(flow, verdict, example=(src.pod.name, dst.pod.name))
            seen.src.add(src.place)
            seen.dst.add(dst.place)
        # Findings and their flows in the job's own flow order.
        out = []
        for found in sorted(gathered.values(), key=lambda f: min(position[flow] for flow in f.flows)):
            found.flows = dict(sorted(found.flows.items(), key=lambda item: position[item[0]]))
            out.append(_flow_finding(job, found))
        return out

    @staticmethod
    def _type(job: JobInfo, verdict: Verdict, src: _Class, dst: _Class) -> str:
        if verdict.verdict == "unknown":
            return "unknown"
        if src.place[0] and dst.place[0]:
            return "blocked"
        return "zone-closed" if job.zone else "blocked"

    def _unzoned(self, unzoned: Mapping[str, Sequence[str]]) -> AuditFinding:
        count = sum(len(p) for p in unzoned.values())
        known = [n for n in unzoned if n in self.node_zones]
        gone = [n for n in unzoned if n not in self.node_zones]
        parts = []
        if known:
            parts.append(f"{_names(sorted(known))} {'has' if len(known) == 1 else 'have'} no "
                         f"{self.settings.zone_label} label")
        if gone:
            parts.append(f"{_names(sorted(gone))} {'is' if len(gone) == 1 else 'are'} not in the snapshot")
        return AuditFinding("unknown", f"Cannot tell which zone {_pods(count)} of this job run in: {'; '.join(parts)}")

    def _zone_gone(self, job: JobInfo, pods: Iterable[PodInfo], shape: JobShape) -> AuditFinding | None:
        """zone-closed by capacity: the pinned zone has no usable node, or too few allocatable GPUs for the
        pending pods beside what the job's own bound pods hold there."""
        waiting = [p for p in pods if not p.node_name]
        roles = sorted({role.key for p in waiting if (role := shape.role_of(p.labels)) is not None})
        who = f"{_pods(len(waiting))}{' (' + ', '.join(roles) + ')' if roles else ''}"
        zone = job.zone
        if zone not in self.index.zones:
            return AuditFinding(
                "zone-closed",
                f"Pending {who} pinned to {zone} cannot start: no ready, schedulable node is left in {zone}",
            )
        gpu_resources = self.kinds
        allocatable: Counter[str] = Counter()
        for cls in self.index.classes_in(zone):
            for resource in gpu_resources:
                allocatable[resource] += cls.allocatable.get(resource, 0)
        need: Counter[str] = Counter()
        held: Counter[str] = Counter()
        for pod in pods:
            for resource in gpu_resources:
                count = pod.requests.get(resource, 0)
                if not pod.node_name:
                    need[resource] += count
                elif self.node_zones.get(pod.node_name) == zone:
                    held[resource] += count
        short = [r for r in gpu_resources if need[r] and need[r] > allocatable[r] - held[r]]
        if not short:
            return None
        texts = []
        for r in short:
            text = f"they need {need[r]} {r}, the zone has {allocatable[r]} allocatable on its ready nodes"
            if held[r]:
                text += f", {held[r]} of them held by this job's running pods"
            texts.append(text)
        return AuditFinding("zone-closed", f"Pending {who} pinned to {zone} cannot start: {'; '.join(texts)}")


# The what-if (app/engine/whatif.py) walks the same pass: one flow model.
AuditPass = _Pass
PodGroup = _Class


# --- messages ---------------------------------------------------------------------------------


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _pods(n: int) -> str:
    return _plural(n, "pod")


def _names(items: Sequence[str]) -> str:
    shown = list(items[:3])
    more = len(items) - len(shown)
    text = ", ".join(shown[:-1]) + (" and " if len(shown) > 1 else "") + shown[-1] if shown else ""
    return f"{text} and {more} more" if more else text


def _split(zones: Mapping[str, int], per_role: Mapping[str, Mapping[str, int]]) -> AuditFinding:
    parts = []
    for role, counts in sorted(per_role.items()):
        for zone, n in sorted(counts.items()):
            parts.append(f"{n} {role or 'other'} {'pod' if n == 1 else 'pods'} in {zone}")
    return AuditFinding("split", f"Job split across zones {_names(sorted(zones))}: {', '.join(parts)}")


def _where(places: set[Place]) -> str:
    zones = sorted(z or "a node without a zone" for bound, z in places if bound)
    pending = any(not bound for bound, _ in places)
    text = f"in {_names(zones)}" if zones else ""
    if pending:
        text = f"{text} and pending" if text else "pending"
    return text


def _subject(role: str, places: set[Place]) -> str:
    where = _where(places)
    return f"pending {role} pods" if where == "pending" else f"{role} pods {where}"


def _object(role: str, places: set[Place]) -> str:
    where = _where(places)
    return f"pending {role} pods" if where == "pending" else f"{role} {where}"


def _ports(flow: Flow) -> str:
    text = f"{flow.protocol} {flow.ports}"
    return f"{text} (collective traffic)" if flow.purpose == "collective" else text


def _refs(verdict: Verdict) -> tuple[str, ...]:
    """`CiliumNetworkPolicy ns/name` of each policy that made the flow deny (or unknown), in order."""
    effects = ("deny", "default-deny") if verdict.verdict == "deny" else ("unknown",)
    out: dict[str, None] = {}
    for side in (verdict.egress, verdict.ingress):
        if side.verdict != verdict.verdict:
            continue
        for r in side.reasons:
            if r.policy and r.effect in effects:
                out[f"{r.kind} {r.policy}".strip()] = None
    return tuple(out)


def by_kind(refs: Sequence[str]) -> str:
    """`CiliumNetworkPolicy ml/a, ml/b; NetworkPolicy ml/c`."""
    kinds: dict[str, list[str]] = {}
    for ref in refs:
        kind, _, name = ref.rpartition(" ")
        kinds.setdefault(kind, []).append(name)
    return "; ".join(f"{kind} {', '.join(names)}".strip() for kind, names in kinds.items())


def _flow_json(job: JobInfo, seen: _FlowSeen) -> dict[str, Any]:
    flow, verdict = seen.flow, seen.verdict
    return {
        "src": flow.src,
        "dst": flow.dst,
        "srcZones": sorted({z for bound, z in seen.src if bound}),
        "srcPending": any(not bound for bound, _ in seen.src),
        "dstZones": sorted({z for bound, z in seen.dst if bound}),
        "dstPending": any(not bound for bound, _ in seen.dst),
        "port": f"{flow.protocol}/{flow.ports}",
        "purpose": flow.purpose,
        "verdict": verdict.verdict,
        "policies": list(_refs(verdict)),
        "reasons": [memo.render(r, job.name) for r in blocking_reasons(verdict)],
        "example": {"src": f"{job.namespace}/{seen.example[0]}", "dst": f"{job.namespace}/{seen.example[1]}"},
    }


def _flow_finding(job: JobInfo, found: _Found) -> AuditFinding:
    seen = list(found.flows.values())
    first = seen[0]
    src_places = set().union(*(s.src for s in seen))
    dst_places = set().union(*(s.dst for s in seen))
    refs = tuple(dict.fromkeys(r for s in seen for r in _refs(s.verdict)))
    who = _subject(found.src, src_places)
    same = found.src == found.dst and src_places == dst_places
    whom = "each other" if same else _object(found.dst, dst_places)
    ports = " and ".join(dict.fromkeys(_ports(s.flow) for s in seen))
    why = by_kind(refs) if refs else "; ".join(memo.render(r, job.name) for r in blocking_reasons(first.verdict))
    if found.type == "unknown":
        message = f"Cannot tell whether {who} can reach {whom} on {ports}: " + "; ".join(
            dict.fromkeys(memo.render(r, job.name) for s in seen for r in blocking_reasons(s.verdict))
        )
    elif found.type == "zone-closed":
        message = f"{who} pinned to {job.zone} cannot reach {whom} on {ports}: {why}"
    else:
        message = f"{who} cannot reach {whom} on {ports}: {why}"
    return AuditFinding(
        found.type,
        message[0].upper() + message[1:],
        flows=tuple(_flow_json(job, s) for s in seen),
        policies=refs,
    )
