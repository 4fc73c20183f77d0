"""Per-snapshot zone aggregates and GPU capacity: free GPUs per node, node classes, bin packing.

PURE. `zone_index(snapshot, ...)` is built once per snapshot (through `Snapshot.memo`) so a
decision never walks the node or pod list:

- Only Ready, schedulable nodes that carry the zone label are placement targets.
- Free GPUs of a node = allocatable minus what non-terminal pods bound to it request.
- Nodes are grouped into classes: same zone, same taints, same labels once the per-node label keys
  (hostname, or any key with a value per node) are set aside, same GPU resources. A selector that
  reads only shared keys is matched once per class; one that reads a per-node key or the node name
  is matched node by node. With realistic pools the number of classes, not nodes, bounds the cost.
- `pack` places the GPU replicas' pods best-fit-decreasing: largest demand first, each onto the node
  with the least room that still fits it.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from app.models.cluster import NodeInfo, Snapshot, Taint, freeze
from app.models.labels import HOSTNAME_LABEL

# A label key counts as per-node when it takes more distinct values than this floor and than half of
# the nodes carrying it (hostname, instance ids). Its value never becomes part of a class.
PER_NODE_MIN_DISTINCT_VALUES = 16


@dataclass(frozen=True)
class NodeSlot:
    """One placement target and the GPUs still free on it."""

    name: str
    labels: Mapping[str, str]
    free: Mapping[str, int]  # per GPU resource the node offers (allocatable minus held, floored at 0)

    @property
    def total_free(self) -> int:
        return sum(self.free.values())


@dataclass(frozen=True)
class Pool:
    """Nodes a pod may use, most free GPUs first, with their negated free counts for bisection."""

    nodes: tuple[NodeSlot, ...]
    order: tuple[int, ...]  # -total_free of each node: ascending, so bisect finds the nodes with room
    positions: Mapping[str, int]  # node name -> index in `nodes`

    @classmethod
    def of(cls, nodes: Sequence[NodeSlot]) -> Pool:
        ordered = tuple(sorted(nodes, key=lambda s: (-s.total_free, s.name)))
        return cls(ordered, tuple(-s.total_free for s in ordered), freeze({s.name: i for i, s in enumerate(ordered)}))


@dataclass(frozen=True)
class NodeClass:
    """Nodes of one zone that a selector or toleration cannot tell apart."""

    zone: str
    labels: Mapping[str, str]  # shared labels only (per-node keys removed)
    taints: tuple[Taint, ...]
    gpu_resources: frozenset[str]  # GPU resources with allocatable > 0
    nodes: tuple[NodeSlot, ...]  # most free GPUs first, then by name
    free: Mapping[str, int]  # free GPUs per resource over all nodes of the class
    pool: Pool  # the same nodes, ready for packing

    def gpus_free(self, resources: Iterable[str]) -> int:
        return sum(self.free.get(r, 0) for r in resources)


@dataclass(frozen=True)
class ZoneIndex:
    zones: tuple[str, ...]  # sorted zone names that have at least one placement target
    classes: Mapping[str, tuple[NodeClass, ...]]  # zone -> its node classes
    per_node_keys: frozenset[str]

    def classes_in(self, zone: str) -> tuple[NodeClass, ...]:
        return self.classes.get(zone, ())


def held_gpus(snapshot: Snapshot, gpu_resources: Iterable[str]) -> dict[str, dict[str, int]]:
    """GPUs requested per node by the non-terminal pods bound to it."""
    wanted = frozenset(gpu_resources)
    held: dict[str, dict[str, int]] = defaultdict(dict)
    for pod in snapshot.pods:
        if not pod.node_name or pod.terminal:
            continue
        for resource, count in pod.requests.items():
            if resource in wanted and count:
                per_node = held[pod.node_name]
                per_node[resource] = per_node.get(resource, 0) + count
    return held


def _per_node_keys(nodes: Sequence[NodeInfo]) -> frozenset[str]:
    values: dict[str, set[str]] = defaultdict(set)
    carriers: dict[str, int] = defaultdict(int)
    for node in nodes:
        for key, value in node.labels.items():
            values[key].add(value)
            carriers[key] += 1
    unique = {
        key
        for key, seen in values.items()
        if len(seen) > PER_NODE_MIN_DISTINCT_VALUES and len(seen) * 2 > carriers[key]
    }
    return frozenset(unique | {HOSTNAME_LABEL})


def build_zone_index(snapshot: Snapshot, *, zone_label: str, gpu_resources: Sequence[str]) -> ZoneIndex:
    """Group the snapshot's placement targets into per-zone node classes (see the module docstring)."""
    targets = [n for n in snapshot.nodes if n.ready and not n.unschedulable and n.labels.get(zone_label)]
    per_node = _per_node_keys(targets)
    held = held_gpus(snapshot, gpu_resources)
    ClassKey = tuple[str, tuple[tuple[str, str], ...], tuple[Taint, ...], tuple[str, ...]]
    grouped: dict[ClassKey, list[NodeSlot]] = defaultdict(list)
    for node in targets:
        offered = {r: node.allocatable.get(r, 0) for r in gpu_resources if node.allocatable.get(r, 0) > 0}
        used = held.get(node.name, {})
        free: Mapping[str, int] = freeze({r: max(n - used.get(r, 0), 0) for r, n in offered.items()})
        shared = tuple(sorted((k, v) for k, v in node.labels.items() if k not in per_node))
        key: ClassKey = (node.labels[zone_label], shared, node.taints, tuple(sorted(offered)))
        grouped[key].append(NodeSlot(node.name, node.labels, free))
    by_zone: dict[str, list[NodeClass]] = defaultdict(list)
    for (zone, shared, taints, offered_keys), slots in grouped.items():
        pool = Pool.of(slots)
        ordered = pool.nodes
        totals: dict[str, int] = defaultdict(int)
        for slot in ordered:
            for r, n in slot.free.items():
                totals[r] += n
        by_zone[zone].append(
            NodeClass(zone, freeze(dict(shared)), taints, frozenset(offered_keys), ordered, freeze(totals), pool)
        )
    classes = {z: tuple(sorted(cs, key=lambda c: c.nodes[0].name)) for z, cs in by_zone.items()}
    return ZoneIndex(zones=tuple(sorted(classes)), classes=freeze(classes), per_node_keys=per_node)


def zone_index(snapshot: Snapshot, *, zone_label: str, gpu_resources: Sequence[str]) -> ZoneIndex:
    """The memoised `build_zone_index` for this snapshot and these settings."""
    memo_key = f"engine.zone-index/{zone_label}/{','.join(gpu_resources)}"
    return snapshot.memo(memo_key, lambda s: build_zone_index(s, zone_label=zone_label, gpu_resources=gpu_resources))


@dataclass(frozen=True)
class PodDemand:
    """The GPU pods of one replica type and the nodes they may use in one zone."""

    replica: str
    count: int
    gpus: Mapping[str, int]
    pools: tuple[Pool, ...]

    @property
    def per_pod(self) -> int:
        return sum(self.gpus.values())


def _fits(node: NodeSlot, used: Mapping[str, int], demand: Mapping[str, int]) -> bool:
    return all(node.free.get(r, 0) - used.get(r, 0) >= n for r, n in demand.items())


def _room(node: NodeSlot, used: Mapping[str, int]) -> int:
    return node.total_free - sum(used.values())


def _best_in_pool(pool: Pool, demand: PodDemand, used: Mapping[str, Mapping[str, int]]) -> tuple[int, str] | None:
    """(room, name) of the node of `pool` with the least room that still fits one pod of `demand`.

    Untouched nodes keep their initial free count, so the tightest untouched fit is the last node of
    the sorted prefix with enough room (found by bisection); the few nodes this packing already used
    (possibly through another replica's pool) are checked one by one.
    """
    found: list[tuple[int, str]] = []
    i = bisect.bisect_right(pool.order, -demand.per_pod) - 1
    while i >= 0:
        node = pool.nodes[i]
        if node.name not in used and _fits(node, {}, demand.gpus):
            found.append((node.total_free, node.name))
            break
        i -= 1
    for name, taken in used.items():
        index = pool.positions.get(name)
        if index is not None and _fits(pool.nodes[index], taken, demand.gpus):
            found.append((_room(pool.nodes[index], taken), name))
    return min(found, default=None)


def pack(demands: Sequence[PodDemand]) -> str | None:
    """Best-fit-decreasing placement of every pod; None when all fit, else the first replica that did not.

    Pods are placed largest demand first, each onto the node with the least room that still fits it,
    which keeps whole nodes free for the large pods (most-free-first would fail 4+3+3 GPUs on nodes
    with 6 and 4 free). The cost depends on the pods placed, not on the number of nodes.
    """
    used: dict[str, dict[str, int]] = {}
    pods = sorted(((d, i) for d in demands for i in range(d.count)), key=lambda p: (-p[0].per_pod, p[0].replica, p[1]))
    for demand, _ in pods:
        options = [best for pool in demand.pools if (best := _best_in_pool(pool, demand, used)) is not None]
        if not options:
            return demand.replica
        _, name = min(options)
        taken = used.setdefault(name, {})
        for r, n in demand.gpus.items():
            taken[r] = taken.get(r, 0) + n
    return None


PACK_MEMO_KEY = "engine.pack"
PACK_MEMO_SIZE = 1024  # distinct (demand, pools) shapes remembered per snapshot


@dataclass
class _PackMemo:
    """Packing outcomes of one snapshot. Pools are keyed by identity and kept alive by the entry,
    so an id in a key always names the very (immutable) pool it was computed on."""

    entries: dict[tuple[object, ...], tuple[str | None, tuple[Pool, ...]]]
    lock: threading.Lock

    @classmethod
    def empty(cls, _: Snapshot) -> _PackMemo:
        return cls({}, threading.Lock())


def pack_memo(snapshot: Snapshot) -> _PackMemo:
    """The snapshot's packing memo (created empty the first time)."""
    return snapshot.memo(PACK_MEMO_KEY, _PackMemo.empty)


def pack_memoized(snapshot: Snapshot, demands: Sequence[PodDemand]) -> str | None:
    """`pack(demands)`, remembered per snapshot.

    `pack` reads only each demand's replica key, pod count, GPUs per pod (in order) and pools;
    pools come from the snapshot's zone index (or are built from its nodes) and never change.
    """
    key = tuple((d.replica, d.count, tuple(d.gpus.items()), tuple(id(p) for p in d.pools)) for d in demands)
    memo = pack_memo(snapshot)
    found = memo.entries.get(key)
    if found is not None:
        return found[0]
    result = pack(demands)
    with memo.lock:
        while len(memo.entries) >= PACK_MEMO_SIZE:
            del memo.entries[next(iter(memo.entries))]
        memo.entries[key] = (result, tuple(p for d in demands for p in d.pools))
    return result


def largest_free(pools: Iterable[Pool]) -> int:
    """The most GPUs free on any one node of these pools (each pool is most-free first)."""
    return max((pool.nodes[0].total_free for pool in pools if pool.nodes), default=0)
