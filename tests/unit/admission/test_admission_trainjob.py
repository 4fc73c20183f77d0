"""TrainJob reviews: composed from the snapshot's runtime, refused (or warned) by name when it is missing,
re-judged when a queue manager unsuspends it, and a no-op when reviewed again."""

from __future__ import annotations

import copy
import dataclasses
from types import MappingProxyType
from typing import Any

from app import jobs
from app.cache import projections
from app.models.cluster import Snapshot
from tests.unit.admission.test_admission import GPU, NS, answer, cluster, patch_of, response_of, review
from tests.unit.crd.jsonpatch import apply_patch

# The runtime's own GPU-pool toleration: only a review that reads the runtime knows the nodes can run.
RUNTIME_TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-gpu"},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [{
        "name": "node",
        "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                     "spec": {"template": {"spec": {
                         "containers": [{"name": "node", "image": "pytorch"}],
                         "tolerations": [RUNTIME_TOLERATION]}}}},
    }]}}},
}


def trainjob(runtime: str = "torch-gpu", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "train", "namespace": NS},
            "spec": {"runtimeRef": {"name": runtime}, "trainer": {"numNodes": 2, "resourcesPerNode": {
                "limits": {GPU: 4}}}, **spec}}


def with_runtime(snapshot: Snapshot) -> Snapshot:
    info = projections.project_training_runtime(RUNTIME)
    return dataclasses.replace(snapshot, training_runtimes=MappingProxyType({(info.kind, "", info.name): info}))


def test_a_trainjob_is_pinned_keeping_the_runtimes_toleration_and_reviewed_again_to_nothing() -> None:
    snapshot = with_runtime(cluster())
    job = trainjob()

    ops = patch_of(response_of(answer(review(job), snapshot)))
    patched = apply_patch(job, ops)
    (entry,) = patched["spec"]["runtimePatches"]
    pod = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]

    assert pod["spec"]["tolerations"] == [RUNTIME_TOLERATION]
    assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}]}]}
    assert "ClusterTrainingRuntime torch-gpu via runtimePatches" in patched["metadata"]["annotations"][
        "topoguard.io/decision"]
    assert patch_of(response_of(answer(review(patched), snapshot))) == []


def test_a_missing_runtime_is_refused_naming_it() -> None:
    response = response_of(answer(review(trainjob("gone")), with_runtime(cluster())))

    assert (response["allowed"], response["status"]["code"]) == (False, 403)
    assert "ClusterTrainingRuntime gone does not exist" in response["status"]["message"]


def test_a_missing_runtime_is_admitted_with_a_warning_under_warn() -> None:
    labels = {"kubernetes.io/metadata.name": NS, "topoguard.io/enabled": "true", "topoguard.io/enforcement": "warn"}
    outcome = answer(review(trainjob("gone")), with_runtime(cluster(namespace_labels=labels)))
    response = response_of(outcome)

    assert (response["allowed"], outcome.outcome) == (True, "warned")
    assert any("ClusterTrainingRuntime gone" in w for w in response["warnings"])


def test_a_controllers_update_of_a_job_whose_runtime_is_gone_is_let_through() -> None:
    old = trainjob("gone")
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"touched": "yes"}

    outcome = answer(review(new, operation="UPDATE", old=old), with_runtime(cluster()), operation="validate")
    assert (response_of(outcome)["allowed"], outcome.outcome) == (True, "unchanged")


def test_unsuspending_a_trainjob_is_judged_again_with_the_runtime() -> None:
    snapshot = with_runtime(cluster())
    old = trainjob(suspend=True)
    new = trainjob(suspend=False)
    same = trainjob(suspend=True)
    same["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}

    still_suspended = answer(review(same, operation="UPDATE", old=old), snapshot, operation="validate")
    unsuspended = answer(review(new, operation="UPDATE", old=old), snapshot, operation="validate")

    assert (still_suspended.outcome, still_suspended.decision) == ("unchanged", None)  # not judged
    assert unsuspended.decision is not None and unsuspended.decision.zone == "zone-a"  # judged, with the runtime


def test_unsuspends_only_on_true_to_false() -> None:
    assert [jobs.unsuspends(trainjob(suspend=a), trainjob(suspend=b)) for a, b in
            ((True, False), (True, True), (False, False), (False, True))] == [True, False, False, False]
    assert jobs.unsuspends(None, trainjob()) is False
