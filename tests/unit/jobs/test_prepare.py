"""prepare_templates: every template pointer exists afterwards, nothing else changes, twice = once."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app import jobs
from app.jobs.pointers import split_pointer
from app.models.labels import MANAGER_NAME
from tests.unit.jobs.builders import (
    GPU_RESOURCES,
    container,
    jobset,
    kubeflow_job,
    replica,
    rjob,
    runtime_patch,
    template,
    trainjob,
)

TOLERATION = {"key": "training", "operator": "Exists", "effect": "NoSchedule"}


def resolve(doc: Any, pointer: str) -> Any:
    for token in split_pointer(pointer):
        doc = doc[int(token)] if isinstance(doc, list) else doc[token]
    return doc


def prepared(raw: dict[str, Any]) -> dict[str, Any]:
    group = jobs.parse_job(raw, gpu_resources=GPU_RESOURCES, namespace="ml")
    doc = copy.deepcopy(raw)
    jobs.prepare_templates(doc, group)
    return doc


CASES = [
    pytest.param(
        kubeflow_job("PyTorchJob", {"Master": replica(), "Worker": replica(template(container()))}),
        id="pytorch template missing on one replica",
    ),
    pytest.param(
        kubeflow_job("TFJob", {"a/b~c": {"template": None}}), id="tf key needing pointer escapes and a null template"
    ),
    pytest.param(
        kubeflow_job("MPIJob", {"Launcher": replica(), "Worker": replica()}, api_version="kubeflow.org/v2beta1"),
        id="mpi v2",
    ),
    pytest.param(jobset(rjob("a"), {"name": "b", "template": {}}), id="jobset entry without a job spec"),
    pytest.param(trainjob(numNodes=2), id="trainjob without patches"),
    pytest.param(
        trainjob(patches=[runtime_patch("a.io/x", {"launcher": {"spec": {"tolerations": [TOLERATION]}}})]),
        id="trainjob after a user patch",
    ),
]


@pytest.mark.parametrize("raw", CASES)
def test_every_template_path_exists_with_metadata_and_spec(raw: dict[str, Any]) -> None:
    doc = prepared(raw)
    group = jobs.parse_job(doc, gpu_resources=GPU_RESOURCES, namespace="ml")
    for r in group.replicas:
        tpl = resolve(doc, r.template_path)
        assert isinstance(tpl.get("metadata"), dict) and isinstance(tpl.get("spec"), dict), r.template_path


@pytest.mark.parametrize("raw", CASES)
def test_prepare_is_idempotent_and_paths_are_stable(raw: dict[str, Any]) -> None:
    once = prepared(raw)
    twice = prepared(once)
    assert twice == once
    before = jobs.parse_job(raw, gpu_resources=GPU_RESOURCES)
    after = jobs.parse_job(once, gpu_resources=GPU_RESOURCES)
    assert [r.template_path for r in after.replicas] == [r.template_path for r in before.replicas]


def test_kubeflow_prepare_only_adds_the_missing_parents() -> None:
    raw = kubeflow_job("PyTorchJob", {"Master": {"replicas": 1}, "Worker": replica(template(container()))})
    doc = prepared(raw)
    want = copy.deepcopy(raw)
    want["spec"]["pytorchReplicaSpecs"]["Master"]["template"] = {"metadata": {}, "spec": {}}
    want["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"] = {}
    assert doc == want


def test_trainjob_entry_is_appended_with_earlier_lists_seeded() -> None:
    user = runtime_patch("a.io/x", {"node": {"spec": {"tolerations": [TOLERATION], "nodeSelector": {"d": "s"}}}})
    doc = prepared(trainjob(patches=[user]))
    assert doc["spec"]["runtimePatches"] == [
        user,
        {
            "manager": MANAGER_NAME,
            "trainingRuntimeSpec": {
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {
                                "name": "node",
                                "template": {
                                    "spec": {"template": {"metadata": {}, "spec": {"tolerations": [TOLERATION]}}}
                                },
                            }
                        ]
                    }
                }
            },
        },
    ]


def test_trainjob_without_room_for_our_entry_is_an_error() -> None:
    raw = trainjob(patches=[runtime_patch(f"x{i}.io/m", {}) for i in range(16)])
    group = jobs.parse_job(raw, gpu_resources=GPU_RESOURCES)
    with pytest.raises(jobs.InvalidJobError) as info:
        jobs.prepare_templates(copy.deepcopy(raw), group)
    assert [e.path for e in info.value.errors] == ["spec.runtimePatches"]
