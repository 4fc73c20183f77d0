"""The cluster snapshot: compact, immutable projections of the objects topoguard reads.

A `Snapshot` is built once (from files or by the watch cache) and then only read. Derived,
precomputed structures (policy indexes, per-zone aggregates) hang off it through `memo`, so they
are built once per snapshot and never per request.
"""

from __future__ import annotations

import operator
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from app.models.dra import (
    ComputeDomainInfo,
    DeviceClassInfo,
    ResourceClaimInfo,
    ResourceClaimTemplateInfo,
    ResourceSliceInfo,
)
from app.models.job import JobShape
from app.models.labels import ENABLED_LABEL
from app.models.pods import ContainerPort as ContainerPort
from app.models.pods import PodIndex, PodIndexBuilder
from app.models.pods import PodInfo as PodInfo
from app.models.resources import add_counts as add_counts

# This module sits above job.py and pods.py (neither imports it: no cycle in app/models, docs/architecture.md).
# ContainerPort, PodInfo (pods.py) and add_counts (resources.py) stay importable from here, as they were.

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

EMPTY: Mapping[str, str] = MappingProxyType({})


def freeze(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A read-only copy of `mapping` (an empty mapping for None)."""
    return MappingProxyType(dict(mapping or {}))


class BoundedMemo(Generic[K, V]):
    """A bounded cache kept with a snapshot (e.g. verdicts, decisions); the oldest entry goes first
    when it is full. Reads take no lock; writes do, so concurrent reviews can share it.

    The oldest key is kept in a queue of the keys in the order they came: a dict's first key (`next(iter(d))`)
    is found by a scan over the slots its deletions left at the front, which grows with every eviction until
    the dict is resized (about 2 µs a put at 1,024 entries under a burst of new keys, against 0.5 µs).
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: dict[K, V] = {}
        self._order: deque[K] = deque()  # the keys of `_entries`, oldest first
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        return self._entries.get(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            if key not in self._entries:  # (a value two callers made at once is kept once, in its first place)
                self._order.append(key)
                if len(self._order) > self._size:
                    del self._entries[self._order.popleft()]
            self._entries[key] = value

    def __len__(self) -> int:
        return len(self._entries)


_CANONICAL: dict[object, object] = {}
_CANONICAL_LOCK = threading.Lock()


def canonical(value: V) -> V:
    """One object for all equal `value`s (a zone label, a tuple of GPU resources): an IdentityMemo keyed on
    it then finds what an equal value built, whoever passes it. For settings' values (few distinct ones)."""
    found = _CANONICAL.get(value)
    if found is None:
        with _CANONICAL_LOCK:
            found = _CANONICAL.setdefault(value, value)
    return found  # type: ignore[return-value]


class IdentityMemo(Generic[V]):
    """Values derived from immutable inputs, kept from one snapshot to the next: found by the identity of
    the inputs (the watch cache reuses an unchanged object, so an unchanged node or job finds its value
    again in the next snapshot). The inputs are kept with the value and compared by identity, so a
    reused id never answers.

    Bounded by generations: when `size` values have been stored since the last turn, the entries not
    asked for since then are dropped. A reader that asks for all its values on every snapshot (as many
    as there are nodes or jobs) keeps them, and what it stopped asking for (a replaced pod group, a
    deleted node) goes within two turns, with the old objects it held.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._current: dict[tuple[int, ...], tuple[tuple[object, ...], V]] = {}
        self._previous: dict[tuple[int, ...], tuple[tuple[object, ...], V]] = {}
        self._lock = threading.Lock()

    def get(self, inputs: tuple[object, ...], build: Callable[[], V]) -> V:
        key = tuple(map(id, inputs))
        found = self._current.get(key)
        if found is None:
            found = self._previous.get(key)
            if found is not None and all(map(operator.is_, found[0], inputs)):
                self._store(key, found)
                return found[1]
        elif all(map(operator.is_, found[0], inputs)):
            return found[1]
        value = build()
        self._store(key, (inputs, value))
        return value

    def _store(self, key: tuple[int, ...], entry: tuple[tuple[object, ...], V]) -> None:
        with self._lock:
            if len(self._current) >= self._size:
                self._previous, self._current = self._current, {}
            self._current[key] = entry

    def fit(self, wanted: int) -> None:
        """Keep room for `wanted` values asked for on every snapshot (twice that between turns)."""
        self._size = max(self._size, 2 * wanted)

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    allocatable: Mapping[str, int]  # extended resources only, whole units (e.g. nvidia.com/gpu: 8)
    ready: bool
    unschedulable: bool
    # Extended resources whose allocatable quantity is not a number (`nvidia.com/gpu: "eight"`), as
    # written: counted as 0 in `allocatable` and reported (engine warnings), never silently.
    unparsable: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    pod_cidrs: tuple[str, ...] = ()  # spec.podCIDRs (else spec.podCIDR): the pod IP ranges of the node
    # Allocatable cpu (millicores), memory, ephemeral-storage, hugepages-* (bytes), as the node reports them
    # (models/resources.py node_resources); one it does not report is not judged.
    resources: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class ConfigMapInfo:
    """A ConfigMap the snapshot keeps (the Cilium agent's cilium-config): its data and labels."""

    namespace: str
    name: str
    data: Mapping[str, str]
    labels: Mapping[str, str]


@dataclass(frozen=True)
class NamespaceInfo:
    name: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class PolicyObject:
    """One network policy object as written: kind, identity and its raw body (spec/specs)."""

    kind: str  # CiliumNetworkPolicy | CiliumClusterwideNetworkPolicy | NetworkPolicy
    api_version: str
    name: str
    namespace: str  # "" for cluster-wide
    body: Mapping[str, Any]  # the whole object minus status/managedFields (read-only)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class CIDRGroup:
    name: str
    cidrs: tuple[str, ...]


@dataclass(frozen=True)
class TrainingRuntimeInfo:
    """A Kubeflow Trainer (Cluster)TrainingRuntime, projected to what composing a TrainJob's pods needs.

    `template` is the runtime's `spec.template` (JobSet metadata + JobSetSpec, replicatedJobs with their
    pod templates), `ml_policy` its `spec.mlPolicy`, `pod_group_policy` its `spec.podGroupPolicy`, all
    as written (read-only; no status, no managedFields).
    """

    kind: str  # TrainingRuntime | ClusterTrainingRuntime
    name: str
    namespace: str  # "" for ClusterTrainingRuntime
    resource_version: str
    labels: Mapping[str, str]
    ml_policy: Mapping[str, Any]
    pod_group_policy: Mapping[str, Any]
    template: Mapping[str, Any]

    @property
    def ref(self) -> str:
        """`ClusterTrainingRuntime torch-distributed`, `TrainingRuntime ml/torch` for messages."""
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"


# (kind, namespace, name): namespace "" for ClusterTrainingRuntime.
RuntimeKey = tuple[str, str, str]
@dataclass(frozen=True, slots=True)
class JobInfo:
    """A stored training job as the reservation ledger reads it (a few hundred bytes, not the object).

    `demand` is every extended resource the job's pods ask for, summed over all its pods (the same
    pod_requests reading as a bound pod's); `pod_label` is the label key, and `operators` the
    `training.kubeflow.org/operator-name` values, by which its pods are told apart from others.
    """

    kind: str
    namespace: str
    name: str
    uid: str
    zone: str  # the `topoguard.io/zone` annotation: "" when topoguard did not pin it to one zone
    demand: Mapping[str, int]
    pods: int
    suspended: bool
    finished: bool
    created: str  # metadata.creationTimestamp as written ("" when absent)
    pod_label: str
    operators: tuple[str, ...] = ()
    # The replica types and required flows the audit checks between the job's pods (parsed from the
    # job when it is projected); None when they are composed later: a TrainJob's come from its runtime,
    # which the snapshot holds (`source` is then the TrainJob as written, metadata and spec only).
    shape: JobShape | None = None
    source: Mapping[str, Any] | None = None

    @property
    def ref(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


class NetworkMemo:
    """Derived values that read only a snapshot's network inputs: its policies, namespaces, CIDR groups,
    the Cilium agent's settings and the named ports of its pods (`PodIndex.named_ports`).

    Consecutive snapshots whose network inputs are the same share one (the watch cache hands it on;
    see `Snapshot.memo(..., network=True)`), so a pod or node change does not rebuild the policy
    index or forget the verdicts. A value kept here must not hold the snapshot that built it.
    """

    def __init__(self, named_ports: Mapping[str, frozenset[int]] | None = None) -> None:
        self.values: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.building: dict[str, threading.Lock] = {}  # per key, held while its value is built
        # The named ports of the snapshot it was made for (None: not computed): a later snapshot whose
        # pods name other ports needs a memo of its own.
        self.named_ports = named_ports


@dataclass(frozen=True, eq=False)
class Snapshot:
    """Everything a decision reads, immutable. `revision` changes whenever the content does."""

    nodes: tuple[NodeInfo, ...] = ()
    namespaces: Mapping[str, NamespaceInfo] = field(default_factory=lambda: MappingProxyType({}))
    pods: tuple[PodInfo, ...] = ()
    policies: tuple[PolicyObject, ...] = ()
    cidr_groups: Mapping[str, CIDRGroup] = field(default_factory=lambda: MappingProxyType({}))
    revision: str = "0"
    # Which object kinds the source could not provide (e.g. Cilium CRDs not installed).
    missing_kinds: tuple[str, ...] = ()
    # Kubeflow Trainer runtimes by (kind, namespace, name); see TrainingRuntimeInfo.
    training_runtimes: Mapping[RuntimeKey, TrainingRuntimeInfo] = field(default_factory=lambda: MappingProxyType({}))
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    _memo_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _memo_building: dict[str, threading.Lock] = field(default_factory=dict, repr=False, compare=False)
    # The stored training jobs of every supported kind (the reservation ledger's input).
    jobs: tuple[JobInfo, ...] = ()
    # The cilium-config ConfigMap (data, and its labels); None when not read or not present.
    cilium_config: Mapping[str, str] | None = None
    cilium_config_labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # The image of the Cilium agent DaemonSet's agent container ("" when not known).
    cilium_image: str = ""
    # What this snapshot shares with its predecessors of the same network inputs (see NetworkMemo).
    network_memo: NetworkMemo = field(default_factory=NetworkMemo, repr=False, compare=False)
    # The pods' aggregates as the watch cache keeps them (models/pods.py); None: built from `pods` on use.
    pod_index: PodIndex | None = field(default=None, repr=False, compare=False)
    # Dynamic Resource Allocation (resource.k8s.io/v1) and NVIDIA ComputeDomains, all optional (models/dra.py).
    device_classes: Mapping[str, DeviceClassInfo] = field(default_factory=lambda: MappingProxyType({}))
    resource_slices: tuple[ResourceSliceInfo, ...] = ()
    resource_claims: tuple[ResourceClaimInfo, ...] = ()
    # (namespace, name) -> template
    claim_templates: Mapping[tuple[str, str], ResourceClaimTemplateInfo] = field(
        default_factory=lambda: MappingProxyType({}))
    compute_domains: tuple[ComputeDomainInfo, ...] = ()

    def memo(self, key: str, build: Callable[[Snapshot], T], *, network: bool = False) -> T:
        """Return the derived value `key`, building it with `build(self)` the first time.

        Derived values are computed once per snapshot (indexes, aggregates); a snapshot is
        never mutated, so they never go stale. `network`: the value reads only the network inputs
        (NetworkMemo), so it is kept in the memo this snapshot shares with others of the same ones.
        Each key is built under a lock of its own, so a builder may read other memos (derived values
        depend on one another without cycles) and threads wait only for the value they need.
        """
        shared = self.network_memo if network else None
        values = shared.values if shared else self._memo
        try:
            return values[key]  # type: ignore[no-any-return]
        except KeyError:
            pass
        locks = shared.building if shared else self._memo_building
        with shared.lock if shared else self._memo_lock:
            building = locks.get(key)
            if building is None:
                building = locks[key] = threading.Lock()
        with building:
            if key not in values:
                values[key] = build(self)
            return values[key]  # type: ignore[no-any-return]

    def opted_in(self, namespace: str) -> bool:
        """Whether topoguard handles `namespace`'s jobs: labelled `topoguard.io/enabled=true`, or not in the
        snapshot at all (the webhook's namespaceSelector already chose it)."""
        known = self.namespaces.get(namespace) if namespace else None
        return known is None or known.labels.get(ENABLED_LABEL) == "true"

    def namespace_labels(self, name: str) -> Mapping[str, str]:
        ns = self.namespaces.get(name)
        return ns.labels if ns else MappingProxyType({"kubernetes.io/metadata.name": name})


INDEX_MEMO_KEY = "pods.index"


def pod_index(snapshot: Snapshot) -> PodIndex:
    """The snapshot's PodIndex: the one the watch cache kept, else built once over its pods."""
    kept = snapshot.pod_index
    if kept is not None:
        return kept
    return snapshot.memo(INDEX_MEMO_KEY, lambda s: PodIndexBuilder.of(s.pods).freeze())
