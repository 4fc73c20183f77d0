"""The zone index is rebuilt only where its inputs changed (app/engine/capacity.py `_GROUPS`,
`_CLASS_STATE`): after any sequence of pod and node changes, as the watch cache makes them (unchanged objects
reused, the pod index kept one pod at a time), it is the index built from scratch, and what no change
touched is the very object of the previous snapshot."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.engine import capacity
from app.models.cluster import IdentityMemo, NodeInfo, PodInfo, Snapshot
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
