"""The validating webhook on network policies (charts/topoguard/templates/webhook-policychanges.yaml): off by
default, on with one value; always failurePolicy Ignore, sideEffects None, a timeout of at most 5 s; the policy
kinds with CREATE, UPDATE, DELETE; the server's own deadline one second shorter; Events RBAC with it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from app.config import Settings
from tests.chart.rendering import HelmError, Render, one

NAME = "ValidatingWebhookConfiguration"


def policy_webhook(objects: list[dict[str, Any]]) -> dict[str, Any] | None:
    found = [o for o in objects if o["kind"] == NAME and o["metadata"]["name"].endswith("-policy-changes")]
    return found[0]["webhooks"][0] if found else None


def config(objects: list[dict[str, Any]]) -> Settings:
    cm = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-config"))
    return Settings.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))


def test_off_by_default(default_objects: list[dict[str, Any]]) -> None:
    assert policy_webhook(default_objects) is None
    assert config(default_objects).policy_changes.enforcement == "warn"


def test_one_value_turns_it_on_and_it_can_never_hold_a_change_up(render: Render) -> None:
    objects = render(values={"policyChanges": {"enabled": True}})
    hook = policy_webhook(objects)
    assert hook is not None
    assert (hook["failurePolicy"], hook["sideEffects"], hook["timeoutSeconds"]) == ("Ignore", "None", 5)
    assert hook["clientConfig"]["service"]["path"] == "/validate-policy"
    assert "namespaceSelector" not in hook  # the release namespace too: a policy there can cut topoguard off
    matched = {(g, r) for rule in hook["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert matched == {("cilium.io", "ciliumnetworkpolicies"), ("cilium.io", "ciliumclusterwidenetworkpolicies"),
                       ("networking.k8s.io", "networkpolicies"),
                       ("policy.networking.k8s.io", "clusternetworkpolicies")}
    for rule in hook["rules"]:
        assert rule["operations"] == ["CREATE", "UPDATE", "DELETE"]
    settings = config(objects)
    assert settings.policy_changes.deadline_seconds == 4  # answers before the apiserver gives up
    # The job-webhooks are unchanged beside it.
    assert one(objects, NAME, "topoguard")["webhooks"][0]["clientConfig"]["service"]["path"] == "/validate"


def test_enforcement_and_timeout_values(render: Render) -> None:
    objects = render(values={"policyChanges": {"enabled": True, "enforcement": "deny", "timeoutSeconds": 3}})
    hook = policy_webhook(objects)
    assert hook is not None and hook["timeoutSeconds"] == 3
    assert config(objects).policy_changes.enforcement == "deny"
    assert config(objects).policy_changes.deadline_seconds == 2


@pytest.mark.parametrize("seconds", [1, 6, 30])
def test_a_timeout_past_5s_is_refused(render: Render, seconds: int) -> None:
    with pytest.raises(HelmError, match=r"policyChanges/?\.?timeoutSeconds"):
        render(values={"policyChanges": {"enabled": True, "timeoutSeconds": seconds}})


def test_events_rbac_comes_with_it_even_without_the_audit(render: Render) -> None:
    objects = render(values={"policyChanges": {"enabled": True}, "audit": {"enabled": False}})
    role = one(objects, "ClusterRole")
    assert {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]} in role["rules"]
    without = render(values={"audit": {"enabled": False}})
    assert not any(r.get("apiGroups") == ["events.k8s.io"] for r in one(without, "ClusterRole")["rules"])


def test_it_trusts_the_same_ca_as_the_job_webhooks(render: Render) -> None:
    objects = render(values={"policyChanges": {"enabled": True}})
    hook = policy_webhook(objects)
    assert hook is not None
    jobs = one(objects, NAME, "topoguard")["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == jobs["clientConfig"]["caBundle"]
