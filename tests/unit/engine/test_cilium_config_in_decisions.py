"""The decision path reads the Cilium agent's cilium-config (issue 14): ClusterNetworkPolicy only where the agent
enforces it, policy-cidr-match-mode pods against each zone's Node podCIDRs, audit mode, and enable-policy unless
topoguard's own policyEnforcement is given."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

import pytest

from app import engine, jobs
from app.cache import projections
from app.config import Settings
from app.models.cluster import Snapshot
from tests.builders import GPU, make_ccnp, make_namespace, make_node, make_pytorchjob, make_snapshot

NS = "ml"
NAMESPACE = make_namespace(NS, {"topoguard.io/enabled": "true", "kubernetes.io/metadata.name": NS})
DENY_ALL = {"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "quarantine"},
            "spec": {"tier": "Admin", "priority": 5, "subject": {"namespaces": {}},
                     "ingress": [{"name": "nobody", "action": "Deny", "from": [{"namespaces": {}}]}]}}
# Zone b's pods come from 10.2.0.0/16: a CIDR deny of it shuts zone b only, and only in pods mode.
CIDR_DENY = make_ccnp("no-zone-b", {"endpointSelector": {}, "ingress": [{"fromEndpoints": [{}]}],
                                    "ingressDeny": [{"fromCIDR": ["10.2.0.0/16"]}]})


def nodes() -> list[Any]:
    return [dataclasses.replace(make_node("gpu-a", zone="zone-a", gpus=8), pod_cidrs=("10.1.0.0/24",)),
            dataclasses.replace(make_node("gpu-b", zone="zone-b", gpus=8), pod_cidrs=("10.2.0.0/24",))]


def snapshot(config: dict[str, str] | None, *policies: Any, image: str = "quay.io/cilium/cilium:v1.20.2") -> Snapshot:
    snap = make_snapshot(nodes(), namespaces=[NAMESPACE],
                         policies=[p if not isinstance(p, dict) else projections.project_policy(p) for p in policies])
    return dataclasses.replace(snap, cilium_config=MappingProxyType(config) if config is not None else None,
                               cilium_image=image)


def networks(snap: Snapshot, settings: Settings | None = None) -> dict[str, str]:
    group = jobs.parse_job(make_pytorchjob("train", namespace=NS), gpu_resources=(GPU,), namespace=NS)
    decision = engine.decide(group, snap, settings or Settings())
    return {z.zone: z.network for z in decision.zones}


KCNP_ON = {"enable-k8s-cluster-network-policy": "true"}


@pytest.mark.parametrize(("snap", "want"), [
    pytest.param(snapshot(KCNP_ON, DENY_ALL), {"zone-a": "deny", "zone-b": "deny"},
                 id="an Admin Deny the agent enforces blocks every zone"),
    pytest.param(snapshot({}, DENY_ALL), {"zone-a": "allow", "zone-b": "allow"},
                 id="enable-k8s-cluster-network-policy off: not enforced, open"),
    pytest.param(snapshot(None, DENY_ALL), {"zone-a": "unknown", "zone-b": "unknown"},
                 id="cilium-config not read: unknown, never a silent allow"),
    pytest.param(snapshot(KCNP_ON, DENY_ALL, image="quay.io/cilium/cilium:v1.15.6"),
                 {"zone-a": "allow", "zone-b": "allow"}, id="Cilium 1.15 has no ClusterNetworkPolicy: open"),
    pytest.param(snapshot({"policy-cidr-match-mode": "pods"}, CIDR_DENY), {"zone-a": "allow", "zone-b": "deny"},
                 id="pods mode: the CIDR deny holds zone b's pod CIDRs only"),
    pytest.param(snapshot({}, CIDR_DENY), {"zone-a": "allow", "zone-b": "allow"},
                 id="default mode: CIDR peers never match pods"),
    pytest.param(snapshot({"policy-audit-mode": "true", **KCNP_ON}, DENY_ALL), {"zone-a": "allow", "zone-b": "allow"},
                 id="audit mode: would-be drops are allowed"),
    pytest.param(snapshot({"enable-policy": "never", **KCNP_ON}, DENY_ALL), {"zone-a": "allow", "zone-b": "allow"},
                 id="the agent's enable-policy never: nothing enforced"),
])
def test_decisions_follow_the_agent_settings(snap: Snapshot, want: dict[str, str]) -> None:
    assert networks(snap) == want


def test_explicit_policy_enforcement_wins_over_cilium_config() -> None:
    snap = snapshot({"enable-policy": "never", **KCNP_ON}, DENY_ALL)
    settings = Settings.model_validate({"policyEnforcement": "default"})
    assert networks(snap, settings) == {"zone-a": "deny", "zone-b": "deny"}


def test_audit_mode_is_a_decision_warning() -> None:
    snap = snapshot({"policy-audit-mode": "true", **KCNP_ON}, DENY_ALL)
    group = jobs.parse_job(make_pytorchjob("train", namespace=NS), gpu_resources=(GPU,), namespace=NS)
    decision = engine.decide(group, snap, Settings())
    assert any("policy audit mode" in w for w in decision.warnings)
