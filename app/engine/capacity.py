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
  with the least room that still fits it, counted by (GPUs per pod, pods) against groups of alike
  nodes, never pod by pod; onto free GPUs (fits now) or onto allocatable ones (fits once running
  work ends).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import operator
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from app.engine.devices import DeviceInventory
from app.engine.gpus import DEFAULT_GPU_DEVICE_CLASSES, dra_key, gpu_kinds, inventory_of
from app.models.cluster import IdentityMemo, NodeInfo, Snapshot, Taint, canonical, freeze, pod_index
from app.models.labels import HOSTNAME_LABEL
from app.models.pods import PodIndex

EMPTY_COUNTS: Mapping[str, int] = freeze({})
_NO_SELECTION: Mapping[str, str] = freeze({})
_NO_OFFERS: Mapping[str, tuple[int, int]] = freeze({})

# A label key counts as per-node when it takes more distinct values than this floor and than half of
# the nodes carrying it (hostname, instance ids). Its value never becomes part of a class.
PER_NODE_MIN_DISTINCT_VALUES = 16


# A node's GPUs as sorted (resource, count) pairs.
Shape = tuple[tuple[str, int], ...]
Basis = Literal["free", "allocatable"]


def _histogram(shapes: Iterable[Shape]) -> tuple[tuple[Shape, int], ...]:
    counted: dict[Shape, int] = defaultdict(int)
    for shape in shapes:
        counted[shape] += 1
    return tuple(sorted(counted.items()))


@dataclass(frozen=True)
class NodeSlot:
    """One placement target and the GPUs still free on it."""

    name: str
    labels: Mapping[str, str]
    free: Mapping[str, int]  # per GPU resource the node offers (allocatable minus held, floored at 0)
    allocatable: Mapping[str, int] | None = None  # per GPU resource as if nothing ran (None: same as free)
    # Every other resource the node offers pods (cpu, memory, ..., extended resources): what the scheduler's
    # NodeResourcesFit compares a pod's requests with.
    capacity: Mapping[str, int] = field(default_factory=lambda: freeze({}))

    # NB: computed once a slot (slots are kept from one snapshot to the next, and pools read these for
    # every node they sort and count).
    @functools.cached_property
    def total_free(self) -> int:
        return sum(self.free.values())

    @functools.cached_property
    def shape(self) -> Shape:
        """The free GPUs as sorted (resource, count) pairs: what packing tells nodes apart by."""
        return tuple(sorted(self.free.items()))

    @functools.cached_property
    def total_shape(self) -> Shape:
        """The allocatable GPUs as sorted (resource, count) pairs."""
        return tuple(sorted((self.free if self.allocatable is None else self.allocatable).items()))


def _slot_order(slot: NodeSlot) -> tuple[int, str]:
    return (-slot.total_free, slot.name)


@dataclass(frozen=True)
class Pool:
    """Nodes a pod may use, most free GPUs first (then by name)."""

    nodes: tuple[NodeSlot, ...]
    # The node class the nodes come from: pools of different owners share no node ("" for pools
    # built without one, which packing compares node by node).
    owner: str = ""
    free_shapes: tuple[tuple[Shape, int], ...] = ()  # (free shape, nodes with it), built by `of`
    total_shapes: tuple[tuple[Shape, int], ...] = ()  # (allocatable shape, nodes with it)

    @classmethod
    def of(cls, nodes: Sequence[NodeSlot], *, owner: str = "") -> Pool:
        ordered = tuple(sorted(nodes, key=_slot_order))
        return cls(ordered, owner, _histogram(s.shape for s in ordered), _histogram(s.total_shape for s in ordered))

    def replaced(self, changes: Sequence[tuple[NodeSlot, NodeSlot]]) -> Pool:
        """This pool with each (old, new) slot of the same node and allocatable GPUs swapped: what `of` gives
        over the new slots, at the cost of the changes (bisection), not of the pool's size."""
        nodes = list(self.nodes)
        counted = dict(self.free_shapes)
        for old, new in changes:
            del nodes[bisect.bisect_left(nodes, _slot_order(old), key=_slot_order)]
            nodes.insert(bisect.bisect_left(nodes, _slot_order(new), key=_slot_order), new)
            counted[old.shape] -= 1
            counted[new.shape] = counted.get(new.shape, 0) + 1
        free_shapes = tuple(sorted((shape, n) for shape, n in counted.items() if n))
        return Pool(tuple(nodes), self.owner, free_shapes, self.total_shapes)

    def shapes(self, basis: Basis) -> tuple[tuple[Shape, int], ...]:
        """(shape, node count) of the pool's nodes, by free or by allocatable GPUs."""
        return self.free_shapes if basis == "free" else self.total_shapes


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
    allocatable: Mapping[str, int] = field(default_factory=lambda: freeze({}))  # allocatable GPUs over all its nodes
    # The distinct `NodeSlot.capacity` of its nodes (one, most of the time: a pool is one instance type).
    capacities: tuple[Mapping[str, int], ...] = ()

    def gpus_free(self, resources: Iterable[str]) -> int:
        return sum(self.free.get(r, 0) for r in resources)

    def gpus_allocatable(self, resources: Iterable[str]) -> int:
        return sum(self.allocatable.get(r, 0) for r in resources)


@dataclass(frozen=True)
class ZoneIndex:
    zones: tuple[str, ...]  # sorted zone names that have at least one placement target
    classes: Mapping[str, tuple[NodeClass, ...]]  # zone -> its node classes
    per_node_keys: frozenset[str]

    def classes_in(self, zone: str) -> tuple[NodeClass, ...]:
        return self.classes.get(zone, ())


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


ClassKey = tuple[str, tuple[tuple[str, str], ...], tuple[Taint, ...], tuple[str, ...]]
# A node class in the making: its key and its nodes, each with the GPUs it offers (allocatable > 0, or DRA devices
# usable) and, for those DRA serves, the selection key whose free devices count (the device counter's: bound pods
# are not subtracted again).
Member = tuple[NodeInfo, Mapping[str, int], Mapping[str, str]]
# A node's DRA offers as the device counter counted them (`DeviceInventory.offers`), None where DRA serves none.
Offers = Mapping[str, tuple[int, int]] | None
Group = tuple[ClassKey, tuple[Member, ...]]

# The zone index is rebuilt only where its inputs changed, found by their identity from one snapshot to
# the next (the watch cache reuses unchanged nodes, and the pod index an unchanged node's held GPUs):
# - which nodes form which class depends on the nodes alone: regrouped only when a node changes;
# - a class whose nodes' held GPUs did not change is the previous snapshot's; one where some did is the
#   previous one with those nodes' slots replaced (`Pool.replaced`), at the cost of the changed nodes.
# - DRA: the classes depend on the devices published (`DeviceInventory.published`), not on what is allocated; a
#   node's free devices are read like its held GPUs (the counter keeps an unchanged node's offers the same object).
# Under pod and claim churn a publish thus costs the changed nodes (`_held_by_group`) and an identity test per class.
_TARGETS: IdentityMemo[tuple[tuple[NodeInfo, ...], frozenset[str]]] = IdentityMemo(16)
_GROUPS: IdentityMemo[tuple[Group, ...]] = IdentityMemo(16)
# Per group: [(its nodes' held GPUs, their slots in the group's order, the class)] as last built.
_CLASS_STATE: IdentityMemo[list[tuple[tuple[Mapping[str, int] | None, ...], tuple[Offers, ...], tuple[NodeSlot, ...],
                                       NodeClass]]] = IdentityMemo(256)


def _targets(nodes: tuple[NodeInfo, ...], zone_label: str) -> tuple[tuple[NodeInfo, ...], frozenset[str]]:
    """The placement targets (Ready, schedulable, zoned nodes) and their per-node label keys."""
    def build() -> tuple[tuple[NodeInfo, ...], frozenset[str]]:
        targets = tuple(n for n in nodes if n.ready and not n.unschedulable and n.labels.get(zone_label))
        return targets, _per_node_keys(targets)
    return _TARGETS.get((nodes, zone_label), build)


def _group(
    targets: tuple[NodeInfo, ...], per_node: frozenset[str], gpu_resources: tuple[str, ...], zone_label: str,
    inventory: DeviceInventory | None = None,
) -> tuple[Group, ...]:
    """The targets by class key, in the order each key is first met.

    Per node and GPU resource the scheduler's rule decides who serves it (KEP-5004): allocatable > 0, the device
    plugin; else the DRA devices of the selection (or of the GPU class that maps the name), if any.
    """
    grouped: dict[ClassKey, list[Member]] = defaultdict(list)
    served = {r: dra_key(inventory, r) for r in gpu_resources} if inventory is not None else {}
    for node in targets:
        offered = {r: node.allocatable.get(r, 0) for r in gpu_resources if node.allocatable.get(r, 0) > 0}
        selected: dict[str, str] = {}
        if inventory is not None:
            devices_here = inventory.offers(node.name)
            if devices_here:
                for r, selection in served.items():
                    if selection and r not in offered and selection in devices_here:
                        offered[r] = devices_here[selection][0]
                        selected[r] = selection
        shared = tuple(sorted((k, v) for k, v in node.labels.items() if k not in per_node))
        key = (node.labels[zone_label], shared, node.taints, tuple(sorted(offered)))
        grouped[key].append((node, freeze(offered), freeze(selected) if selected else _NO_SELECTION))
    return tuple((key, tuple(members)) for key, members in grouped.items())


def node_capacity(node: NodeInfo) -> Mapping[str, int]:
    """What a node offers pods beside its GPUs, as the scheduler compares requests (cpu, memory, extended)."""
    return freeze({**node.resources, **node.allocatable}) if node.resources else node.allocatable


def _slot(member: Member, used: Mapping[str, int] | None, offers: Offers, capacity: Mapping[str, int]) -> NodeSlot:
    node, offered, selected = member
    free: Mapping[str, int] = offered
    if used or selected:
        free = freeze({r: (offers or _NO_OFFERS).get(selected[r], (0, 0))[1] if r in selected
                       else max(n - (used or {}).get(r, 0), 0) for r, n in offered.items()})
    return NodeSlot(node.name, node.labels, free, offered, capacity)


def _node_class(group: Group, number: int, used: tuple[Mapping[str, int] | None, ...],
                offers: tuple[Offers, ...]) -> NodeClass:
    """The group's class with these held GPUs and DRA offers: the previous one if they are the same, else patched
    or built."""
    state = _CLASS_STATE.get((group,), lambda: [])
    last = state[0] if state else None  # NB: read once; another thread may replace it meanwhile
    (zone, shared, taints, offered_keys), members = group
    if last is not None:
        last_used, last_offers, last_slots, last_class = last
        if all(map(operator.is_, last_used, used)) and all(map(operator.is_, last_offers, offers)):
            return last_class
        slots = list(last_slots)
        changes = []
        for i in [i for i in range(len(members)) if last_used[i] is not used[i] or last_offers[i] is not offers[i]]:
            slots[i] = _slot(members[i], used[i], offers[i], last_slots[i].capacity)
            changes.append((last_slots[i], slots[i]))
        pool = last_class.pool.replaced(changes)
        totals = dict(last_class.free)
        for old, new in changes:  # every slot of a class offers the same resources (its key)
            for r, n in new.free.items():
                totals[r] += n - old.free[r]
        made = dataclasses.replace(last_class, nodes=pool.nodes, free=freeze(totals), pool=pool)
    else:
        slots = [_slot(member, held, offer, node_capacity(member[0]))
                 for member, held, offer in zip(members, used, offers, strict=True)]
        pool = Pool.of(slots, owner=f"{zone}#{number}")
        free: dict[str, int] = dict.fromkeys(offered_keys, 0)
        allocatable: dict[str, int] = dict.fromkeys(offered_keys, 0)
        for slot in pool.nodes:
            for r, n in slot.free.items():
                free[r] += n
            for r, n in (slot.allocatable or {}).items():
                allocatable[r] += n
        capacities = {tuple(sorted(s.capacity.items())): s.capacity for s in pool.nodes}
        made = NodeClass(zone, freeze(dict(shared)), taints, frozenset(offered_keys), pool.nodes, freeze(free), pool,
                         freeze(allocatable), tuple(capacities.values()))
    state[:] = [(used, offers, tuple(slots), made)]
    return made


# Per tuple of groups: where each node sits (group, position), and the held GPUs of every group's nodes as last
# read with the serial of the pod index read (models/pods.py). The next snapshot's pod index says which nodes'
# held GPUs changed since (`changes_since`): only those positions are read again, not every node.
_POSITIONS: IdentityMemo[Mapping[str, tuple[int, int]]] = IdentityMemo(16)
_HELD: IdentityMemo[list[tuple[int, tuple[tuple[Mapping[str, int] | None, ...], ...]]]] = IdentityMemo(16)


def _held_by_group(groups: tuple[Group, ...], index: PodIndex) -> tuple[tuple[Mapping[str, int] | None, ...], ...]:
    """Per group, the held GPUs of its nodes in the group's order (None: nothing held)."""
    box = _HELD.get((groups,), list)
    last = box[0] if box else None  # NB: read once; another thread may replace it meanwhile
    changes = index.changes_since(last[0]) if last is not None else None
    if last is not None and changes is not None:
        held = list(last[1])
        if changes.nodes:
            positions = _POSITIONS.get((groups,), lambda: {
                member[0].name: (g, i) for g, (_, members) in enumerate(groups) for i, member in enumerate(members)})
            patched: dict[int, list[Mapping[str, int] | None]] = {}
            for name in changes.nodes:
                at = positions.get(name)
                if at is not None:
                    patched.setdefault(at[0], list(held[at[0]]))[at[1]] = index.held.get(name)
            for g, values in patched.items():
                held[g] = tuple(values)
        made = tuple(held)
    else:
        made = tuple(tuple(index.held.get(member[0].name) for member in members) for _, members in groups)
    box[:] = [(index.serial, made)]
    return made


# Per group: its nodes' names where DRA serves a GPU resource, else None (what `DeviceInventory.offers` is read for).
_DRA_SERVED: IdentityMemo[tuple[str | None, ...]] = IdentityMemo(256)


def _dra_served(group: Group) -> tuple[str | None, ...]:
    return tuple(node.name if selected else None for node, _, selected in group[1])


def build_zone_index(snapshot: Snapshot, *, zone_label: str, gpu_resources: Sequence[str],
                     inventory: DeviceInventory | None = None) -> ZoneIndex:
    """Group the snapshot's placement targets into per-zone node classes (see the module docstring);
    `gpu_resources` are resolved names (`gpus.gpu_kinds`), `inventory` the DRA devices (`gpus.inventory_of`)."""
    zone_label, resources = canonical(zone_label), canonical(tuple(gpu_resources))
    targets, per_node = _targets(snapshot.nodes, zone_label)
    groups = _GROUPS.get((targets, per_node, resources, zone_label, inventory and inventory.published),
                         lambda: _group(targets, per_node, resources, zone_label, inventory))
    _CLASS_STATE.fit(len(groups))
    _DRA_SERVED.fit(len(groups))
    by_zone: dict[str, list[NodeClass]] = defaultdict(list)
    for number, (group, used) in enumerate(zip(groups, _held_by_group(groups, pod_index(snapshot)), strict=True)):
        names = _DRA_SERVED.get((group,), functools.partial(_dra_served, group))
        offers: tuple[Offers, ...] = (None,) * len(names)
        if inventory is not None and any(names):
            offers = tuple(None if name is None else inventory.offers(name) for name in names)
        by_zone[group[0][0]].append(_node_class(group, number, used, offers))
    classes = {z: tuple(sorted(cs, key=lambda c: c.nodes[0].name)) for z, cs in by_zone.items()}
    return ZoneIndex(zones=tuple(sorted(classes)), classes=freeze(classes), per_node_keys=per_node)


def zone_index(snapshot: Snapshot, *, zone_label: str, gpu_resources: Sequence[str],
               gpu_device_classes: Sequence[str] = DEFAULT_GPU_DEVICE_CLASSES) -> ZoneIndex:
    """The memoised `build_zone_index` for this snapshot and these settings (`gpuResources` resolved by
    `gpus.gpu_kinds`)."""
    inventory = inventory_of(snapshot, gpu_resources, gpu_device_classes)
    kinds = gpu_kinds(snapshot, gpu_resources, gpu_device_classes)
    memo_key = f"engine.zone-index/{zone_label}/{','.join(kinds)}/{','.join(gpu_device_classes)}"
    return snapshot.memo(memo_key, lambda s: build_zone_index(s, zone_label=zone_label, gpu_resources=kinds,
                                                              inventory=inventory))


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


@dataclass
class _Bin:
    """Nodes that packing cannot tell apart: the same room per resource, reachable by the same demands."""

    room: tuple[int, ...]  # GPUs left per resource (in the packing's resource order)
    members: frozenset[int]  # indices of the distinct pools these nodes belong to
    count: int  # how many such nodes


def _node_shape(slot: NodeSlot, basis: Basis) -> Shape:
    return slot.shape if basis == "free" else slot.total_shape


def _regions(pools: Sequence[Pool], basis: Basis) -> list[tuple[frozenset[int], Shape, int]]:
    """(pool indices, node shape, node count) for every set of nodes the distinct `pools` cover.

    Pools of different node classes (`owner`) share no node, so each is taken from its histogram of
    shapes. Several pools of one class (a whole class and a node-by-node subset, or two subsets) are
    split node by node: only selectors that read per-node keys make those, and they cost a pass over
    their class anyway.
    """
    by_owner: dict[str, list[int]] = defaultdict(list)
    for i, pool in enumerate(pools):
        by_owner[pool.owner].append(i)
    out: list[tuple[frozenset[int], Shape, int]] = []
    for indices in by_owner.values():
        if len(indices) == 1:
            i = indices[0]
            out += [(frozenset((i,)), shape, n) for shape, n in pools[i].shapes(basis)]
            continue
        membership: dict[str, tuple[set[int], Shape]] = {}
        for i in indices:
            for slot in pools[i].nodes:
                membership.setdefault(slot.name, (set(), _node_shape(slot, basis)))[0].add(i)
        counted: dict[tuple[frozenset[int], Shape], int] = defaultdict(int)
        for members, shape in membership.values():
            counted[(frozenset(members), shape)] += 1
        out += [(members, shape, n) for (members, shape), n in counted.items()]
    return out


def _per_node(room: tuple[int, ...], need: tuple[int, ...]) -> int:
    """How many pods asking `need` fit on a node with `room` left (f // g per resource, the least)."""
    return min(r // g for r, g in zip(room, need, strict=True) if g > 0)


def pack(demands: Sequence[PodDemand], *, basis: Basis = "free") -> str | None:
    """Best-fit-decreasing placement of every pod; None when all fit, else the first replica that did not.

    Pods are placed largest demand first, each onto the node with the least room that still fits it,
    which keeps whole nodes free for the large pods (most-free-first would fail 4+3+3 GPUs on nodes
    with 6 and 4 free). `basis="allocatable"` packs onto the nodes as if nothing ran on them (whether
    the job can ever fit), `"free"` onto what bound pods leave.

    Counted, never pod by pod: identical pods go to the tightest fitting node until it is full (which
    is what placing them one at a time does, since a node's room only shrinks), so a replica type of
    `count` pods is placed with one step per group of identical nodes it fills. The cost is bounded by
    replica types x node shapes, whatever the pod counts (a 10,000,000-pod replica packs in
    microseconds), and the outcome is the pod-by-pod one.
    """
    resources = tuple(sorted({r for d in demands for r, n in d.gpus.items() if n > 0}))
    pools: list[Pool] = []
    pool_index: dict[int, int] = {}
    for d in demands:
        for pool in d.pools:
            if id(pool) not in pool_index:
                pool_index[id(pool)] = len(pools)
                pools.append(pool)
    bins: dict[tuple[tuple[int, ...], frozenset[int]], _Bin] = {}

    def add(room: tuple[int, ...], members: frozenset[int], count: int) -> None:
        found = bins.get((room, members))
        if found is None:
            bins[(room, members)] = _Bin(room, members, count)
        else:
            found.count += count

    for members, shape, count in _regions(pools, basis):
        held = dict(shape)
        add(tuple(held.get(r, 0) for r in resources), members, count)
    for demand in sorted(demands, key=lambda d: (-d.per_pod, d.replica)):
        need = tuple(demand.gpus.get(r, 0) for r in resources)
        if demand.count <= 0 or not any(need):
            continue
        usable = frozenset(pool_index[id(p)] for p in demand.pools)
        left = demand.count
        while left > 0:
            fitting = [
                b
                for b in bins.values()
                if b.count and b.members & usable and all(r >= g for r, g in zip(b.room, need, strict=True))
            ]
            if not fitting:
                return demand.replica
            tightest = min(fitting, key=lambda b: (sum(b.room), b.room, sorted(b.members)))
            per_node = _per_node(tightest.room, need)
            nodes = min(tightest.count, -(-left // per_node))
            full, last = (nodes, 0) if nodes * per_node <= left else (nodes - 1, left - (nodes - 1) * per_node)
            tightest.count -= nodes
            if full:
                add(tuple(r - g * per_node for r, g in zip(tightest.room, need, strict=True)), tightest.members, full)
            if last:
                add(tuple(r - g * last for r, g in zip(tightest.room, need, strict=True)), tightest.members, 1)
            left -= full * per_node + last
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


def pack_memoized(snapshot: Snapshot, demands: Sequence[PodDemand], *, basis: Basis = "free") -> str | None:
    """`pack(demands, basis=basis)`, remembered per snapshot.

    `pack` reads only each demand's replica key, pod count, GPUs per pod (in order) and pools;
    pools come from the snapshot's zone index (or are built from its nodes) and never change.
    """
    key = (basis, *((d.replica, d.count, tuple(d.gpus.items()), tuple(id(p) for p in d.pools)) for d in demands))
    memo = pack_memo(snapshot)
    found = memo.entries.get(key)
    if found is not None:
        return found[0]
    result = pack(demands, basis=basis)
    with memo.lock:
        while len(memo.entries) >= PACK_MEMO_SIZE:
            del memo.entries[next(iter(memo.entries))]
        memo.entries[key] = (result, tuple(p for d in demands for p in d.pools))
    return result


def largest_free(pools: Iterable[Pool]) -> int:
    """The most GPUs free on any one node of these pools (each pool is most-free first)."""
    return max((pool.nodes[0].total_free for pool in pools if pool.nodes), default=0)
