"""The pods of a snapshot: what it keeps of each (`PodInfo`, with its `ContainerPort`s), and what decisions
read of them all, kept as pods come and go rather than recomputed per snapshot.

PURE. A 5,000-node cluster keeps tens of thousands of pods in the snapshot (bound GPU pods, training
jobs' pods) and changes hundreds of them a second. Three readers need the pods only through
aggregates: the zone index (GPUs requested per node by bound pods), the reservation ledger and the
audit (each job's pods, found by the operators' job-name labels or by their controller owner), and
the policy index (which numbers a named port stands for). `PodIndexBuilder` keeps those three up to
date one pod at a time (`add`/`remove`, costs the pod's size); `freeze()` gives the immutable
`PodIndex` a snapshot carries, at the cost of copying the top-level maps (nodes, groups), never a pass
over the pods. The watch cache keeps a builder per pod list; a snapshot read from files builds one over
all its pods (`PodIndexBuilder.of`, in `cluster.pod_index`), so both go through the same code. Each frozen
index also says which groups and which nodes' held resources changed since its builder's previous one
(`changes_since`), so a reader that derives something per group or node from the previous snapshot redoes
only those (engine/ledger.py, engine/capacity.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from app.models.labels import JOBSET_NAME_LABEL, KF_JOB_NAME
from app.models.resources import add_counts

# The operators' job-name pod labels (`JobInfo.pod_label` is one of these).
JOB_POD_LABELS = (KF_JOB_NAME, JOBSET_NAME_LABEL)
OWNER_PREFIX = "owner:"  # a group key's middle part for the pods whose controller is the job: "owner:<kind>"

GroupKey = tuple[str, str, str]  # (namespace, label key or OWNER_PREFIX + kind, value or name)


@dataclass(frozen=True)
class ContainerPort:
    port: int
    protocol: str = "TCP"  # TCP | UDP | SCTP
    name: str = ""


@dataclass(frozen=True)
class PodInfo:
    name: str
    namespace: str
    labels: Mapping[str, str]
    service_account: str
    node_name: str  # "" when not bound
    phase: str  # Pending | Running | Succeeded | Failed | Unknown | ""
    requests: Mapping[str, int]  # extended resources the pod holds (max of init, sum of containers)
    ports: tuple[ContainerPort, ...]
    host_network: bool
    ips: tuple[str, ...]
    owner: tuple[str, str] = ("", "")  # (kind, name) of its controller ownerReference, when it has one

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class PodChanges:
    """What differs between two frozen indexes of one builder."""

    groups: frozenset[GroupKey] = frozenset()  # whose members are another tuple
    nodes: frozenset[str] = frozenset()  # whose `held` is another mapping

    def __bool__(self) -> bool:
        return bool(self.groups or self.nodes)


NO_CHANGES = PodChanges()


def group_keys(pod: PodInfo) -> tuple[GroupKey, ...]:
    """The groups a non-terminal pod belongs to: per job-name label it carries, and its controller owner."""
    keys: tuple[GroupKey, ...] = ()
    for key in JOB_POD_LABELS:
        value = pod.labels.get(key)
        if value:
            keys += ((pod.namespace, key, value),)
    if pod.owner[0]:
        keys += ((pod.namespace, OWNER_PREFIX + pod.owner[0], pod.owner[1]),)
    return keys


def _pod_order(pod: PodInfo) -> tuple[str, str]:
    return (pod.namespace, pod.name)


@dataclass(frozen=True)
class PodIndex:
    """The pods' aggregates of one snapshot (see the module docstring); read-only."""

    # node name -> extended resource -> requested by the bound, non-terminal pods on it
    held: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: MappingProxyType({}))
    # GroupKey -> its non-terminal pods (bound or pending), by namespace and name
    groups: Mapping[GroupKey, tuple[PodInfo, ...]] = field(default_factory=lambda: MappingProxyType({}))
    # container port name (lowercased) -> the numbers it stands for on some pod
    named_ports: Mapping[str, frozenset[int]] = field(default_factory=lambda: MappingProxyType({}))
    # This index's number (unique in the process; 0: not frozen by a builder), the number of the one its builder
    # froze before it (0: none), and what differs between the two. Not part of what an index equals: two indexes
    # of the same pods are equal however they were kept.
    serial: int = field(default=0, compare=False)
    after: int = field(default=0, compare=False)
    changed: PodChanges = field(default_factory=lambda: NO_CHANGES, compare=False)

    def changes_since(self, serial: int) -> PodChanges | None:
        """What changed since the index numbered `serial`, when known: this very index (nothing) or the one its
        builder froze just before it; None otherwise."""
        if not serial or not self.serial:
            return None
        if serial == self.serial:
            return NO_CHANGES
        return self.changed if serial == self.after else None


_SERIALS = itertools.count(1)


class PodIndexBuilder:
    """Keeps a PodIndex's parts current as pods are added and removed (not thread-safe: the caller locks)."""

    def __init__(self) -> None:
        self._held: dict[str, Mapping[str, int]] = {}
        self._groups: dict[GroupKey, tuple[PodInfo, ...]] = {}
        self._ports: dict[str, dict[int, int]] = {}  # name -> number -> pods naming it so
        self._frozen: PodIndex | None = None
        self._serial = 0  # of the last index frozen
        self._dirty: set[GroupKey] = set()  # groups changed since then
        self._dirty_nodes: set[str] = set()  # nodes whose held resources changed since then

    @classmethod
    def of(cls, pods: Iterable[PodInfo]) -> PodIndexBuilder:
        builder = cls()
        for pod in pods:
            builder.add(pod)
        return builder

    def add(self, pod: PodInfo) -> None:
        self._change(pod, +1)

    def remove(self, pod: PodInfo) -> None:
        self._change(pod, -1)

    def replace(self, old: PodInfo | None, new: PodInfo | None) -> None:
        if old is not None:
            self.remove(old)
        if new is not None:
            self.add(new)

    def _change(self, pod: PodInfo, sign: int) -> None:
        self._frozen = None
        for port in pod.ports:
            if port.name:
                numbers = self._ports.setdefault(port.name.lower(), {})
                left = numbers.get(port.port, 0) + sign
                if left > 0:
                    numbers[port.port] = left
                else:
                    numbers.pop(port.port, None)
                    if not numbers:
                        del self._ports[port.name.lower()]
        if pod.terminal:
            return
        if pod.node_name and pod.requests:
            per = dict(self._held.get(pod.node_name, {}))
            self._dirty_nodes.add(pod.node_name)
            add_counts(per, pod.requests, sign)
            if per:
                self._held[pod.node_name] = MappingProxyType(per)
            else:
                self._held.pop(pod.node_name, None)
        for key in group_keys(pod):
            members = self._groups.get(key, ())
            if sign > 0:
                kept = tuple(sorted((*(p for p in members if _pod_order(p) != _pod_order(pod)), pod), key=_pod_order))
            else:
                kept = tuple(p for p in members if p is not pod and p != pod)
            self._dirty.add(key)
            if kept:
                self._groups[key] = kept
            else:
                self._groups.pop(key, None)

    def freeze(self) -> PodIndex:
        """The current aggregates, immutable (the same object until the next change)."""
        if self._frozen is None:
            serial = next(_SERIALS)
            self._frozen = PodIndex(
                MappingProxyType(dict(self._held)),
                MappingProxyType(dict(self._groups)),
                MappingProxyType({name: frozenset(numbers) for name, numbers in self._ports.items()}),
                serial=serial,
                after=self._serial,
                changed=PodChanges(frozenset(self._dirty), frozenset(self._dirty_nodes)),
            )
            self._serial, self._dirty, self._dirty_nodes = serial, set(), set()
        return self._frozen
