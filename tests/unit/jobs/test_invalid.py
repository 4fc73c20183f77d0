"""Malformed jobs raise JobError subclasses naming every bad field by its path, never crash."""

from __future__ import annotations

from typing import Any

import pytest

from app import jobs
from app.jobs import FieldError, InvalidJobError, UnsupportedKindError
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

PT = "spec.pytorchReplicaSpecs"


def errors_of(raw: Any) -> list[FieldError]:
    with pytest.raises(InvalidJobError) as info:
        jobs.parse_job(raw, gpu_resources=GPU_RESOURCES, namespace="ml")
    return info.value.errors


def paths_of(raw: Any) -> list[str]:
    return [e.path for e in errors_of(raw)]


@pytest.mark.parametrize(
    "raw, want",
    [
        pytest.param(
            ["not", "a", "job"], [FieldError("", "job must be an object, got list")], id="list instead of job"
        ),
        pytest.param(
            {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "x"}},
            [FieldError(PT, "is required and must hold at least one replica type")],
            id="no spec at all",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Worker": "two"}),
            [FieldError(f"{PT}.Worker", "must be an object, got string")],
            id="replica spec not a map",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Worker": {"template": []}}),
            [FieldError(f"{PT}.Worker.template", "must be an object, got list")],
            id="template not an object",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Worker": {"replicas": -1}}),
            [FieldError(f"{PT}.Worker.replicas", "must be >= 0, got -1")],
            id="negative replicas",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Worker": {"replicas": "2"}}),
            [FieldError(f"{PT}.Worker.replicas", "must be an integer, got string")],
            id="replicas as a string",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Worker": {"replicas": True}}),
            [FieldError(f"{PT}.Worker.replicas", "must be an integer, got boolean")],
            id="replicas as a boolean",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Chief": replica()}),
            [FieldError(f"{PT}.Chief", "unsupported replica type; expected one of Master, Worker")],
            id="pytorch rejects a tf replica type",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Worker": replica(), "worker": replica()}),
            [FieldError(f"{PT}.worker", "duplicates replica type 'Worker' (keys match case-insensitively)")],
            id="keys equal but for case are ambiguous",
        ),
        pytest.param(
            kubeflow_job("XGBoostJob", {"Worker": replica()}),
            [FieldError("spec.xgbReplicaSpecs", "a Master replica is required")],
            id="xgboost without master",
        ),
        pytest.param(
            kubeflow_job("MPIJob", {"Worker": replica()}),
            [FieldError("spec.mpiReplicaSpecs", "a Launcher replica is required")],
            id="mpi without launcher",
        ),
        pytest.param(
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "TFJob",
                "metadata": {},
                "spec": {"tfReplicaSpecs": {"Worker": {}}},
            },
            [FieldError("metadata.name", "is required")],
            id="no name and no generateName",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Worker": replica(template(container(), labels={"a": 1}))}),  # type: ignore[dict-item]
            [FieldError(f"{PT}.Worker.template.metadata.labels.a", "must be a string, got integer")],
            id="label value not a string",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Worker": replica(template(container(ports=[{"containerPort": 70000}])))}),
            [
                FieldError(
                    f"{PT}.Worker.template.spec.containers[0].ports[0].containerPort", "must be an integer in 1..65535"
                )
            ],
            id="port out of range",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Worker": replica({"spec": {"containers": {"name": "x"}}})}),
            [FieldError(f"{PT}.Worker.template.spec.containers", "must be a list, got object")],
            id="containers not a list",
        ),
        pytest.param(
            kubeflow_job(
                "PyTorchJob", {"Worker": replica(template(container(), tolerations="gpu", hostNetwork="yes"))}
            ),
            [
                FieldError(f"{PT}.Worker.template.spec.hostNetwork", "must be a boolean, got string"),
                FieldError(f"{PT}.Worker.template.spec.tolerations", "must be a list, got string"),
            ],
            id="every bad field is reported at once",
        ),
        pytest.param(
            kubeflow_job("PyTorchJob", {"Worker": replica()}, elasticPolicy={"rdzvPort": 0, "rdzvHost": 5}),
            [
                FieldError("spec.elasticPolicy.rdzvPort", "must be >= 1, got 0"),
                FieldError("spec.elasticPolicy.rdzvHost", "must be a string, got integer"),
            ],
            id="pytorch elastic rendezvous overrides of the wrong type",
        ),
        pytest.param(
            kubeflow_job("MPIJob", {"Extra": replica()}, api_version="kubeflow.org/v2beta1"),
            [FieldError("spec.mpiReplicaSpecs", "a Launcher replica is required")],
            id="mpi v2 with only keys the operator ignores",
        ),
        pytest.param(
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "JAXJob",
                "metadata": {"name": 3},
                "spec": {"jaxReplicaSpecs": {}},
            },
            [
                FieldError("metadata.name", "must be a string, got integer"),
                FieldError("spec.jaxReplicaSpecs", "is required and must hold at least one replica type"),
            ],
            id="errors elsewhere do not hide a missing replica map",
        ),
        pytest.param(
            jobset(),
            [FieldError("spec.replicatedJobs", "is required and must hold at least one replicatedJob")],
            id="jobset without replicatedJobs",
        ),
        pytest.param(
            jobset(rjob("a"), "b", {"replicas": 1}),  # type: ignore[arg-type]
            [
                FieldError("spec.replicatedJobs[1]", "must be an object, got string"),
                FieldError("spec.replicatedJobs[2].name", "is required"),
            ],
            id="jobset entry not an object and entry without name",
        ),
        pytest.param(
            jobset(rjob("a"), rjob("a")),
            [FieldError("spec.replicatedJobs[1].name", "duplicate replicatedJob name 'a'")],
            id="jobset duplicate replicatedJob names",
        ),
        pytest.param(
            jobset(rjob("a", parallelism=-2), coordinator={"replicatedJob": "driver", "podIndex": "0"}),
            [
                FieldError("spec.replicatedJobs[0].template.spec.parallelism", "must be >= 0, got -2"),
                FieldError("spec.coordinator.replicatedJob", "names no replicatedJob: 'driver'"),
                FieldError("spec.coordinator.podIndex", "must be an integer, got string"),
            ],
            id="jobset negative parallelism and unknown coordinator",
        ),
        pytest.param(
            trainjob(numNodes="3"),
            [FieldError("spec.trainer.numNodes", "must be an integer, got string")],
            id="trainjob numNodes as a string",
        ),
        pytest.param(
            trainjob(resourcesPerNode={"limits": {"nvidia.com/gpu": "half"}}),
            [
                FieldError(
                    "spec.trainer.resourcesPerNode.limits[nvidia.com/gpu]", "must be a whole non-negative quantity"
                )
            ],
            id="trainjob gpu quantity",
        ),
        pytest.param(
            trainjob(patches={"manager": "x"}),  # type: ignore[arg-type]
            [FieldError("spec.runtimePatches", "must be a list, got object")],
            id="trainjob runtimePatches not a list",
        ),
        pytest.param(
            trainjob(patches=[runtime_patch("a.io/x", {"": {}})]),
            [
                FieldError(
                    "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].name", "is required"
                )
            ],
            id="trainjob patch replicatedJob without a name",
        ),
        pytest.param(
            trainjob(
                patches=[runtime_patch("a.io/x", {"node": {"metadata": {"labels": []}, "spec": {"tolerations": {}}}})]
            ),
            [
                FieldError(
                    "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template"
                    ".metadata.labels",
                    "must be an object, got list",
                ),
                FieldError(
                    "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template"
                    ".spec.tolerations",
                    "must be a list, got object",
                ),
            ],
            id="trainjob patch pod template fields of the wrong type",
        ),
    ],
)
def test_malformed_job_names_every_bad_field(raw: Any, want: list[FieldError]) -> None:
    assert errors_of(raw) == want


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param({"apiVersion": "batch/v1", "kind": "Job"}, id="batch job"),
        pytest.param({"apiVersion": "kubeflow.org/v2", "kind": "PyTorchJob"}, id="unknown version of a known kind"),
        pytest.param({"kind": "PyTorchJob"}, id="missing apiVersion"),
        pytest.param({"apiVersion": 1, "kind": ["x"]}, id="apiVersion and kind of the wrong type"),
    ],
)
def test_unknown_kind_is_unsupported(raw: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedKindError):
        jobs.parse_job(raw, gpu_resources=GPU_RESOURCES)


def test_error_message_lists_every_path() -> None:
    raw = kubeflow_job("PyTorchJob", {"Master": {"replicas": -1}, "Worker": {"template": 3}})
    with pytest.raises(InvalidJobError) as info:
        jobs.parse_job(raw, gpu_resources=GPU_RESOURCES)
    assert str(info.value) == (
        "invalid job: spec.pytorchReplicaSpecs.Master.replicas: must be >= 0, got -1; "
        "spec.pytorchReplicaSpecs.Worker.template: must be an object, got integer"
    )


def test_unsupported_kind_message_names_kind_and_version() -> None:
    assert str(UnsupportedKindError("batch/v1", "Job")) == "unsupported job kind 'Job' in apiVersion 'batch/v1'"


@pytest.mark.parametrize(
    "raw, want",
    [
        pytest.param({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                      "spec": {"pytorchReplicaSpecs": {"Master": {}, "Worker": {}}}}, 2, id="a replica map"),
        pytest.param({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                      "spec": {"replicatedJobs": [{"name": f"r{i}"} for i in range(9)]}}, 9, id="replicated jobs"),
        pytest.param({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "spec": {}}, 1,
                     id="a TrainJob: its types come from the runtime"),
        pytest.param({"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "spec": {"tfReplicaSpecs": "many"}}, 0,
                     id="no map: the adapter words that"),
        pytest.param({"apiVersion": "v1", "kind": "Pod"}, 0, id="not a supported job"),
        pytest.param({"apiVersion": [], "kind": "PyTorchJob"}, 0, id="an apiVersion that is no string"),
        pytest.param({"apiVersion": "kubeflow.org/v1", "kind": {"a": 1}}, 0, id="a kind that is no string"),
        pytest.param(["not", "an", "object"], 0, id="not an object"),
        pytest.param(None, 0, id="no object"),
    ],
)
def test_replica_types_counts_what_the_job_writes_before_it_is_read(raw: Any, want: int) -> None:
    assert jobs.replica_types(raw) == want
