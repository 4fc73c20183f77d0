"""The operators' own admission webhooks are live, not just registered: each one refuses a job its
upstream validation rejects, with the apiserver naming that webhook. (Kueue's mutating webhook is
shown live by test_kueue.py: the job is stored suspended.) The jobs go to the operators' namespace,
which topoguard does not serve, so the refusal can only come from the operator."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e import kube
from tests.e2e_full.components import OPERATOR_NAMESPACE, Operator
from tests.e2e_full.conftest import fixture, lab_job

pytestmark = pytest.mark.e2e


def _refused(cluster: kube.Cluster, job: kube.RawObject, webhook: str, needle: str) -> None:
    with pytest.raises(ApiException) as refused:
        cluster.create(job)
    message = str(kube.api_error_body(refused.value).get("message", ""))
    assert refused.value.status in (400, 403, 422), message
    assert f'admission webhook "{webhook}" denied the request' in message, message
    assert needle in message, message
    assert cluster.get(job) is None


def _invalid_pytorchjob() -> kube.RawObject:
    job = lab_job(OPERATOR_NAMESPACE, "two-masters")
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    return job


def _invalid_jobset() -> kube.RawObject:
    job = fixture("jobset-gpu.yaml", namespace=OPERATOR_NAMESPACE)
    job["spec"]["network"] = {"subdomain": "Not_A_DNS_Name"}
    return job


def _invalid_trainjob() -> kube.RawObject:
    job = fixture("trainjob-torch.yaml", namespace=OPERATOR_NAMESPACE)
    job["spec"]["runtimeRef"]["name"] = "no-such-runtime"
    return job


CASES: dict[str, tuple[str, Callable[[], kube.RawObject], str, str]] = {
    "training-operator": ("training_operator", _invalid_pytorchjob,
                          "validator.pytorchjob.training-operator.kubeflow.org", "must be 1"),
    "jobset": ("jobset_controller", _invalid_jobset, "vjobset.kb.io", "Not_A_DNS_Name"),
    "trainer": ("trainer_controller", _invalid_trainjob, "validator.trainjob.trainer.kubeflow.org",
                "no-such-runtime"),
}


@pytest.mark.parametrize("operator", sorted(CASES))
def test_operator_webhook_refuses_what_upstream_rejects(operator: str, request: pytest.FixtureRequest,
                                                        cluster: kube.Cluster) -> None:
    fixture_name, build, webhook, needle = CASES[operator]
    running: Operator = request.getfixturevalue(fixture_name)
    assert running.process.running()
    _refused(cluster, build(), webhook, needle)
