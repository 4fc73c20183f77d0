"""DRA devices counted as the kube-scheduler counts them: per node, per selection (DeviceClass + CEL selectors).

PURE (no I/O). The rules mirror kube-scheduler's dynamicresources plugin and the structured allocator of
k8s.io/dynamic-resource-allocation (research/gpus-2026.md section 3):
- A ResourceSlice reaches a node by `nodeName`, `nodeSelector` (a NodeSelector over the node's labels and its
  name as `metadata.name`), `allNodes`, or per device (`perDeviceNodeSelection`); a slice that carries only
  `sharedCounters` belongs to its pool on every node.
- Slices group into pools by (driver, pool name); only the highest `pool.generation` counts, and a pool is
  complete when the slices the node sees, or all of that generation, are `resourceSliceCount` in number
  (dynamic-resource-allocation structured/internal/stable/pools_stable.go, GatherPools): an incomplete pool
  offers nothing.
- A device is usable when it is not tainted NoSchedule/NoExecute (DeviceTaints); it is free when, moreover, no
  claim's `status.allocation.devices.results` holds it (adminAccess results excluded; the scheduler's
  extended-resource claims are claims like any other, each device counted once) and its `consumesCounters` fit
  what the pool's counter sets have left after the allocated devices' consumption.
- A device belongs to a selection when every CEL selector of the class and of the request matches it
  (app/engine/cel.py). What cannot be evaluated (an expression that does not compile, an unknown function,
  an attribute of unknown type that a selector reads) makes that selection `unknown`, named.

A device reachable from several nodes (allNodes, a nodeSelector) is offered to each of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import Any

from app.config import Settings
from app.engine import cel
from app.engine.nodes import match_term
from app.models.cluster import IdentityMemo, NodeInfo, Snapshot, canonical
from app.models.dra import (
    COMPUTE_DOMAIN_CHANNEL_CLASS,
    COMPUTE_DOMAIN_LABEL,
    IMPLICIT_EXTENDED_RESOURCE_PREFIX,
    ComputeDomainInfo,
    Device,
    DeviceRequest,
    PodClaimRef,
    ResourceClaimInfo,
    ResourceClaimTemplateInfo,
    ResourceSliceInfo,
)

# fnmatch patterns over DeviceClass names: which classes hand out GPUs (settings `gpuDeviceClasses`). NVIDIA's
# gpu.nvidia.com, mig.nvidia.com and vfio.gpu.nvidia.com, AMD's gpu.amd.com; never NVIDIA's compute-domain
# channel and daemon classes.
GPU_DEVICE_CLASS_DEFAULTS: tuple[str, ...] = Settings.model_fields["gpu_device_classes"].default
BLOCKING_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
_EMPTY: Mapping[str, Any] = MappingProxyType({})

DeviceId = tuple[str, str, str]  # (driver, pool, device): a device's identity


def selection_key(device_class: str, selectors: Sequence[str] = ()) -> str:
    """`deviceclass.resource.kubernetes.io/<class>` (the class's implicit extended resource name, KEP-5004);
    with request selectors, a suffix that depends only on them (`#` and 12 hex digits of their digest)."""
    base = IMPLICIT_EXTENDED_RESOURCE_PREFIX + device_class
    if not selectors:
        return base
    return f"{base}#{hashlib.sha256(chr(0).join(selectors).encode()).hexdigest()[:12]}"


# A node's view of one pool: (driver, pool, the slices it sees).
PoolView = tuple[str, str, list["Seen"]]


@dataclass(frozen=True, eq=False)
class Published:
    """What the devices published decide, whatever is allocated: the selections and their unknowns, each node's
    views of its pools, and the pools each node sees. Kept while the slices, classes, nodes and selections are
    the same (`_published`), so that a claim allocated or released recounts only the nodes of its pool."""

    keys: tuple[tuple[str, tuple[str, ...]], ...]  # (selection key, its selectors' expressions), in match order
    matches: Callable[[ResourceSliceInfo], tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, str], ...]]]
    views: Mapping[str, tuple[PoolView, ...]]  # node -> the complete pools it sees
    pool_nodes: Mapping[tuple[str, str], tuple[str, ...]]  # (driver, pool) -> the nodes that see it
    unknown: Mapping[str, str]
    problems: tuple[str, ...]  # what could not be read from the slices
    offered: frozenset[str]  # the selection keys some node has a usable device of


@dataclass(frozen=True)
class DeviceInventory:
    """The devices of a snapshot, counted per node and selection key (see the module docstring)."""

    gpu_classes: frozenset[str]
    mapped: Mapping[str, str]  # extended resource name -> DeviceClass (extendedResourceName and implicit name)
    unknown: Mapping[str, str]  # selection key -> why its count cannot be evaluated
    # selection key -> its DeviceClass, and the request selectors it adds.
    key_classes: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    key_selectors: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    # What could not be read from the slices (a slice without a pool: its devices are not counted), named.
    problems: tuple[str, ...] = ()
    _offers: Mapping[str, Mapping[str, tuple[int, int]]] = field(default_factory=lambda: _EMPTY, repr=False)
    # The same object for inventories that differ only in what is allocated (the zone index groups nodes by it).
    published: Published | None = field(default=None, repr=False, compare=False)

    def key(self, device_class: str, selectors: tuple[str, ...] = ()) -> str:
        return selection_key(device_class, selectors)

    def offers(self, node_name: str) -> Mapping[str, tuple[int, int]]:
        """Per selection key: (usable published devices, free devices) reachable from the node (keys with no
        usable device left out)."""
        return self._offers.get(node_name, _EMPTY)

    def keys(self) -> frozenset[str]:
        """Every selection key: the GPU classes', and each (class, selectors) a claim or claim template in the
        snapshot requests of a GPU class."""
        return frozenset(self.key_classes)

    def offered_anywhere(self, key: str) -> bool:
        if self.published is not None:
            return key in self.published.offered
        return any(offer.get(key, (0, 0))[0] > 0 for offer in self._offers.values())

    def nodes(self) -> frozenset[str]:
        """The nodes some device is offered to."""
        return frozenset(self._offers)


# Inventories kept from one snapshot to the next while their inputs are the same objects (the watch cache reuses
# an unchanged kind's tuple); the per-slice matches while the slice and the selections are.
_INVENTORIES: IdentityMemo[DeviceInventory] = IdentityMemo(16)
_SLICE_MATCHES: IdentityMemo[tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, str], ...]]] = IdentityMemo(4096)
_ALLOCATED: IdentityMemo[frozenset[DeviceId]] = IdentityMemo(8)
# Per (slices, classes, nodes, settings): [(selections, what they publish)] as last built.
_PUBLISHED: IdentityMemo[list[tuple[dict[str, tuple[str, tuple[str, ...]]], Published]]] = IdentityMemo(8)
# Per Published: [(allocated devices, the offers counted with them)] as last built; the next allocation recounts
# only the nodes that see a pool whose allocated devices changed.
_OFFERS: IdentityMemo[list[tuple[frozenset[DeviceId], dict[str, Mapping[str, tuple[int, int]]]]]] = IdentityMemo(8)


def device_inventory(
    snapshot: Snapshot, *, gpu_device_classes: Sequence[str], gpu_resources: Sequence[str]
) -> DeviceInventory:
    """The snapshot's inventory, built once per snapshot (and per settings), reused across snapshots whose
    DRA objects and nodes did not change."""
    patterns = canonical(tuple(gpu_device_classes))
    resources = canonical(tuple(gpu_resources))

    def build(s: Snapshot) -> DeviceInventory:
        inputs = (s.resource_slices, s.resource_claims, s.device_classes, s.claim_templates, s.nodes,
                  patterns, resources)
        return _INVENTORIES.get(inputs, lambda: _build(s, patterns, resources))

    return snapshot.memo(f"devices:{patterns!r}:{resources!r}", build)


def _gpu_classes(snapshot: Snapshot, patterns: tuple[str, ...], resources: tuple[str, ...]) -> frozenset[str]:
    return frozenset(
        name for name, info in snapshot.device_classes.items()
        if any(fnmatchcase(name, p) for p in patterns)
        or (info.extended_resource_name and any(fnmatchcase(info.extended_resource_name, r) for r in resources))
    )


def _mapped(snapshot: Snapshot) -> dict[str, str]:
    """KEP-5004: extendedResourceName -> class (of two, the newer wins; then the later name), and every class's
    implicit name."""
    out: dict[str, str] = {}
    for info in sorted(snapshot.device_classes.values(), key=lambda c: (c.created, c.name)):
        out[IMPLICIT_EXTENDED_RESOURCE_PREFIX + info.name] = info.name
        if info.extended_resource_name:
            out[info.extended_resource_name] = info.name
    return out


def _requests_of(requests: Iterable[DeviceRequest]) -> Iterable[DeviceRequest]:
    for request in requests:
        yield from request.first_available or (request,)


def _selections(snapshot: Snapshot, gpu: frozenset[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """selection key -> (class, request selectors): every GPU class, and what claims and templates ask of one."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {selection_key(name): (name, ()) for name in sorted(gpu)}
    # NB: tens of thousands of claims on every publish under claim churn, nearly all without selectors or
    # firstAvailable: those cost one test each.
    owners: Iterable[ResourceClaimInfo | ResourceClaimTemplateInfo] = (
        *snapshot.resource_claims, *snapshot.claim_templates.values())
    for owner in owners:
        for request in owner.requests:
            if request.selectors or request.first_available:
                for one in _requests_of((request,)):
                    if one.device_class in gpu and one.selectors:
                        key = selection_key(one.device_class, one.selectors)
                        out.setdefault(key, (one.device_class, one.selectors))
    return out


class _Holders:
    """The allocated devices of a tuple of claims, with how many claims hold each, kept from one tuple to the next:
    the claims that came or went (found by identity, as the watch cache reuses unchanged ones) are added or taken
    away, not every claim read again."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.claims: dict[int, ResourceClaimInfo] = {}
        self.held: dict[DeviceId, int] = {}

    def of(self, claims: tuple[ResourceClaimInfo, ...]) -> frozenset[DeviceId]:
        with self.lock:
            now = dict(zip(map(id, claims), claims, strict=True))
            gone = self.claims.keys() - now.keys()
            came = now.keys() - self.claims.keys()
            if len(gone) + len(came) > len(now):  # mostly others: counted afresh
                self.held, gone, came = {}, set(), set(now)
            for claim_id, sign in ((c, -1) for c in gone):
                self._count(self.claims[claim_id], sign)
            for claim_id in came:
                self._count(now[claim_id], 1)
            self.claims = now
            return frozenset(self.held)

    def _count(self, claim: ResourceClaimInfo, sign: int) -> None:
        for r in claim.allocated:
            if not r.admin_access:
                device = (r.driver, r.pool, r.device)
                left = self.held.get(device, 0) + sign
                if left:
                    self.held[device] = left
                else:
                    del self.held[device]


_HOLDERS = _Holders()


def _allocated(claims: tuple[ResourceClaimInfo, ...]) -> frozenset[DeviceId]:
    return _ALLOCATED.get((claims,), lambda: _HOLDERS.of(claims))


def _build(snapshot: Snapshot, patterns: tuple[str, ...], resources: tuple[str, ...]) -> DeviceInventory:
    gpu = _gpu_classes(snapshot, patterns, resources)
    selections = _selections(snapshot, gpu)
    box = _PUBLISHED.get((snapshot.resource_slices, snapshot.device_classes, snapshot.nodes, patterns, resources),
                         list)
    last = box[0] if box else None  # NB: read once; another thread may replace it meanwhile
    if last is not None and last[0] == selections:
        published = last[1]
    else:
        published = _publish(snapshot, selections)
        box[:] = [(selections, published)]
    _SLICE_MATCHES.fit(len(snapshot.resource_slices))
    return DeviceInventory(
        gpu_classes=gpu,
        mapped=MappingProxyType(_mapped(snapshot)),
        unknown=published.unknown,
        key_classes=MappingProxyType({k: c for k, (c, _) in selections.items()}),
        key_selectors=MappingProxyType({k: s for k, (_, s) in selections.items()}),
        problems=published.problems,
        _offers=MappingProxyType(_offers(published, _allocated(snapshot.resource_claims))),
        published=published,
    )


def _publish(snapshot: Snapshot, selections: Mapping[str, tuple[str, tuple[str, ...]]]) -> Published:
    """The selections compiled, and every node's views of the complete pools it sees."""
    unknown: dict[str, str] = {}
    problems: list[str] = []
    spec: list[tuple[str, tuple[cel.Selector, ...]]] = []
    for key, (name, request_selectors) in selections.items():
        info = snapshot.device_classes[name]
        if info.problem:
            unknown[key] = f"DeviceClass {name}: {info.problem}"
        selectors = tuple(cel.compile_selector(e) for e in (*info.selectors, *request_selectors))
        for position, selector in enumerate(selectors):
            if selector.fault:
                owner = f"DeviceClass {name}" if position < len(info.selectors) else "a request's selector"
                unknown.setdefault(key, f"{owner}: {selector.fault}")
        spec.append((key, selectors))
    keys = canonical(tuple((k, tuple(s.expression for s in sels)) for k, sels in spec))
    compiled = tuple(sels for _, sels in spec)
    nodes_by_name = {n.name: n for n in snapshot.nodes}

    def matches(slice_: ResourceSliceInfo) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, str], ...]]:
        return _SLICE_MATCHES.get((slice_, keys), lambda: _match_slice(slice_, compiled))

    views: dict[str, list[PoolView]] = {}
    pool_nodes: dict[tuple[str, str], list[str]] = {}
    for (driver, pool), current in _pools(snapshot.resource_slices, problems).items():
        expected = max(s.slice_count for s in current)
        for node_name, view in _node_views(current, snapshot.nodes, nodes_by_name):
            if len(view) != expected and len(current) != expected:
                continue  # incomplete: the allocator allocates nothing from it (structured GatherPools)
            views.setdefault(node_name, []).append((driver, pool, view))
            pool_nodes.setdefault((driver, pool), []).append(node_name)
            for s, _ in view:
                for index, fault in matches(s)[1] if s.devices else ():
                    unknown.setdefault(keys[index][0], fault)
    published = Published(keys, matches, MappingProxyType({n: tuple(v) for n, v in views.items()}),
                          MappingProxyType({p: tuple(n) for p, n in pool_nodes.items()}),
                          MappingProxyType(unknown), tuple(problems), frozenset())
    offered = frozenset(k for by_key in _offers(published, frozenset()).values() for k in by_key)
    return dataclasses.replace(published, offered=offered)


def _offers(published: Published, allocated: frozenset[DeviceId]) -> dict[str, Mapping[str, tuple[int, int]]]:
    """node -> selection key -> (usable, free), for the keys with a usable device. After a count with other
    allocated devices on the same Published, only the nodes that see a pool whose allocations changed are counted
    again."""
    box = _OFFERS.get((published,), list)
    last = box[0] if box else None  # NB: read once; another thread may replace it meanwhile
    if last is not None and last[0] is allocated:
        return last[1]
    if last is None:
        recount: Iterable[str] = published.views
        offers: dict[str, Mapping[str, tuple[int, int]]] = {}
    else:
        pools = {(driver, pool) for driver, pool, _ in last[0] ^ allocated}
        recount = {n for p in pools for n in published.pool_nodes.get(p, ())}
        offers = dict(last[1])
    for node_name in recount:
        counted: dict[str, dict[str, list[int]]] = {}
        for driver, pool, view in published.views.get(node_name, ()):
            _count_view(driver, pool, node_name, view, published.matches, published.keys, allocated, counted)
        offers[node_name] = MappingProxyType({k: (u, f) for k, (u, f) in counted.get(node_name, {}).items() if u})
    box[:] = [(allocated, offers)]
    return offers


def _pools(slices: Iterable[ResourceSliceInfo], problems: list[str]) -> dict[tuple[str, str], list[ResourceSliceInfo]]:
    """(driver, pool) -> its slices of the highest generation; unreadable slices are named and left out."""
    grouped: dict[tuple[str, str], list[ResourceSliceInfo]] = {}
    for s in slices:
        if not s.pool or not s.driver or s.generation < 0 or s.slice_count <= 0:
            problems.append(f"ResourceSlice {s.name}: {s.problem or 'no driver'}; its devices are not counted")
            continue
        if s.problem:
            problems.append(f"ResourceSlice {s.name}: {s.problem}")
        grouped.setdefault((s.driver, s.pool), []).append(s)
    out = {}
    for key, group in grouped.items():
        top = max(s.generation for s in group)
        out[key] = [s for s in group if s.generation == top]
    return out


def _selector_matches(selector: Mapping[str, Any] | None, node: NodeInfo) -> bool:
    terms = selector.get("nodeSelectorTerms") if selector else None
    return isinstance(terms, list | tuple) and any(
        isinstance(t, Mapping) and match_term(t, node.labels, node.name) for t in terms)


Seen = tuple[ResourceSliceInfo, frozenset[int] | None]  # a slice, and which of its devices a node sees (None: all)


def _node_views(
    current: list[ResourceSliceInfo], nodes: tuple[NodeInfo, ...], by_name: Mapping[str, NodeInfo]
) -> Iterable[tuple[str, list[Seen]]]:
    """(node, the pool's slices that node sees), for every node that sees a slice with devices."""
    named: dict[str, list[Seen]] = {}
    counters_only: list[Seen] = []
    elsewhere = []
    for s in current:
        if s.node_name:
            named.setdefault(s.node_name, []).append((s, None))
        elif not s.devices and s.shared_counters:
            counters_only.append((s, None))
        elif s.all_nodes or s.node_selector is not None or s.per_device_node_selection:
            elsewhere.append(s)
    if not elsewhere:
        for node_name, view in named.items():
            yield node_name, view + counters_only
        return
    for node_name, view in named.items():
        if node_name not in by_name:  # a node the snapshot does not hold: only what names it reaches it
            yield node_name, view + counters_only
    for node in nodes:
        view = named.get(node.name, []) + counters_only
        for s in elsewhere:
            if s.per_device_node_selection:
                view.append((s, frozenset(i for i, d in enumerate(s.devices) if d.all_nodes or d.node_name == node.name
                                          or _selector_matches(d.node_selector, node))))
            elif s.all_nodes or _selector_matches(s.node_selector, node):
                view.append((s, None))
        if any(s.devices and (seen is None or seen) for s, seen in view):
            yield node.name, view


def _match_slice(
    slice_: ResourceSliceInfo, compiled: tuple[tuple[cel.Selector, ...], ...]
) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, str], ...]]:
    """Per selection (in `compiled`'s order): the positions of the slice's usable devices it selects; and the
    selections that cannot be evaluated on some device, with why."""
    per_key: list[list[int]] = [[] for _ in compiled]
    faults: dict[int, str] = {}
    driver = slice_.driver
    for position, device in enumerate(slice_.devices):
        if device.taints and any(t.effect in BLOCKING_TAINT_EFFECTS for t in device.taints):
            continue
        for index, selectors in enumerate(compiled):
            matched = True
            for selector in selectors:
                if selector.fault:
                    matched = False
                    break
                fault = _unreadable_read(selector, driver, device) if device.unreadable else ""
                if fault:
                    faults.setdefault(index, f"ResourceSlice {slice_.name} device {device.name}: {fault}")
                    matched = False
                    break
                outcome = _evaluate(selector, driver, device)
                if outcome.fault:
                    faults.setdefault(index, outcome.fault)
                if not outcome.matches:
                    matched = False
                    break
            if matched:
                per_key[index].append(position)
    return tuple(tuple(p) for p in per_key), tuple(sorted(faults.items()))


def _unreadable_read(selector: cel.Selector, driver: str, device: Device) -> str:
    for name in device.unreadable:
        domain, _, bare = name.rpartition("/")
        if selector.reads is None or ("attributes", domain or driver, bare) in selector.reads:
            return f"attribute {name} is of no known type, and {selector.expression!r} reads it"
    return ""


_RESULTS: dict[tuple[str, Any], cel.Outcome] = {}


def _evaluate(selector: cel.Selector, driver: str, device: Device) -> cel.Outcome:
    """One evaluation per distinct expression and distinct values it reads (cel.read_key)."""
    memo_key = (selector.expression, cel.read_key(selector, driver, device))
    found = _RESULTS.get(memo_key)
    if found is None:
        found = cel.evaluate(selector, cel.device_view(driver, device))
        if len(_RESULTS) > 100_000:
            _RESULTS.clear()
        _RESULTS[memo_key] = found
    return found


def _count_view(
    driver: str,
    pool: str,
    node_name: str,
    view: list[Seen],
    matches: Callable[[ResourceSliceInfo], tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, str], ...]]],
    keys: tuple[tuple[str, tuple[str, ...]], ...],
    allocated: frozenset[DeviceId],
    offers: dict[str, dict[str, list[int]]],
) -> None:
    """Add one node's view of one pool to `offers[node][key] = [usable, free]`."""
    left = _counters_left(driver, pool, [s for s, _ in view], allocated)
    by_key = offers.setdefault(node_name, {})
    for s, seen in view:
        if not s.devices:
            continue
        positions, _ = matches(s)
        for index, chosen in enumerate(positions):
            if not chosen:
                continue
            usable = free = 0
            for position in chosen:
                if seen is not None and position not in seen:
                    continue  # a device that does not select this node (perDeviceNodeSelection)
                device = s.devices[position]
                usable += 1
                if (driver, pool, device.name) not in allocated and (left is None or _fits(device, left)):
                    free += 1
            if usable:
                count = by_key.setdefault(keys[index][0], [0, 0])
                count[0] += usable
                count[1] += free


def _counters_left(
    driver: str, pool: str, view: list[ResourceSliceInfo], allocated: frozenset[DeviceId]
) -> dict[str, dict[str, int]] | None:
    """What each of the pool's counter sets has left after its allocated devices' consumption (None: the pool
    has no counters)."""
    left: dict[str, dict[str, int]] = {}
    for s in view:
        for name, counters in s.shared_counters.items():
            left[name] = dict(counters)
    if not left and not any(d.consumes_counters for s in view for d in s.devices):
        return None
    for s in view:
        for device in s.devices:
            if device.consumes_counters and (driver, pool, device.name) in allocated:  # few: partitionable only
                for use in device.consumes_counters:
                    have = left.setdefault(use.counter_set, {})
                    for counter, amount in use.counters.items():
                        have[counter] = have.get(counter, 0) - amount
    return left


def _fits(device: Device, left: Mapping[str, Mapping[str, int]]) -> bool:
    for use in device.consumes_counters:
        have = left.get(use.counter_set)
        if have is None or any(have.get(counter, 0) < amount for counter, amount in use.counters.items()):
            return False
    return True


# --- what a pod's claims ask for ---------------------------------------------------------------


@dataclass(frozen=True)
class SharedClaim:
    """A pod's named ResourceClaim (`resourceClaimName`): one claim for all the pods that name it."""

    name: str
    demand: Mapping[str, int]
    allocated: bool
    node_selector: Mapping[str, Any] | None
    all_mode: frozenset[str] = frozenset()  # keys it requests with allocationMode All


@dataclass(frozen=True)
class ClaimDemand:
    per_pod: Mapping[str, int]
    all_mode: frozenset[str]
    shared: tuple[SharedClaim, ...]
    compute_domain: str
    compute_domain_uid: str
    problems: tuple[str, ...]


@dataclass
class _Demand:
    counts: dict[str, int] = field(default_factory=dict)
    all_mode: set[str] = field(default_factory=set)
    channel: bool = False  # a request of the ComputeDomain channel class


def _add_requests(
    snapshot: Snapshot, inventory: DeviceInventory, requests: Iterable[DeviceRequest], owner: str,
    demand: _Demand, problems: list[str],
) -> None:
    for request in requests:
        if request.first_available:
            request = _first_available(snapshot, inventory, request.first_available)
        if request.admin_access:
            continue  # admin access takes no device from others (the scheduler does not count it)
        name = request.device_class
        if name == COMPUTE_DOMAIN_CHANNEL_CLASS:
            demand.channel = True
        if name not in snapshot.device_classes:
            problems.append(f"{owner}: request {request.name} names DeviceClass {name or '(none)'}, which does not "
                            "exist")
            continue
        if name not in inventory.gpu_classes:
            continue
        key = selection_key(name, request.selectors)
        if request.allocation_mode == "All":
            demand.all_mode.add(key)
        else:
            demand.counts[key] = demand.counts.get(key, 0) + request.count


def _first_available(snapshot: Snapshot, inventory: DeviceInventory,
                     subrequests: tuple[DeviceRequest, ...]) -> DeviceRequest:
    """The subrequest the allocator would try to satisfy first with success: the first whose GPU selection is
    offered anywhere, or that is of a class other than a GPU's (which this counter does not count), else the
    first."""
    for sub in subrequests:
        if sub.device_class in inventory.gpu_classes:
            if inventory.offered_anywhere(selection_key(sub.device_class, sub.selectors)):
                return sub
        elif sub.device_class in snapshot.device_classes:
            return sub
    return subrequests[0]


def _domain_by_template(snapshot: Snapshot, namespace: str, template: str) -> ComputeDomainInfo | None:
    for domain in snapshot.compute_domains:
        if domain.namespace == namespace and domain.claim_template == template:
            return domain
    return None


def claim_demand(
    snapshot: Snapshot, inventory: DeviceInventory, namespace: str, claims: Sequence[PodClaimRef]
) -> ClaimDemand:
    """What one pod's `spec.resourceClaims` ask for, in selection keys of GPU classes (see ClaimDemand)."""
    per_pod = _Demand()
    shared: list[SharedClaim] = []
    problems: list[str] = []
    domain, domain_uid = "", ""
    by_name = snapshot.memo("devices.claims-by-name", lambda s: {(c.namespace, c.name): c for c in s.resource_claims}
                            ) if any(c.claim for c in claims) else {}
    for ref in claims:
        if ref.template:
            template = snapshot.claim_templates.get((namespace, ref.template))
            cd = _domain_by_template(snapshot, namespace, ref.template)
            label = template.labels.get(COMPUTE_DOMAIN_LABEL, "") if template else ""
            if label and cd is None:
                cd = next((d for d in snapshot.compute_domains if d.uid == label), None)
            before = per_pod.channel
            if template is None:
                if cd is None:
                    problems.append(f"ResourceClaimTemplate {namespace}/{ref.template} (claim {ref.name}) does not "
                                    "exist")
            else:
                if template.problem:
                    problems.append(f"ResourceClaimTemplate {namespace}/{ref.template}: {template.problem}")
                _add_requests(snapshot, inventory, template.requests,
                              f"ResourceClaimTemplate {namespace}/{ref.template}", per_pod, problems)
            if cd is not None or label or per_pod.channel != before:
                domain = domain or (f"{cd.namespace}/{cd.name}" if cd else f"{namespace}/{ref.template}")
                domain_uid = domain_uid or (cd.uid if cd else label)
        elif ref.claim:
            claim = by_name.get((namespace, ref.claim))
            if claim is None:
                problems.append(f"ResourceClaim {namespace}/{ref.claim} (claim {ref.name}) does not exist")
                continue
            if claim.problem:
                problems.append(f"ResourceClaim {namespace}/{ref.claim}: {claim.problem}")
            one = _Demand()
            _add_requests(snapshot, inventory, claim.requests, f"ResourceClaim {namespace}/{ref.claim}", one,
                          problems)
            if one.channel:
                cd = next((d for d in snapshot.compute_domains if d.uid == claim.labels.get(COMPUTE_DOMAIN_LABEL)),
                          None)
                domain = domain or (f"{cd.namespace}/{cd.name}" if cd else f"{namespace}/{ref.claim}")
                domain_uid = domain_uid or (cd.uid if cd else claim.labels.get(COMPUTE_DOMAIN_LABEL, ""))
            shared.append(SharedClaim(name=ref.claim, demand=MappingProxyType(one.counts),
                                      allocated=bool(claim.allocated), node_selector=claim.allocation_node_selector,
                                      all_mode=frozenset(one.all_mode)))
        else:
            problems.append(f"resourceClaims entry {ref.name} names neither a ResourceClaimTemplate nor a "
                            "ResourceClaim")
    return ClaimDemand(
        per_pod=MappingProxyType(per_pod.counts),
        all_mode=frozenset(per_pod.all_mode),
        shared=tuple(shared),
        compute_domain=domain,
        compute_domain_uid=domain_uid,
        problems=tuple(problems),
    )
