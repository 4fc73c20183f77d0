"""The device counter against a from-scratch reference (tests/dra_reference.py) over generated slice and claim
worlds: pool generations, incomplete pools, every node selection, taints, shared counters, allocations with and
without adminAccess (and the scheduler's extended-resource claims), mapped extended resources, shared claims."""

from __future__ import annotations

import dataclasses
import threading
from types import MappingProxyType
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine import devices
from app.models.cluster import NodeInfo, Snapshot
from app.models.dra import (
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    AllocatedDevice,
    CounterUse,
    Device,
    DeviceClassInfo,
    DeviceRequest,
    DeviceTaint,
    PodClaimRef,
    ResourceClaimInfo,
    ResourceClaimTemplateInfo,
    ResourceSliceInfo,
)
from tests.dra_reference import Selection, reference_mapped, reference_offers

DRIVERS = ("gpu.example.com", "nic.example.com")
NODES = ("n1", "n2", "n3")
DEVICE_NAMES = tuple(f"d{i}" for i in range(4))
POOLS = ("p1", "p2")
# (class, driver, wanted attributes): what each generated DeviceClass selects, and its CEL expression.
CLASSES = (
    ("gpu.example.com", "gpu.example.com", (("type", "gpu"),)),
    ("part.gpu.example.com", "gpu.example.com", (("type", "part"),)),
    ("nic.example.com", "nic.example.com", ()),
)
MODEL_SELECTOR = "device.attributes['gpu.example.com'].model == 'm1'"


def cel_of(driver: str, wanted: tuple[tuple[str, str], ...]) -> str:
    parts = [f"device.driver == '{driver}'", *(f"device.attributes['{driver}'].{k} == '{v}'" for k, v in wanted)]
    return " && ".join(parts)


ZONE_SELECTOR = MappingProxyType({"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]})
NAME_SELECTOR = MappingProxyType({"nodeSelectorTerms": [
    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]})


@st.composite
def device(draw: Any, per_device: bool) -> Device:
    attributes = {"type": draw(st.sampled_from(["gpu", "part", "nic"]))}
    if draw(st.booleans()):
        attributes["model"] = draw(st.sampled_from(["m1", "m2"]))
    effect = draw(st.sampled_from(["", "", "NoSchedule", "NoExecute", "None"]))
    uses = ()
    if draw(st.integers(0, 3)) == 0:
        uses = (CounterUse(draw(st.sampled_from(["cs", "cs", "missing"])),
                           MappingProxyType({"memory": draw(st.integers(1, 4))})),)
    where: dict[str, Any] = {}
    if per_device:
        where = draw(st.sampled_from([{"node_name": "n1"}, {"node_name": "n3"}, {"all_nodes": True},
                                      {"node_selector": ZONE_SELECTOR}, {}]))
    return Device(name=draw(st.sampled_from(DEVICE_NAMES)), attributes=MappingProxyType(attributes),
                  taints=(DeviceTaint("k", "v", effect),) if effect else (), consumes_counters=uses, **where)


@st.composite
def resource_slice(draw: Any, index: int) -> ResourceSliceInfo:
    how = draw(st.sampled_from(["node", "node", "node", "unknown-node", "all", "zone", "name", "per-device",
                                "counters"]))
    placement: dict[str, Any] = {
        "node": {"node_name": draw(st.sampled_from(NODES))}, "unknown-node": {"node_name": "gone"},
        "all": {"all_nodes": True}, "zone": {"node_selector": ZONE_SELECTOR},
        "name": {"node_selector": NAME_SELECTOR}, "per-device": {"per_device_node_selection": True},
        "counters": {"node_name": draw(st.sampled_from(NODES))} if draw(st.booleans()) else {},
    }[how]
    found = () if how == "counters" else tuple(
        draw(st.lists(device(how == "per-device"), max_size=4, unique_by=lambda d: d.name)))
    counters = MappingProxyType({"cs": MappingProxyType({"memory": draw(st.integers(0, 6))})}) \
        if how == "counters" or draw(st.integers(0, 4)) == 0 else MappingProxyType({})
    return ResourceSliceInfo(
        name=f"s{index}", driver=draw(st.sampled_from(DRIVERS)), pool=draw(st.sampled_from([*POOLS, ""])),
        generation=draw(st.sampled_from([0, 1, 1, 2, -1])), slice_count=draw(st.sampled_from([1, 1, 1, 2, 0])),
        devices=found, shared_counters=counters, **placement)


@st.composite
def claim(draw: Any, index: int) -> ResourceClaimInfo:
    results = tuple(
        AllocatedDevice("r", draw(st.sampled_from(DRIVERS)), draw(st.sampled_from(POOLS)),
                        draw(st.sampled_from(DEVICE_NAMES)), admin_access=draw(st.booleans()))
        for _ in range(draw(st.integers(0, 3))))
    annotations = {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"} if draw(st.booleans()) else {}
    requests = (DeviceRequest("r", device_class=draw(st.sampled_from([c for c, _, _ in CLASSES])),
                              count=draw(st.integers(1, 3)), admin_access=draw(st.booleans()),
                              allocation_mode=draw(st.sampled_from(["ExactCount", "ExactCount", "All"]))),)
    return ResourceClaimInfo(namespace="ns", name=f"c{index}", annotations=MappingProxyType(annotations),
                             requests=requests, allocated=results)


@st.composite
def world(draw: Any) -> Snapshot:
    nodes = tuple(NodeInfo(name, MappingProxyType({"zone": draw(st.sampled_from("ab"))}), (), MappingProxyType({}),
                           True, False) for name in NODES[: draw(st.integers(1, 3))])
    slices = tuple(draw(resource_slice(i)) for i in range(draw(st.integers(0, 7))))
    claims = tuple(draw(claim(i)) for i in range(draw(st.integers(0, 5))))
    classes = {}
    for name, driver, wanted in CLASSES:
        extended = draw(st.sampled_from(["", "example.com/gpu", "example.com/part"]))
        classes[name] = DeviceClassInfo(name, (cel_of(driver, wanted),), extended,
                                        created=draw(st.sampled_from(["2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"])))
    template = ResourceClaimTemplateInfo("ns", "t", requests=(
        DeviceRequest("model", device_class="gpu.example.com", selectors=(MODEL_SELECTOR,),
                      count=draw(st.integers(1, 2))),))
    return Snapshot(nodes=nodes, resource_slices=slices, resource_claims=claims,
                    device_classes=MappingProxyType(classes),
                    claim_templates=MappingProxyType({("ns", "t"): template}))


SELECTIONS = (
    *(Selection(devices.selection_key(name), driver, wanted) for name, driver, wanted in CLASSES[:2]),
    Selection(devices.selection_key("gpu.example.com", (MODEL_SELECTOR,)), "gpu.example.com",
              (("type", "gpu"), ("model", "m1"))),
)


@settings(max_examples=200, deadline=None)
@given(world())
def test_offers_match_the_reference(snapshot: Snapshot) -> None:
    inventory = devices.device_inventory(snapshot, gpu_device_classes=("*gpu*",), gpu_resources=())

    want = reference_offers(snapshot.nodes, snapshot.resource_slices, snapshot.resource_claims, SELECTIONS)
    got = {node: dict(inventory.offers(node)) for node in inventory.nodes()}
    assert {n: o for n, o in got.items() if o} == want
    assert inventory.keys() == {s.key for s in SELECTIONS}
    assert dict(inventory.unknown) == {}
    assert inventory.gpu_classes == {"gpu.example.com", "part.gpu.example.com"}
    assert dict(inventory.mapped) == reference_mapped(snapshot.device_classes)


@settings(max_examples=150, deadline=None)
@given(world(), st.lists(st.integers(0, 11), min_size=1, max_size=8), st.data())
def test_offers_after_claims_change_match_the_reference(snapshot: Snapshot, toggles: list[int],
                                                        data: st.DataObject) -> None:
    """Successive snapshots with the same slices, classes and nodes, one claim added or deleted at a time (as the
    watch cache publishes them under claim churn, unchanged claims the same objects): each count, made from the
    last one's, is the reference's from scratch."""
    pool = [*snapshot.resource_claims, *(data.draw(claim(10 + i)) for i in range(12))]
    held = dict(enumerate(snapshot.resource_claims))
    for step in [-1, *toggles]:
        if step >= 0 and held.pop(step, None) is None and step < len(pool):
            held[step] = pool[step]
        claims = tuple(held[i] for i in sorted(held))
        current = dataclasses.replace(snapshot, resource_claims=claims, _memo={}, _memo_lock=threading.Lock(),
                                      _memo_building={})
        inventory = devices.device_inventory(current, gpu_device_classes=("*gpu*",), gpu_resources=())

        want = reference_offers(current.nodes, current.resource_slices, claims, SELECTIONS)
        got = {node: dict(inventory.offers(node)) for node in inventory.nodes()}
        assert {n: o for n, o in got.items() if o} == want


@settings(max_examples=100, deadline=None)
@given(world(), st.lists(st.sampled_from(["t", "c0", "c1", "c2", "missing"]), max_size=4, unique=True))
def test_claim_demand_sums_template_requests_per_pod_and_names_claims_once(
        snapshot: Snapshot, refs: list[str]) -> None:
    inventory = devices.device_inventory(snapshot, gpu_device_classes=("*gpu*",), gpu_resources=())
    pod_claims = [PodClaimRef(f"x{i}", template="t") if r == "t" else PodClaimRef(f"x{i}", claim=r)
                  for i, r in enumerate(refs)]

    demand = devices.claim_demand(snapshot, inventory, "ns", pod_claims)

    gpu = {"gpu.example.com", "part.gpu.example.com"}
    want_per_pod: dict[str, int] = {}
    if "t" in refs:
        (request,) = snapshot.claim_templates[("ns", "t")].requests
        want_per_pod[devices.selection_key(request.device_class, request.selectors)] = request.count
    claims = {c.name: c for c in snapshot.resource_claims}
    want_shared = []
    for ref in refs:
        if ref in claims:
            (request,) = claims[ref].requests
            counted = request.device_class in gpu and not request.admin_access
            exact = {devices.selection_key(request.device_class): request.count} \
                if counted and request.allocation_mode == "ExactCount" else {}
            all_mode = {devices.selection_key(request.device_class)} \
                if counted and request.allocation_mode == "All" else set()
            want_shared.append((ref, exact, all_mode, bool(claims[ref].allocated)))
    assert dict(demand.per_pod) == want_per_pod
    assert [(s.name, dict(s.demand), set(s.all_mode), s.allocated) for s in demand.shared] == want_shared
    missing = [r for r in refs if r != "t" and r not in claims]
    assert [p for p in demand.problems if "does not exist" in p] == [
        f"ResourceClaim ns/{r} (claim x{refs.index(r)}) does not exist" for r in missing]
