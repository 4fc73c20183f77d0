"""Where each replica of a group can run, zone by zone: GPU anchors, pool taints, user pins.

PURE. For one zone:

- A GPU replica can use the zone's nodes that offer its GPU resources, match its own nodeSelector
  and required node affinity, and carry only taints it tolerates. These nodes anchor the zone.
- The zone's GPU-pool taints are the blocking taints of those anchor nodes (never the node
  lifecycle controller's `node.kubernetes.io/*`). A CPU-only replica (the coordinator, a
  parameter server) may use any matching node of the zone whose remaining taints are GPU-pool
  taints: topoguard adds those tolerations (the seed lab's coordinator needs `gpu=present`). In
  strict mode (validate: the job as written) nothing is added.
- A replica that cannot use any node of the zone gets a problem naming why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.engine import nodes
from app.engine.capacity import NodeClass, Pool, ZoneIndex
from app.models.cluster import Taint
from app.models.job import JobGroup, Replica, UserPlacement
from app.models.resources import is_extended


@dataclass(frozen=True)
class ReplicaFit:
    """One replica type in one zone."""

    replica: str
    pools: tuple[Pool, ...]  # usable nodes (GPU replicas: the GPU nodes), one pool per class
    classes: tuple[NodeClass, ...]  # the node classes those lists come from
    add_tolerations: tuple[Taint, ...]  # GPU-pool taints it does not tolerate yet (sorted)
    problem: str  # "" when it can run in the zone

    @property
    def can_run(self) -> bool:
        return not self.problem


@dataclass(frozen=True)
class ZoneFit:
    """Every replica type of a group in one zone."""

    zone: str
    anchored: bool  # every GPU replica has a usable GPU node here (always True for a CPU-only group)
    replicas: Mapping[str, ReplicaFit]
    pool_taints: tuple[Taint, ...]
    gpu_nodes: int  # distinct nodes any GPU replica can use
    gpus_free: int  # free GPUs (of the kinds the group asks for) on those nodes
    gpus_allocatable: int = 0  # the same nodes' allocatable GPUs, as if nothing ran on them

    @property
    def problems(self) -> tuple[str, ...]:
        return tuple(sorted(f.problem for f in self.replicas.values() if f.problem))


def describe_placement(placement: UserPlacement) -> str:
    """The user's own node constraints in a few words, for messages."""
    parts = []
    if placement.node_selector:
        parts.append("nodeSelector " + ", ".join(f"{k}={v}" for k, v in sorted(placement.node_selector.items())))
    if placement.node_selector_terms:
        parts.append("required node affinity")
    return " and ".join(parts) or "no node constraints"


def is_pinned(placement: UserPlacement, zone_label: str) -> bool:
    """Whether the user's own selectors name the zone label."""
    return zone_label in nodes.selector_label_keys(placement)


def _match_class(placement: UserPlacement, cls: NodeClass, per_node_keys: frozenset[str]) -> Pool | None:
    """The class's nodes the placement admits: the whole class, a node-by-node subset, or None."""
    if nodes.selects_by_name(placement) or nodes.selector_label_keys(placement) & per_node_keys:
        picked = [n for n in cls.nodes if nodes.match_placement(placement, n.labels, n.name)]
        return Pool.of(picked, owner=cls.pool.owner) if picked else None
    return cls.pool if nodes.match_placement(placement, cls.labels, "") else None


def _matching(placement: UserPlacement, classes: Sequence[NodeClass], index: ZoneIndex) -> list[tuple[NodeClass, Pool]]:
    out = []
    for cls in classes:
        pool = _match_class(placement, cls, index.per_node_keys)
        if pool is not None:
            out.append((cls, pool))
    return out


def _offers(cls: NodeClass, replica: Replica) -> bool:
    return all(r in cls.gpu_resources for r, n in replica.gpus.items() if n > 0)


def resource_need(replica: Replica) -> Mapping[str, int]:
    """What each pod of the replica asks for beside its GPUs (which packing counts)."""
    return {r: n for r, n in replica.requests.items() if r not in replica.gpus}


def fits_resources(need: Mapping[str, int], capacity: Mapping[str, int]) -> bool:
    """Whether a node offering `capacity` passes the scheduler's NodeResourcesFit for a pod asking `need` (at
    allocatable). A cpu/memory/ephemeral-storage figure the node does not report is not judged; an extended
    resource it lacks it has none of."""
    for resource, amount in need.items():
        have = capacity.get(resource)
        if have is None:
            if is_extended(resource):
                return False
            continue
        if have < amount:
            return False
    return True


def _sized(need: Mapping[str, int], matched: Sequence[tuple[NodeClass, Pool]]) -> list[tuple[NodeClass, Pool]]:
    """The matched nodes big enough for a pod asking `need`: whole classes where every node is (the usual
    case, decided on the class's few distinct capacities), else the nodes that are, one by one."""
    if not need:
        return list(matched)
    out = []
    for cls, pool in matched:
        fitting = sum(1 for c in cls.capacities if fits_resources(need, c))
        if fitting == len(cls.capacities):
            out.append((cls, pool))
        elif fitting:
            picked = [n for n in pool.nodes if fits_resources(need, n.capacity)]
            if picked:
                out.append((cls, Pool.of(picked, owner=cls.pool.owner)))
    return out


def format_amount(resource: str, amount: int) -> str:
    """`cpu 500m`, `cpu 4`, `memory 2Gi`, `example.com/fpga 1` (the scheduler's units back to quantities)."""
    if resource == "cpu":
        return f"cpu {amount // 1000}" if amount % 1000 == 0 else f"cpu {amount}m"
    if is_extended(resource) or resource == "pods":
        return f"{resource} {amount}"
    for suffix, scale in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if amount >= scale and amount % scale == 0:
            return f"{resource} {amount // scale}{suffix}"
    return f"{resource} {amount}"


def _too_small(replica: Replica, need: Mapping[str, int], matched: Sequence[tuple[NodeClass, Pool]]) -> ReplicaFit:
    """The failure of a replica whose pods no matched node can hold: what it asks and the most any node has."""
    short = []
    for resource, amount in sorted(need.items()):
        best = max((c.get(resource, 0) for cls, _ in matched for c in cls.capacities), default=0)
        if best < amount:
            short.append(f"{format_amount(resource, amount)} (the largest node has {format_amount(resource, best)})")
    if not short:  # each resource fits some node, but no node fits them all
        short = [", ".join(format_amount(r, n) for r, n in sorted(need.items())) + " together"]
    return _failed(replica, "no node it may use offers " + "; ".join(short))


def _failed(replica: Replica, why: str) -> ReplicaFit:
    return ReplicaFit(replica.key, (), (), (), f"{replica.key} cannot run here: {why}")


def _blocking(
    matched: Sequence[tuple[NodeClass, Pool]],
    replica: Replica,
    granted: frozenset[Taint] = frozenset(),
    tolerations: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """The taints that keep `replica` off the matched nodes, beyond those topoguard would tolerate."""
    taints = {
        nodes.format_taint(t)
        for c, _ in matched
        for t in nodes.untolerated(c.taints, replica.placement.tolerations if tolerations is None else tolerations)
        if t not in granted
    }
    return ", ".join(sorted(taints))


# NB: what the apiserver's ExtendedResourceToleration admission plugin adds to a pod that requests
# an extended resource (plugin/pkg/admission/extendedresourcetoleration, kubernetes/kubernetes#55839):
# "when enabled, automatically adds a toleration with key <resource>, operator Exists and effect
# NoSchedule". It is not in the kube-apiserver's default-enabled plugins, hence the default `false`
# (config.extended_resource_toleration); GKE enables it, so GKE users set it.
def implied_tolerations(replica: Replica) -> tuple[Mapping[str, Any], ...]:
    """The tolerations the plugin gives every pod of `replica` (one per GPU resource it requests)."""
    return tuple(
        {"key": r, "operator": "Exists", "effect": "NoSchedule"} for r, n in sorted(replica.gpus.items()) if n > 0
    )


EXTENDED_RESOURCE_HINT = (
    "; if the apiserver adds that toleration itself (ExtendedResourceToleration admission plugin, "
    "as on GKE), set extendedResourceToleration: true in the topoguard config"
)


def _gpu_fit(
    replica: Replica, classes: Sequence[NodeClass], index: ZoneIndex, *, extended_resource_toleration: bool = False
) -> ReplicaFit:
    offering = [c for c in classes if _offers(c, replica)]
    resources = "+".join(sorted(r for r, n in replica.gpus.items() if n > 0))
    if not offering:
        return _failed(replica, f"no Ready, schedulable {resources} node")
    matched = _matching(replica.placement, offering, index)
    if not matched:
        count = sum(len(c.nodes) for c in offering)
        return _failed(
            replica, f"its {describe_placement(replica.placement)} matches none of the {count} {resources} node(s)"
        )
    tolerations = tuple(replica.placement.tolerations)
    if extended_resource_toleration:
        tolerations += implied_tolerations(replica)
    usable = [(c, slots) for c, slots in matched if not nodes.untolerated(c.taints, tolerations)]
    if not usable:
        blocking = _blocking(matched, replica, tolerations=tolerations)
        gpu_taint = not extended_resource_toleration and any(
            t.key in replica.gpus and t.effect == "NoSchedule"
            for c, _ in matched
            for t in nodes.untolerated(c.taints, tolerations)
        )
        hint = EXTENDED_RESOURCE_HINT if gpu_taint else ""
        return _failed(replica, f"it does not tolerate taint {blocking} of the {resources} nodes{hint}")
    need = resource_need(replica)
    sized = _sized(need, usable)
    if not sized:
        return _too_small(replica, need, usable)
    return ReplicaFit(replica.key, tuple(s for _, s in sized), tuple(c for c, _ in sized), (), "")


def _cpu_fit(
    replica: Replica, classes: Sequence[NodeClass], index: ZoneIndex, pool_taints: frozenset[Taint]
) -> ReplicaFit:
    matched = _matching(replica.placement, classes, index)
    if not matched:
        return _failed(replica, f"its {describe_placement(replica.placement)} matches no node")
    usable = [
        (c, slots)
        for c, slots in matched
        if all(t in pool_taints for t in nodes.untolerated(c.taints, replica.placement.tolerations))
    ]
    if not usable:
        return _failed(
            replica, f"it does not tolerate taint {_blocking(matched, replica, pool_taints)} of the nodes it selects"
        )
    need = resource_need(replica)
    sized = _sized(need, usable)
    if not sized:
        return _too_small(replica, need, usable)
    # Tolerate every GPU-pool taint the replica lacks, so it can share the GPU nodes (the lab's fix).
    add = tuple(sorted(nodes.untolerated(pool_taints, replica.placement.tolerations), key=taint_order))
    return ReplicaFit(replica.key, tuple(s for _, s in sized), tuple(c for c, _ in sized), add, "")


def taint_order(taint: Taint) -> tuple[str, str, str]:
    return (taint.key, taint.value, taint.effect)


def fit_zone(
    group: JobGroup, index: ZoneIndex, zone: str, *, strict: bool, extended_resource_toleration: bool = False
) -> ZoneFit:
    """How every replica type of `group` fits `zone` (strict: tolerations exactly as written, plus
    those the apiserver adds to GPU pods when `extended_resource_toleration`)."""
    classes = index.classes_in(zone)
    gpu_replicas = [r for r in group.replicas if r.gpus_per_pod > 0]
    fits: dict[str, ReplicaFit] = {
        r.key: _gpu_fit(r, classes, index, extended_resource_toleration=extended_resource_toleration)
        for r in gpu_replicas
    }
    anchors = [f for f in fits.values() if f.can_run]
    pool_taints: frozenset[Taint] = frozenset()
    if not strict:
        pool_taints = frozenset(
            t
            for cls in {id(c): c for f in anchors for c in f.classes}.values()
            for t in cls.taints
            if t.effect in nodes.BLOCKING_EFFECTS and not nodes.is_system_taint(t)
        )
    for replica in group.replicas:
        if replica.gpus_per_pod == 0:
            fits[replica.key] = _cpu_fit(replica, classes, index, pool_taints)
    gpu_keys = frozenset(r for rep in gpu_replicas for r, n in rep.gpus.items() if n > 0)
    return ZoneFit(
        zone=zone,
        anchored=len(anchors) == len(gpu_replicas),
        replicas=fits,
        pool_taints=tuple(sorted(pool_taints, key=taint_order)),
        **_anchor_totals(anchors, gpu_keys),
    )


def _anchor_totals(anchors: Sequence[ReplicaFit], gpu_keys: frozenset[str]) -> dict[str, int]:
    """GPU nodes, free and allocatable GPUs on the union of the anchor pools, per class where a pool is a whole class.

    NB: summing whole classes from their precomputed totals keeps this independent of the node count;
    only a selector that reads a per-node key (hostname, node name) costs a pass over its class.
    """
    picked: dict[int, tuple[NodeClass, set[str] | None]] = {}  # None: the whole class
    for fit in anchors:
        for cls, pool in zip(fit.classes, fit.pools, strict=True):
            seen = picked.get(id(cls), (cls, set()))[1]
            if pool is cls.pool or seen is None:
                picked[id(cls)] = (cls, None)
            else:
                picked[id(cls)] = (cls, seen | {n.name for n in pool.nodes})
    nodes_count = free = allocatable = 0
    for cls, names in picked.values():
        if names is None:
            nodes_count += len(cls.nodes)
            free += cls.gpus_free(gpu_keys)
            allocatable += cls.gpus_allocatable(gpu_keys)
        else:
            nodes_count += len(names)
            for n in cls.nodes:
                if n.name in names:
                    free += sum(n.free.get(r, 0) for r in gpu_keys)
                    allocatable += sum((n.allocatable or n.free).get(r, 0) for r in gpu_keys)
    return {"gpu_nodes": nodes_count, "gpus_free": free, "gpus_allocatable": allocatable}


def replica_zones(fits: Sequence[ZoneFit]) -> dict[str, tuple[str, ...]]:
    """Per replica key, the zones (in `fits` order) where it can run."""
    out: dict[str, list[str]] = {}
    for fit in fits:
        for key, rf in fit.replicas.items():
            out.setdefault(key, [])
            if rf.can_run:
                out[key].append(fit.zone)
    return {k: tuple(v) for k, v in out.items()}


def describe_conflict(group: JobGroup, zones_of: Mapping[str, Sequence[str]], zone_label: str) -> str:
    """ "Master is pinned to zone-b, Worker can only run in zone-a" for replicas that share no zone."""
    parts = []
    for replica in group.replicas:
        where = zones_of.get(replica.key, ())
        if not where:
            parts.append(f"{replica.key} cannot run in any zone")
        elif is_pinned(replica.placement, zone_label):
            parts.append(f"{replica.key} is pinned to {', '.join(where)}")
        else:
            parts.append(f"{replica.key} can only run in {', '.join(where)}")
    return "the replicas share no zone: " + ", ".join(parts)
