"""DRA and ComputeDomain projections: real NVIDIA shapes read whole, odd input named in `problem`, never a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.cache import projections
from app.cache.files import load_snapshot
from app.models.dra import parse_quantity

NVIDIA = Path(__file__).parents[2] / "data" / "dra" / "nvidia.yaml"


def slice_of(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}, "spec": spec}


def test_the_nvidia_shapes_are_read_whole() -> None:
    snapshot = load_snapshot(NVIDIA)

    gpus = next(s for s in snapshot.resource_slices if s.name == "gpu-a-1-gpu.nvidia.com-x7k2p")
    counters = next(s for s in snapshot.resource_slices if s.name == "gpu-b-1-gpu.nvidia.com-counters")
    partitions = next(s for s in snapshot.resource_slices if s.name == "gpu-b-1-gpu.nvidia.com-devices")
    claim = next(c for c in snapshot.resource_claims if c.name == "monitor")
    assert (gpus.driver, gpus.pool, gpus.generation, gpus.slice_count, gpus.node_name) == (
        "gpu.nvidia.com", "gpu-a-1", 1, 1, "gpu-a-1")
    assert [d.name for d in gpus.devices] == [f"gpu-{i}" for i in range(8)]
    assert gpus.devices[0].attributes["type"] == "gpu"
    assert gpus.devices[0].attributes["driverVersion"] == "580.126.20"
    assert gpus.devices[0].attributes["resource.kubernetes.io/pcieRoot"] == "pci0000:15"
    assert gpus.devices[0].capacity == {"memory": "80Gi"}
    assert [(t.key, t.value, t.effect) for t in gpus.devices[7].taints] == [("gpu.nvidia.com/xid", "79", "NoSchedule")]
    assert counters.shared_counters == {"gpu-0-counter-set": {"memory": 80 * 2**30 * 1000, "multiprocessors": 132_000}}
    assert partitions.devices[1].consumes_counters[0].counters == {"memory": 40 * 2**30 * 1000,
                                                                   "multiprocessors": 60_000}
    assert snapshot.device_classes["gpu.nvidia.com"].extended_resource_name == "nvidia.com/gpu"
    assert (claim.requests[0].allocation_mode, claim.requests[0].admin_access, claim.allocated[0].admin_access) == (
        "All", True, True)
    assert snapshot.claim_templates[("team-a", "eight-gpus")].requests[0].count == 8
    assert snapshot.compute_domains[0].claim_template == "llm-cd-channel"
    assert all(not s.problem for s in snapshot.resource_slices)


@pytest.mark.parametrize("spec, problem", [
    pytest.param({"driver": "d", "nodeName": "n", "devices": [{"name": "x"}]}, "spec.pool has no name", id="no pool"),
    pytest.param({"driver": "d", "pool": {"name": "p", "generation": "one"}}, "generation 'one' is no count",
                 id="generation not a number"),
    pytest.param({"driver": "d", "pool": {"name": "p", "resourceSliceCount": 0}}, "resourceSliceCount 0",
                 id="slice count zero"),
    pytest.param({"driver": "d", "pool": {"name": "p"}, "devices": [
        {"name": "x", "attributes": {"weird": {"float": 1.5}, "two": {"int": 1, "string": "a"}, "ok": {"int": 3}}}]},
        "device x: attributes two, weird of no known type", id="unknown attribute types"),
    pytest.param({"driver": "d", "pool": {"name": "p"}, "devices": [{"attributes": {}}]}, "a device has no name",
                 id="device without a name"),
    pytest.param({"driver": "d", "pool": {"name": "p"}, "sharedCounters": [{"name": "c", "counters": {
        "memory": {"value": "lots"}}}]}, "counter set c counter memory has no quantity", id="counter not a quantity"),
])
def test_bad_slices_name_what_cannot_be_read(spec: dict[str, Any], problem: str) -> None:
    assert problem in projections.project_resource_slice(slice_of(spec)).problem


def test_unknown_attribute_types_are_left_out_and_listed() -> None:
    device = projections.project_resource_slice(slice_of({"driver": "d", "pool": {"name": "p"}, "devices": [
        {"name": "x", "attributes": {"weird": {"float": 1.5}, "ok": {"int": 3}}}]})).devices[0]
    assert (dict(device.attributes), device.unreadable) == ({"ok": 3}, ("weird",))


def test_a_128_device_slice_is_read_whole() -> None:
    devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}}} for i in range(128)]
    info = projections.project_resource_slice(slice_of({"driver": "d", "nodeName": "n", "pool": {"name": "p"},
                                                        "devices": devices}))
    assert (len(info.devices), info.problem, info.generation, info.slice_count) == (128, "", 0, 1)


@pytest.mark.parametrize("request_body, problem", [
    pytest.param({"name": "r"}, "request r has neither exactly nor firstAvailable", id="empty request"),
    pytest.param({"name": "r", "exactly": {"deviceClassName": "c", "count": -2}}, "count -2 is no positive count",
                 id="negative count"),
    pytest.param({"name": "r", "exactly": {"deviceClassName": "c", "allocationMode": "Some"}},
                 "allocationMode 'Some'", id="unknown mode"),
    pytest.param({"name": "r", "exactly": {"count": 1}}, "request r names no deviceClassName", id="no class"),
    pytest.param({"name": "r", "exactly": {"deviceClassName": "c", "selectors": [{"cel": {}}]}},
                 "request r selector 0 has no CEL expression", id="selector without expression"),
])
def test_bad_claim_requests_are_named(request_body: dict[str, Any], problem: str) -> None:
    claim = {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": {"requests": [request_body]}}}
    template = {"metadata": {"name": "t", "namespace": "ns"},
                "spec": {"spec": {"devices": {"requests": [request_body]}}}}
    assert problem in projections.project_resource_claim(claim).problem
    assert problem in projections.project_claim_template(template).problem


def test_first_available_keeps_its_subrequests_in_order() -> None:
    template = {"metadata": {"name": "t", "namespace": "ns"}, "spec": {"spec": {"devices": {"requests": [
        {"name": "gpu", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2},
                                           {"name": "small", "deviceClassName": "mig.nvidia.com"}]}]}}}}
    (request,) = projections.project_claim_template(template).requests
    assert [(s.name, s.device_class, s.count) for s in request.first_available] == [
        ("gpu/big", "gpu.nvidia.com", 2), ("gpu/small", "mig.nvidia.com", 1)]


ANY_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.floats(),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                   max_size=3), max_leaves=12)
FIELDS = st.sampled_from(["metadata", "spec", "status", "driver", "pool", "devices", "attributes", "name",
                          "sharedCounters", "consumesCounters", "counters", "taints", "requests", "exactly",
                          "firstAvailable", "allocation", "results", "selectors", "cel", "channel", "value"])
SHAPES = st.recursive(ANY_JSON, lambda inner: st.dictionaries(FIELDS, inner, max_size=4) | st.lists(inner, max_size=3),
                      max_leaves=25)


@given(SHAPES)
def test_no_shape_crashes_a_projection(obj: Any) -> None:
    raw = obj if isinstance(obj, dict) else {"spec": obj}
    for project in (projections.project_device_class, projections.project_resource_slice,
                    projections.project_resource_claim, projections.project_claim_template,
                    projections.project_compute_domain):
        project(raw)


@pytest.mark.parametrize("text, want", [("80Gi", 80 * 2**30), ("9856Mi", 9856 * 2**20), ("132", 132), ("500m", 0.5),
                                        ("1e3", 1000), ("1.5Gi", 1.5 * 2**30), ("eight", None), ("1Gb", None)])
def test_quantities(text: str, want: float | None) -> None:
    assert parse_quantity(text) == want
