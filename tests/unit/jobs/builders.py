"""Small builders for job objects, so each test states only what it is about."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

FIXTURES = Path(__file__).parent / "fixtures"
GPU = "nvidia.com/gpu"
GPU_RESOURCES = (GPU, "amd.com/gpu")

MAP_KEYS = {
    "PyTorchJob": "pytorchReplicaSpecs",
    "TFJob": "tfReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs",
    "PaddleJob": "paddleReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs",
    "MPIJob": "mpiReplicaSpecs",
}


def load_fixture(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((FIXTURES / name).read_text())
    assert isinstance(doc, dict)
    return doc


def container(
    name: str = "main",
    *,
    gpus: int | str | None = None,
    ports: list[dict[str, Any]] | None = None,
    requests: dict[str, Any] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "example.io/train:1"}
    if gpus is not None:
        out["resources"] = {"limits": {GPU: gpus}}
    if requests is not None:
        out.setdefault("resources", {})["requests"] = requests
    if ports is not None:
        out["ports"] = ports
    return out


def template(*containers: dict[str, Any], labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"spec": {"containers": list(containers), **spec}}
    if labels is not None:
        out["metadata"] = {"labels": labels}
    return out


def replica(tpl: dict[str, Any] | None = None, replicas: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if replicas is not None:
        out["replicas"] = replicas
    if tpl is not None:
        out["template"] = tpl
    return out


def kubeflow_job(
    kind: str,
    specs: dict[str, Any],
    *,
    name: str = "train",
    namespace: str | None = "ml",
    api_version: str = "kubeflow.org/v1",
    **spec: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": {MAP_KEYS[kind]: specs, **spec}}


def jobset(*rjobs: dict[str, Any], name: str = "js", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"replicatedJobs": list(rjobs), **spec},
    }


def rjob(
    name: str,
    tpl: dict[str, Any] | None = None,
    *,
    replicas: int | None = None,
    depends_on: list[dict[str, str]] | None = None,
    **job_spec: Any,
) -> dict[str, Any]:
    """A replicatedJob; `job_spec` goes into the batch Job spec (parallelism, completions)."""
    out: dict[str, Any] = {"name": name, "template": {"spec": {**job_spec, "template": tpl or template(container())}}}
    if replicas is not None:
        out["replicas"] = replicas
    if depends_on is not None:
        out["dependsOn"] = depends_on
    return out


def trainjob(*, name: str = "tj", patches: list[dict[str, Any]] | None = None, **trainer: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"runtimeRef": {"name": "torch-distributed"}}
    if trainer:
        spec["trainer"] = trainer
    if patches is not None:
        spec["runtimePatches"] = patches
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": name}, "spec": spec}


def runtime_patch(manager: str, jobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A runtimePatches entry: replicatedJob name → pod template patch."""
    return {
        "manager": manager,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [{"name": n, "template": {"spec": {"template": t}}} for n, t in jobs.items()]
                }
            }
        },
    }
