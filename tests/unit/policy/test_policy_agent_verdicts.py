"""Verdicts under the agent's cilium-config settings: audit mode, non-default-deny policies, policy kinds off,
policy-enforcement, and the ConfigMap / DaemonSet read from a snapshot file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cache.files import load_snapshot
from app.models.cilium import CiliumAgent
from app.models.network import PortRange
from app.policy import check_flow, snapshot_agent
from tests.unit.policy.builders import cnp, knp, rule, sel, snapshot
from tests.unit.policy.test_policy_verdicts import COORD, WORKER

RDZV = PortRange.single(23456)
DENY_WORKERS = cnp("no", spec=rule(sel(role="coord"), ingressDeny=[{"fromEndpoints": [sel(role="worker")]}]))
RELAXED_DENY_OTHERS = cnp("relaxed", spec=rule(sel(role="coord"), ingressDeny=[{"fromEndpoints": [sel(role="x")]}],
                                               enableDefaultDeny={"ingress": False}))
ISOLATE = knp("iso", podSelector=sel(role="coord"), policyTypes=["Ingress"])
V120 = (1, 20, 2)


@pytest.mark.parametrize(
    "policies, agent, want",
    [
        pytest.param([DENY_WORKERS], CiliumAgent(version=V120), "deny", id="a deny without audit mode: deny"),
        pytest.param([DENY_WORKERS], CiliumAgent(version=V120, audit_mode=True), "allow",
                     id="policy-audit-mode: the drop is only logged, allow"),
        pytest.param([RELAXED_DENY_OTHERS], CiliumAgent(version=V120), "allow",
                     id="enableDefaultDeny false honoured: allow"),
        pytest.param([RELAXED_DENY_OTHERS], CiliumAgent(version=V120, non_default_deny=False), "deny",
                     id="enable-non-default-deny-policies false: the rule enforces ingress, deny"),
        pytest.param([RELAXED_DENY_OTHERS], CiliumAgent(version=(1, 15, 6)), "deny",
                     id="Cilium 1.15 has no enableDefaultDeny: the rule enforces ingress, deny"),
        pytest.param([ISOLATE], CiliumAgent(version=V120), "deny", id="a NetworkPolicy isolating the coordinator"),
        pytest.param([ISOLATE], CiliumAgent(version=V120, kinds_off=("NetworkPolicy",)), "allow",
                     id="enable-k8s-networkpolicy false: NetworkPolicies are not enforced, allow"),
    ],
)
def test_agent_settings_change_verdicts(policies: list[dict[str, Any]], agent: CiliumAgent, want: str) -> None:
    verdict = check_flow(snapshot(*policies), WORKER, COORD, RDZV, "TCP", agent=agent)
    assert verdict.verdict == want, verdict.reasons


def test_audit_mode_says_what_would_be_denied() -> None:
    verdict = check_flow(snapshot(DENY_WORKERS), WORKER, COORD, RDZV, "TCP",
                         agent=CiliumAgent(version=V120, audit_mode=True))
    (audit,) = [r for r in verdict.ingress.reasons if r.message.startswith("policy audit mode")]
    assert audit.effect == "allow"
    assert "would be denied (CiliumNetworkPolicy ml-demo/no ingressDeny[0])" in audit.message


def write(tmp_path: Path, *objects: dict[str, Any]) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    return path


CILIUM_CONFIG = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cilium-config",
                                                                      "namespace": "kube-system"},
                 "data": {"enable-policy": "always", "cluster-name": "west"}}
INIT = [{"name": "config", "image": "quay.io/cilium/cilium:v1.15.6"}]
AGENT = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "cilium", "namespace": "kube-system"},
         "spec": {"template": {"spec": {"initContainers": INIT,
                                        "containers": [{"name": "cilium-agent",
                                                        "image": "quay.io/cilium/cilium:v1.20.2"}]}}}}


def test_snapshot_file_carries_cilium_config_and_agent_image(tmp_path: Path) -> None:
    path = write(tmp_path, CILIUM_CONFIG, AGENT,
                 {**CILIUM_CONFIG, "metadata": {"name": "other", "namespace": "kube-system"}, "data": {"x": "y"}})
    snap = load_snapshot(path)
    agent = snapshot_agent(snap)
    assert (agent.version, agent.policy_enforcement, agent.cluster_name) == (V120, "always", "west")
    assert snapshot_agent(snap, policy_enforcement="default").policy_enforcement == "default"


def test_snapshot_file_with_cilium_config_off_reads_neither(tmp_path: Path) -> None:
    snap = load_snapshot(write(tmp_path, CILIUM_CONFIG, AGENT), cilium_config="")
    assert (snap.cilium_config, snap.cilium_image) == (None, "")


def test_snapshot_file_reads_the_configured_config_map(tmp_path: Path) -> None:
    moved = {**CILIUM_CONFIG, "metadata": {"name": "agent", "namespace": "cilium"}}
    snap = load_snapshot(write(tmp_path, CILIUM_CONFIG, moved), cilium_config="cilium/agent")
    assert dict(snap.cilium_config or {}) == CILIUM_CONFIG["data"]


PODS_MODE = CiliumAgent(version=V120, cidr_match_mode=("pods",))
ZONE_A = ("10.1.0.0/24", "10.1.1.0/24")  # the pod CIDRs of zone a's nodes
ALL_IN_NS = [{"fromEndpoints": [{}]}]
DENY_ZONE_A = cnp("no-a", spec=rule(sel(role="coord"), ingress=ALL_IN_NS, ingressDeny=[{"fromCIDR": ["10.1.0.0/16"]}]))
DENY_PART = cnp("no-part", spec=rule(sel(role="coord"), ingress=ALL_IN_NS, ingressDeny=[{"fromCIDRSet": [
    {"cidr": "10.1.0.0/16", "except": ["10.1.1.0/24"]}]}]))
ALLOW_ZONE_A_KNP = knp("from-a", podSelector=sel(role="coord"),
                       ingress=[{"from": [{"ipBlock": {"cidr": "10.1.0.0/16"}}]}])


def worker_in(*ranges: str) -> Any:
    from dataclasses import replace
    return replace(WORKER, ranges=tuple(ranges))


@pytest.mark.parametrize(
    "policies, agent, src, want",
    [
        pytest.param([DENY_ZONE_A], CiliumAgent(version=V120), worker_in(*ZONE_A), "allow",
                     id="default mode: a CIDR peer never matches a pod, allow"),
        pytest.param([DENY_ZONE_A], PODS_MODE, worker_in(*ZONE_A), "deny",
                     id="pods mode: every pod CIDR of the zone inside the denied CIDR, deny"),
        pytest.param([DENY_ZONE_A], PODS_MODE, worker_in("10.2.0.0/24"), "allow",
                     id="pods mode: the zone's pod CIDRs outside it, allow"),
        pytest.param([DENY_ZONE_A], PODS_MODE, worker_in("10.1.0.0/24", "10.2.0.0/24"), "unknown",
                     id="pods mode: partly covered, unknown"),
        pytest.param([DENY_PART], PODS_MODE, worker_in(*ZONE_A), "unknown",
                     id="pods mode: an except prefix takes part of the zone, unknown"),
        pytest.param([DENY_ZONE_A], PODS_MODE, worker_in(), "unknown",
                     id="pods mode: nodes without podCIDRs, unknown"),
        pytest.param([ALLOW_ZONE_A_KNP], PODS_MODE, worker_in(*ZONE_A), "allow",
                     id="pods mode: a NetworkPolicy ipBlock allows the zone's pods"),
        pytest.param([ALLOW_ZONE_A_KNP], CiliumAgent(version=V120), worker_in(*ZONE_A), "deny",
                     id="default mode: the ipBlock allows no pod, the NetworkPolicy isolates, deny"),
    ],
)
def test_policy_cidr_match_mode_pods(policies: list[dict[str, Any]], agent: CiliumAgent, src: Any,
                                     want: str) -> None:
    verdict = check_flow(snapshot(*policies), src, COORD, RDZV, "TCP", agent=agent)
    assert verdict.verdict == want, verdict.reasons


def test_policy_cidr_match_mode_nodes_leaves_host_network_peers_unknown() -> None:
    from dataclasses import replace
    host_worker = replace(WORKER, host_network=True)
    deny_nodes = cnp("no-nodes", spec=rule(sel(role="coord"), ingress=[{"fromEntities": ["all"]}],
                                           ingressDeny=[{"fromCIDR": ["192.168.0.0/16"]}]))
    default = check_flow(snapshot(deny_nodes), host_worker, COORD, RDZV, "TCP", agent=CiliumAgent(version=V120))
    nodes = check_flow(snapshot(deny_nodes), host_worker, COORD, RDZV, "TCP",
                       agent=CiliumAgent(version=V120, cidr_match_mode=("nodes",)))
    assert (default.ingress.verdict, nodes.ingress.verdict) == ("allow", "unknown"), nodes.reasons


GROUP = {"apiVersion": "cilium.io/v2", "kind": "CiliumCIDRGroup", "metadata": {"name": "zone-a-pods"},
         "spec": {"externalCIDRs": ["10.1.0.0/16"]}}


@pytest.mark.parametrize(
    "peer, objects, want",
    [
        pytest.param({"cidrGroupRef": "zone-a-pods"}, [GROUP], "deny", id="cidrGroupRef: the group's CIDRs, deny"),
        pytest.param({"cidrGroupRef": "missing"}, [GROUP], "allow", id="cidrGroupRef to no group selects nothing"),
        pytest.param({"cidrGroupSelector": sel(zone="a")}, [GROUP], "unknown",
                     id="cidrGroupSelector: group labels are not known, unknown"),
    ],
)
def test_cidr_groups_under_pods_mode(peer: dict[str, Any], objects: list[dict[str, Any]], want: str) -> None:
    policy = cnp("no-group", spec=rule(sel(role="coord"), ingress=ALL_IN_NS, ingressDeny=[{"fromCIDRSet": [peer]}]))
    verdict = check_flow(snapshot(policy, *objects), worker_in(*ZONE_A), COORD, RDZV, "TCP", agent=PODS_MODE)
    assert verdict.verdict == want, verdict.reasons
