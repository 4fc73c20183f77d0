"""capacityPolicy and the zone ranking: fits now, then fits once running work ends, then most free."""

from __future__ import annotations

from typing import Any

import pytest

from app import engine
from app.config import Settings
from app.models.cluster import Snapshot
from app.models.decision import Decision
from app.models.job import JobGroup
from tests.builders import (
    GPU,
    make_ccnp,
    make_group,
    make_namespace,
    make_node,
    make_placement,
    make_pod,
    make_replica,
    make_snapshot,
    tolerate,
)

NS = "ml"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
QUARANTINE_C = make_ccnp(
    "zone-c-quarantine", {"endpointSelector": {"matchLabels": {"zone": "zone-c"}}, "ingressDeny": [
        {"fromEntities": ["cluster"]}]}
)


def cluster(busy: dict[str, int] | None = None, policies: list[Any] | None = None) -> Snapshot:
    """zone-a: two 8-GPU nodes, zone-c: one 8-GPU node; `busy` maps a node to the GPUs running pods hold."""
    nodes = [
        make_node("a100-a-1", zone="zone-a", gpus=8, taints=[GPU_TAINT]),
        make_node("a100-a-2", zone="zone-a", gpus=8, taints=[GPU_TAINT]),
        make_node("a100-c-1", zone="zone-c", gpus=8, taints=[GPU_TAINT]),
    ]
    pods = [make_pod(f"busy-{n}", namespace=NS, node=n, gpus=g) for n, g in (busy or {}).items()]
    return make_snapshot(nodes, pods=pods, namespaces=[make_namespace(NS)], policies=policies or [])


def job(workers: int, gpus: int) -> JobGroup:
    worker = make_replica("Worker", count=workers, gpus=gpus, placement=make_placement(tolerations=[tolerate()]))
    return make_group(make_replica("Master", coordinator=True), worker, namespace=NS)


FULL = {"a100-a-1": 8, "a100-a-2": 8, "a100-c-1": 8}


def outcome(decision: Decision) -> dict[str, Any]:
    return {
        "allowed": decision.allowed,
        "zone": decision.zone,
        "capacity": decision.capacity,
        "zones": {z.zone: (z.capacity, z.eligible) for z in decision.zones},
    }


@pytest.mark.parametrize(
    "group, snapshot, settings, want",
    [
        pytest.param(
            job(2, 2), cluster(), Settings(),
            {"allowed": True, "zone": "zone-a", "capacity": "now",
             "zones": {"zone-a": ("now", True), "zone-c": ("now", True)}},
            id="an idle cluster: most free among zones that fit now",
        ),
        pytest.param(
            job(2, 2), cluster({"a100-a-1": 8, "a100-a-2": 6}), Settings(),
            {"allowed": True, "zone": "zone-c", "capacity": "now",
             "zones": {"zone-a": ("wait", True), "zone-c": ("now", True)}},
            id="a zone that fits now beats one with more GPUs where the job would wait",
        ),
        pytest.param(
            job(3, 1), cluster(FULL, [QUARANTINE_C]), Settings(zone_identity_label="zone"),
            {"allowed": True, "zone": "zone-a", "capacity": "wait",
             "zones": {"zone-a": ("wait", True), "zone-c": ("wait", False)}},
            id="a full cluster: the job waits in the open zone instead of being refused",
        ),
        pytest.param(
            job(3, 1), cluster(FULL, [QUARANTINE_C]), Settings(zone_identity_label="zone", capacity_policy="refuse"),
            {"allowed": False, "zone": None, "capacity": "",
             "zones": {"zone-a": ("wait", False), "zone-c": ("wait", False)}},
            id="capacityPolicy refuse keeps round 1: no free GPUs now, refused",
        ),
        pytest.param(
            job(1, 8), cluster({"a100-a-1": 4, "a100-a-2": 4, "a100-c-1": 8}), Settings(),
            {"allowed": True, "zone": "zone-a", "capacity": "wait",
             "zones": {"zone-a": ("wait", True), "zone-c": ("wait", True)}},
            id="waiting: the zone with most free GPUs (8 over two nodes) although no node has 8 free",
        ),
        pytest.param(
            job(3, 8), cluster(), Settings(),
            {"allowed": False, "zone": None, "capacity": "",
             "zones": {"zone-a": ("never", False), "zone-c": ("never", False)}},
            id="no zone could ever hold 24 GPUs: refused even under wait",
        ),
        pytest.param(
            job(2, 8), cluster(FULL, [QUARANTINE_C]), Settings(zone_identity_label="zone"),
            {"allowed": True, "zone": "zone-a", "capacity": "wait",
             "zones": {"zone-a": ("wait", True), "zone-c": ("never", False)}},
            id="zone-c could never hold 16 GPUs and is blocked anyway; zone-a could once it drains",
        ),
        pytest.param(
            job(1, 8), cluster(FULL), Settings(zone_strategy="binpack"),
            {"allowed": True, "zone": "zone-a", "capacity": "wait",
             "zones": {"zone-a": ("wait", True), "zone-c": ("wait", True)}},
            id="binpack orders the zones that fit now; waiting jobs still go where most is free (0 = 0: by name)",
        ),
    ],
)
def test_capacity_ranking(group: JobGroup, snapshot: Snapshot, settings: Settings, want: dict[str, Any]) -> None:
    assert outcome(engine.decide(group, snapshot, settings)) == want


def test_a_waiting_job_says_so_in_the_annotation_and_a_warning() -> None:
    decision = engine.decide(job(3, 1), cluster(FULL, [QUARANTINE_C]), Settings(zone_identity_label="zone"))

    assert decision.summary.endswith(" network=allow capacity=wait")
    assert any("zone-a: needs 3 GPUs" in w and "capacity=wait" in w for w in decision.warnings)


def test_a_job_that_fits_now_says_capacity_now_and_gets_no_capacity_warning() -> None:
    decision = engine.decide(job(2, 2), cluster(), Settings())

    assert decision.summary.endswith(" capacity=now")
    assert not any("capacity=" in w for w in decision.warnings)


def test_a_suspended_job_is_placed_by_total_allocatable() -> None:
    # zone-c has its 8 GPUs free, zone-a has none free but 16 allocatable: a job waiting in a queue is
    # judged on what each zone has, not on what is free at this moment.
    snapshot = cluster({"a100-a-1": 8, "a100-a-2": 8})
    running = engine.decide(job(2, 2), snapshot, Settings())
    queued = engine.decide(job(2, 2), snapshot, Settings(), suspended=True)

    assert (running.zone, running.capacity) == ("zone-c", "now")
    assert (queued.zone, queued.capacity) == ("zone-a", "wait")


def test_a_suspended_job_is_admitted_under_refuse_when_some_zone_could_hold_it() -> None:
    decision = engine.decide(job(2, 2), cluster(FULL), Settings(capacity_policy="refuse"), suspended=True)

    assert decision.allowed


def test_validate_warns_of_a_wait_and_admits() -> None:
    pinned = make_placement({"topology.kubernetes.io/zone": "zone-c"}, tolerations=[tolerate()])
    worker = make_replica("Worker", count=2, gpus=2, placement=pinned)
    group = make_group(make_replica("Master", coordinator=True, placement=pinned), worker, namespace=NS)

    decision = engine.validate(group, cluster(FULL), Settings())

    assert decision.allowed
    assert decision.capacity == "wait"
    assert any(w.startswith("zone-c: needs 4 GPUs") for w in decision.warnings)


def test_a_missing_gpu_toleration_names_the_extended_resource_toleration_key() -> None:
    bare = make_replica("Worker", count=2, gpus=2)
    group = make_group(make_replica("Master", coordinator=True), bare, namespace=NS)

    refused = engine.decide(group, cluster(), Settings())
    plugged = engine.decide(group, cluster(), Settings(extended_resource_toleration=True))

    assert not refused.allowed
    assert any("extendedResourceToleration: true" in r for r in refused.reasons)
    assert (plugged.allowed, plugged.zone) == (True, "zone-a")
    assert "Worker" not in plugged.tolerations  # the apiserver adds it to the pods; the template stays
