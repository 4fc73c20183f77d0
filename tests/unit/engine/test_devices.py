"""The device counter on NVIDIA's DRA shapes (tests/data/dra/nvidia.yaml), CEL selectors, and what a pod's claims
ask for."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from app.cache.files import load_snapshot
from app.engine import devices
from app.models.cluster import Snapshot
from app.models.dra import (
    AllocatedDevice,
    Device,
    DeviceClassInfo,
    DeviceRequest,
    PodClaimRef,
    ResourceClaimInfo,
    ResourceClaimTemplateInfo,
    ResourceSliceInfo,
)

NVIDIA = Path(__file__).parents[2] / "data" / "dra" / "nvidia.yaml"
GPU = devices.selection_key("gpu.nvidia.com")
MIG = devices.selection_key("mig.nvidia.com")
VFIO = devices.selection_key("vfio.gpu.nvidia.com")


@pytest.fixture(scope="module")
def snapshot() -> Snapshot:
    return load_snapshot(NVIDIA)


def changed(snapshot: Snapshot, **fields: Any) -> Snapshot:
    """A copy with `fields` changed and a memo of its own (replace() would share the original's)."""
    return dataclasses.replace(snapshot, **fields, _memo={}, _memo_lock=threading.Lock(), _memo_building={})


def inventory_of(snapshot: Snapshot) -> devices.DeviceInventory:
    return devices.device_inventory(snapshot, gpu_device_classes=devices.GPU_DEVICE_CLASS_DEFAULTS,
                                    gpu_resources=("nvidia.com/gpu",))


@pytest.mark.parametrize("node, want", [
    pytest.param("gpu-a-1", {GPU: (7, 4)},
                 id="8 GPUs: one tainted NoSchedule; 3 allocated (the KEP-5004 claim's too), adminAccess not counted"),
    pytest.param("gpu-a-2", {MIG: (4, 4), VFIO: (1, 1)},
                 id="static MIG: slices only, generation 3; the older generation's GPU not counted"),
    pytest.param("gpu-b-1", {GPU: (1, 0), MIG: (2, 1)},
                 id="dynamic MIG: a 3g.40gb partition allocated leaves no room for the full GPU, room for the other"),
    pytest.param("gpu-z-9", {}, id="a node without slices"),
])
def test_nvidia_devices_per_node(snapshot: Snapshot, node: str, want: dict[str, tuple[int, int]]) -> None:
    assert dict(inventory_of(snapshot).offers(node)) == want


def test_classes_mapping_and_compute_domain_channels(snapshot: Snapshot) -> None:
    inventory = inventory_of(snapshot)

    assert inventory.gpu_classes == {"gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"}
    assert inventory.mapped["nvidia.com/gpu"] == "gpu.nvidia.com"
    assert inventory.mapped["deviceclass.resource.kubernetes.io/mig.nvidia.com"] == "mig.nvidia.com"
    assert inventory.keys() == {GPU, MIG, VFIO}  # never the compute-domain channel or daemon classes
    assert (dict(inventory.unknown), inventory.problems) == ({}, ())


def test_a_class_mapping_a_gpu_resource_is_a_gpu_class(snapshot: Snapshot) -> None:
    classes = dict(snapshot.device_classes)
    classes["accel.example.com"] = DeviceClassInfo("accel.example.com", (), "example.com/accel")
    other = changed(snapshot, device_classes=MappingProxyType(classes))

    inventory = devices.device_inventory(other, gpu_device_classes=("gpu.nvidia.com",),
                                         gpu_resources=("example.com/*",))
    assert inventory.gpu_classes == {"gpu.nvidia.com", "accel.example.com"}


def test_the_inventory_is_built_once_and_reused_while_its_inputs_are_the_same(snapshot: Snapshot) -> None:
    again = changed(snapshot, revision="other", pods=())
    assert inventory_of(snapshot) is inventory_of(snapshot) is inventory_of(again)


def with_classes(snapshot: Snapshot, **selectors: str) -> Snapshot:
    classes = dict(snapshot.device_classes)
    for name, expression in selectors.items():
        classes[name.replace("_", ".")] = DeviceClassInfo(name.replace("_", "."), (expression,))
    return changed(snapshot, device_classes=MappingProxyType(classes))


@pytest.mark.parametrize("expression, want", [
    pytest.param("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName"
                 ".startsWith('NVIDIA H100')", {"gpu-a-1": (7, 4), "gpu-a-2": (5, 5), "gpu-b-1": (1, 0)},
                 id="string functions"),
    pytest.param("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
                 {"gpu-a-1": (7, 4), "gpu-a-2": (1, 1)}, id="capacity as a quantity"),
    pytest.param("device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('575.0.0'))",
                 {"gpu-a-1": (7, 4)}, id="a version attribute as a semver"),
    pytest.param("device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:15'",
                 {"gpu-a-1": (7, 4)}, id="a qualified attribute"),
    pytest.param("has(device.attributes['gpu.nvidia.com'].profile) && "
                 "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'", {"gpu-a-2": (3, 3)},
                 id="has() on a name some devices lack"),
    pytest.param("device.attributes['gpu.nvidia.com'].exists(name, name == 'profile')",
                 {"gpu-a-2": (4, 4), "gpu-b-1": (2, 1)}, id="a comprehension over a domain"),
])
def test_cel_selectors(snapshot: Snapshot, expression: str, want: dict[str, tuple[int, int]]) -> None:
    inventory = devices.device_inventory(with_classes(snapshot, probe_gpu_example_com=expression),
                                         gpu_device_classes=("probe.*",), gpu_resources=())
    key = devices.selection_key("probe.gpu.example.com")
    assert {n: dict(inventory.offers(n)) for n in inventory.nodes() if inventory.offers(n)} == {
        n: {key: counts} for n, counts in want.items()}
    assert dict(inventory.unknown) == {}


@pytest.mark.parametrize("expression, reason", [
    pytest.param("device.driver ==", "does not compile: <input>:1:17: Syntax error", id="syntax error"),
    pytest.param("device.attributes['gpu.nvidia.com'].cidr.containsIP(ip('10.0.0.1'))",
                 "undeclared reference to 'ip'", id="an unknown function"),
    pytest.param("", "the selector has no CEL expression", id="no expression"),
])
def test_what_cannot_be_evaluated_is_unknown_and_named(snapshot: Snapshot, expression: str, reason: str) -> None:
    inventory = devices.device_inventory(with_classes(snapshot, probe_gpu_example_com=expression),
                                         gpu_device_classes=("probe.*",), gpu_resources=())
    assert reason in inventory.unknown[devices.selection_key("probe.gpu.example.com")]
    assert inventory.unknown[devices.selection_key("probe.gpu.example.com")].startswith(
        "DeviceClass probe.gpu.example.com: ")


def test_an_attribute_of_unknown_type_that_a_selector_reads_makes_it_unknown() -> None:
    odd = ResourceSliceInfo("s", "gpu.nvidia.com", "p", 1, 1, node_name="n", devices=(
        Device("gpu-0", attributes=MappingProxyType({"model": "x"}), unreadable=("type",)),))
    snapshot = Snapshot(resource_slices=(odd,), device_classes=MappingProxyType({
        "gpu.nvidia.com": DeviceClassInfo("gpu.nvidia.com", ("device.attributes['gpu.nvidia.com'].type == 'gpu'",)),
        "any.gpu": DeviceClassInfo("any.gpu", ("device.attributes['gpu.nvidia.com'].model == 'x'",))}))
    inventory = devices.device_inventory(snapshot, gpu_device_classes=("*gpu*",), gpu_resources=())
    assert dict(inventory.unknown) == {GPU: "ResourceSlice s device gpu-0: attribute type is of no known type, and "
                                            "\"device.attributes['gpu.nvidia.com'].type == 'gpu'\" reads it"}
    assert dict(inventory.offers("n")) == {devices.selection_key("any.gpu"): (1, 1)}


def test_a_slice_without_a_pool_offers_nothing_and_is_named() -> None:
    bad = ResourceSliceInfo("s", "gpu.nvidia.com", "", 1, 1, node_name="n", devices=(Device("gpu-0"),),
                            problem="spec.pool has no name")
    snapshot = Snapshot(resource_slices=(bad,), device_classes=MappingProxyType({
        "gpu.nvidia.com": DeviceClassInfo("gpu.nvidia.com")}))
    inventory = devices.device_inventory(snapshot, gpu_device_classes=("*gpu*",), gpu_resources=())
    assert (dict(inventory.offers("n")), inventory.problems) == (
        {}, ("ResourceSlice s: spec.pool has no name; its devices are not counted",))


def test_a_template_claims_devices_per_pod_and_joins_its_compute_domain(snapshot: Snapshot) -> None:
    demand = devices.claim_demand(snapshot, inventory_of(snapshot), "team-a", [
        PodClaimRef("gpus", template="eight-gpus"), PodClaimRef("channel", template="llm-cd-channel")])
    assert (dict(demand.per_pod), demand.all_mode, demand.shared, demand.problems) == ({GPU: 8}, set(), (), ())
    assert (demand.compute_domain, demand.compute_domain_uid) == ("team-a/llm-cd",
                                                                  "62407f0c-8627-4b55-8caa-bf496ae6f730")


def test_a_compute_domain_template_not_created_yet_is_found_by_its_domain(snapshot: Snapshot) -> None:
    templates = {k: v for k, v in snapshot.claim_templates.items() if k != ("team-a", "llm-cd-channel")}
    early = changed(snapshot, claim_templates=MappingProxyType(templates))
    demand = devices.claim_demand(early, inventory_of(early), "team-a", [PodClaimRef("ch", template="llm-cd-channel")])
    assert (demand.compute_domain, demand.problems) == ("team-a/llm-cd", ())


def test_missing_templates_claims_and_classes_are_named(snapshot: Snapshot) -> None:
    templates = dict(snapshot.claim_templates)
    templates[("team-a", "odd")] = ResourceClaimTemplateInfo("team-a", "odd", requests=(
        DeviceRequest("r", device_class="tpu.example.com"),))
    other = changed(snapshot, claim_templates=MappingProxyType(templates))
    demand = devices.claim_demand(other, inventory_of(other), "team-a", [
        PodClaimRef("a", template="nope"), PodClaimRef("b", claim="nope"), PodClaimRef("c", template="odd"),
        PodClaimRef("d")])
    assert demand.problems == (
        "ResourceClaimTemplate team-a/nope (claim a) does not exist",
        "ResourceClaim team-a/nope (claim b) does not exist",
        "ResourceClaimTemplate team-a/odd: request r names DeviceClass tpu.example.com, which does not exist",
        "resourceClaims entry d names neither a ResourceClaimTemplate nor a ResourceClaim",
    )


def test_all_mode_first_available_and_named_claims(snapshot: Snapshot) -> None:
    templates = dict(snapshot.claim_templates)
    templates[("team-a", "flex")] = ResourceClaimTemplateInfo("team-a", "flex", requests=(
        DeviceRequest("whole-node", device_class="gpu.nvidia.com", allocation_mode="All"),
        DeviceRequest("gpu", first_available=(
            DeviceRequest("gpu/big", device_class="gpu.nvidia.com", selectors=(
                "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B300'",), count=2),
            DeviceRequest("gpu/mig", device_class="mig.nvidia.com", count=3))),
    ))
    other = changed(snapshot, claim_templates=MappingProxyType(templates))
    demand = devices.claim_demand(other, inventory_of(other), "team-a", [
        PodClaimRef("f", template="flex"), PodClaimRef("part", claim="part-0")])

    # No B300 anywhere: the allocator would fall through to the MIG subrequest.
    assert (dict(demand.per_pod), demand.all_mode) == ({MIG: 3}, {GPU})
    (shared,) = demand.shared
    assert (shared.name, dict(shared.demand), shared.allocated, shared.node_selector) == ("part-0", {MIG: 1}, True,
                                                                                         None)


@pytest.mark.parametrize("count, want", [
    pytest.param(2, {GPU: (1, 0), MIG: (2, 1)}, id="both slices there: complete"),
    pytest.param(3, {}, id="a slice missing: incomplete, nothing offered"),
    pytest.param(1, {}, id="more slices than the count: incomplete"),
])
def test_an_incomplete_pool_offers_nothing(snapshot: Snapshot, count: int, want: dict[str, tuple[int, int]]) -> None:
    slices = tuple(dataclasses.replace(s, slice_count=count) if s.pool == "gpu-b-1" else s
                   for s in snapshot.resource_slices)
    assert dict(inventory_of(changed(snapshot, resource_slices=slices)).offers("gpu-b-1")) == want


def test_claims_coming_and_going_are_counted_from_the_last_count() -> None:
    """Under claim churn the allocated devices are kept from one claims tuple to the next (devices._Holders): a
    device two claims hold stays taken until both are gone; a claim gone frees what it held."""
    slice_ = ResourceSliceInfo(name="s", driver="gpu.example.com", pool="n1", generation=1, slice_count=1,
                               node_name="n1", devices=tuple(Device(name=f"d{i}", attributes=MappingProxyType(
                                   {"type": "gpu"})) for i in range(4)))
    gpu_class = DeviceClassInfo("gpu.example.com", ("device.driver == 'gpu.example.com'",))

    def held(name: str, device: str) -> ResourceClaimInfo:
        return ResourceClaimInfo(namespace="ns", name=name, allocated=(
            AllocatedDevice("r", "gpu.example.com", "n1", device),))

    a, b, c, d = held("a", "d0"), held("b", "d1"), held("c", "d0"), held("d", "d2")
    base = Snapshot(resource_slices=(slice_,), device_classes=MappingProxyType({gpu_class.name: gpu_class}))
    key = devices.selection_key("gpu.example.com")
    for claims, free in [((a, b, d), 1), ((a, b, c, d), 1), ((b, c, d), 1), ((b, d), 2), ((b,), 3), ((b, d), 2),
                         ((a, b, c, d), 1), ((), 4), ((a, c), 3)]:
        inventory = devices.device_inventory(changed(base, resource_claims=claims),
                                             gpu_device_classes=("*gpu*",), gpu_resources=())
        assert inventory.offers("n1")[key] == (4, free), [x.name for x in claims]
