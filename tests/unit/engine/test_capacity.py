"""Per-snapshot zone index (placement targets, free GPUs, node classes) and first-fit-decreasing packing."""

from __future__ import annotations

import tracemalloc
from collections.abc import Sequence

import pytest

from app.engine import capacity
from app.models.cluster import NodeInfo, PodInfo
from tests.builders import GPU, make_node, make_pod, make_snapshot


def free_by_zone(nodes: Sequence[NodeInfo], pods: Sequence[PodInfo] = ()) -> dict[str, dict[str, int]]:
    index = capacity.build_zone_index(
        make_snapshot(nodes, pods=pods), zone_label="topology.kubernetes.io/zone", gpu_resources=(GPU,)
    )
    return {
        zone: {slot.name: slot.free.get(GPU, 0) for cls in index.classes_in(zone) for slot in cls.nodes}
        for zone in index.zones
    }


@pytest.mark.parametrize(
    "nodes, pods, want",
    [
        pytest.param([make_node("g1", gpus=8)], [], {"zone-a": {"g1": 8}}, id="an idle node has all GPUs free"),
        pytest.param(
            [make_node("g1", gpus=8)],
            [make_pod("busy", node="g1", gpus=6)],
            {"zone-a": {"g1": 2}},
            id="running pods hold their GPUs",
        ),
        pytest.param(
            [make_node("g1", gpus=8)],
            [
                make_pod("done", node="g1", gpus=8, phase="Succeeded"),
                make_pod("bad", node="g1", gpus=8, phase="Failed"),
            ],
            {"zone-a": {"g1": 8}},
            id="terminal pods hold nothing",
        ),
        pytest.param(
            [make_node("g1", gpus=8)],
            [make_pod("queued", gpus=8, phase="Pending")],
            {"zone-a": {"g1": 8}},
            id="unbound pods hold nothing",
        ),
        pytest.param(
            [make_node("g1", gpus=4)],
            [make_pod("a", node="g1", gpus=4), make_pod("b", node="g1", gpus=4)],
            {"zone-a": {"g1": 0}},
            id="overcommitted nodes floor at zero",
        ),
        pytest.param(
            [
                make_node("g1", gpus=8, ready=False),
                make_node("g2", gpus=8, unschedulable=True),
                make_node("g3", zone=None, gpus=8),
                make_node("c1", zone="zone-b"),
            ],
            [],
            {"zone-b": {"c1": 0}},
            id="not Ready, cordoned and zoneless nodes are not targets",
        ),
    ],
)
def test_free_gpus_per_node(nodes: list[NodeInfo], pods: list[PodInfo], want: dict[str, dict[str, int]]) -> None:
    assert free_by_zone(nodes, pods) == want


def test_nodes_differing_only_by_hostname_share_a_class() -> None:
    nodes = [make_node(f"g{i}", gpus=8, labels={"pool": "a100"}) for i in range(3)]
    nodes.append(make_node("h1", gpus=8, labels={"pool": "h100"}))
    index = capacity.build_zone_index(
        make_snapshot(nodes), zone_label="topology.kubernetes.io/zone", gpu_resources=(GPU,)
    )
    assert sorted(len(c.nodes) for c in index.classes_in("zone-a")) == [1, 3]


def test_per_node_label_keys_do_not_split_classes() -> None:
    nodes = [make_node(f"g{i}", gpus=8, labels={"instance-id": f"i-{i:04}"}) for i in range(40)]
    index = capacity.build_zone_index(
        make_snapshot(nodes), zone_label="topology.kubernetes.io/zone", gpu_resources=(GPU,)
    )
    assert len(index.classes_in("zone-a")) == 1
    assert "instance-id" in index.per_node_keys


def test_zone_index_is_built_once_per_snapshot() -> None:
    snapshot = make_snapshot([make_node("g1", gpus=8)])
    first = capacity.zone_index(snapshot, zone_label="topology.kubernetes.io/zone", gpu_resources=(GPU,))
    again = capacity.zone_index(snapshot, zone_label="topology.kubernetes.io/zone", gpu_resources=(GPU,))
    other = capacity.zone_index(snapshot, zone_label="zone", gpu_resources=(GPU,))
    assert first is again
    assert other.zones == ()


def slots(*free: int, prefix: str = "n") -> capacity.Pool:
    return capacity.Pool.of([capacity.NodeSlot(f"{prefix}{i}", {}, {GPU: f}) for i, f in enumerate(free)])


@pytest.mark.parametrize(
    "demands, want",
    [
        pytest.param([("Worker", 4, 2, [slots(8)])], None, id="four 2-GPU pods fit one 8-GPU node"),
        pytest.param([("Worker", 1, 8, [slots(4, 4)])], "Worker", id="8 free in total but no node has 8"),
        pytest.param([("Worker", 2, 4, [slots(4, 4)])], None, id="one pod per node when each has room for one"),
        pytest.param(
            [("Big", 1, 6, [slots(6, 2)]), ("Small", 2, 1, [slots(6, 2)])],
            None,
            id="largest demand is placed first",
        ),
        pytest.param(
            [("Big", 1, 4, [slots(4)]), ("Small", 1, 1, [slots(4)])],
            "Small",
            id="replicas share the same nodes",
        ),
        pytest.param(
            [("Worker", 2, 2, [slots(2, prefix="a"), slots(2, prefix="b")])],
            None,
            id="pods spread over several pools",
        ),
        pytest.param([("Worker", 3, 1, [slots(1, 1)])], "Worker", id="more pods than free GPUs"),
        pytest.param(
            [("Big", 1, 4, [slots(6, 4)]), ("Small", 2, 3, [slots(6, 4)])],
            None,
            id="best fit: the 4-GPU pod takes the 4-free node so both 3-GPU pods fit the 6-free one",
        ),
        pytest.param(
            [("Worker", 3, 2, [slots(*([0] * 500 + [2, 2, 2]))])], None, id="nodes with nothing free are skipped"
        ),
        pytest.param(
            [("A", 1, 4, [slots(8, prefix="shared")]), ("B", 1, 4, [slots(8, prefix="shared")])],
            None,
            id="a node reached through two replicas' pools keeps its remaining room",
        ),
    ],
)
def test_pack(demands: list[tuple[str, int, int, list[capacity.Pool]]], want: str | None) -> None:
    got = capacity.pack(
        [capacity.PodDemand(key, count, {GPU: per_pod}, tuple(pools)) for key, count, per_pod, pools in demands]
    )
    assert got == want


@pytest.mark.parametrize(
    "count, free, want",
    [
        pytest.param(10_000_000, [8] * 1000, "Worker", id="ten million 1-GPU pods do not fit 8,000 GPUs"),
        pytest.param(8_000, [8] * 1000, None, id="8,000 1-GPU pods fill 1,000 8-GPU nodes exactly"),
        pytest.param(8_001, [8] * 1000, "Worker", id="one pod more than the GPUs"),
    ],
)
def test_pack_counts_pods_instead_of_listing_them(count: int, free: list[int], want: str | None) -> None:
    pool = slots(*free)
    tracemalloc.start()
    try:
        got = capacity.pack([capacity.PodDemand("Worker", count, {GPU: 1}, (pool,))])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == want
    # One object per pod would be hundreds of MB for ten million; counted packing keeps a few bins.
    assert peak < 200_000


def test_pack_mixes_partly_filled_nodes_with_untouched_ones() -> None:
    # 3-GPU pods on 8-GPU nodes leave 2 per node; the 2-GPU pods then use exactly those remainders.
    pool = slots(8, 8, 8)
    demands = [
        capacity.PodDemand("Big", 6, {GPU: 3}, (pool,)),
        capacity.PodDemand("Small", 3, {GPU: 2}, (pool,)),
    ]
    assert capacity.pack(demands) is None
    assert capacity.pack([*demands, capacity.PodDemand("Tiny", 1, {GPU: 1}, (pool,))]) == "Tiny"


def test_pack_on_allocatable_ignores_what_runs_now() -> None:
    busy = capacity.Pool.of([capacity.NodeSlot(f"n{i}", {}, {GPU: 0}, {GPU: 8}) for i in range(2)])
    demand = [capacity.PodDemand("Worker", 2, {GPU: 8}, (busy,))]
    assert capacity.pack(demand) == "Worker"
    assert capacity.pack(demand, basis="allocatable") is None
    assert capacity.pack([capacity.PodDemand("Worker", 3, {GPU: 8}, (busy,))], basis="allocatable") == "Worker"


def test_pools_of_different_classes_are_counted_apart_and_subsets_node_by_node() -> None:
    whole = capacity.Pool.of([capacity.NodeSlot(f"n{i}", {}, {GPU: 4}) for i in range(4)], owner="zone-a#0")
    subset = capacity.Pool.of(whole.nodes[:1], owner="zone-a#0")
    other = capacity.Pool.of([capacity.NodeSlot("m0", {}, {GPU: 4})], owner="zone-a#1")
    # Pinned takes the one node both reach; the rest still has 3 x 4 + 4 free.
    demands = [
        capacity.PodDemand("Pinned", 1, {GPU: 4}, (subset,)),
        capacity.PodDemand("Worker", 4, {GPU: 4}, (whole, other)),
    ]
    assert capacity.pack(demands) is None
    assert capacity.pack([*demands[:1], capacity.PodDemand("Worker", 5, {GPU: 4}, (whole, other))]) == "Worker"
