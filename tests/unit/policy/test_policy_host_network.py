"""check_flow from and to hostNetwork pods (cilium-semantics.md §1.4, §4.5, §4.7, §8).

A hostNetwork pod's traffic reaches a pod as entity `host` from the same node and `remote-node`
from another; where the pods run is not known, so the pod's side must agree for both. The
hostNetwork pod's own side is host traffic: not enforced without host policies, else unknown.
Each case names the verdict and the (egress, ingress) side verdicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from app.models.cluster import ContainerPort
from app.models.network import Endpoint, PortRange, Verdict
from app.policy import check_flow
from tests.unit.policy.builders import NS, ccnp, cnp, endpoint, expr, knp, port, rule, sel, snapshot

RDZV = PortRange.single(23456)
HOST_WORKER = endpoint(name="hw", role="worker", host_network=True)
COORD = endpoint(name="coord", role="coord", ports=[ContainerPort(23456, "TCP", "rdzv")])
WORKER = endpoint(name="worker", role="worker")
HOST_COORD = endpoint(name="hc", role="coord", host_network=True, ports=[ContainerPort(23456, "TCP", "rdzv")])
HOST_POLICY = ccnp("host-fw", spec={"nodeSelector": {}, "ingress": [{"fromEntities": ["cluster"]}]})
HOST_EGRESS_POLICY = ccnp("host-out", spec={"nodeSelector": sel(gpu="yes"), "egress": [{"toEntities": ["world"]}]})


@dataclass(frozen=True)
class Case:
    policies: Sequence[dict[str, Any]]
    want: str
    sides: tuple[str, str]
    src: Endpoint = HOST_WORKER
    dst: Endpoint = COORD
    enforcement: str = "default"
    says: str = ""  # a phrase some reason's message must contain
    names: tuple[str, str] | None = None  # (policy, rule) some reason must name


def ingress_to_coord(*entries: Any, **extra: Any) -> dict[str, Any]:
    return cnp("coord-in", spec=rule(sel(role="coord"), ingress=list(entries), **extra))


def deny_into_coord(*entries: Any) -> dict[str, Any]:
    return cnp("coord-deny", spec=rule(sel(role="coord"), ingressDeny=list(entries)))


def egress_of_worker(*entries: Any, **extra: Any) -> dict[str, Any]:
    return cnp("worker-out", spec=rule(sel(role="worker"), egress=list(entries), **extra))


def check(case: Case) -> Verdict:
    return check_flow(snapshot(*case.policies), case.src, case.dst, RDZV, "TCP", enforcement=case.enforcement)  # type: ignore[arg-type]


FROM_HOST_NETWORK = [
    pytest.param(Case([], "allow", ("allow", "allow"), says="no host policy"), id="no policies at all: allow"),
    pytest.param(
        Case([ingress_to_coord({"fromEntities": ["host", "remote-node"]})], "allow", ("allow", "allow")),
        id="ingress allows entities host and remote-node: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEntities": ["cluster"]})], "allow", ("allow", "allow")),
        id="entity cluster holds host and remote-node: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEntities": ["remote-node"]})], "allow", ("allow", "allow"),
             says="allow-localhost"),
        id="remote-node allowed, the local host by allow-localhost: allow",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(role="worker")]})],
            "unknown",
            ("allow", "unknown"),
            says=f"allowed from the same node (entity host) but denied (CiliumNetworkPolicy {NS}/coord-in spec)",
        ),
        id="a pod selector never holds remote-node, the local host is allowed: unknown (placement)",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEntities": ["host"]})],
            "unknown",
            ("allow", "unknown"),
            says="depends on the nodes the pods run on",
        ),
        id="only entity host allowed: another node is denied, unknown (placement)",
    ),
    pytest.param(
        Case([deny_into_coord({"fromEntities": ["cluster"]})], "deny", ("allow", "deny"),
             names=(f"{NS}/coord-deny", "ingressDeny[0]")),
        id="a deny of entity cluster holds both identities, allow-localhost too: deny",
    ),
    pytest.param(
        Case(
            [deny_into_coord({"fromEntities": ["remote-node"]})],
            "unknown",
            ("allow", "unknown"),
            says=f"but denied (CiliumNetworkPolicy {NS}/coord-deny ingressDeny[0])",
        ),
        id="a deny of remote-node only: unknown (placement)",
    ),
    pytest.param(
        Case(
            [deny_into_coord({"fromEndpoints": [{"matchLabels": {"reserved:host": ""}}]}),
             ingress_to_coord({"fromEntities": ["remote-node"]})],
            "unknown",
            ("allow", "unknown"),
        ),
        id="a reserved:host selector denies the same node only: unknown (placement)",
    ),
    pytest.param(
        Case(
            [ccnp("cw", spec=rule(sel(role="coord"), ingress=[
                {"fromEndpoints": [{"matchExpressions": [expr("k8s:io.kubernetes.pod.namespace", "NotIn", "x")]}]}
            ]))],
            "allow",
            ("allow", "allow"),
        ),
        id="a NotIn namespace selector holds node identities, which are in no namespace: allow",
    ),
    pytest.param(
        Case(
            [ccnp("cw", spec=rule(sel(role="coord"), ingress=[
                {"fromEndpoints": [{"matchLabels": {"reserved:remote-node": "", "gpu": "yes"}}]}
            ]))],
            "unknown",
            ("allow", "unknown"),
            says="may select entity remote-node",
        ),
        id="a selector on node labels may or may not hold a remote node: unknown",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromNodes": [{}]})], "allow", ("allow", "allow")),
        id="fromNodes {} holds every remote node: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromNodes": [sel(gpu="yes")]})], "unknown", ("allow", "unknown"),
             says="the nodes the pods run on are not known"),
        id="fromNodes by node label: the node is not known, unknown",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEntities": ["kube-apiserver"]})], "unknown", ("allow", "unknown")),
        id="entity kube-apiserver may be on a node: unknown",
    ),
    pytest.param(
        Case([knp("k", podSelector=sel(role="coord"), ingress=[{"from": [{"podSelector": {}}]}])],
             "unknown", ("allow", "unknown")),
        id="NetworkPolicy podSelector peers never select node traffic: remote-node denied, unknown",
    ),
    pytest.param(
        Case([knp("k", podSelector=sel(role="coord"), ingress=[{"from": [{"namespaceSelector": {
            "matchExpressions": [expr("team", "NotIn", "x")]}}]}])], "unknown", ("allow", "unknown")),
        id="NetworkPolicy namespaceSelector peers never select node traffic either: unknown",
    ),
    pytest.param(
        Case([knp("k", podSelector=sel(role="coord"), ingress=[{"ports": [{"port": 23456}]}])], "allow",
             ("allow", "allow")),
        id="NetworkPolicy rule without from is the true wildcard, host included: allow",
    ),
    pytest.param(
        Case([knp("k", podSelector=sel(role="coord"), ingress=[{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}])],
             "unknown", ("allow", "unknown")),
        id="ipBlock never matches a node under the default cidr match mode: unknown",
    ),
    pytest.param(
        Case([], "unknown", ("unknown", "unknown"), enforcement="always", says="host firewall"),
        id="mode always: host egress default-deny if the host firewall is on, and remote-node denied: unknown",
    ),
    pytest.param(
        Case([HOST_EGRESS_POLICY], "unknown", ("unknown", "allow"), names=("host-out", "spec")),
        id="a host policy with egress exists: the host's egress is not evaluated, unknown",
    ),
    pytest.param(
        Case([HOST_POLICY], "allow", ("allow", "allow")),
        id="a host policy with ingress only leaves the host's egress unenforced: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEntities": ["host", "remote-node"],
                                "toPorts": [{"ports": [port(23456)], "rules": {"http": [{"method": "GET"}]}}]})],
             "unknown", ("allow", "unknown")),
        id="an L7 rule redirects the port for both identities: unknown",
    ),
]


TO_HOST_NETWORK = [
    pytest.param(Case([], "allow", ("allow", "allow"), src=WORKER, dst=HOST_COORD), id="no policies at all: allow"),
    pytest.param(
        Case([egress_of_worker({"toEntities": ["host", "remote-node"]})], "allow", ("allow", "allow"),
             src=WORKER, dst=HOST_COORD),
        id="egress allows host and remote-node: allow",
    ),
    pytest.param(
        Case([egress_of_worker({"toEndpoints": [sel(role="coord")]})], "deny", ("deny", "allow"),
             src=WORKER, dst=HOST_COORD, names=(f"{NS}/worker-out", "spec")),
        id="egress allows only pods: both identities default-deny, deny",
    ),
    pytest.param(
        Case([egress_of_worker({"toEntities": ["remote-node"]})], "unknown", ("unknown", "allow"),
             src=WORKER, dst=HOST_COORD, says=f"denied (CiliumNetworkPolicy {NS}/worker-out spec) from the same node"),
        id="egress allows remote-node only, no allow-localhost on egress: unknown (placement)",
    ),
    pytest.param(
        Case([HOST_POLICY], "unknown", ("allow", "unknown"), src=WORKER, dst=HOST_COORD, names=("host-fw", "spec")),
        id="a host policy with ingress: the host's ingress is not evaluated, unknown",
    ),
    pytest.param(
        Case([HOST_EGRESS_POLICY], "allow", ("allow", "allow"), src=WORKER, dst=HOST_COORD),
        id="a host policy with egress only leaves the host's ingress unenforced: allow",
    ),
    pytest.param(
        Case([], "allow", ("allow", "allow"), src=HOST_WORKER, dst=HOST_COORD),
        id="host to host without host policies: allow",
    ),
    pytest.param(
        Case([HOST_POLICY, HOST_EGRESS_POLICY], "unknown", ("unknown", "unknown"), src=HOST_WORKER, dst=HOST_COORD),
        id="host to host with host policies both ways: unknown",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEntities": ["world"]})], "allow", ("allow", "allow"), src=WORKER,
             dst=HOST_COORD, enforcement="never"),
        id="mode never: allow",
    ),
]


@pytest.mark.parametrize("case", FROM_HOST_NETWORK + TO_HOST_NETWORK)
def test_host_network(case: Case) -> None:
    verdict = check(case)
    assert (verdict.verdict, (verdict.egress.verdict, verdict.ingress.verdict)) == (case.want, case.sides), (
        verdict.reasons
    )
    assert verdict.reasons == verdict.egress.reasons + verdict.ingress.reasons
    if case.says:
        assert any(case.says in r.message for r in verdict.reasons), [r.message for r in verdict.reasons]
    if case.names is not None:
        assert case.names in {(r.policy, r.rule) for r in verdict.reasons}, verdict.reasons
