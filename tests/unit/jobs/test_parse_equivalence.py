"""The job readers give the same answer whatever kind of mapping holds the job.

Every reader recognises a dict (what JSON decoding gives) by `type(x) is dict` before the generic
`Mapping` check. A job parses to the same group, or fails with the same errors, when its objects are
read-only mappings (`MappingProxyType`), which sends every reader past those dict checks.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import jobs
from app.jobs import templates
from app.jobs.errors import FieldError
from app.models.job import JobGroup
from tests.unit.jobs.builders import (
    FIXTURES,
    GPU,
    GPU_RESOURCES,
    container,
    jobset,
    kubeflow_job,
    load_fixture,
    replica,
    rjob,
    template,
    trainjob,
)
from tests.unit.jobs.strategies import json_values, mutated

AMD = "amd.com/gpu"

# Valid templates: every field the reader reads, in the shapes jobs write them.
PLAIN_TEMPLATES = [
    template(container("pytorch", gpus=4), labels={"app": "llm", "role": "worker"}, tolerations=[{"key": GPU}]),
    template(container("tensorflow", ports=[{"containerPort": 2222, "name": "tfjob-port"}])),
    template(
        container("main", gpus="2", requests={GPU: "2000m", AMD: 1, "cpu": "4"}),
        container("sidecar", ports=[{"containerPort": 53, "protocol": "UDP"}, {"containerPort": 9090, "name": "m"}]),
        labels={"a.b/c": "d"},
        serviceAccountName="trainer",
        hostNetwork=True,
        nodeSelector={"zone": "a"},
    ),
    template(container("paddle", gpus=0), serviceAccount="legacy", hostNetwork=None, tolerations=None),
    template(
        container("jax"),
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]
                },
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}],
            },
            "podAntiAffinity": {},
        },
    ),
    template(container(), affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}),
    {"metadata": {}, "spec": {"containers": [], "serviceAccountName": ""}},
]
# Valid templates with init containers or unusual fields.
OTHER_TEMPLATES = [
    template(container(), initContainers=[{"name": "init", "resources": {"limits": {GPU: 1}}}]),
    template({"image": "no-name"}),
    {"spec": {}},
]

KEYS = st.sampled_from(
    [
        *("metadata", "labels", "spec", "containers", "name", "ports", "containerPort", "protocol", "resources"),
        *("limits", "requests", GPU, AMD, "serviceAccountName", "serviceAccount", "hostNetwork", "nodeSelector"),
        *("tolerations", "affinity", "initContainers", "restartPolicy", "template", "replicas", "replicatedJobs"),
        *("trainer", "numNodes"),
    ]
)
JSON = json_values(KEYS)


@pytest.mark.parametrize("tpl", PLAIN_TEMPLATES + OTHER_TEMPLATES)
def test_sample_templates_are_read_without_an_error(tpl: dict[str, Any]) -> None:
    errors: list[FieldError] = []
    templates.read_pod_template(tpl, "t", errors, gpu_resources=GPU_RESOURCES)
    assert errors == []


def _as_mapping_proxies(node: Any) -> Any:
    if isinstance(node, dict):
        return types.MappingProxyType({k: _as_mapping_proxies(v) for k, v in node.items()})
    if isinstance(node, list):
        return [_as_mapping_proxies(v) for v in node]
    return node


def _outcome(doc: Any) -> Any:
    try:
        return jobs.parse_job(doc, gpu_resources=GPU_RESOURCES, namespace="ml")
    except jobs.InvalidJobError as e:
        return ("invalid", e.errors)
    except jobs.JobError as e:
        return type(e)  # its message quotes the kind as written, repr and all


JOBS = [
    *(load_fixture(p.name) for p in sorted(FIXTURES.glob("*.yaml"))),
    kubeflow_job("PyTorchJob", {"Master": replica(PLAIN_TEMPLATES[2]), "Worker": replica(PLAIN_TEMPLATES[0], 15)}),
    kubeflow_job("TFJob", {"PS": replica(PLAIN_TEMPLATES[4]), "Worker": replica(OTHER_TEMPLATES[0], 2)}),
    kubeflow_job("XGBoostJob", {"Master": replica(PLAIN_TEMPLATES[1]), "Worker": replica(OTHER_TEMPLATES[1], 2)}),
    kubeflow_job(
        "MPIJob", {"Launcher": replica(), "Worker": replica(PLAIN_TEMPLATES[3], 2)}, api_version="kubeflow.org/v2beta1"
    ),
    jobset(rjob("a", PLAIN_TEMPLATES[0]), rjob("b", OTHER_TEMPLATES[1], replicas=2)),
    trainjob(numNodes=2),
]


@pytest.mark.parametrize("doc", JOBS, ids=lambda doc: f"{doc['kind']}-{doc['metadata'].get('name')}")
def test_job_parses_the_same_from_dicts_and_from_other_mappings(doc: dict[str, Any]) -> None:
    group = _outcome(doc)
    assert isinstance(group, JobGroup)
    assert _outcome(_as_mapping_proxies(doc)) == group


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(JOBS, KEYS, JSON))
def test_mutated_job_parses_the_same_from_dicts_and_from_other_mappings(doc: Any) -> None:
    assert _outcome(_as_mapping_proxies(doc)) == _outcome(doc)
