"""Where each replica type can run in a zone: GPU anchors, GPU-pool tolerations, user pins (zones.fit_zone)."""

from __future__ import annotations

from typing import Any

import pytest

from app.engine import capacity, zones
from app.models.cluster import Snapshot, Taint
from app.models.job import JobGroup
from tests.builders import (
    GPU,
    gpu_taint,
    make_group,
    make_node,
    make_placement,
    make_pod,
    make_replica,
    make_snapshot,
)

ZONE = "topology.kubernetes.io/zone"
LAB_TAINT = {"key": "gpu", "value": "present", "effect": "NoSchedule"}
LAB_TOLERATION = {"key": "gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
LAB = make_snapshot(
    [
        make_node("gpu-a-1", zone="zone-a", gpus=4, labels={"gpu": "true"}, taints=[LAB_TAINT]),
        make_node("gpu-a-2", zone="zone-a", gpus=4, labels={"gpu": "true"}, taints=[LAB_TAINT]),
        make_node("cpu-b-1", zone="zone-b", labels={"gpu": "false"}),
        make_node("cpu-b-2", zone="zone-b", labels={"gpu": "false"}),
    ]
)


def lab_group(master: dict[str, Any] | None = None, worker: dict[str, Any] | None = None) -> JobGroup:
    worker_placement = make_placement({"gpu": "true"}, tolerations=[LAB_TOLERATION])
    return make_group(
        make_replica("Master", coordinator=True, placement=make_placement(**(master or {}))),
        make_replica(
            "Worker", count=4, gpus=1, placement=make_placement(**worker) if worker is not None else worker_placement
        ),
    )


def fit(group: JobGroup, snapshot: Snapshot, zone: str, *, strict: bool = False) -> dict[str, Any]:
    index = capacity.build_zone_index(snapshot, zone_label=ZONE, gpu_resources=(GPU,))
    got = zones.fit_zone(group, index, zone, strict=strict)
    return {
        "anchored": got.anchored,
        "gpu_nodes": got.gpu_nodes,
        "gpus_free": got.gpus_free,
        "replicas": {k: (f.problem, f.add_tolerations) for k, f in got.replicas.items()},
    }


GPU_POOL = Taint("gpu", "present", "NoSchedule")
# Without an anchored GPU pool there is no toleration to grant.
MASTER_TAINTED = "Master cannot run here: it does not tolerate taint gpu=present:NoSchedule of the nodes it selects"


@pytest.mark.parametrize(
    "group, snapshot, zone, strict, want",
    [
        pytest.param(
            lab_group(),
            LAB,
            "zone-a",
            False,
            {
                "anchored": True,
                "gpu_nodes": 2,
                "gpus_free": 8,
                "replicas": {"Worker": ("", ()), "Master": ("", (GPU_POOL,))},
            },
            id="lab zone-a: workers anchor, the coordinator gets the GPU-pool toleration",
        ),
        pytest.param(
            lab_group(),
            LAB,
            "zone-b",
            False,
            {
                "anchored": False,
                "gpu_nodes": 0,
                "gpus_free": 0,
                "replicas": {
                    "Worker": ("Worker cannot run here: no Ready, schedulable nvidia.com/gpu node", ()),
                    "Master": ("", ()),
                },
            },
            id="lab zone-b: a CPU-only zone cannot anchor, the coordinator alone could run there",
        ),
        pytest.param(
            lab_group(),
            LAB,
            "zone-a",
            True,
            {
                "anchored": True,
                "gpu_nodes": 2,
                "gpus_free": 8,
                "replicas": {
                    "Worker": ("", ()),
                    "Master": (MASTER_TAINTED, ()),
                },
            },
            id="strict: nothing is added, so the coordinator cannot use the tainted GPU nodes",
        ),
        pytest.param(
            lab_group(worker={"node_selector": {"gpu": "true"}}),
            LAB,
            "zone-a",
            False,
            {
                "anchored": False,
                "gpu_nodes": 0,
                "gpus_free": 0,
                "replicas": {
                    "Worker": (
                        "Worker cannot run here: it does not tolerate taint gpu=present:NoSchedule of the "
                        "nvidia.com/gpu nodes",
                        (),
                    ),
                    "Master": (MASTER_TAINTED, ()),
                },
            },
            id="GPU workers are never given tolerations: a missing one is a problem",
        ),
        pytest.param(
            lab_group(worker={"node_selector": {"gpu": "h100"}, "tolerations": [LAB_TOLERATION]}),
            LAB,
            "zone-a",
            False,
            {
                "anchored": False,
                "gpu_nodes": 0,
                "gpus_free": 0,
                "replicas": {
                    "Worker": (
                        "Worker cannot run here: its nodeSelector gpu=h100 matches none of the 2 "
                        "nvidia.com/gpu node(s)",
                        (),
                    ),
                    "Master": (MASTER_TAINTED, ()),
                },
            },
            id="a worker nodeSelector that matches no GPU node",
        ),
        pytest.param(
            lab_group(master={"node_selector": {ZONE: "zone-b"}}),
            LAB,
            "zone-a",
            False,
            {
                "anchored": True,
                "gpu_nodes": 2,
                "gpus_free": 8,
                "replicas": {
                    "Worker": ("", ()),
                    "Master": (
                        "Master cannot run here: its nodeSelector topology.kubernetes.io/zone=zone-b matches no node",
                        (),
                    ),
                },
            },
            id="a coordinator pinned to another zone",
        ),
        pytest.param(
            lab_group(
                master={"terms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-a-2"]}]}]}
            ),
            LAB,
            "zone-a",
            False,
            {
                "anchored": True,
                "gpu_nodes": 2,
                "gpus_free": 8,
                "replicas": {"Worker": ("", ()), "Master": ("", (GPU_POOL,))},
            },
            id="matchFields pins the coordinator to one GPU node",
        ),
        pytest.param(
            lab_group(),
            make_snapshot(
                [
                    make_node("gpu-a-1", zone="zone-a", gpus=4, labels={"gpu": "true"}, taints=[LAB_TAINT]),
                    make_node("gpu-a-2", zone="zone-a", gpus=4, labels={"gpu": "true"}, taints=[LAB_TAINT]),
                ],
                pods=[
                    make_pod("busy", node="gpu-a-1", gpus=3),
                    make_pod("done", node="gpu-a-2", gpus=4, phase="Succeeded"),
                ],
            ),
            "zone-a",
            False,
            {
                "anchored": True,
                "gpu_nodes": 2,
                "gpus_free": 5,
                "replicas": {"Worker": ("", ()), "Master": ("", (GPU_POOL,))},
            },
            id="free GPUs count running pods but not finished ones",
        ),
        pytest.param(
            make_group(
                make_replica("Master", coordinator=True),
                make_replica("Worker", count=2, gpus=1, placement=make_placement(tolerations=[{"operator": "Exists"}])),
            ),
            make_snapshot(
                [
                    make_node(
                        "g1",
                        gpus=8,
                        taints=[gpu_taint(), {"key": "node.kubernetes.io/disk-pressure", "effect": "NoSchedule"}],
                    )
                ]
            ),
            "zone-a",
            False,
            {
                "anchored": True,
                "gpu_nodes": 1,
                "gpus_free": 8,
                "replicas": {
                    "Worker": ("", ()),
                    "Master": (
                        "Master cannot run here: it does not tolerate taint "
                        "node.kubernetes.io/disk-pressure:NoSchedule of the nodes it selects",
                        (),
                    ),
                },
            },
            id="node.kubernetes.io taints are never tolerated on the user's behalf",
        ),
        pytest.param(
            make_group(make_replica("Master", coordinator=True), make_replica("Worker", count=2, gpus=1)),
            make_snapshot(
                [
                    make_node("g1", gpus=8, taints=[{"key": "team", "value": "x", "effect": "PreferNoSchedule"}]),
                    make_node("c1"),
                ]
            ),
            "zone-a",
            False,
            {"anchored": True, "gpu_nodes": 1, "gpus_free": 8, "replicas": {"Worker": ("", ()), "Master": ("", ())}},
            id="PreferNoSchedule taints need no toleration",
        ),
        pytest.param(
            make_group(make_replica("Chief", coordinator=True), make_replica("PS", count=2)),
            make_snapshot([make_node("c1"), make_node("c2", zone="zone-b")]),
            "zone-b",
            False,
            {"anchored": True, "gpu_nodes": 0, "gpus_free": 0, "replicas": {"Chief": ("", ()), "PS": ("", ())}},
            id="a CPU-only group is anchored in every zone",
        ),
    ],
)
def test_fit_zone(group: JobGroup, snapshot: Snapshot, zone: str, strict: bool, want: dict[str, Any]) -> None:
    assert fit(group, snapshot, zone, strict=strict) == want


def test_replica_zones_and_conflict_message() -> None:
    group = lab_group(master={"node_selector": {ZONE: "zone-b"}})
    index = capacity.build_zone_index(LAB, zone_label=ZONE, gpu_resources=(GPU,))
    fits = [zones.fit_zone(group, index, z, strict=False) for z in index.zones]
    zones_of = zones.replica_zones(fits)
    assert zones_of == {"Master": ("zone-b",), "Worker": ("zone-a",)}
    assert zones.describe_conflict(group, zones_of, ZONE) == (
        "the replicas share no zone: Master is pinned to zone-b, Worker can only run in zone-a"
    )
