"""The validating decision (engine.validate): the job as written must stay in one open zone."""

from __future__ import annotations

from typing import Any

import pytest

from app import engine
from app.config import Settings
from app.models.cluster import Snapshot
from app.models.job import JobGroup
from tests.builders import (
    GPU_TAINT,
    make_group,
    make_intra_zone_cnp,
    make_namespace,
    make_node,
    make_placement,
    make_pod,
    make_replica,
    make_snapshot,
    tolerate,
)

ZONE = "topology.kubernetes.io/zone"
NS = "ml"
LAB_TAINT = {"key": "gpu", "value": "present", "effect": "NoSchedule"}
LAB_TOLERATION = {"key": "gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}

LAB = make_snapshot(
    [
        make_node("gpu-a-1", zone="zone-a", gpus=4, labels={"gpu": "true"}, taints=[LAB_TAINT]),
        make_node("gpu-a-2", zone="zone-a", gpus=4, labels={"gpu": "true"}, taints=[LAB_TAINT]),
        make_node("cpu-b-1", zone="zone-b", labels={"gpu": "false"}),
    ],
    namespaces=[make_namespace(NS)],
    policies=[make_intra_zone_cnp(z, namespace=NS) for z in ("zone-a", "zone-b")],
)


def in_zones(*zones: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": ZONE, "operator": "In", "values": list(zones)}]}


def lab_job(*, master: Any, worker: Any, master_zone_label: str = "zone-b") -> JobGroup:
    return make_group(
        make_replica("Master", coordinator=True, labels={"zone": master_zone_label}, placement=master),
        make_replica("Worker", count=2, gpus=1, labels={"zone": "zone-a"}, placement=worker),
        namespace=NS,
    )


WORKER_AS_WRITTEN = make_placement({"gpu": "true"}, tolerations=[LAB_TOLERATION])
WORKER_PATCHED = make_placement({"gpu": "true"}, [in_zones("zone-a")], [LAB_TOLERATION])
MASTER_PATCHED = make_placement(terms=[in_zones("zone-a")], tolerations=[LAB_TOLERATION])

THREE = make_snapshot(
    [
        make_node("a100-a-1", zone="zone-a", gpus=8, taints=[GPU_TAINT]),
        make_node("a100-c-1", zone="zone-c", gpus=8, taints=[GPU_TAINT]),
        make_node("cpu-b-1", zone="zone-b"),
    ],
    pods=[make_pod("busy", namespace=NS, node="a100-a-1", gpus=7)],
    namespaces=[make_namespace(NS)],
)


def colocated(zones: tuple[str, ...]) -> JobGroup:
    affinity = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": ZONE, "labelSelector": {"matchLabels": {"training.kubeflow.org/job-name": "train"}}}
            ]
        }
    }
    placement = make_placement(terms=[in_zones(*zones)], tolerations=[tolerate()])
    return make_group(
        make_replica("Master", coordinator=True, placement=placement, template={"spec": {"affinity": affinity}}),
        make_replica("Worker", count=2, gpus=1, placement=placement, template={"spec": {"affinity": affinity}}),
        namespace=NS,
    )


@pytest.mark.parametrize(
    "group, snapshot, allowed, zone, reasons",
    [
        pytest.param(
            lab_job(master=make_placement({ZONE: "zone-b"}), worker=WORKER_AS_WRITTEN),
            LAB,
            False,
            None,
            ["the replicas share no zone: Master is pinned to zone-b, Worker can only run in zone-a"],
            id="coordinator pinned to zone-b, workers only fit zone-a: denied naming both",
        ),
        pytest.param(
            lab_job(master=make_placement(), worker=WORKER_AS_WRITTEN),
            LAB,
            False,
            None,
            ["the replicas share no zone: Master can only run in zone-b, Worker can only run in zone-a"],
            id="the lab as written: the coordinator cannot tolerate the GPU pool, so the group splits",
        ),
        pytest.param(
            lab_job(master=MASTER_PATCHED, worker=WORKER_PATCHED, master_zone_label="zone-a"),
            LAB,
            True,
            "zone-a",
            [],
            id="the lab after the mutating webhook: one zone, open paths",
        ),
        pytest.param(
            lab_job(master=MASTER_PATCHED, worker=WORKER_PATCHED),
            LAB,
            False,
            None,
            ["zone-a: Worker → Master TCP/23456 is blocked"],
            id="pinned to one zone but the static zone-b label keeps the path closed",
        ),
        pytest.param(
            make_group(
                make_replica("Master", coordinator=True, placement=make_placement(tolerations=[tolerate()])),
                make_replica("Worker", count=2, gpus=1, placement=make_placement(tolerations=[tolerate()])),
                namespace=NS,
            ),
            THREE,
            False,
            None,
            [
                "the group can be split across zones (Master can run in zone-a, zone-b, zone-c; Worker can run in "
                "zone-a, zone-c)"
            ],
            id="nothing pins the group: it can be split across zones",
        ),
        pytest.param(
            colocated(("zone-a", "zone-c")),
            THREE,
            True,
            None,
            [],
            id="podAffinity over the zone topology keeps the group together: allowed over its open zones",
        ),
    ],
)
def test_validate(group: JobGroup, snapshot: Snapshot, allowed: bool, zone: str | None, reasons: list[str]) -> None:
    got = engine.validate(group, snapshot, Settings())
    assert (got.allowed, got.zone) == (allowed, zone)
    for fragment in reasons:
        assert any(fragment in r for r in got.reasons), (fragment, got.reasons)
    assert bool(got.reasons) == (not allowed)
    # The structured cause the metrics count (reason="split") agrees with the words.
    assert got.split == any(r.startswith(("the replicas share no zone", "the group can be split")) for r in got.reasons)


def test_validate_only_warns_about_a_gpu_shortfall() -> None:
    placement = make_placement(terms=[in_zones("zone-a")], tolerations=[tolerate()])
    group = make_group(
        make_replica("Master", coordinator=True, placement=placement),
        make_replica("Worker", count=2, gpus=1, placement=placement),
        namespace=NS,
    )
    got = engine.validate(group, THREE, Settings())
    assert (got.allowed, got.zone, got.open_zones) == (True, "zone-a", ("zone-a",))
    assert got.warnings == ("zone-a: needs 2 GPUs (2×1), 1 free",)  # noqa: RUF001
