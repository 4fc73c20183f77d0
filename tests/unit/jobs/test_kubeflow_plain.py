"""The one-pass kubeflow reader gives exactly the group of the field-by-field one.

`parse_job` reads a kubeflow.org job written the usual way with `kubeflow_plain.read_plain` and
leaves any other to `kubeflow.parse`, the field-by-field reader, which is the reference here. The
properties:

- a usual job (every fixture, the bench job) is read in one pass, and `parse_job` does not fall
  back for it;
- whenever the one-pass reader answers, the field-by-field reader gives the same group: equal,
  the same repr (so every dict in the same key order), the same records' instance dicts, and the
  same dicts fresh, shared with the job or shared within the group;
- `parse_job` gives what the reference gives, group or errors, for any job.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app import jobs
from app.config import Limits
from app.jobs import kubeflow, kubeflow_plain
from app.models.job import JobGroup
from app.models.network import EPHEMERAL_PORTS
from tests.unit.jobs.builders import (
    FIXTURES,
    GPU,
    GPU_RESOURCES,
    container,
    kubeflow_job,
    load_fixture,
    replica,
    template,
)
from tests.unit.jobs.strategies import LEAVES, json_values, mutated

V2 = "kubeflow.org/v2beta1"
REVIEW = Path(__file__).parents[2] / "data" / "reviews" / "lab-pytorchjob-create.json"
TOLERATE_GPUS = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]


def bench_job() -> dict[str, Any]:
    """The shape of the bench job (/tmp/prof/review.json): Master + 15 Workers x 4 GPUs, kubectl-applied."""
    master = template(container("pytorch", requests={"cpu": "16"}), labels={"app": "llm", "role": "coordinator"})
    worker = template(container("pytorch", gpus=4), labels={"app": "llm", "role": "worker"}, tolerations=TOLERATE_GPUS)
    doc = kubeflow_job("PyTorchJob", {"Master": replica(master, 1), "Worker": replica(worker, 15)}, name="llm")
    doc["metadata"]["labels"] = {"app": "llm", "team": "research"}
    doc["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(doc)}
    doc["metadata"]["managedFields"] = [{"manager": "kubectl-client-side-apply", "operation": "Update"}]
    return doc


def _review_job() -> dict[str, Any]:
    doc = json.loads(REVIEW.read_text())["request"]["object"]
    assert isinstance(doc, dict)
    return doc


FIXTURE_JOBS = {p.stem: load_fixture(p.name) for p in sorted(FIXTURES.glob("*.yaml"))}
GPU_WORKER = replica(template(container("main", gpus=2)), 3)
CPU_WORKER = replica(template(container("main")), 2)
# Usual jobs of every kind and feature the one-pass reader covers.
USUAL = {
    "bench": bench_job(),
    "lab review": _review_job(),
    **{name: doc for name, doc in FIXTURE_JOBS.items() if (doc["apiVersion"], doc["kind"]) in kubeflow.FRAMEWORKS},
    "pytorch worker only": kubeflow_job("PyTorchJob", {"Worker": GPU_WORKER}),
    "pytorch lower-case keys": kubeflow_job("PyTorchJob", {"worker": GPU_WORKER, "master": replica()}),
    "pytorch elastic rdzvPort": kubeflow_job(
        "PyTorchJob", {"Worker": GPU_WORKER}, elasticPolicy={"rdzvPort": 29400, "minReplicas": 1}
    ),
    "pytorch elastic rdzvHost": kubeflow_job(
        "PyTorchJob", {"Worker": GPU_WORKER}, elasticPolicy={"rdzvHost": "etcd", "rdzvBackend": "etcd"}
    ),
    "pytorch named port": kubeflow_job(
        "PyTorchJob",
        {"Master": replica(template(container("pytorch", ports=[{"containerPort": 3000, "name": "pytorchjob-port"}])))},
    ),
    "pytorch generateName": {
        **kubeflow_job("PyTorchJob", {"Worker": CPU_WORKER}),
        "metadata": {"generateName": "train-"},
    },
    "pytorch no pods": kubeflow_job("PyTorchJob", {"Master": replica(None, 0), "Worker": replica(None, 0)}),
    "tf all kinds": kubeflow_job(
        "TFJob",
        {"Chief": replica(), "PS": CPU_WORKER, "Worker": GPU_WORKER, "Evaluator": replica(), "Custom": CPU_WORKER},
    ),
    "tf cpu only": kubeflow_job("TFJob", {"PS": CPU_WORKER, "Worker": CPU_WORKER}),
    "xgboost": kubeflow_job("XGBoostJob", {"Master": replica(), "Worker": CPU_WORKER}),
    "paddle collective": kubeflow_job("PaddleJob", {"Worker": GPU_WORKER}),
    "jax": kubeflow_job("JAXJob", {"Worker": GPU_WORKER}, namespace=None),
    "mpi v1": kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": GPU_WORKER}),
    "mpi v1 launcher account": kubeflow_job(
        "MPIJob", {"Launcher": replica(template(container(), serviceAccountName="mpi")), "Worker": GPU_WORKER}
    ),
    "mpi v1 launcher deprecated account": kubeflow_job(
        "MPIJob", {"Launcher": replica(template(container(), serviceAccount="mpi")), "Worker": GPU_WORKER}
    ),
    "mpi v1 default workers": kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": {}}),
    "mpi v2": kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": GPU_WORKER, "Other": {}}, api_version=V2),
    "mpi v2 launcher works": kubeflow_job(
        "MPIJob", {"Launcher": replica(), "Worker": GPU_WORKER}, api_version=V2, runLauncherAsWorker=True
    ),
    "keys to escape": kubeflow_job("TFJob", {"a/b~c": CPU_WORKER, "Worker": CPU_WORKER}, name="a/b"),
}

KEYS = st.sampled_from(
    [
        *("metadata", "name", "generateName", "namespace", "annotations", "labels", "spec", "template"),
        *("replicas", "Master", "master", "Worker", "Launcher", "PS", "Chief", "Other", "pytorchReplicaSpecs"),
        *("elasticPolicy", "rdzvPort", "rdzvHost", "runLauncherAsWorker", "containers", "ports", "containerPort"),
        *("resources", "limits", "requests", GPU, "serviceAccountName", "serviceAccount", "hostNetwork"),
        *("tolerations", "nodeSelector", "initContainers"),
    ]
)
JSON = json_values(KEYS, LEAVES | st.sampled_from(["Worker", "worker", "a/b", "pytorchjob-port", 29400]))
GPU_CHOICES = st.sampled_from([GPU_RESOURCES, (GPU,), (GPU, GPU), ()])


def _mutated_same_kind(seed: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """`seed` with a subtree or two of its metadata and spec changed (another kind is another adapter's)."""
    head = {"apiVersion": seed["apiVersion"], "kind": seed["kind"]}
    body = {k: v for k, v in seed.items() if k not in head}
    return mutated([body], KEYS, JSON).map(lambda changed: {**head, **changed})


def _framework(doc: dict[str, Any]) -> kubeflow.Framework:
    return kubeflow.FRAMEWORKS[(doc["apiVersion"], doc["kind"])]


def _reference(doc: Any, gpu_resources: tuple[str, ...]) -> Any:
    try:
        return kubeflow.parse(doc, _framework(doc), gpu_resources=gpu_resources, namespace="ml",
                              collective_ports=EPHEMERAL_PORTS)
    except jobs.InvalidJobError as e:
        return ("invalid", e.errors)


def _containers(node: Any, path: str, skip: set[int]) -> Iterator[tuple[str, Any]]:
    """(path, object) for every dict and list under `node`; not below those whose id is in `skip`."""
    if isinstance(node, dict | list):
        yield path, node
        if id(node) in skip:
            return
    if dataclasses.is_dataclass(node):
        children: Any = [(f.name, getattr(node, f.name)) for f in dataclasses.fields(node)]
    elif isinstance(node, dict):
        children = node.items()
    elif isinstance(node, list | tuple):
        children = enumerate(node)
    else:
        return
    for key, child in children:
        yield from _containers(child, f"{path}.{key}", skip)


def _sharing(group: JobGroup, job: dict[str, Any]) -> list[tuple[str, str]]:
    """Each dict and list of the group: the job's own (its path there), one met before in the group, or new."""
    in_job = {id(obj): path for path, obj in _containers(job, "job", set())}
    seen: dict[int, str] = {}
    out = []
    for path, obj in _containers(group, "group", set(in_job)):
        out.append((path, in_job.get(id(obj)) or seen.get(id(obj)) or "new"))
        seen.setdefault(id(obj), path)
    return out


def _instance_dicts(node: Any) -> list[list[str]]:
    """The attribute names, in order, of every record in the group."""
    if dataclasses.is_dataclass(node):
        return [
            list(vars(node)),
            *(d for f in dataclasses.fields(node) for d in _instance_dicts(getattr(node, f.name))),
        ]
    if isinstance(node, tuple):
        return [d for item in node for d in _instance_dicts(item)]
    return []


def _assert_same_group(fast: Any, reference: Any, job: dict[str, Any]) -> None:
    assert isinstance(reference, JobGroup), reference
    assert type(fast) is JobGroup
    assert repr(fast) == repr(reference)
    assert fast == reference
    assert _instance_dicts(fast) == _instance_dicts(reference)
    assert _sharing(fast, job) == _sharing(reference, job)


@pytest.mark.parametrize("doc", USUAL.values(), ids=USUAL.keys())
def test_usual_job_is_read_in_one_pass_to_the_reference_group(doc: dict[str, Any]) -> None:
    fast = kubeflow_plain.read_plain(doc, _framework(doc), GPU_RESOURCES, "ml", EPHEMERAL_PORTS)
    assert fast is not None
    _assert_same_group(fast, _reference(doc, GPU_RESOURCES), doc)


@pytest.mark.parametrize("doc", USUAL.values(), ids=USUAL.keys())
def test_parse_job_reads_a_usual_job_without_the_field_by_field_reader(
    doc: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _reference(doc, GPU_RESOURCES)

    def fail(*args: Any, **kwargs: Any) -> JobGroup:
        raise AssertionError("fell back to kubeflow.parse")

    monkeypatch.setattr(kubeflow, "parse", fail)
    assert jobs.parse_job(doc, gpu_resources=GPU_RESOURCES, namespace="ml") == want


def _with(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


WORKER = ("spec", "pytorchReplicaSpecs", "Worker")
# Both replicas on Paddle's default port, named as PyTorch names it: the same replicas and ports
# to either framework, but the rendezvous port's name differs (pytorchjob-port; master).
ON_PADDLE_PORT = {
    key: replica(template(container("pytorch", ports=[{"containerPort": 36543, "name": "pytorchjob-port"}])), n)
    for key, n in (("Master", 1), ("Worker", 2))
}
# Jobs one after the other that differ only in what the flows depend on: each gets its own flows.
FLOW_SHAPES = [
    bench_job(),
    _with(bench_job(), (*WORKER, "replicas"), 1),
    _with(bench_job(), (*WORKER, "replicas"), 0),
    _with(bench_job(), (*WORKER, "template", "spec", "containers"), [container("pytorch")]),
    _with(bench_job(), ("spec", "elasticPolicy"), {"rdzvPort": 29400}),
    _with(bench_job(), ("spec", "elasticPolicy"), {"rdzvHost": "etcd"}),
    kubeflow_job("PaddleJob", bench_job()["spec"]["pytorchReplicaSpecs"], name="llm"),
    kubeflow_job("PyTorchJob", ON_PADDLE_PORT),
    kubeflow_job("PaddleJob", ON_PADDLE_PORT),
    bench_job(),
]


def test_flows_follow_each_shape_of_job_in_turn() -> None:
    for doc in FLOW_SHAPES:
        fast = kubeflow_plain.read_plain(doc, _framework(doc), GPU_RESOURCES, "ml", EPHEMERAL_PORTS)
        reference = _reference(doc, GPU_RESOURCES)
        assert fast is not None
        assert fast.flows == reference.flows


BENCH = bench_job()
SPECS = ("spec", "pytorchReplicaSpecs")
# Each thing the one-pass reader checks, written otherwise: all but the last two are errors.
NOT_PLAIN = {
    "metadata not an object": _with(BENCH, ("metadata",), []),
    "name not a string": _with(BENCH, ("metadata", "name"), 1),
    "no name": _with(BENCH, ("metadata", "name"), ""),
    "generateName not a string": {**BENCH, "metadata": {"generateName": 1}},
    "namespace not a string": _with(BENCH, ("metadata", "namespace"), ["ml"]),
    "annotation not a string": _with(BENCH, ("metadata", "annotations"), {"a": 1}),
    "no spec": _with(BENCH, ("spec",), None),
    "replica map not an object": _with(BENCH, SPECS, []),
    "replica map empty": _with(BENCH, SPECS, {}),
    "empty replica type": _with(BENCH, (*SPECS, ""), {}),
    "unknown replica type": _with(BENCH, (*SPECS, "PS"), {}),
    "replica types equal but for case": _with(BENCH, (*SPECS, "worker"), {}),
    "replica spec not an object": _with(BENCH, WORKER, []),
    "negative replicas": _with(BENCH, (*WORKER, "replicas"), -1),
    "boolean replicas": _with(BENCH, (*WORKER, "replicas"), True),
    "replicas as text": _with(BENCH, (*WORKER, "replicas"), "2"),
    "template not plain": _with(BENCH, (*WORKER, "template", "spec", "hostNetwork"), "yes"),
    "elasticPolicy not an object": _with(BENCH, ("spec", "elasticPolicy"), "etcd"),
    "rdzvPort 0": _with(BENCH, ("spec", "elasticPolicy"), {"rdzvPort": 0}),
    "rdzvPort boolean": _with(BENCH, ("spec", "elasticPolicy"), {"rdzvPort": True}),
    "rdzvHost not a string": _with(BENCH, ("spec", "elasticPolicy"), {"rdzvHost": 1}),
    "xgboost without master": kubeflow_job("XGBoostJob", {"Worker": CPU_WORKER}),
    "mpi v2 without known types": kubeflow_job("MPIJob", {"Other": {}}, api_version=V2),
    "valid: null replica spec": _with(BENCH, WORKER, None),
    "valid: init container": _with(BENCH, (*WORKER, "template", "spec", "initContainers"), [container("init")]),
}


@pytest.mark.parametrize(("case", "doc"), NOT_PLAIN.items(), ids=NOT_PLAIN.keys())
def test_job_written_otherwise_is_left_to_the_field_by_field_reader(case: str, doc: dict[str, Any]) -> None:
    assert kubeflow_plain.read_plain(doc, _framework(doc), GPU_RESOURCES, "ml", EPHEMERAL_PORTS) is None
    assert isinstance(_reference(doc, GPU_RESOURCES), JobGroup) == case.startswith("valid")


UNLIMITED = Limits(pods_per_replica_type=2**62, pods_per_job=2**62, replica_types_per_job=2**31,
                   policy_index_values_per_job=2**31)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(list(USUAL.values())).flatmap(_mutated_same_kind), GPU_CHOICES)
def test_one_pass_reader_answers_only_with_the_reference_group(doc: Any, gpu_resources: tuple[str, ...]) -> None:
    reference = _reference(doc, gpu_resources)
    fast = kubeflow_plain.read_plain(doc, _framework(doc), gpu_resources, "ml", EPHEMERAL_PORTS)
    event("one pass" if fast is not None else "field by field")
    if fast is not None:
        _assert_same_group(fast, reference, doc)
    try:
        # No job limits: this is about the reader, and the mutations may write any replica count.
        got = jobs.parse_job(doc, gpu_resources=gpu_resources, namespace="ml", limits=UNLIMITED)
    except jobs.InvalidJobError as e:
        got = ("invalid", e.errors)
    assert repr(got) == repr(reference)
