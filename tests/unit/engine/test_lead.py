"""The lead sentence (engine/lead.py): the verdict an ML engineer understands and the smallest fix."""

from __future__ import annotations

import pytest

from app.config import Settings
from app.engine import lead
from app.engine.decide import decide_fresh
from app.engine.validation import validate_fresh
from tests.builders import (
    make_cnp,
    make_group,
    make_intra_zone_cnp,
    make_namespace,
    make_node,
    make_replica,
    make_snapshot,
)

NS = "research"


def rendezvous_only() -> object:
    """Every pod of the namespace may reach every other, but only on the rendezvous port."""
    return make_cnp(
        "llm-rendezvous-only",
        {
            "endpointSelector": {},
            "ingress": [{"fromEndpoints": [{}], "toPorts": [{"ports": [{"port": "23456", "protocol": "TCP"}]}]}],
        },
        namespace=NS,
    )


def gpu_zones(*zones: str, gpus: int = 8) -> list[object]:
    return [make_node(f"gpu-{z}", zone=z, gpus=gpus) for z in zones]


def worker_group(count: int = 4, gpus: int = 2):  # type: ignore[no-untyped-def]
    return make_group(make_replica("Worker", count=count, gpus=gpus, coordinator=True), namespace=NS)


def test_collectives_blocked_everywhere_name_their_range_and_the_fix() -> None:
    snapshot = make_snapshot(gpu_zones("zone-a", "zone-b"), namespaces=[make_namespace(NS)],
                             policies=[rendezvous_only()])
    got = decide_fresh(worker_group(), snapshot, Settings())
    assert not got.allowed
    assert got.lead == (
        "NCCL/Gloo collective traffic (TCP 32768-60999) between the Worker pods is blocked in every GPU zone: "
        "no rule of CiliumNetworkPolicy research/llm-rendezvous-only allows it (ingress of the Worker pods); "
        "smallest fix: a policy selecting the Worker pods must allow ingress from the Worker pods on TCP 32768-60999"
    )
    # Said once: the reasons the lead states are not listed again after it.
    assert lead.remaining_reasons(got) == []


def test_collectives_partly_open_name_the_open_ports() -> None:
    part = make_cnp(
        "llm-part-of-the-range",
        {
            "endpointSelector": {},
            "ingress": [{"fromEndpoints": [{}],
                         "toPorts": [{"ports": [{"port": "40000", "endPort": 40100, "protocol": "TCP"}]}]}],
        },
        namespace=NS,
    )
    snapshot = make_snapshot(gpu_zones("zone-a"), namespaces=[make_namespace(NS)], policies=[part])
    got = decide_fresh(worker_group(), snapshot, Settings())
    assert got.lead.startswith(
        "NCCL/Gloo collective traffic (TCP 32768-60999) between the Worker pods is blocked in zone-a, "
        "the only zone with GPUs for it: CiliumNetworkPolicy research/llm-part-of-the-range allows them only "
        "40000-40100/TCP (ingress of the Worker pods)"
    ), got.lead


def test_static_label_hint_is_the_fix_and_both_directions_are_one_finding() -> None:
    master = make_replica("Master", labels={"zone": "zone-b"}, coordinator=True)
    worker = make_replica("Worker", count=2, gpus=2, labels={"zone": "zone-a"})
    nodes = [*gpu_zones("zone-a"), make_node("cpu-b", zone="zone-b")]
    snapshot = make_snapshot(nodes, namespaces=[make_namespace(NS)],
                             policies=[make_intra_zone_cnp(z, namespace=NS) for z in ("zone-a", "zone-b")])
    got = decide_fresh(make_group(master, worker, namespace=NS), snapshot, Settings())
    assert got.lead.startswith(
        "Rendezvous traffic (TCP 23456) and NCCL/Gloo collective traffic (TCP 32768-60999) between the Worker pods "
        "and the Master pod are blocked in zone-a, the only zone with GPUs for it: "
    )
    assert "CiliumNetworkPolicy research/allow-intra-zone-a" in got.lead
    assert got.lead.endswith(
        "smallest fix: Master carries the static label zone=zone-b, which the policies read: set "
        "zoneIdentityLabel: zone in the topoguard config, or change the label to zone=zone-a"
    )
    assert lead.remaining_reasons(got) == []


def test_gpu_shortfall_leads_with_capacity_and_how_to_wait() -> None:
    snapshot = make_snapshot(gpu_zones("zone-a", gpus=4), namespaces=[make_namespace(NS)])
    got = decide_fresh(worker_group(count=4, gpus=2), snapshot, Settings(capacity_policy="refuse"))
    assert not got.allowed
    assert got.lead.startswith("There are not enough GPUs for the job in any open zone (zone-a: the job needs 8 GPUs")
    assert got.lead.endswith("smallest fix: ask for fewer GPUs, or add GPU nodes the pods can use")


def test_no_gpu_zone_says_so() -> None:
    got = decide_fresh(worker_group(), make_snapshot([make_node("cpu", zone="zone-a")]), Settings())
    assert got.lead.startswith("No zone can run the job's GPU pods: ")


@pytest.mark.parametrize("decide", [decide_fresh, validate_fresh], ids=["mutate", "validate"])
def test_an_admitted_job_leads_with_its_zone(decide) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot(gpu_zones("zone-a"), namespaces=[make_namespace(NS)])
    got = decide(worker_group(count=2), snapshot, Settings())
    assert got.allowed
    assert got.lead.startswith("The job goes to zone-a: all ") or got.lead.startswith("The job as written")
