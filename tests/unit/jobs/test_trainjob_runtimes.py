"""TrainJob pods composed from Trainer v2.3.0's own runtimes and examples (fixtures/trainer/).

Every upstream runtime (torch, deepspeed (MPI), jax, xgboost, torchtune, and the runtimes the
examples bring) is composed with every upstream example TrainJob (01-05, its runtimeRef pointed at
that runtime): the replicas are the runtime's replicatedJobs with Trainer's pod counts, the pods carry
the JobSet labels, the flows are the framework's, and the composed pod templates are valid under the
ClusterTrainingRuntime CRD's schema (nothing pruned, no type errors).
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from app import jobs
from app.cache.files import build_snapshot
from app.jobs import jobset, runtimes
from app.jobs.errors import FieldError
from app.models.cluster import TrainingRuntimeInfo
from app.models.job import Flow, JobGroup
from app.models.network import EPHEMERAL_PORTS, PortRange
from tests.unit.crd import structural
from tests.unit.jobs.builders import GPU, GPU_RESOURCES

TRAINER = Path(__file__).resolve().parent / "fixtures" / "trainer"
SCHEMA = Path(__file__).resolve().parents[1] / "crd" / "fixtures" / "schemas" / "clustertrainingruntime-v1alpha1.json"
NS = "ml"
RUNTIME_FILES = ["torch_distributed.yaml", "deepspeed_distributed.yaml", "jax_distributed.yaml",
                 "xgboost_distributed.yaml", "torchtune_llama3_2_1B.yaml", "example-04-volcano-integration.yaml",
                 "example-05-multi-step.yaml"]
EXAMPLE_FILES = ["example-01-multi-node.yaml", "example-02-runtime-patches.yaml", "example-03-kueue-integration.yaml",
                 "example-04-volcano-integration.yaml", "example-05-multi-step.yaml"]


def documents(name: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((TRAINER / name).read_text()) if isinstance(d, dict)]
    for doc in docs:
        if doc["kind"] != "ClusterTrainingRuntime":
            doc["metadata"]["namespace"] = NS
    return docs


@cache
def runtime_objects() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for f in RUNTIME_FILES for d in documents(f) if d["kind"].endswith("Runtime")}


@cache
def cluster_runtimes() -> Any:
    return build_snapshot(list(runtime_objects().values())).training_runtimes


def example_job(name: str, runtime: str) -> dict[str, Any]:
    (job,) = [d for d in documents(name) if d["kind"] == "TrainJob"]
    obj = runtime_objects()[runtime]
    job["spec"]["runtimeRef"] = {"apiGroup": "trainer.kubeflow.org", "kind": obj["kind"], "name": runtime}
    return job


def runtime_info(name: str) -> TrainingRuntimeInfo:
    return next(r for r in cluster_runtimes().values() if r.name == name)


def parse(job: dict[str, Any]) -> JobGroup:
    return jobs.parse_job(job, gpu_resources=GPU_RESOURCES, namespace=NS, runtimes=cluster_runtimes())


CASES = [pytest.param(e, r, id=f"{r} + {e.removesuffix('.yaml')}") for r in runtime_objects() for e in EXAMPLE_FILES]


@pytest.mark.parametrize("example, runtime", CASES)
def test_every_runtime_composes_with_every_example_into_valid_pods(example: str, runtime: str) -> None:
    job = example_job(example, runtime)
    obj = runtime_objects()[runtime]
    info = runtime_info(runtime)
    errors: list[FieldError] = []
    composition = runtimes.compose(job["spec"], info, errors, gpu_resources=GPU_RESOURCES)
    group = parse(job)

    assert errors == []
    rjobs = obj["spec"]["template"]["spec"]["replicatedJobs"]
    assert [r.key for r in group.replicas] == [r["name"] for r in rjobs]
    composed = copy.deepcopy(obj)
    for rjob in composed["spec"]["template"]["spec"]["replicatedJobs"]:
        rjob["template"]["spec"]["template"] = composition.job(rjob["name"]).template  # type: ignore[union-attr]
    assert structural.check(composed, schema()) == structural.Findings()

    nodes = job["spec"]["trainer"]["numNodes"]
    mpi = "mpi" in obj["spec"]["mlPolicy"]
    counts = {r.key: r.count for r in group.replicas}
    if mpi:  # deepspeed: runLauncherAsNode, so the launcher is one of the nodes
        assert counts == {"node": max(nodes - 1, 1), "launcher": 1}
        assert group.coordinator == "launcher"
        assert Flow("launcher", "node", PortRange.single(2222), "TCP", "launcher") in group.flows
    else:
        assert counts["node"] == nodes
        assert all(n == 1 for k, n in counts.items() if k != "node")  # initializers
        assert group.coordinator == "node"
        assert Flow("node", "node", PortRange.single(29500), "TCP", "rendezvous") in group.flows
        assert all("initializer" not in f.src + f.dst for f in group.flows)
    for replica in group.replicas:
        rjob = next(r for r in rjobs if r["name"] == replica.key)
        want = jobset.pod_labels(job["metadata"]["name"], replica.key, rjob.get("replicas", 1), "default")
        assert want.items() <= replica.pod_labels.items()
    patched_sa = example == "example-02-runtime-patches.yaml"
    assert group.replica("node").service_account == ("training-sa" if patched_sa else "default")
    assert group.composed_from.startswith(f"{obj['kind']} ")


@cache
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA.read_text())["openAPIV3Schema"]
    return loaded


def test_deepspeed_runs_its_launcher_as_a_node_and_reaches_the_nodes_over_its_sshd_port() -> None:
    job = example_job("example-01-multi-node.yaml", "deepspeed-distributed")
    job["spec"]["trainer"]["resourcesPerNode"] = {"limits": {GPU: 4}}
    group = parse(job)

    assert [(r.key, r.count, dict(r.gpus), r.is_coordinator) for r in group.replicas] == [
        ("node", 2, {GPU: 4}, False), ("launcher", 1, {GPU: 4}, True),
    ]
    assert set(group.flows) == {
        Flow("launcher", "node", PortRange.single(2222), "TCP", "launcher"),
        Flow("launcher", "node", EPHEMERAL_PORTS, "TCP", "collective"),
        Flow("node", "launcher", EPHEMERAL_PORTS, "TCP", "collective"),
        Flow("node", "node", EPHEMERAL_PORTS, "TCP", "collective"),
    }


def test_torchtune_keeps_the_runtimes_gpus_and_pins_its_initializers_with_the_nodes() -> None:
    group = parse(example_job("example-02-runtime-patches.yaml", "torchtune-llama3.2-1b"))

    assert [(r.key, r.count, dict(r.gpus)) for r in group.replicas] == [
        ("dataset-initializer", 1, {}), ("model-initializer", 1, {}), ("node", 2, {GPU: 2}),
    ]
    node = group.replica("node")
    assert (dict(node.placement.node_selector), node.placement.tolerations) == (
        {"node-type": "training"},
        ({"key": "training-workload", "operator": "Equal", "value": "true", "effect": "NoSchedule"},),
    )
    assert group.composed_from == "ClusterTrainingRuntime torchtune-llama3.2-1b via runtimePatches"


def test_the_runtimes_own_placement_is_what_the_group_starts_from() -> None:
    obj = copy.deepcopy(runtime_objects()["torch-distributed"])
    pod_spec = obj["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod_spec["tolerations"] = [{"key": "pool", "operator": "Exists", "effect": "NoSchedule"}]
    pod_spec["nodeSelector"] = {"pool": "h100"}
    obj["metadata"]["labels"] = {}
    obj["spec"]["podGroupPolicy"] = {"coscheduling": {}}
    job = example_job("example-01-multi-node.yaml", "torch-distributed")
    group = jobs.parse_job(job, gpu_resources=GPU_RESOURCES, namespace=NS,
                           runtimes=build_snapshot([obj]).training_runtimes)

    node = group.replica("node")
    assert (dict(node.placement.node_selector), node.placement.tolerations) == ({"pool": "h100"}, tuple(
        pod_spec["tolerations"]))
    assert node.pod_labels["scheduling.x-k8s.io/pod-group"] == "multi-node-example"
    assert node.seed == {"tolerations": pod_spec["tolerations"]}


@pytest.mark.parametrize(
    "spec, want",
    [
        pytest.param({"runtimeRef": {"name": "nope"}}, "ClusterTrainingRuntime nope", id="cluster runtime"),
        pytest.param({"runtimeRef": {"name": "torch-with-dataset-init"}},
                     "ClusterTrainingRuntime torch-with-dataset-init",
                     id="a namespaced runtime is not a cluster runtime"),
        pytest.param({"runtimeRef": {"name": "torch-distributed", "kind": "TrainingRuntime"}},
                     "TrainingRuntime ml/torch-distributed", id="a cluster runtime is not a namespaced one"),
    ],
)
def test_a_missing_runtime_is_named(spec: dict[str, Any], want: str) -> None:
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "tj"}, "spec": spec}
    with pytest.raises(jobs.MissingRuntimeError) as raised:
        parse(job)
    assert raised.value.ref == want


def test_a_patch_naming_a_job_the_runtime_lacks_is_invalid() -> None:
    job = example_job("example-02-runtime-patches.yaml", "torch-distributed")
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    patch["replicatedJobs"][0]["name"] = "launcher"
    with pytest.raises(jobs.InvalidJobError) as raised:
        parse(job)
    assert [e.message for e in raised.value.errors] == [
        "names replicatedJob 'launcher', which ClusterTrainingRuntime torch-distributed does not have"
    ]


@pytest.mark.parametrize(
    "field, entry, want_sa",
    [
        pytest.param("podTemplateOverrides",
                     {"targetJobs": [{"name": "node"}], "spec": {"serviceAccountName": "v21",
                                                                 "nodeSelector": {"pool": "a"}}},
                     "v21", id="v2.1 podTemplateOverrides"),
        pytest.param("podSpecOverrides",
                     {"targetJobs": [{"name": "node"}], "serviceAccountName": "v20", "nodeSelector": {"pool": "a"}},
                     "v20", id="v2.0 podSpecOverrides"),
    ],
)
def test_older_override_apis_are_composed_and_named(field: str, entry: dict[str, Any], want_sa: str) -> None:
    job = example_job("example-01-multi-node.yaml", "torch-distributed")
    job["spec"][field] = [entry]
    group = parse(job)

    node = group.replica("node")
    assert (node.service_account, dict(node.placement.node_selector)) == (want_sa, {"pool": "a"})
    assert group.composed_from == f"ClusterTrainingRuntime torch-distributed via {field}"
    with pytest.raises(jobs.InvalidJobError, match=r"v2\.0/v2\.1"):
        jobs.prepare_templates(copy.deepcopy(job), group)


@pytest.mark.parametrize(
    "base, patch, want",
    [
        pytest.param({"nodeSelector": {"a": "1"}}, {"nodeSelector": {"b": "2"}}, {"nodeSelector": {"a": "1", "b": "2"}},
                     id="maps merge key by key"),
        pytest.param({"tolerations": [{"key": "a"}]}, {"tolerations": [{"key": "b"}]}, {"tolerations": [{"key": "b"}]},
                     id="tolerations are replaced whole"),
        pytest.param({"containers": [{"name": "node", "image": "x"}, {"name": "side"}]},
                     {"containers": [{"name": "node", "env": [{"name": "A", "value": "1"}]}, {"name": "new"}]},
                     {"containers": [{"name": "node", "image": "x", "env": [{"name": "A", "value": "1"}]},
                                     {"name": "side"}, {"name": "new"}]},
                     id="containers merge by name, new ones are appended"),
        pytest.param({"nodeSelector": {"a": "1", "b": "2"}}, {"nodeSelector": {"a": None}},
                     {"nodeSelector": {"b": "2"}}, id="null deletes a key"),
        pytest.param({"affinity": {"nodeAffinity": {"preferred": [1]}}},
                     {"affinity": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"x": 1}]}}}},
                     {"affinity": {"nodeAffinity": {"preferred": [1], "required": {"nodeSelectorTerms": [{"x": 1}]}}}},
                     id="affinity merges down to its atomic lists"),
    ],
)
def test_merge_strategic_follows_the_pod_specs_patch_strategies(base: Any, patch: Any, want: Any) -> None:
    before = copy.deepcopy(base)
    assert runtimes.merge_strategic(base, patch) == want
    assert base == before
