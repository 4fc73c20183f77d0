"""A TrainJob behind the real kube-apiserver with the real Trainer CRDs: composed from its runtime.

The ClusterTrainingRuntime (fixtures/cluster/trainer-runtime.yaml) carries the GPU-pool toleration;
the TrainJob adds a platform team's runtime patch (labels, service account). topoguard's entry comes
after it and sets tolerations and node affinity, lists a runtime patch replaces: what is stored must
be such that Trainer's merge of the runtime and every patch keeps the runtime's toleration and pins
the zone; reviewing the stored object
again must be a no-op; a TrainJob naming a runtime that does not exist is refused with its name.
"""

from __future__ import annotations

import uuid

import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e import kube
from tests.e2e.conftest import CLUSTER_FIXTURES, load_job
from tests.e2e.topoguard import TopoguardServer, apply_patch, missing_from, response_patch
from tests.unit.engine.test_trainjob_merge import final_pods

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ZONE_IN_A = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}
RUNTIME_TOLERATION = {"key": "gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}


def runtime() -> kube.RawObject:
    (obj,) = [o for o in kube.load_documents(CLUSTER_FIXTURES) if o["kind"] == "ClusterTrainingRuntime"]
    return obj


def test_stored_trainjob_merges_to_runtime_user_and_zone_and_is_not_patched_again(
    admission: kube.Cluster, webhook_server: TopoguardServer
) -> None:
    job = load_job("trainjob-gpu.yaml", namespace="ml-open", job_name=f"tj-{uuid.uuid4().hex[:6]}")
    expected = apply_patch(job, response_patch(webhook_server.review("mutate", job, admission.ref(job))))

    admission.create(job)
    stored = admission.get(job)

    assert stored is not None
    assert missing_from(expected["spec"], stored["spec"]) == []  # nothing topoguard wrote was pruned
    managers = [p["manager"] for p in stored["spec"]["runtimePatches"]]
    assert managers == ["example.io/platform-team", "topoguard.io/webhook"]
    platform = {k: v for k, v in stored["spec"]["runtimePatches"][0].items() if k != "time"}  # Trainer stamps time
    assert platform == job["spec"]["runtimePatches"][0]  # the other manager's entry is left as it was
    node = final_pods(runtime(), stored)["node"]
    assert node["tolerations"] == [RUNTIME_TOLERATION]
    assert node["serviceAccountName"] == "training-sa"
    terms = node["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms and all(ZONE_IN_A in t["matchExpressions"] for t in terms)
    assert stored["metadata"]["annotations"]["topoguard.io/zone"] == "zone-a"
    assert "ClusterTrainingRuntime torch-gpu-pool" in stored["metadata"]["annotations"]["topoguard.io/decision"]
    assert response_patch(webhook_server.review("mutate", stored, admission.ref(stored))) == []


def test_trainjob_naming_a_missing_runtime_is_refused_with_its_name(admission: kube.Cluster) -> None:
    job = load_job("trainjob-gpu.yaml", namespace="ml-open", job_name=f"tj-{uuid.uuid4().hex[:6]}")
    job["spec"]["runtimeRef"]["name"] = "no-such-runtime"

    with pytest.raises(ApiException) as refused:
        admission.create(job)

    status = kube.api_error_body(refused.value)
    assert refused.value.status == 403, status
    assert "ClusterTrainingRuntime no-such-runtime" in status["message"], status
    assert admission.get(job) is None
