"""The webhook behind a real kube-apiserver: what gets stored, refused, warned about or left alone.

Every job goes through the apiserver's admission chain (mutating webhook -> CRD schema pruning and
defaulting -> validating webhook -> etcd), so these tests see what a user of kubectl would.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e import kube, webhooks
from tests.e2e.conftest import load_job
from tests.e2e.topoguard import TopoguardServer, apply_patch, missing_from, response_patch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ZONE_LABEL = "topology.kubernetes.io/zone"
ZONE_ANNOTATION = "topoguard.io/zone"
DECISION_ANNOTATION = "topoguard.io/decision"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def templates(job: kube.RawObject) -> dict[str, dict[str, Any]]:
    """Every replica's pod template by role: `<x>ReplicaSpecs` maps (Kubeflow) or JobSet replicatedJobs."""
    spec = job["spec"]
    if "replicatedJobs" in spec:
        return {rj["name"]: rj["template"]["spec"]["template"] for rj in spec["replicatedJobs"]}
    (replicas,) = [v for k, v in spec.items() if k.endswith("ReplicaSpecs")]
    return {role: replica["template"] for role, replica in replicas.items()}


def zone_terms(template: dict[str, Any]) -> list[list[dict[str, Any]]]:
    affinity = template.get("spec", {}).get("affinity", {}).get("nodeAffinity", {})
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {})
    return [term.get("matchExpressions", []) for term in required.get("nodeSelectorTerms", [])]


def kubectl_error(error: ApiException) -> str:
    """The line kubectl prints for a refused create: `Error from server (Reason): message`."""
    status = kube.api_error_body(error)
    return f"Error from server ({status.get('reason', error.reason)}): {status.get('message', error.body)}"


def expected_after_webhook(server: TopoguardServer, cluster: kube.Cluster, job: kube.RawObject) -> kube.RawObject:
    """The job as topoguard's /mutate means it to be stored: the job with its JSON Patch applied."""
    response = server.review("mutate", job, cluster.ref(job))
    assert response["allowed"], f"topoguard refused the job it should pin: {response.get('status')}"
    return apply_patch(job, response_patch(response))


def test_opted_in_lab_job_is_stored_pinned_to_zone_a_with_nothing_pruned(
    admission: kube.Cluster, webhook_server: TopoguardServer
) -> None:
    job = load_job("lab-pytorchjob.yaml", namespace="ml-demo", job_name=unique("lab"))
    expected = expected_after_webhook(webhook_server, admission, job)

    admission.create(job)
    stored = admission.get(job)

    assert stored is not None
    # Everything the webhook wrote survived the CRD's pruning (stored may only add defaults).
    assert missing_from(expected["spec"], stored["spec"]) == []
    assert missing_from(expected["metadata"].get("annotations", {}), stored["metadata"].get("annotations", {})) == []
    assert stored["metadata"]["annotations"][ZONE_ANNOTATION] == "zone-a"
    assert DECISION_ANNOTATION in stored["metadata"]["annotations"]
    for role, template in templates(stored).items():
        terms = zone_terms(template)
        assert terms, f"{role}: no required nodeAffinity stored"
        for expressions in terms:
            assert {"key": ZONE_LABEL, "operator": "In", "values": ["zone-a"]} in expressions, role
        assert template["metadata"]["labels"]["zone"] == "zone-a", role
        assert template["metadata"]["labels"]["app"] == "ml-training", role
    master_tolerations = templates(stored)["Master"]["spec"].get("tolerations", [])
    assert any(t.get("key") == "gpu" and t.get("effect") == "NoSchedule" and t.get("value", "present") == "present"
               for t in master_tolerations), master_tolerations
    # The user's own constraints stay.
    assert templates(stored)["Worker"]["spec"]["nodeSelector"] == {"gpu": "true"}
    # Reinvocation (reinvocationPolicy IfNeeded) sends the patched job again: nothing more to do.
    assert response_patch(webhook_server.review("mutate", expected, admission.ref(expected))) == []


def test_update_that_splits_a_pinned_job_is_refused_by_the_validating_webhook(admission: kube.Cluster) -> None:
    job = load_job("lab-pytorchjob.yaml", namespace="ml-demo", job_name=unique("update"))
    admission.create(job)
    stored = admission.get(job)
    assert stored is not None
    stored["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["nodeSelector"] = {ZONE_LABEL: "zone-b"}

    with pytest.raises(ApiException) as refused:
        admission.replace(stored)

    status = kube.api_error_body(refused.value)
    shown = kubectl_error(refused.value)
    assert refused.value.status == 403, shown
    assert f'admission webhook "{webhooks.VALIDATING_NAME}" denied the request: ' in status["message"], shown
    assert "zone-b" in status["message"], shown
    after = admission.get(job)
    assert after is not None
    assert "nodeSelector" not in after["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]


@pytest.mark.parametrize(
    "fixture",
    [
        pytest.param("tfjob-gpu.yaml", id="TFJob: every replica stored pinned to zone-a"),
        pytest.param("mpijob-gpu.yaml", id="MPIJob v2beta1: every replica stored pinned to zone-a"),
        pytest.param("jobset-gpu.yaml", id="JobSet: every replicated job stored pinned to zone-a"),
    ],
)
def test_job_kind_is_stored_pinned_to_the_gpu_zone_with_nothing_pruned(
    admission: kube.Cluster, webhook_server: TopoguardServer, fixture: str
) -> None:
    job = load_job(fixture, namespace="ml-open", job_name=unique("kind"))
    expected = expected_after_webhook(webhook_server, admission, job)

    admission.create(job)
    stored = admission.get(job)

    assert stored is not None
    assert missing_from(expected["spec"], stored["spec"]) == []
    assert stored["metadata"].get("annotations", {}).get(ZONE_ANNOTATION) == "zone-a"
    for role, template in templates(stored).items():
        terms = zone_terms(template)
        assert terms, f"{role}: no required nodeAffinity stored"
        for expressions in terms:
            assert {"key": ZONE_LABEL, "operator": "In", "values": ["zone-a"]} in expressions, role
        assert template["metadata"]["labels"]["zone"] == "zone-a", role


@pytest.mark.parametrize(
    ("fixture", "namespace", "message_names"),
    [
        pytest.param("lab-pytorchjob.yaml", "ml-locked", "lock-down",
                     id="every zone blocked by a policy: 403 naming the policy"),
        pytest.param("split-pin-pytorchjob.yaml", "ml-demo", "zone-b",
                     id="coordinator pinned away from the GPU zone: 403 naming the zone"),
    ],
)
def test_job_that_cannot_work_is_refused_with_topoguards_message(
    admission: kube.Cluster, fixture: str, namespace: str, message_names: str
) -> None:
    job = load_job(fixture, namespace=namespace, job_name=unique("refused"))

    with pytest.raises(ApiException) as refused:
        admission.create(job)

    status = kube.api_error_body(refused.value)
    shown = kubectl_error(refused.value)
    assert refused.value.status == 403, shown
    assert status.get("reason") == "Forbidden", shown
    hooks = (webhooks.MUTATING_NAME, webhooks.VALIDATING_NAME)
    assert any(f'admission webhook "{h}" denied the request: ' in status["message"] for h in hooks), shown
    assert message_names in status["message"], shown
    assert admission.get(job) is None


def test_warn_namespace_creates_the_job_and_returns_warning_headers(admission: kube.Cluster) -> None:
    job = load_job("lab-pytorchjob.yaml", namespace="ml-warn", job_name=unique("warned"))

    _, warnings = admission.create(job)

    assert admission.get(job) is not None
    assert warnings, "no Warning header on a job topoguard would deny"
    assert any("lock-down" in w for w in warnings), warnings


def test_namespace_not_opted_in_is_left_untouched(admission: kube.Cluster) -> None:
    job = load_job("lab-pytorchjob.yaml", namespace="ml-plain", job_name=unique("plain"))

    admission.create(job)
    stored = admission.get(job)

    assert stored is not None
    assert stored["spec"] == job["spec"]
    assert not {k for k in stored["metadata"].get("annotations", {}) if k.startswith("topoguard.io/")}


def test_dry_run_create_returns_the_same_patch_and_stores_nothing(
    admission: kube.Cluster, webhook_server: TopoguardServer
) -> None:
    job = load_job("lab-pytorchjob.yaml", namespace="ml-dryrun", job_name=unique("dry"))
    expected = expected_after_webhook(webhook_server, admission, job)

    dry, _ = admission.create(job, dry_run=True)

    assert admission.get(job) is None
    assert dry["metadata"].get("annotations", {}).get(ZONE_ANNOTATION) == "zone-a"
    assert missing_from(expected["spec"], dry["spec"]) == []
    # And a real create of the same object stores exactly what the dry run showed.
    admission.create(job)
    stored = admission.get(job)
    assert stored is not None
    assert stored["spec"] == dry["spec"]
    assert stored["metadata"]["annotations"] == dry["metadata"]["annotations"]
