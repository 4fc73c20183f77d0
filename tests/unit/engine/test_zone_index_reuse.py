"""The zone index is rebuilt only where its inputs changed (app/engine/capacity.py `_GROUPS`,
`_CLASS_STATE`): after any sequence of pod and node changes, as the watch cache makes them (unchanged objects
reused, the pod index kept one pod at a time), it is the index built from scratch, and what no change
touched is the very object of the previous snapshot."""

from __future__ import annotations

import random
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cache import projections
from app.engine import capacity, devices, gpus
from app.models.cluster import IdentityMemo, NodeInfo, PodInfo, Snapshot
from app.models.dra import ResourceClaimInfo, ResourceSliceInfo
from app.models.pods import PodIndexBuilder
from tests.builders import GPU, make_node, make_pod

ZONE = "topology.kubernetes.io/zone"
ZONES = ("zone-a", "zone-b")


def described(index: capacity.ZoneIndex) -> Any:
    """Everything a reader of the index sees, as plain values."""
    return (index.zones, index.per_node_keys, {
        zone: [(c.zone, dict(c.labels), c.taints, c.gpu_resources, dict(c.free), dict(c.allocatable), c.pool.owner,
                [(s.name, dict(s.free), dict(s.allocatable or {})) for s in c.nodes], c.pool.nodes == c.nodes,
                c.pool.free_shapes, c.pool.total_shapes)
               for c in index.classes_in(zone)]
        for zone in index.zones
    })


def from_scratch(snapshot: Snapshot, monkeypatch: pytest.MonkeyPatch) -> capacity.ZoneIndex:
    with monkeypatch.context() as m:
        for name in ("_TARGETS", "_GROUPS", "_CLASS_STATE", "_POSITIONS", "_HELD"):
            m.setattr(capacity, name, IdentityMemo(16))
        return capacity.build_zone_index(snapshot, zone_label=ZONE, gpu_resources=(GPU,))


def node(i: int, gpus: int, pool: str) -> NodeInfo:
    return make_node(f"n{i}", zone=ZONES[i % 2], gpus=gpus, labels={"pool": pool},
                     taints=[{"key": GPU, "value": "present", "effect": "NoSchedule"}] if gpus else ())


STEP = st.tuples(st.sampled_from(["pod+", "pod-", "node"]), st.integers(0, 11), st.integers(0, 8))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(STEP, min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_after_any_changes_the_index_is_the_one_built_from_scratch(
    monkeypatch: pytest.MonkeyPatch, steps: list[tuple[str, int, int]], rng: random.Random
) -> None:
    nodes = {i: node(i, 8 if i < 8 else 0, "gpu" if i < 8 else "cpu") for i in range(12)}
    builder = PodIndexBuilder()
    pods: dict[str, PodInfo] = {}
    ordered = tuple(nodes[i] for i in sorted(nodes))
    previous = capacity.build_zone_index(Snapshot(nodes=ordered, pod_index=builder.freeze()), zone_label=ZONE,
                                         gpu_resources=(GPU,))
    for what, i, n in steps:
        touched = {f"n{i}"}
        if what == "pod+":
            pod = make_pod(f"p{len(pods)}", node=f"n{i}", gpus=n)
            pods[pod.name] = pod
            builder.add(pod)
        elif what == "pod-" and pods:
            gone = pods.pop(rng.choice(sorted(pods)))
            builder.remove(gone)
            touched = {gone.node_name}
        elif what == "node":  # a node relabelled, cordoned or resized: a new object, the rest reused
            nodes[i] = node(i, n, rng.choice(["gpu", "cpu", "big"]))
            ordered = tuple(nodes[k] for k in sorted(nodes))
        snapshot = Snapshot(nodes=ordered, pod_index=builder.freeze())
        index = capacity.build_zone_index(snapshot, zone_label=ZONE, gpu_resources=(GPU,))

        assert described(index) == described(from_scratch(snapshot, monkeypatch))
        if what != "node":
            kept = {id(c) for z in previous.zones for c in previous.classes_in(z)
                    if not touched & {s.name for s in c.nodes}}
            now = {id(c) for z in index.zones for c in index.classes_in(z)}
            assert kept <= now  # the classes no pod change touched are the previous snapshot's
        previous = index


# --- DRA: claims allocated and released on DRA-only nodes (KEP-5004: nvidia.com/gpu mapped by gpu.nvidia.com) ---

DRA_MEMOS = ("_INVENTORIES", "_SLICE_MATCHES", "_ALLOCATED", "_PUBLISHED", "_OFFERS")
GPU_CLASS = projections.project_device_class({"metadata": {"name": "gpu.nvidia.com"}, "spec": {
    "extendedResourceName": GPU, "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}})


def dra_slice(i: int) -> ResourceSliceInfo:
    return projections.project_resource_slice({"metadata": {"name": f"s{i}"}, "spec": {
        "driver": "gpu.nvidia.com", "nodeName": f"n{i}", "pool": {"name": f"n{i}", "generation": 1,
                                                                   "resourceSliceCount": 1},
        "devices": [{"name": f"gpu-{d}", "attributes": {"type": {"string": "gpu"}}} for d in range(4)]}})


def dra_claim(i: int, device: int, serial: int) -> ResourceClaimInfo:
    return projections.project_resource_claim({"metadata": {"name": f"c{serial}", "namespace": "ns"}, "status": {
        "allocation": {"devices": {"results": [{"request": "r", "driver": "gpu.nvidia.com", "pool": f"n{i}",
                                                "device": f"gpu-{device}"}]}}}})


def dra_index(snapshot: Snapshot) -> capacity.ZoneIndex:
    inventory = gpus.inventory_of(snapshot, (GPU,), gpus.DEFAULT_GPU_DEVICE_CLASSES)
    kinds = gpus.gpu_kinds(snapshot, (GPU,), gpus.DEFAULT_GPU_DEVICE_CLASSES)
    return capacity.build_zone_index(snapshot, zone_label=ZONE, gpu_resources=kinds, inventory=inventory)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["claim+", "claim-"]), st.integers(0, 5), st.integers(0, 4)),
                min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_after_claims_change_the_dra_index_is_the_one_built_from_scratch(
    monkeypatch: pytest.MonkeyPatch, steps: list[tuple[str, int, int]], rng: random.Random
) -> None:
    ordered = tuple(node(i, 0, "gpu") for i in range(6))  # DRA-only: no nvidia.com/gpu in allocatable
    slices = tuple(dra_slice(i) for i in range(6))
    classes = MappingProxyType({"gpu.nvidia.com": GPU_CLASS})
    pod_index = PodIndexBuilder().freeze()
    claims: dict[int, ResourceClaimInfo] = {}

    def snapshot_now() -> Snapshot:
        return Snapshot(nodes=ordered, pod_index=pod_index, resource_slices=slices, device_classes=classes,
                        resource_claims=tuple(claims[k] for k in sorted(claims)))

    previous = dra_index(snapshot_now())
    for serial, (what, i, device) in enumerate(steps):
        touched = set()
        if what == "claim+":
            claims[serial] = dra_claim(i, device, serial)
            touched = {f"n{i}"}
        elif claims:
            gone = claims.pop(rng.choice(sorted(claims)))
            touched = {gone.allocated[0].pool}
        snapshot = snapshot_now()
        index = dra_index(snapshot)

        with monkeypatch.context() as m:
            for name in DRA_MEMOS:
                m.setattr(devices, name, IdentityMemo(16))
            for name in ("_TARGETS", "_GROUPS", "_CLASS_STATE", "_POSITIONS", "_HELD"):
                m.setattr(capacity, name, IdentityMemo(16))
            m.setattr(gpus, "_KINDS", IdentityMemo(16))
            scratch = dra_index(snapshot)
        assert described(index) == described(scratch)
        held = {(c.allocated[0].pool, c.allocated[0].device) for c in claims.values()}
        assert sum(c.free[GPU] for z in index.zones for c in index.classes_in(z)) == 24 - len(
            held - {(f"n{k}", "gpu-4") for k in range(6)})  # (gpu-4 is published nowhere)
        kept = {id(c) for z in previous.zones for c in previous.classes_in(z)
                if not touched & {s.name for s in c.nodes}}
        assert kept <= {id(c) for z in index.zones for c in index.classes_in(z)}  # untouched classes reused
        previous = index
