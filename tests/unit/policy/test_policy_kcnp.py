"""Kubernetes ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2) as Cilium v1.20 enforces it.

The cases follow the network-policy-api documentation (sigs.k8s.io/network-policy-api, API
reference of ClusterNetworkPolicy v1alpha2: tiers, priority, actions, peers, protocols) and, where
that leaves a choice to the implementation or Cilium's code departs from it, Cilium's own code
(pkg/k8s/cluster_network_policy.go, pkg/policy repository tiers); `make oracle` runs every case of
`KCNPS` through Cilium's code too (hack/oracle/cases.py).
"""

from __future__ import annotations

import pytest

from app.models.cilium import CiliumAgent
from app.models.cluster import ContainerPort
from app.models.network import PortRange
from app.policy import check_flow, policy_problems
from tests.unit.policy.builders import NS, cnp, endpoint, kcnp, kcnp_rule, knp, port, rule, sel, snapshot, tcp
from tests.unit.policy.test_policy_verdicts import COORD, WORKER, Case, run

# An agent that enforces ClusterNetworkPolicy (Cilium 1.20, enable-k8s-cluster-network-policy=true).
ENFORCING = CiliumAgent(version=(1, 20, 2), kinds_unknown=())
OTHER_WORKER = endpoint("other", name="worker", role="worker")
TO_COORD = {"pods": {"namespaceSelector": {}, "podSelector": sel(role="coord")}}


def case(policies: list[dict[str, object]], want: str, **kw: object) -> Case:
    return Case(policies, want, agent=ENFORCING, **kw)  # type: ignore[arg-type]


KCNPS = [
    pytest.param(
        case([kcnp("deny-workers", ingress=[kcnp_rule("Deny", "no-workers", pods=sel(role="worker"))])], "deny",
             reason=("ingress", "deny", "deny-workers", "ingress[0]")),
        id="only an Admin Deny from the worker pods: deny (the silent allow of issue 14)",
    ),
    pytest.param(
        case([kcnp(ingress=[kcnp_rule("Deny", pods=sel(role="launcher"))])], "allow", sides=("allow", "allow")),
        id="Admin Deny from other pods does not touch the flow; no default-deny: allow",
    ),
    pytest.param(
        case([kcnp("ok", ingress=[kcnp_rule("Accept", pods=sel(role="worker"))]),
              cnp("no", spec=rule(sel(role="coord"), ingressDeny=[{"fromEndpoints": [sel(role="worker")]}]))],
             "allow", reason=("ingress", "allow", "ok", "ingress[0]")),
        id="Admin Accept is final: a CiliumNetworkPolicy deny below it does not apply: allow",
    ),
    pytest.param(
        case([kcnp("pass", ingress=[kcnp_rule("Pass", pods=sel(role="worker"))]),
              cnp("no", spec=rule(sel(role="coord"), ingressDeny=[{"fromEndpoints": [sel(role="worker")]}]))],
             "deny", reason=("ingress", "deny", f"{NS}/no", "ingressDeny[0]")),
        id="Admin Pass hands the flow to the NetworkPolicy tier, which denies it: deny",
    ),
    pytest.param(
        case([kcnp("pass", ingress=[kcnp_rule("Pass", pods=sel(role="worker"))]),
              kcnp("deny-all", priority=20, ingress=[kcnp_rule("Deny")])], "allow"),
        id="Pass skips the lower-precedence Admin Deny; nothing else applies: allow",
    ),
    pytest.param(
        case([kcnp("pass", ingress=[kcnp_rule("Pass", pods=sel(role="worker"))]),
              kcnp("base", tier="Baseline", ingress=[kcnp_rule("Deny")])], "deny",
             reason=("ingress", "deny", "base", "ingress[0]")),
        id="Admin Pass, no NetworkPolicy, Baseline Deny: deny",
    ),
    pytest.param(
        case([kcnp("base", tier="Baseline", ingress=[kcnp_rule("Deny")]),
              cnp("in", spec=rule(sel(role="coord"), ingress=[{"fromEndpoints": [sel(role="worker")]}]))],
             "allow", reason=("ingress", "allow", f"{NS}/in", "ingress[0]")),
        id="the NetworkPolicy tier's allow comes before a Baseline Deny: allow",
    ),
    pytest.param(
        case([kcnp("base", tier="Baseline", ingress=[kcnp_rule("Deny", pods=sel(role="worker"))])], "deny"),
        id="only a Baseline Deny: deny",
    ),
    pytest.param(
        case([kcnp("base", tier="Baseline", ingress=[kcnp_rule("Accept")]),
              cnp("in", spec=rule(sel(role="coord"), ingress=[{"fromEndpoints": [sel(role="launcher")]}]))],
             "allow", reason=("ingress", "allow", "base", "ingress[0]")),
        id="Cilium: a Baseline Accept allows what a CiliumNetworkPolicy leaves to default-deny: allow",
    ),
    pytest.param(
        case([kcnp("base", tier="Baseline", ingress=[kcnp_rule("Accept")]),
              knp("k", podSelector=sel(role="coord"), policyTypes=["Ingress"])], "allow"),
        id="Cilium: a Baseline Accept allows what a NetworkPolicy isolates: allow",
    ),
    pytest.param(
        case([kcnp("base", tier="Baseline", ingress=[kcnp_rule("Pass")]),
              knp("k", podSelector=sel(role="coord"), policyTypes=["Ingress"])], "deny",
             reason=("ingress", "default-deny", f"{NS}/k", "spec")),
        id="a Baseline Pass leaves the flow to the default, here a NetworkPolicy's default-deny: deny",
    ),
    pytest.param(
        case([kcnp("accept", priority=10, ingress=[kcnp_rule("Accept")]),
              kcnp("deny", priority=20, ingress=[kcnp_rule("Deny")])], "allow",
             reason=("ingress", "allow", "accept", "ingress[0]")),
        id="a lower priority number wins: Accept at 10 over Deny at 20: allow",
    ),
    pytest.param(
        case([kcnp("accept", priority=30, ingress=[kcnp_rule("Accept")]),
              kcnp("deny", priority=20, ingress=[kcnp_rule("Deny")])], "deny",
             reason=("ingress", "deny", "deny", "ingress[0]")),
        id="Deny at priority 20 over Accept at 30: deny",
    ),
    pytest.param(
        case([kcnp("a", priority=10, ingress=[kcnp_rule("Accept")]),
              kcnp("d", priority=10, ingress=[kcnp_rule("Deny")])], "deny"),
        id="same priority in two policies (the API leaves it open): Cilium lets Deny win: deny",
    ),
    pytest.param(
        case([kcnp(ingress=[kcnp_rule("Accept", "rdzv", protocols=[tcp(23456)]), kcnp_rule("Deny", "rest")])],
             "allow"),
        id="rules in one policy: the first written wins (Accept rdzv before Deny all): allow",
    ),
    pytest.param(
        case([kcnp(ingress=[kcnp_rule("Accept", "rdzv", protocols=[tcp(23456)]), kcnp_rule("Deny", "rest")])],
             "deny", ports=PortRange.single(80), reason=("ingress", "deny", "cnp", "ingress[1]")),
        id="the same policy on another port: the second rule denies it: deny",
    ),
    pytest.param(
        case([kcnp(ingress=[kcnp_rule("Deny", protocols=[tcp(23456)])])], "deny", ports=PortRange(23000, 24000)),
        id="a range with one denied port: deny",
    ),
    pytest.param(
        case([kcnp(ingress=[kcnp_rule("Deny", protocols=[tcp(20000, 30000)])])], "allow",
             ports=PortRange.single(80)),
        id="a port range that does not hold the port: allow",
    ),
    pytest.param(
        case([kcnp(ingress=[kcnp_rule("Deny", protocols=[{"destinationNamedPort": "rdzv"}])])], "deny"),
        id="destinationNamedPort resolved against the destination's container port: deny",
    ),
    pytest.param(
        case([kcnp(ingress=[kcnp_rule("Deny", protocols=[{"udp": {}}])])], "allow"),
        id="a UDP-only Deny leaves TCP alone: allow",
    ),
    pytest.param(
        case([kcnp(ingress=[kcnp_rule("Deny", protocols=[tcp()])])], "deny"),
        id="tcp without destinationPort denies every TCP port: deny",
    ),
    pytest.param(
        case([kcnp(ingress=[kcnp_rule("Deny", namespaces=sel(**{"kubernetes.io/metadata.name": "other"}))])],
             "allow"),
        id="namespaces peer naming another namespace: allow",
    ),
    pytest.param(
        case([kcnp(ingress=[kcnp_rule("Deny", namespaces=sel(**{"kubernetes.io/metadata.name": "other"}))])],
             "deny", src=OTHER_WORKER),
        id="namespaces peer naming the source's namespace: deny",
    ),
    pytest.param(
        case([kcnp(ingress=[kcnp_rule("Deny", namespaces={})])], "deny", src=OTHER_WORKER),
        id="an empty namespaces selector holds every namespace: deny",
    ),
    pytest.param(
        case([kcnp(subject={"namespaces": sel(**{"kubernetes.io/metadata.name": "other"})},
                   ingress=[kcnp_rule("Deny")])], "allow"),
        id="a subject in another namespace does not select the destination: allow",
    ),
    pytest.param(
        case([kcnp(subject={"pods": {"namespaceSelector": {}, "podSelector": sel(role="coord")}},
                   ingress=[kcnp_rule("Deny", pods=sel(role="worker"))])], "deny"),
        id="pods subject across namespaces selecting the destination: deny",
    ),
    pytest.param(
        case([kcnp(subject={"pods": {"namespaceSelector": {}, "podSelector": sel(role="worker")}},
                   egress=[kcnp_rule("Deny", peers=[TO_COORD], direction="egress")])], "deny",
             sides=("deny", "allow")),
        id="an egress Deny to the coordinator: deny on the egress side",
    ),
    pytest.param(
        case([kcnp(egress=[kcnp_rule("Deny", peers=[{"networks": ["0.0.0.0/0"]}], direction="egress")])], "allow"),
        id="Cilium: a networks peer never matches a pod (the API text says it does): allow",
    ),
    pytest.param(
        case([kcnp(egress=[kcnp_rule("Accept", peers=[{"domainNames": ["example.com"]}], direction="egress")])],
             "allow"),
        id="a domainNames Accept does not touch pod traffic: allow",
    ),
    pytest.param(
        case([kcnp(ingress=[kcnp_rule("Deny", pods=sel(role="worker"))]),
              cnp("in", spec=rule(sel(role="coord"), ingress=[{"fromEndpoints": [sel(role="worker")]}]))], "deny"),
        id="an Admin Deny beats a CiliumNetworkPolicy allow: deny",
    ),
    pytest.param(
        case([kcnp(ingress=[kcnp_rule("Accept", pods=sel(role="worker"))])], "deny", enforcement="always",
             sides=("deny", "allow")),
        id="mode always: the Admin Accept opens the ingress, the egress stays default-deny: deny",
    ),
]


@pytest.mark.parametrize("case", KCNPS)
def test_cluster_network_policy(case: Case) -> None:
    run(case)


def test_reason_names_policy_tier_priority_and_rule() -> None:
    policy = kcnp("deny-workers", priority=7, ingress=[kcnp_rule("Deny", "no-workers", pods=sel(role="worker"))])
    verdict = check_flow(snapshot(policy), WORKER, COORD, PortRange.single(23456), "TCP", agent=ENFORCING)
    (reason,) = [r for r in verdict.reasons if r.effect == "deny"]
    assert (reason.kind, reason.policy, reason.rule) == ("ClusterNetworkPolicy", "deny-workers", "ingress[0]")
    assert "tier Admin, priority 7, rule 'no-workers': Deny" in reason.message


AGENTS = [
    pytest.param(ENFORCING, "deny", id="agent enforces ClusterNetworkPolicy: deny"),
    pytest.param(CiliumAgent(version=(1, 20, 2), kinds_off=("ClusterNetworkPolicy",), kinds_unknown=()), "allow",
                 id="enable-k8s-cluster-network-policy false: not enforced, allow"),
    pytest.param(CiliumAgent(version=(1, 15, 6), kinds_off=("ClusterNetworkPolicy",), kinds_unknown=()), "allow",
                 id="Cilium 1.15: no ClusterNetworkPolicy support, allow"),
    pytest.param(CiliumAgent(version=(1, 20, 2)), "unknown", id="whether the agent enforces it is not known: unknown"),
]


@pytest.mark.parametrize("agent, want", AGENTS)
def test_enforcement_depends_on_the_agent(agent: CiliumAgent, want: str) -> None:
    policy = kcnp(ingress=[kcnp_rule("Deny", pods=sel(role="worker"))])
    verdict = check_flow(snapshot(policy), WORKER, COORD, PortRange.single(23456), "TCP", agent=agent)
    assert verdict.verdict == want, verdict.reasons
    if want == "unknown":
        assert any("enable-k8s-cluster-network-policy" in r.message for r in verdict.reasons)


def test_unknown_enforcement_that_changes_nothing_is_not_unknown() -> None:
    policy = kcnp(ingress=[kcnp_rule("Deny", pods=sel(role="launcher"))])
    verdict = check_flow(snapshot(policy), WORKER, COORD, PortRange.single(23456), "TCP",
                         agent=CiliumAgent(version=(1, 20, 2)))
    assert verdict.verdict == "allow"


INVALID = [
    pytest.param(kcnp(tier="Developer", ingress=[kcnp_rule("Deny")]), "spec.tier", id="tier outside Admin, Baseline"),
    pytest.param(kcnp(priority=1001, ingress=[kcnp_rule("Deny")]), "spec.priority", id="priority above 1000"),
    pytest.param(kcnp(ingress=[kcnp_rule("Drop")]), "action", id="action outside Accept, Deny, Pass"),
    pytest.param(kcnp(ingress=[kcnp_rule("Deny", peers=[{"namespaces": {}, "pods": {"podSelector": {}}}])]),
                 "exactly one", id="a peer with two kinds"),
    pytest.param(kcnp(egress=[kcnp_rule("Deny", peers=[{"domainNames": ["a.example"]}], direction="egress")]),
                 "domainNames", id="domainNames on a Deny rule"),
    pytest.param(kcnp(ingress=[kcnp_rule("Deny", protocols=[tcp(30000, 20000)])]), "start", id="descending range"),
    pytest.param({**kcnp(ingress=[kcnp_rule("Deny")]), "apiVersion": "policy.networking.k8s.io/v1beta1"},
                 "apiVersion", id="an apiVersion Cilium 1.20 does not read"),
    pytest.param(kcnp(ingress=[kcnp_rule("Deny", peers=[{"serviceAccounts": {}}])]), "unknown field",
                 id="a peer kind of a newer API"),
]


@pytest.mark.parametrize("policy, problem", INVALID)
def test_policies_that_cannot_be_evaluated_make_selected_sides_unknown(policy: dict[str, object], problem: str) -> None:
    snap = snapshot(policy)
    verdict = check_flow(snap, WORKER, COORD, PortRange.single(23456), "TCP", agent=ENFORCING)
    assert verdict.verdict == "unknown", verdict.reasons
    assert any(problem in p for _, p in policy_problems(snap)), policy_problems(snap)


def test_snapshot_reads_cluster_network_policies_cluster_scoped() -> None:
    snap = snapshot(kcnp("x"))
    (obj,) = snap.policies
    assert (obj.kind, obj.namespace, obj.ref) == ("ClusterNetworkPolicy", "", "x")


def test_named_port_of_another_pod_does_not_resolve() -> None:
    dst = endpoint(name="coord", role="coord", ports=[ContainerPort(29500, "TCP", "other")])
    policy = kcnp(ingress=[kcnp_rule("Deny", protocols=[{"destinationNamedPort": "rdzv"}])])
    verdict = check_flow(snapshot(policy), WORKER, dst, PortRange.single(23456), "TCP", agent=ENFORCING)
    assert verdict.verdict == "allow"


def test_admin_accept_then_cnp_port_rule_keep_their_own_ports() -> None:
    policies = [kcnp(ingress=[kcnp_rule("Accept", protocols=[tcp(80)])]),
                cnp("in", spec=rule(sel(role="coord"), ingress=[{"toPorts": [{"ports": [port(443)]}]}]))]
    snap = snapshot(*policies)
    got = {p: check_flow(snap, WORKER, COORD, PortRange.single(p), "TCP", agent=ENFORCING).verdict
           for p in (80, 443, 23456)}
    assert got == {80: "allow", 443: "allow", 23456: "deny"}
