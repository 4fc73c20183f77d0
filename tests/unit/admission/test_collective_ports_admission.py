"""Admission under policies that close single ports (issue 24): collectives are judged on the ports NCCL/Gloo/MPI
really use, the frameworks' fixed ports on their own flows.

The hardening overlay of the issue: a CiliumClusterwideNetworkPolicy denying TCP 22 into every pod without
switching pods to default-deny. NCCL and Gloo never use port 22, so a PyTorchJob works and is admitted; an
MPIJob's launcher reaches its workers over ssh, so the same overlay really breaks it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.admission import pipeline
from app.config import Settings
from app.models.cluster import Snapshot
from app.models.labels import COLLECTIVE_PORTS_ANNOTATION
from tests.builders import GPU, make_ccnp, make_namespace, make_node, make_pytorchjob, make_snapshot, make_template

NS = "ml"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
ENABLED = {"kubernetes.io/metadata.name": NS, "topoguard.io/enabled": "true"}
UID = "0d5f6c1e-2f7b-4c55-9c1a-4b1e4c3f0a24"


def deny_port(name: str, port: str) -> Any:
    """The overlay: deny TCP `port` into every pod, from anywhere; leave everything else as it was."""
    return make_ccnp(name, {
        "endpointSelector": {},
        "enableDefaultDeny": {"ingress": False, "egress": False},
        "ingressDeny": [{"fromEntities": ["all"], "toPorts": [{"ports": [{"port": port, "protocol": "TCP"}]}]}],
    })


def cluster(*policies: Any, enforcement: str = "") -> Snapshot:
    labels = {**ENABLED, "topoguard.io/enforcement": enforcement} if enforcement else ENABLED
    return make_snapshot(
        [make_node("gpu-a-1", zone="zone-a", gpus=4, taints=[GPU_TAINT]), make_node("cpu-b-1", zone="zone-b")],
        namespaces=[make_namespace(NS, labels)],
        policies=policies,
    )


def mpijob(name: str = "mpi") -> dict[str, Any]:
    """An mpi-operator v2beta1 MPIJob: a CPU launcher and two GPU workers."""
    worker = make_template(gpus=1, tolerations=[{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}])
    return {
        "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": name, "namespace": NS},
        "spec": {"slotsPerWorker": 1, "mpiReplicaSpecs": {
            "Launcher": {"replicas": 1, "template": make_template()},
            "Worker": {"replicas": 2, "template": worker},
        }},
    }


def pytorchjob(annotation: str | None = None) -> dict[str, Any]:
    job = make_pytorchjob(namespace=NS)
    if annotation is not None:
        job["metadata"]["annotations"] = {COLLECTIVE_PORTS_ANNOTATION: annotation}
    return job


def review(obj: dict[str, Any]) -> dict[str, Any]:
    group, _, version = obj["apiVersion"].rpartition("/")
    gvk = {"group": group, "version": version, "kind": obj["kind"]}
    gvr = {"group": group, "version": version, "resource": obj["kind"].lower() + "s"}
    request = {
        "uid": UID, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "name": obj["metadata"]["name"], "namespace": NS, "operation": "CREATE",
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": copy.deepcopy(obj), "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def respond(obj: dict[str, Any], snapshot: Snapshot, settings: Settings | None = None) -> dict[str, Any]:
    outcome = pipeline.answer(pipeline.parse_review(review(obj)), snapshot=snapshot,
                               settings=settings or Settings(), operation="mutate")
    response: dict[str, Any] = outcome.review["response"]
    assert response["uid"] == UID
    return response


def message(response: dict[str, Any]) -> str:
    return str(response.get("status", {}).get("message", "")) + " ".join(response.get("warnings") or [])


def test_ssh_deny_overlay_admits_a_pytorchjob() -> None:
    response = respond(pytorchjob(), cluster(deny_port("deny-ssh", "22")))
    assert response["allowed"] is True, message(response)
    assert "patch" in response  # pinned as usual


def test_ssh_deny_overlay_refuses_an_mpijob_naming_the_launcher_flow_and_the_policy() -> None:
    snapshot = cluster(deny_port("deny-ssh", "22"))
    assert respond(mpijob(), cluster())["allowed"] is True  # without the overlay it runs
    response = respond(mpijob(), snapshot)
    assert response["allowed"] is False
    text = message(response)
    assert "MPI launcher traffic (TCP 22)" in text and "deny-ssh" in text, text
    assert "collective" not in text.split(";")[0], text  # the collectives are open: not what blocks it


def test_ssh_deny_overlay_warns_for_an_mpijob_under_warn() -> None:
    response = respond(mpijob(), cluster(deny_port("deny-ssh", "22"), enforcement="warn"))
    assert response["allowed"] is True
    assert any("MPI launcher traffic (TCP 22)" in w for w in response.get("warnings") or []), response


@pytest.mark.parametrize("port", ["32768", "40000", "60999"])
def test_a_deny_inside_the_ephemeral_range_blocks_the_collectives(port: str) -> None:
    response = respond(pytorchjob(), cluster(deny_port("deny-one", port)))
    assert response["allowed"] is False
    text = message(response)
    assert "NCCL/Gloo collective traffic (TCP 32768-60999)" in text and "deny-one" in text, text
    assert "every TCP port" not in text


@pytest.mark.parametrize("port", ["32767", "61000", "23457"])
def test_a_deny_outside_the_collectives_and_the_rendezvous_port_admits(port: str) -> None:
    assert respond(pytorchjob(), cluster(deny_port("deny-one", port)))["allowed"] is True


def test_a_deny_on_the_rendezvous_port_still_blocks() -> None:
    response = respond(pytorchjob(), cluster(deny_port("deny-rdzv", "23456")))
    assert response["allowed"] is False
    assert "Rendezvous traffic (TCP 23456)" in message(response)


def test_the_job_annotation_narrows_the_range_to_the_ports_it_pins() -> None:
    snapshot = cluster(deny_port("deny-one", "40000"))
    assert respond(pytorchjob("50000-50100"), snapshot)["allowed"] is True  # 40000 is not among its ports
    response = respond(pytorchjob("39990-40010"), snapshot)
    assert response["allowed"] is False
    assert "NCCL/Gloo collective traffic (TCP 39990-40010)" in message(response)


def test_the_setting_sets_the_range_and_the_annotation_wins_over_it() -> None:
    snapshot = cluster(deny_port("deny-one", "40000"))
    narrow = Settings.model_validate({"collectivePorts": "50000-50100"})
    assert respond(pytorchjob(), snapshot, narrow)["allowed"] is True
    assert respond(pytorchjob("40000"), snapshot, narrow)["allowed"] is False


@pytest.mark.parametrize("value", ["all", "40100-40000", "0-10", "40000-70000"])
def test_an_unusable_annotation_is_a_clear_denial_naming_it(value: str) -> None:
    for enforcement in ("", "warn"):
        response = respond(pytorchjob(value), cluster(enforcement=enforcement))
        assert response["allowed"] is False
        assert response["status"]["code"] == 422  # an invalid job, as for any malformed field
        assert COLLECTIVE_PORTS_ANNOTATION in response["status"]["message"], response
