"""Property tests: parse_job raises nothing but JobError on any JSON, and prepare is idempotent."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import jobs
from tests.unit.jobs.builders import GPU_RESOURCES, container, jobset, kubeflow_job, replica, rjob, template, trainjob

SCALARS = st.none() | st.booleans() | st.integers(-3, 70000) | st.floats(allow_nan=False) | st.text(max_size=6)
KEYS = st.sampled_from(
    [
        "spec",
        "template",
        "replicas",
        "containers",
        "resources",
        "limits",
        "nvidia.com/gpu",
        "ports",
        "containerPort",
        "name",
        "Worker",
        "Master",
        "metadata",
        "labels",
        "tolerations",
        "replicatedJobs",
        "runtimePatches",
        "manager",
        "trainingRuntimeSpec",
        "affinity",
        "nodeSelector",
        "parallelism",
        "numNodes",
        "initContainers",
        "hostNetwork",
    ]
) | st.text(max_size=4)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=25,
)
VALID = [
    kubeflow_job("PyTorchJob", {"Master": replica(template(container("pytorch", gpus=1))), "Worker": replica(None, 2)}),
    kubeflow_job("TFJob", {"PS": replica(), "Worker": replica(template(container()), 2)}),
    kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": replica()}, api_version="kubeflow.org/v2beta1"),
    jobset(rjob("a"), rjob("b", replicas=2)),
    trainjob(numNodes=2),
]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_jobs(draw: st.DrawFn) -> Any:
    """A valid job with one subtree replaced by random JSON: reaches deep into every adapter."""
    doc = copy.deepcopy(draw(st.sampled_from(VALID)))
    path = draw(st.sampled_from(_paths(doc)[1:]))
    node = doc
    for token in path[:-1]:
        node = node[token]
    node[path[-1]] = draw(JSON)
    return doc


def _check(raw: Any) -> None:
    try:
        group = jobs.parse_job(raw, gpu_resources=GPU_RESOURCES, namespace="ml")
    except jobs.JobError:
        return
    once = copy.deepcopy(raw)
    try:
        jobs.prepare_templates(once, group)
    except jobs.JobError:
        return
    twice = copy.deepcopy(once)
    jobs.prepare_templates(twice, jobs.parse_job(once, gpu_resources=GPU_RESOURCES, namespace="ml"))
    assert twice == once


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_jobs())
def test_mutated_job_raises_only_job_errors_and_prepare_is_idempotent(raw: Any) -> None:
    _check(raw)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "apiVersion": st.sampled_from(sorted({a for a, _ in jobs.SUPPORTED})),
            "kind": st.sampled_from(sorted({k for _, k in jobs.SUPPORTED})),
        },
        optional={"metadata": JSON, "spec": JSON},
    )
)
def test_random_job_of_a_supported_kind_raises_only_job_errors(raw: Any) -> None:
    _check(raw)


@settings(max_examples=100, deadline=None)
@given(JSON)
def test_random_json_raises_only_job_errors(raw: Any) -> None:
    _check(raw)
