"""TrainJob: replicas from the trainer fields and runtimePatches, and topoguard's own entry."""

from __future__ import annotations

from typing import Any

import pytest

from app import jobs
from app.jobs import jobset
from app.jobs import trainjob as tjm
from app.models.job import Flow, JobGroup
from app.models.labels import MANAGER_NAME
from app.models.network import EPHEMERAL_PORTS, PortRange
from tests.unit.jobs.builders import GPU, GPU_RESOURCES, runtime_patch, trainjob

TOLERATION = {"key": "training", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
TERM = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h100"]}]}


def parse(raw: dict[str, Any]) -> JobGroup:
    return jobs.parse_job(raw, gpu_resources=GPU_RESOURCES, namespace="ml")


def pod_patch(*, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"spec": spec}
    if labels:
        out["metadata"] = {"labels": labels}
    return out


def our_path(entry: int, slot: int) -> str:
    return (
        f"/spec/runtimePatches/{entry}/trainingRuntimeSpec/template/spec/replicatedJobs/{slot}/template/spec/template"
    )


def test_torch_trainjob_rendezvous_on_29500_between_nodes() -> None:
    group = parse(trainjob(numNodes=4, resourcesPerNode={"limits": {GPU: 8}}))
    node = group.replica("node")
    assert (node.count, dict(node.gpus), node.is_coordinator, node.template_path, node.template) == (
        4,
        {GPU: 8},
        True,
        our_path(0, 0),
        {},
    )
    assert group.flows == (
        Flow("node", "node", PortRange.single(29500), "TCP", "rendezvous"),
        Flow("node", "node", EPHEMERAL_PORTS, "TCP", "collective"),
    )
    assert (group.supports_spread, dict(group.group_selector)) == (False, {tjm.JOBSET_NAME_LABEL: "tj"})


def test_num_nodes_defaults_to_one_and_a_single_node_needs_no_flow() -> None:
    group = parse(trainjob())
    assert (group.replica("node").count, group.flows) == (1, ())


def test_runtime_patches_merge_in_order_like_strategic_merge() -> None:
    patches = [
        runtime_patch(
            "a.io/first",
            {
                "node": pod_patch(
                    labels={"team": "a", "x": "1"}, nodeSelector={"disk": "ssd"}, tolerations=[{"key": "old"}]
                )
            },
        ),
        runtime_patch(
            "b.io/second",
            {
                "node": pod_patch(
                    labels={"x": "2"},
                    nodeSelector={"pool": "gpu"},
                    tolerations=[TOLERATION],
                    serviceAccountName="trainer",
                    affinity={
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [TERM]}
                        }
                    },
                )
            },
        ),
    ]
    node = parse(trainjob(patches=patches)).replica("node")
    assert dict(node.pod_labels) == {"team": "a", "x": "2", **jobset.pod_labels("tj", "node", 1, "default")}
    assert (dict(node.placement.node_selector), node.placement.tolerations, node.placement.node_selector_terms) == (
        {"disk": "ssd", "pool": "gpu"},
        (TOLERATION,),
        (TERM,),
    )
    assert (node.service_account, node.template_path) == ("trainer", our_path(2, 0))


def test_launcher_named_by_a_patch_marks_an_mpi_runtime() -> None:
    group = parse(trainjob(numNodes=2, patches=[runtime_patch("a.io/x", {"launcher": pod_patch()})]))
    assert ([r.key for r in group.replicas], group.coordinator) == (["node", "launcher"], "launcher")
    assert [f for f in group.flows if f.purpose != "collective"] == [
        Flow("launcher", "node", PortRange.single(22), "TCP", "launcher")
    ]
    assert [r.template_path for r in group.replicas] == [our_path(1, 0), our_path(1, 1)]


def test_our_own_entry_is_reused_and_its_template_returned() -> None:
    ours = pod_patch(nodeSelector={"topology.kubernetes.io/zone": "a"})
    patches = [runtime_patch(MANAGER_NAME, {"node": ours}), runtime_patch("a.io/x", {"node": pod_patch()})]
    node = parse(trainjob(patches=patches)).replica("node")
    assert (node.template_path, node.template) == (our_path(0, 0), ours)


@pytest.mark.parametrize(
    "patches, want",
    [
        pytest.param(None, [], id="no patches: no initializer"),
        pytest.param(
            [runtime_patch("a.io/x", {"dataset-initializer": pod_patch()})],
            [("dataset-initializer", 1)],
            id="initializer named by a patch",
        ),
    ],
)
def test_extra_replicated_jobs_only_when_a_patch_proves_them(patches: Any, want: list[tuple[str, int]]) -> None:
    group = parse(trainjob(numNodes=2, patches=patches))
    assert [(r.key, r.count) for r in group.replicas if r.key != "node"] == want
    assert all(f.src == "node" and f.dst == "node" for f in group.flows)
