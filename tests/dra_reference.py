"""A from-scratch reference for app/engine/devices.py: the scheduler's DRA counting rules as one plain loop per
node, selection and device, with no indexes, memos or CEL (the worlds it is run on select devices by driver and
attributes, which it compares directly). Slow and obviously right, for the property tests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.models.cluster import NodeInfo
from app.models.dra import (
    IMPLICIT_EXTENDED_RESOURCE_PREFIX,
    Device,
    DeviceClassInfo,
    ResourceClaimInfo,
    ResourceSliceInfo,
)


@dataclass(frozen=True)
class Selection:
    """A selection the way the world generator wrote it: devices of `driver` whose attributes hold `wanted`."""

    key: str
    driver: str
    wanted: tuple[tuple[str, str], ...]


def _term_matches(term: Mapping[str, Any], node: NodeInfo) -> bool:
    for requirement in term.get("matchExpressions", []):
        if requirement["operator"] == "In" and node.labels.get(requirement["key"]) not in requirement["values"]:
            return False
    for requirement in term.get("matchFields", []):
        if requirement["operator"] == "In" and node.name not in requirement["values"]:
            return False
    return bool(term.get("matchExpressions") or term.get("matchFields"))


def _selects(selector: Mapping[str, Any] | None, node: NodeInfo) -> bool:
    return selector is not None and any(_term_matches(t, node) for t in selector.get("nodeSelectorTerms", []))


def _slice_reaches(s: ResourceSliceInfo, node: NodeInfo, known: bool) -> bool:
    if s.node_name:
        return s.node_name == node.name
    if not s.devices and s.shared_counters:
        return True  # a counters-only slice belongs to its pool everywhere
    # A node only slices name (not in the snapshot) is reached by nothing else.
    return known and (s.all_nodes or s.per_device_node_selection or _selects(s.node_selector, node))


def _device_reaches(s: ResourceSliceInfo, d: Device, node: NodeInfo) -> bool:
    if not s.per_device_node_selection:
        return True
    return d.all_nodes or d.node_name == node.name or _selects(d.node_selector, node)


def _matches(selection: Selection, driver: str, device: Device) -> bool:
    return driver == selection.driver and all(device.attributes.get(k) == v for k, v in selection.wanted)


def reference_offers(
    nodes: tuple[NodeInfo, ...],
    slices: tuple[ResourceSliceInfo, ...],
    claims: tuple[ResourceClaimInfo, ...],
    selections: tuple[Selection, ...],
) -> dict[str, dict[str, tuple[int, int]]]:
    allocated = set()
    for claim in claims:
        for result in claim.allocated:
            if not result.admin_access:
                allocated.add((result.driver, result.pool, result.device))
    everyone = list(nodes)
    for s in slices:
        if s.node_name and all(n.name != s.node_name for n in everyone):
            everyone.append(NodeInfo(s.node_name, {}, (), {}, False, False))
    valid = [s for s in slices if s.pool and s.driver and s.generation >= 0 and s.slice_count > 0]
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for node in everyone:
        for selection in selections:
            usable = free = 0
            for pool in {(s.driver, s.pool) for s in valid}:
                members = [s for s in valid if (s.driver, s.pool) == pool]
                top = max(s.generation for s in members)
                current = [s for s in members if s.generation == top]
                seen = [s for s in current if _slice_reaches(s, node, node in nodes)]
                expected = max(s.slice_count for s in current)
                if len(seen) != expected and len(current) != expected:
                    continue  # incomplete
                left: dict[str, dict[str, int]] = {}
                for s in seen:
                    for name, counters in s.shared_counters.items():
                        left[name] = dict(counters)
                for s in seen:
                    for d in s.devices:
                        if (s.driver, s.pool, d.name) in allocated:
                            for use in d.consumes_counters:
                                for counter, amount in use.counters.items():
                                    left.setdefault(use.counter_set, {})
                                    left[use.counter_set][counter] = left[use.counter_set].get(counter, 0) - amount
                for s in seen:
                    for d in s.devices:
                        if not _device_reaches(s, d, node):
                            continue
                        if any(t.effect in ("NoSchedule", "NoExecute") for t in d.taints):
                            continue
                        if not _matches(selection, s.driver, d):
                            continue
                        usable += 1
                        fits = all(
                            use.counter_set in left and all(left[use.counter_set].get(c, 0) >= a
                                                            for c, a in use.counters.items())
                            for use in d.consumes_counters)
                        if (s.driver, s.pool, d.name) not in allocated and fits:
                            free += 1
            if usable:
                out.setdefault(node.name, {})[selection.key] = (usable, free)
    return out


def reference_mapped(classes: Mapping[str, DeviceClassInfo]) -> dict[str, str]:
    out = {IMPLICIT_EXTENDED_RESOURCE_PREFIX + name: name for name in classes}
    for info in classes.values():
        if not info.extended_resource_name:
            continue
        rivals = [c for c in classes.values() if c.extended_resource_name == info.extended_resource_name]
        newest = max(rivals, key=lambda c: (c.created, c.name))
        out[info.extended_resource_name] = newest.name
    return out
