"""The seed lab on the datapath: its objects, and the pods a training operator would create for a job.

`replica_pods` plays the training-operator's part (no operator runs here): one Pod per replica from the
job's *stored* templates, named and labelled the way the Kubeflow training-operator names and labels
them (`<job>-<replica type>-<index>`, training.kubeflow.org/{operator-name,job-name,replica-type,
replica-index}; research/kubeflow-formats.md section 2), owned by the job. Whatever topoguard wrote
into the templates (labels, affinity, tolerations) is therefore what the pods carry.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from tests.e2e import kube

REPO = Path(__file__).resolve().parents[2]
LAB_CLUSTER = REPO / "examples" / "lab-cluster.yaml"
LAB_JOB = REPO / "examples" / "pytorchjob-lab.yaml"
LAB_CONFIG = REPO / "examples" / "config.yaml"
LAB_NAMESPACE = "ml-demo"
# PyTorchJob's default MASTER_PORT (the training-operator's defaultPort): Worker -> Master rendezvous.
RENDEZVOUS_PORT = 23456


def lab_objects() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the lab's Namespace, its three CiliumNetworkPolicies) from examples/lab-cluster.yaml."""
    objects = kube.load_documents(LAB_CLUSTER)
    (namespace,) = [o for o in objects if o["kind"] == "Namespace"]
    policies = [o for o in objects if o["kind"] == "CiliumNetworkPolicy"]
    return namespace, policies


def lab_job(name: str) -> dict[str, Any]:
    (job,) = kube.load_documents(LAB_JOB)
    job["metadata"]["name"] = name
    return job


def replica_pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The Pods the training-operator would create for a stored PyTorchJob, master first."""
    meta = job["metadata"]
    pods = []
    for replica_type, spec in job["spec"]["pytorchReplicaSpecs"].items():
        for index in range(int(spec.get("replicas", 1))):
            template = copy.deepcopy(spec["template"])
            labels = dict((template.get("metadata") or {}).get("labels") or {})
            labels.update({
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/job-name": meta["name"],
                "training.kubeflow.org/replica-type": replica_type.lower(),
                "training.kubeflow.org/replica-index": str(index),
            })
            if replica_type == "Master":
                labels["training.kubeflow.org/job-role"] = "master"
            pod = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "namespace": meta["namespace"],
                    "name": f"{meta['name']}-{replica_type.lower()}-{index}",
                    "labels": labels,
                    "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
                    "ownerReferences": [{"apiVersion": job["apiVersion"], "kind": job["kind"], "name": meta["name"],
                                         "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
                },
                "spec": template["spec"],
            }
            pods.append(pod)
    pods.sort(key=lambda p: p["metadata"]["labels"]["training.kubeflow.org/replica-type"] != "master")
    return pods
