"""WebhookConfigurations as charts/topoguard renders them, but pointed at a loopback URL.

Mirrors templates/webhook-{mutating,validating}webhookconfiguration.yaml with the default values:
the training-job resources only (apiVersions "*" + matchPolicy Equivalent), CREATE for the
mutating hook and CREATE+UPDATE for the validating one, namespaces labelled
topoguard.io/enabled=true minus kube-system and the release namespace, sideEffects None,
admissionReviewVersions [v1], reinvocationPolicy IfNeeded, failurePolicy Fail, timeoutSeconds 5.
In a cluster clientConfig names the Service; here it is `url: https://127.0.0.1:PORT/...` with
the suite's CA as caBundle. (No helm binary is assumed, so the shape is repeated here; keep it in
step with the chart.)
"""

from __future__ import annotations

import base64
from typing import Any, Literal

from tests.e2e.kube import RawObject

FailurePolicy = Literal["Fail", "Ignore"]

MUTATING_NAME = "mutate.topoguard.io"
VALIDATING_NAME = "validate.topoguard.io"
RELEASE_NAMESPACE = "topoguard"
CHART_TIMEOUT_SECONDS = 5
ENABLED_SELECTOR: RawObject = {"matchExpressions": [
    {"key": "topoguard.io/enabled", "operator": "In", "values": ["true"]},
    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", RELEASE_NAMESPACE]},
]}

# (API group, resources) of every training-job kind topoguard handles (the chart's jobKinds).
TRAINING_JOB_RESOURCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kubeflow.org", ("pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs", "jaxjobs")),
    ("jobset.x-k8s.io", ("jobsets",)),
    ("trainer.kubeflow.org", ("trainjobs",)),
)


def rules(operations: list[str]) -> list[RawObject]:
    return [
        {"apiGroups": [group], "apiVersions": ["*"], "resources": list(resources),
         "operations": operations, "scope": "Namespaced"}
        for group, resources in TRAINING_JOB_RESOURCES
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
                           failure_policy: FailurePolicy = "Fail", timeout_seconds: int = CHART_TIMEOUT_SECONDS,
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
                             failure_policy: FailurePolicy = "Fail", timeout_seconds: int = CHART_TIMEOUT_SECONDS,
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


# charts/topoguard/templates/webhook-policychanges.yaml (policyChanges.enabled): every namespace, the four policy
# kinds, CREATE/UPDATE/DELETE, failurePolicy Ignore, sideEffects None, timeoutSeconds 5.
POLICY_NAME = "policy-changes.topoguard.io"
POLICY_RULES: list[RawObject] = [
    {"apiGroups": ["cilium.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
     "resources": ["ciliumnetworkpolicies", "ciliumclusterwidenetworkpolicies"], "scope": "*"},
    {"apiGroups": ["networking.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
     "resources": ["networkpolicies"], "scope": "Namespaced"},
    {"apiGroups": ["policy.networking.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
     "resources": ["clusternetworkpolicies"], "scope": "Cluster"},
]


def policy_configuration(config_name: str, base_url: str, ca_pem: bytes, *,
                         namespace_selector: RawObject | None = None) -> RawObject:
    hook: RawObject = {
        "name": POLICY_NAME,
        "clientConfig": {"url": f"{base_url}/validate-policy", "caBundle": base64.b64encode(ca_pem).decode()},
        "rules": POLICY_RULES,
        "failurePolicy": "Ignore",
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": CHART_TIMEOUT_SECONDS,
    }
    if namespace_selector is not None:
        hook["namespaceSelector"] = namespace_selector
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": config_name}, "webhooks": [hook]}
