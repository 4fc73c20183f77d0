"""app.policy.agent: the agent's settings from the snapshot's cilium-config and agent image."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from app.models.cilium import parse_version
from app.models.cluster import Snapshot
from app.policy import agent as agents


def snap(data: dict[str, str] | None = None, image: str = "", labels: dict[str, str] | None = None) -> Snapshot:
    return Snapshot(cilium_config=MappingProxyType(data) if data is not None else None,
                    cilium_image=image, cilium_config_labels=MappingProxyType(labels or {}))


@pytest.mark.parametrize(
    "snapshot, kwargs, want",
    [
        pytest.param(snap(), {}, {"version": None, "policy_enforcement": "default", "cluster_name": "default"},
                     id="nothing known: unknown version, defaults"),
        pytest.param(snap(image="quay.io/cilium/cilium:v1.15.6@sha256:ab"), {}, {"version": (1, 15, 6)},
                     id="version from the agent image tag"),
        pytest.param(snap(labels={"app.kubernetes.io/version": "1.20.2"}, image="x:v1.15.6"), {},
                     {"version": (1, 20, 2)}, id="the ConfigMap's version label comes before the image"),
        pytest.param(snap(image="x:v1.15.6"), {"version": "1.20.2"}, {"version": (1, 20, 2)},
                     id="explicit ciliumVersion wins"),
        pytest.param(snap({"enable-policy": "always", "cluster-name": "west", "policy-audit-mode": "true",
                           "policy-cidr-match-mode": "pods", "enable-non-default-deny-policies": "false",
                           "labels": "k8s:app k8s:role"}), {},
                     {"policy_enforcement": "always", "cluster_name": "west", "audit_mode": True,
                      "cidr_match_mode": ("pods",), "non_default_deny": False, "labels": ("k8s:app", "k8s:role")},
                     id="cilium-config keys"),
        pytest.param(snap({"enable-policy": "always"}), {"policy_enforcement": "never"},
                     {"policy_enforcement": "never"}, id="explicit policyEnforcement wins over cilium-config"),
    ],
)
def test_agent_settings(snapshot: Snapshot, kwargs: dict[str, Any], want: dict[str, Any]) -> None:
    agent = agents.agent_settings(snapshot, **kwargs)
    assert {k: getattr(agent, k) for k in want} == want


@pytest.mark.parametrize(
    "snapshot, kwargs",
    [
        pytest.param(snap({"enable-policy": "sometimes"}), {}, id="bad enable-policy"),
        pytest.param(snap({"policy-cidr-match-mode": "everything"}), {}, id="bad cidr match mode"),
        pytest.param(snap({"policy-audit-mode": "yes"}), {}, id="bad boolean"),
        pytest.param(snap({"labels": "k8s:("}), {}, id="label prefix that is not a regexp"),
        pytest.param(snap(), {"version": "latest"}, id="explicit version that is not one"),
    ],
)
def test_agent_settings_refuses_what_the_agent_refuses(snapshot: Snapshot, kwargs: dict[str, Any]) -> None:
    with pytest.raises(agents.AgentConfigError):
        agents.agent_settings(snapshot, **kwargs)


def test_sources_say_where_values_came_from() -> None:
    agent = agents.agent_settings(snap({"cluster-name": "west"}, image="x:v1.20.2"), policy_enforcement="always")
    lines = agents.describe_sources(agent)
    assert "ciliumVersion=1.20.2 (daemonset)" in lines
    assert "clusterName=west (cilium-config)" in lines
    assert "policyEnforcement=always (config)" in lines


@pytest.mark.parametrize(
    "text, want",
    [("v1.20.2", (1, 20, 2)), ("1.16", (1, 16, 0)), ("quay.io/cilium/cilium:v1.19.1@sha256:x", (1, 19, 1)),
     ("localhost:5000/cilium:v1.18.0", (1, 18, 0)), ("quay.io/cilium/cilium@sha256:x", None), ("latest", None)],
)
def test_parse_version(text: str, want: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == want


KCNP = "ClusterNetworkPolicy"


@pytest.mark.parametrize(
    "snapshot, kwargs, off, unknown",
    [
        pytest.param(snap(), {}, (), (KCNP,), id="no cilium-config: ClusterNetworkPolicy enforcement unknown"),
        pytest.param(snap(image="x:v1.20.2"), {}, (), (KCNP,), id="1.20 without its cilium-config: still unknown"),
        pytest.param(snap(image="x:v1.15.6"), {}, (KCNP,), (), id="before 1.20 there is no ClusterNetworkPolicy"),
        pytest.param(snap({}, image="x:v1.20.2"), {}, (KCNP,), (), id="1.20, flag absent: off (its default)"),
        pytest.param(snap({"enable-k8s-cluster-network-policy": "true"}, image="x:v1.20.2"), {}, (), (),
                     id="1.20 with enable-k8s-cluster-network-policy: enforced"),
        pytest.param(snap({"enable-k8s-cluster-network-policy": "true"}), {"version": "1.19.4"}, (KCNP,), (),
                     id="an explicit ciliumVersion before 1.20 wins over the flag"),
        pytest.param(snap({"enable-k8s-networkpolicy": "false", "enable-cilium-network-policy": "false",
                           "enable-cilium-clusterwide-network-policy": "false"}),
                     {}, ("NetworkPolicy", "CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy", KCNP), (),
                     id="every enable-* switch off"),
    ],
)
def test_policy_kinds_the_agent_enforces(snapshot: Snapshot, kwargs: dict[str, Any], off: tuple[str, ...],
                                         unknown: tuple[str, ...]) -> None:
    agent = agents.agent_settings(snapshot, **kwargs)
    assert (set(agent.kinds_off), set(agent.kinds_unknown)) == (set(off), set(unknown))
    for kind in off:
        assert agents.kind_enforced(agent, kind) is False
    for kind in unknown:
        assert agents.kind_enforced(agent, kind) is None


def test_sources_show_what_each_policy_kind_depends_on() -> None:
    lines = agents.describe_sources(agents.agent_settings(snap({"enable-k8s-networkpolicy": "false"})))
    assert "enforces[NetworkPolicy]=false (cilium-config)" in lines
    assert "enforces[ClusterNetworkPolicy]=false (default)" in lines
    assert "enforces[ClusterNetworkPolicy]=unknown (unknown)" in agents.describe_sources(agents.agent_settings(snap()))
