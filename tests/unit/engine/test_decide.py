"""The mutating decision (engine.decide): candidate zones, capacity, flows per zone, pins, strategies.

Each case is one call on a group built with tests.builders and a snapshot, evaluated with the real
policy evaluator; the assertion covers every field of the Decision that the engine computes itself
(zone table, choice, tolerations, labels, open zones) plus the reasons.
"""

from __future__ import annotations

from typing import Any

import pytest

from app import engine, jobs
from app.config import Settings
from app.engine.decide import start_run
from app.models.cluster import Snapshot
from app.models.decision import Decision
from app.models.job import JobGroup
from tests.builders import (
    GPU,
    GPU_TAINT,
    make_ccnp,
    make_cnp,
    make_group,
    make_intra_zone_cnp,
    make_namespace,
    make_node,
    make_placement,
    make_pod,
    make_replica,
    make_snapshot,
    make_template,
    rendezvous,
    tolerate,
)

ZONE = "topology.kubernetes.io/zone"
NS = "ml"
LAB_TAINT = {"key": "gpu", "value": "present", "effect": "NoSchedule"}
LAB_TOLERATION = {"key": "gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION_ADDED = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}


def lab_policies() -> list[Any]:
    """The seed lab's three CNPs (ram2valar/kubeflow-cilium-lab topology-network-policy.yaml)."""

    gpu = make_cnp(
        "deny-cross-zone-gpu-traffic",
        {
            "endpointSelector": {"matchLabels": {"role": "gpu-worker"}},
            "egress": [{"toEndpoints": [{"matchLabels": {"zone": "zone-a"}}]}],
        },
        namespace=NS,
    )
    return [make_intra_zone_cnp("zone-a", namespace=NS), make_intra_zone_cnp("zone-b", namespace=NS), gpu]


LAB = make_snapshot(
    [
        make_node("gpu-a-1", zone="zone-a", gpus=4, labels={"gpu": "true"}, taints=[LAB_TAINT]),
        make_node("gpu-a-2", zone="zone-a", gpus=4, labels={"gpu": "true"}, taints=[LAB_TAINT]),
        make_node("cpu-b-1", zone="zone-b", labels={"gpu": "false"}),
        make_node("cpu-b-2", zone="zone-b", labels={"gpu": "false"}),
    ],
    namespaces=[make_namespace(NS)],
    policies=lab_policies(),
)


def lab_group(master_placement: Any = None) -> JobGroup:
    return make_group(
        make_replica(
            "Master", coordinator=True, labels={"role": "coordinator", "zone": "zone-b"}, placement=master_placement
        ),
        make_replica(
            "Worker",
            count=4,
            gpus=1,
            labels={"role": "gpu-worker", "zone": "zone-a"},
            placement=make_placement({"gpu": "true"}, tolerations=[LAB_TOLERATION]),
        ),
        namespace=NS,
    )


def three_zones(pods: list[Any] | None = None, policies: list[Any] | None = None) -> Snapshot:
    """zone-a: two 8-GPU nodes, zone-c: one 8-GPU node, zone-b: CPU only; GPU nodes carry the NVIDIA taint."""
    return make_snapshot(
        [
            make_node("a100-a-1", zone="zone-a", gpus=8, taints=[GPU_TAINT]),
            make_node("a100-a-2", zone="zone-a", gpus=8, taints=[GPU_TAINT]),
            make_node("a100-c-1", zone="zone-c", gpus=8, taints=[GPU_TAINT]),
            make_node("cpu-b-1", zone="zone-b"),
        ],
        pods=pods or [],
        namespaces=[make_namespace(NS)],
        policies=policies or [],
    )


def torch(workers: int = 2, gpus: int = 2, worker_placement: Any = None, master_placement: Any = None) -> JobGroup:
    return make_group(
        make_replica("Master", coordinator=True, placement=master_placement),
        make_replica(
            "Worker", count=workers, gpus=gpus, placement=worker_placement or make_placement(tolerations=[tolerate()])
        ),
        namespace=NS,
    )


def tf(workers: int = 2) -> JobGroup:
    return make_group(
        make_replica("Chief", coordinator=True),
        make_replica("PS"),
        make_replica("Worker", count=workers, gpus=2, placement=make_placement(tolerations=[tolerate()])),
        namespace=NS,
    )


def table(decision: Decision) -> dict[str, Any]:
    """Everything the engine decides itself (flow verdict texts come from the policy evaluator)."""
    return {
        "allowed": decision.allowed,
        "zone": decision.zone,
        "zones": {
            z.zone: (z.gpu_nodes, z.gpus_free, z.gpus_needed, z.fits, z.network, z.eligible) for z in decision.zones
        },
        "tolerations": {k: [dict(t) for t in v] for k, v in decision.tolerations.items()},
        "labels": dict(decision.labels),
        "open_zones": decision.open_zones,
    }


def denied(zones: dict[str, tuple[int, int, int, bool, str, bool]]) -> dict[str, Any]:
    return {"allowed": False, "zone": None, "zones": zones, "tolerations": {}, "labels": {}, "open_zones": ()}


def rendezvous_only() -> JobGroup:
    group = torch()
    return make_group(*group.replicas, namespace=NS, flows=[rendezvous("Worker", "Master")])


L7_MASTER = make_cnp(
    "l7-master",
    {
        "endpointSelector": {"matchLabels": {"training.kubeflow.org/replica-type": "master"}},
        "ingress": [
            {"toPorts": [{"ports": [{"port": "23456", "protocol": "TCP"}], "rules": {"http": [{"method": "GET"}]}}]}
        ],
    },
    namespace=NS,
)

QUARANTINE_PS_IN_ZONE_A = make_cnp(
    "quarantine-ps",
    {
        "endpointSelector": {"matchLabels": {"zone": "zone-a", "training.kubeflow.org/replica-type": "ps"}},
        "ingressDeny": [{"fromEndpoints": [{}]}],
    },
    namespace=NS,
)

CASES = [
    pytest.param(
        lab_group(),
        LAB,
        Settings(zone_identity_label="zone"),
        {
            "allowed": True,
            "zone": "zone-a",
            "zones": {"zone-a": (2, 8, 4, True, "allow", True)},
            "tolerations": {"Master": [LAB_TOLERATION]},
            "labels": {"zone": "zone-a"},
            "open_zones": ("zone-a",),
        },
        [],
        id="lab: pins to zone-a, sets the identity label, the coordinator tolerates the GPU pool",
    ),
    pytest.param(
        lab_group(),
        LAB,
        Settings(),
        denied({"zone-a": (2, 8, 4, True, "deny", False)}),
        [
            "zone-a: Master carries the static label zone=zone-b, which the policies read: set zoneIdentityLabel: "
            "zone in the topoguard config, or change the label to zone=zone-a",
            "zone-a: Worker → Master TCP/23456 is blocked",
        ],
        id="lab without zoneIdentityLabel: the static zone-b label blocks the path, with the fix",
    ),
    pytest.param(
        lab_group(make_placement({ZONE: "zone-b"})),
        LAB,
        Settings(zone_identity_label="zone"),
        denied({"zone-a": (2, 8, 4, False, "allow", False)}),
        [
            "the replicas share no zone: Master is pinned to zone-b, Worker can only run in zone-a",
            "zone-a: Master cannot run here: its nodeSelector topology.kubernetes.io/zone=zone-b matches no node",
        ],
        id="coordinator pinned away from the only GPU zone: denied naming both zones",
    ),
    pytest.param(
        torch(),
        three_zones(),
        Settings(),
        {
            "allowed": True,
            "zone": "zone-a",
            "zones": {"zone-a": (2, 16, 4, True, "allow", True), "zone-c": (1, 8, 4, True, "allow", True)},
            "tolerations": {"Master": [GPU_TOLERATION_ADDED]},
            "labels": {},
            "open_zones": ("zone-a", "zone-c"),
        },
        [],
        id="most-free picks the zone with the most free GPUs; a CPU-only zone is no candidate",
    ),
    pytest.param(
        torch(),
        three_zones(),
        Settings(zone_strategy="binpack"),
        {
            "allowed": True,
            "zone": "zone-c",
            "zones": {"zone-a": (2, 16, 4, True, "allow", True), "zone-c": (1, 8, 4, True, "allow", True)},
            "tolerations": {"Master": [GPU_TOLERATION_ADDED]},
            "labels": {},
            "open_zones": ("zone-a", "zone-c"),
        },
        [],
        id="binpack picks the zone with the fewest free GPUs that still fits",
    ),
    pytest.param(
        torch(),
        three_zones(
            pods=[
                make_pod("busy-1", namespace=NS, node="a100-a-1", gpus=8),
                make_pod("busy-2", namespace=NS, node="a100-a-2", gpus=6),
                make_pod("finished", namespace=NS, node="a100-c-1", gpus=8, phase="Succeeded"),
            ]
        ),
        Settings(capacity_policy="refuse"),
        {
            "allowed": True,
            "zone": "zone-c",
            "zones": {"zone-a": (2, 2, 4, False, "allow", False), "zone-c": (1, 8, 4, True, "allow", True)},
            "tolerations": {"Master": [GPU_TOLERATION_ADDED]},
            "labels": {},
            "open_zones": ("zone-c",),
        },
        [],
        id="capacity (refuse): running pods hold GPUs, finished pods do not",
    ),
    pytest.param(
        torch(workers=1, gpus=8),
        three_zones(
            pods=[
                make_pod("busy-1", namespace=NS, node="a100-a-1", gpus=4),
                make_pod("busy-2", namespace=NS, node="a100-a-2", gpus=4),
                make_pod("busy-3", namespace=NS, node="a100-c-1", gpus=1),
            ]
        ),
        Settings(capacity_policy="refuse"),
        denied({"zone-a": (2, 8, 8, False, "allow", False), "zone-c": (1, 7, 8, False, "allow", False)}),
        [
            "zone-a: needs 8 GPUs (1×8), 8 free, but they do not fit node by node (at most 4 free on one node)",  # noqa: RUF001
            "zone-c: needs 8 GPUs (1×8), 7 free",  # noqa: RUF001
        ],
        id="per-node fit (refuse): 8 free in zone-a but no node has 8",
    ),
    pytest.param(
        torch(worker_placement=make_placement({ZONE: "zone-c"}, tolerations=[tolerate()])),
        three_zones(),
        Settings(),
        {
            "allowed": True,
            "zone": "zone-c",
            "zones": {"zone-c": (1, 8, 4, True, "allow", True)},
            "tolerations": {"Master": [GPU_TOLERATION_ADDED]},
            "labels": {},
            "open_zones": ("zone-c",),
        },
        [],
        id="the user's own zone pin restricts the candidates",
    ),
    pytest.param(
        torch(worker_placement=make_placement()),
        three_zones(),
        Settings(),
        denied({}),
        [
            "zone-a: Worker cannot run here: it does not tolerate taint nvidia.com/gpu=present:NoSchedule of the "
            "nvidia.com/gpu nodes",
            "zone-c: Worker cannot run here: it does not tolerate taint nvidia.com/gpu=present:NoSchedule of the "
            "nvidia.com/gpu nodes",
        ],
        id="GPU workers that tolerate no GPU node: no candidate zone",
    ),
    pytest.param(
        tf(),
        three_zones(policies=[QUARANTINE_PS_IN_ZONE_A]),
        Settings(zone_identity_label="zone"),
        {
            "allowed": True,
            "zone": "zone-c",
            "zones": {"zone-a": (2, 16, 4, True, "deny", False), "zone-c": (1, 8, 4, True, "allow", True)},
            "tolerations": {"Chief": [GPU_TOLERATION_ADDED], "PS": [GPU_TOLERATION_ADDED]},
            "labels": {"zone": "zone-c"},
            "open_zones": ("zone-c",),
        },
        [],
        id="a zone whose policy blocks a flow is skipped for an open one",
    ),
    pytest.param(
        tf(),
        three_zones(
            policies=[
                QUARANTINE_PS_IN_ZONE_A,
                make_cnp(
                    "quarantine-ps-c",
                    {
                        "endpointSelector": {
                            "matchLabels": {"zone": "zone-c", "training.kubeflow.org/replica-type": "ps"}
                        },
                        "ingressDeny": [{"fromEndpoints": [{}]}],
                    },
                    namespace=NS,
                ),
            ]
        ),
        Settings(zone_identity_label="zone"),
        denied({"zone-a": (2, 16, 4, True, "deny", False), "zone-c": (1, 8, 4, True, "deny", False)}),
        ["zone-a: Chief → PS", "zone-c: Chief → PS", "ml/quarantine-ps"],
        id="every zone blocked: denied naming the flow and the policy per zone",
    ),
    pytest.param(
        rendezvous_only(),
        three_zones(policies=[L7_MASTER]),
        Settings(),
        denied({"zone-a": (2, 16, 4, True, "unknown", False), "zone-c": (1, 8, 4, True, "unknown", False)}),
        [
            "zone-a, zone-c: Worker → Master TCP/23456: ingress cannot be evaluated: CiliumNetworkPolicy "
            "ml/l7-master ingress[0]: ",
        ],
        id="an L7 rule cannot be evaluated: unknown is never a guess, and says so",
    ),
]


@pytest.mark.parametrize("group, snapshot, settings, want, reasons", CASES)
def test_decide(
    group: JobGroup, snapshot: Snapshot, settings: Settings, want: dict[str, Any], reasons: list[str]
) -> None:
    got = engine.decide(group, snapshot, settings)
    assert table(got) == want
    assert list(got.reasons) == sorted(got.reasons)
    for fragment in reasons:
        assert any(fragment in r for r in got.reasons), (fragment, got.reasons)
    assert bool(got.reasons) == (not got.allowed)


def test_unknown_is_worse_than_allow_but_a_deny_elsewhere_wins() -> None:
    got = engine.decide(torch(), three_zones(policies=[L7_MASTER]), Settings())
    verdicts = {(c.flow.src, c.flow.dst, str(c.flow.ports)): c.verdict.verdict for c in got.zones[0].flows}
    # The L7 port cannot be judged; every other port to the Master is default-denied by the same policy.
    assert verdicts[("Worker", "Master", "23456")] == "unknown"
    assert verdicts[("Worker", "Master", "32768-60999")] == "deny"
    assert [z.network for z in got.zones] == ["deny", "deny"]


def test_same_inputs_give_the_same_decision() -> None:
    snapshot = three_zones(policies=[QUARANTINE_PS_IN_ZONE_A])
    settings = Settings(zone_identity_label="zone")
    assert engine.decide(tf(), snapshot, settings) == engine.decide(tf(), snapshot, settings)


def test_prepare_builds_the_zone_index_once() -> None:
    snapshot = three_zones()
    engine.prepare(snapshot, Settings())
    built = dict(snapshot._memo)
    engine.decide(torch(), snapshot, Settings())
    # The indexes prepare() built are the ones decide() used; decide() only adds its decision memo and
    # what the shapes of the jobs it judged share.
    per_job = {"engine.decisions", "engine.shapes"}
    indexes = {k: v for k, v in snapshot._memo.items() if k.startswith("engine.") and k not in per_job}
    assert indexes == {k: v for k, v in built.items() if k.startswith("engine.")}


def index_quarantine(index: int) -> Any:
    return make_cnp(
        "quarantine-worker-3",
        {
            "endpointSelector": {
                "matchLabels": {
                    "training.kubeflow.org/replica-type": "worker",
                    "training.kubeflow.org/replica-index": str(index),
                }
            },
            "ingressDeny": [{"fromEndpoints": [{}]}],
        },
        namespace=NS,
    )


@pytest.mark.parametrize(
    "workers, allowed",
    [
        pytest.param(4, False, id="a policy on replica-index 3 is found by enumerating the indices"),
        pytest.param(3, True, id="with three workers there is no index 3 to block"),
    ],
)
def test_policies_on_the_index_label_enumerate_pods(workers: int, allowed: bool) -> None:
    got = engine.decide(torch(workers=workers, gpus=1), three_zones(policies=[index_quarantine(3)]), Settings())
    assert got.allowed is allowed
    assert any("ml/quarantine-worker-3" in r for r in got.reasons) is not allowed


def test_missing_policy_kinds_are_a_warning() -> None:
    base = three_zones()
    snapshot = Snapshot(nodes=base.nodes, namespaces=base.namespaces, missing_kinds=("CiliumNetworkPolicy",))
    got = engine.decide(torch(), snapshot, Settings())
    assert (got.allowed, got.warnings) == (True, ("the cluster snapshot has no CiliumNetworkPolicy",))


def test_a_policy_on_one_index_of_many_is_found_exactly() -> None:
    got = engine.decide(torch(workers=64, gpus=0), three_zones(policies=[index_quarantine(63)]), Settings())
    assert got.allowed is False
    assert any("ml/quarantine-worker-3" in r for r in got.reasons)
    assert got.warnings == ()


def test_a_thousand_workers_cost_a_few_representatives() -> None:
    run = start_run(torch(workers=1000, gpus=0), three_zones(policies=[index_quarantine(7)]), Settings(), strict=False)
    _, worst = run.checker.check({})
    assert worst == "deny"
    assert [(c.index, c.size) for c in run.checker.classes(run.group.replica("Worker"))] == [(0, 1), (7, 1), (1, 998)]
    # Master → Worker, Worker → Master and Worker → Worker over at most three classes each, two port sets.
    assert len(run.checker.cache) <= 2 * (3 + 3 + 9)


def worker_only_pytorchjob(workers: int) -> dict[str, Any]:
    template = make_template(gpus=1, tolerations=[tolerate()])
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "solo", "namespace": NS},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": workers, "template": template}}},
    }


def role_ingress_deny(role: str) -> Any:
    return make_cnp(
        "no-rendezvous-into-masters",
        {
            "endpointSelector": {"matchLabels": {"training.kubeflow.org/job-role": role}},
            "enableDefaultDeny": {"ingress": False},
            "ingressDeny": [{"fromEndpoints": [{}], "toPorts": [{"ports": [{"port": "23456", "protocol": "TCP"}]}]}],
        },
        namespace=NS,
    )


@pytest.mark.parametrize(
    "role, allowed",
    [
        pytest.param("master", False, id="worker-0 is the coordinator: a deny on job-role=master blocks rendezvous"),
        pytest.param("worker", True, id="no pod carries job-role=worker: the same deny leaves the job open"),
    ],
)
def test_leader_labels_of_a_worker_only_pytorchjob(role: str, allowed: bool) -> None:
    group = jobs.parse_job(worker_only_pytorchjob(4), gpu_resources=[GPU])
    got = engine.decide(group, three_zones(policies=[role_ingress_deny(role)]), Settings())
    assert got.allowed is allowed
    assert any("ml/no-rendezvous-into-masters" in r for r in got.reasons) is not allowed


def host_network_torch() -> JobGroup:
    return make_group(
        make_replica("Master", coordinator=True, host_network=True),
        make_replica("Worker", count=2, gpus=2, host_network=True, placement=make_placement(tolerations=[tolerate()])),
        namespace=NS,
    )


HOST_FIREWALL = make_ccnp("host-fw", {"nodeSelector": {}, "ingress": [{"fromEntities": ["cluster"]}]})


@pytest.mark.parametrize(
    "policies, allowed",
    [
        pytest.param([], True, id="no policies: host traffic is not enforced, allowed"),
        pytest.param([index_quarantine(0)], True, id="pod policies do not apply to hostNetwork pods: allowed"),
        pytest.param([HOST_FIREWALL], False, id="a host policy exists: host ingress is not evaluated, refused"),
    ],
)
def test_host_network_job(policies: list[Any], allowed: bool) -> None:
    got = engine.decide(host_network_torch(), three_zones(policies=policies), Settings())
    assert got.allowed is allowed
    assert all("host-fw" in r and "cannot be evaluated" in r for r in got.reasons)


def test_index_values_that_cannot_be_enumerated_make_the_unchecked_flows_unknown() -> None:
    broken = make_cnp(
        "index-gt",
        {
            "endpointSelector": {"matchExpressions": [{"key": "training.kubeflow.org/replica-index",
                                                       "operator": "Gt", "values": ["3"]}]},
            "ingress": [{}],
        },
        namespace="elsewhere",
    )
    group = make_group(make_replica("Master", coordinator=True), make_replica("Worker", count=40), namespace=NS)
    got = engine.decide(group, three_zones(policies=[broken]), Settings())
    assert got.allowed is False
    assert got.warnings == (
        "Worker has 40 pods and a policy selector uses training.kubeflow.org/replica-index in a way whose values "
        "cannot be enumerated (an operator other than In, NotIn, Exists, DoesNotExist): 32 of them were checked, "
        "the flows of the others cannot be evaluated",
    )
    flow_reasons = [r for r in got.reasons if "→" in r]
    assert flow_reasons and all("32 of them were checked" in r for r in flow_reasons)


def test_zones_without_usable_gpu_nodes_are_listed_as_excluded() -> None:
    got = engine.decide(lab_group(), LAB, Settings(zone_identity_label="zone"))
    assert got.excluded_zones == {"zone-b": ("Worker cannot run here: no Ready, schedulable nvidia.com/gpu node",)}


def test_static_label_hint_when_another_identity_label_is_configured() -> None:
    got = engine.decide(lab_group(), LAB, Settings(zone_identity_label="topology-zone"))
    assert (
        "zone-a: Master carries the static label zone=zone-b, which the policies read: change the label to "
        "zone=zone-a (zoneIdentityLabel is topology-zone, the policies read zone)"
    ) in got.reasons


@pytest.mark.parametrize(
    "settings, open_zones",
    [
        pytest.param(
            Settings(mode="colocate"), ("zone-a", "zone-c"), id="colocate without identity label: every open zone"
        ),
        pytest.param(
            Settings(mode="colocate", zone_identity_label="zone"),
            ("zone-a",),
            id="colocate with an identity label: only the zone whose label the pods carry",
        ),
    ],
)
def test_colocate_open_zones(settings: Settings, open_zones: tuple[str, ...]) -> None:
    got = engine.decide(torch(), three_zones(), settings)
    assert (got.zone, got.open_zones, dict(got.tolerations)) == (
        "zone-a",
        open_zones,
        {"Master": (GPU_TOLERATION_ADDED,)},
    )
