"""WebhookConfigurations as the Helm chart renders them, but pointed at a loopback URL.

The rules mirror charts/topoguard (DESIGN.md "Helm"): the training-job resources only, CREATE
for the mutating hook and CREATE+UPDATE for the validating one, namespaces labelled
topoguard.io/enabled=true, sideEffects None, admissionReviewVersions [v1], matchPolicy
Equivalent, reinvocationPolicy IfNeeded. In a cluster clientConfig names the Service; here it is
`url: https://127.0.0.1:PORT/...` with the suite's CA as caBundle.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

from tests.e2e.kube import RawObject

FailurePolicy = Literal["Fail", "Ignore"]

MUTATING_NAME = "mutate.topoguard.io"
VALIDATING_NAME = "validate.topoguard.io"
ENABLED_SELECTOR: RawObject = {"matchLabels": {"topoguard.io/enabled": "true"}}

# (API group, versions, resources) of every training-job kind topoguard handles.
TRAINING_JOB_RESOURCES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("kubeflow.org", ("v1",), ("pytorchjobs", "tfjobs", "xgboostjobs", "paddlejobs", "jaxjobs", "mpijobs")),
    ("kubeflow.org", ("v2beta1",), ("mpijobs",)),
    ("jobset.x-k8s.io", ("v1alpha2",), ("jobsets",)),
    ("trainer.kubeflow.org", ("v1alpha1",), ("trainjobs",)),
)


def rules(operations: list[str]) -> list[RawObject]:
    return [
        {"apiGroups": [group], "apiVersions": list(versions), "resources": list(resources),
         "operations": operations, "scope": "Namespaced"}
        for group, versions, resources in TRAINING_JOB_RESOURCES
    ]


def _webhook(name: str, url: str, ca_pem: bytes, *, operations: list[str], failure_policy: FailurePolicy,
             timeout_seconds: int, namespace_selector: RawObject) -> RawObject:
    return {
        "name": name,
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
        "rules": rules(operations),
        "namespaceSelector": namespace_selector,
        "failurePolicy": failure_policy,
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": timeout_seconds,
    }


def mutating_configuration(config_name: str, base_url: str, ca_pem: bytes, *,
                           failure_policy: FailurePolicy = "Fail", timeout_seconds: int = 10,
                           namespace_selector: RawObject | None = None,
                           webhook_name: str = MUTATING_NAME) -> RawObject:
    hook: dict[str, Any] = _webhook(webhook_name, f"{base_url}/mutate", ca_pem, operations=["CREATE"],
                                    failure_policy=failure_policy, timeout_seconds=timeout_seconds,
                                    namespace_selector=namespace_selector or ENABLED_SELECTOR)
    hook["reinvocationPolicy"] = "IfNeeded"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": config_name},
        "webhooks": [hook],
    }


def validating_configuration(config_name: str, base_url: str, ca_pem: bytes, *,
                             failure_policy: FailurePolicy = "Fail", timeout_seconds: int = 10,
                             namespace_selector: RawObject | None = None,
                             webhook_name: str = VALIDATING_NAME) -> RawObject:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": config_name},
        "webhooks": [_webhook(webhook_name, f"{base_url}/validate", ca_pem, operations=["CREATE", "UPDATE"],
                              failure_policy=failure_policy, timeout_seconds=timeout_seconds,
                              namespace_selector=namespace_selector or ENABLED_SELECTOR)],
    }
