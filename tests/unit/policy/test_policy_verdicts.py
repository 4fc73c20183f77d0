"""check_flow over every rule of the semantics (research/cilium-semantics.md), one table per topic.

Each case: the policies, source, destination, port, protocol → the verdict, and (where one rule
decides) the reason that must name it as (side, effect, policy, rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from app.models.cilium import CiliumAgent
from app.models.cluster import ContainerPort
from app.models.network import Endpoint, PortRange
from app.policy import check_flow
from tests.unit.policy.builders import NS, ccnp, cnp, endpoint, expr, knp, port, rule, sel, snapshot

WORKER = endpoint(name="worker", role="worker", zone="a")
COORD = endpoint(name="coord", role="coord", zone="a", ports=[ContainerPort(23456, "TCP", "rdzv")])
RDZV = PortRange.single(23456)
OTHER_NS_COORD = endpoint("other", name="coord", role="coord", zone="a")
SSH_DENY_OVERLAY = ccnp("deny-ssh", spec=rule(
    {}, enableDefaultDeny={"ingress": False, "egress": False},
    ingressDeny=[{"fromEntities": ["all"], "toPorts": [{"ports": [{"port": "22", "protocol": "TCP"}]}]}],
))


@dataclass(frozen=True)
class Case:
    policies: Sequence[dict[str, Any]]
    want: str
    src: Endpoint = WORKER
    dst: Endpoint = COORD
    ports: PortRange = RDZV
    protocol: str = "TCP"
    enforcement: str = "default"
    reason: tuple[str, str, str, str] | None = None  # (side, effect, policy, rule) that must be present
    sides: tuple[str, str] | None = None  # (egress, ingress) verdicts
    agent: CiliumAgent | None = None  # None: what the snapshot says (here: an agent of unknown version)


def run(case: Case) -> None:
    verdict = check_flow(
        snapshot(*case.policies), case.src, case.dst, case.ports, case.protocol, enforcement=case.enforcement,
        agent=case.agent,
    )  # type: ignore[arg-type]
    assert verdict.verdict == case.want, verdict.reasons
    assert verdict.reasons == verdict.egress.reasons + verdict.ingress.reasons
    if case.sides is not None:
        assert (verdict.egress.verdict, verdict.ingress.verdict) == case.sides
    if case.reason is not None:
        got = {(r.side, r.effect, r.policy, r.rule) for r in verdict.reasons}
        assert case.reason in got, got


def ingress_to_coord(*entries: Any, **extra: Any) -> dict[str, Any]:
    return cnp("coord-in", spec=rule(sel(role="coord"), ingress=list(entries), **extra))


def egress_of_worker(*entries: Any, **extra: Any) -> dict[str, Any]:
    return cnp("worker-out", spec=rule(sel(role="worker"), egress=list(entries), **extra))


ENFORCEMENT = [
    pytest.param(
        Case([], "allow", sides=("allow", "allow"), reason=("egress", "not-enforced", "", "")),
        id="no policies: both sides not enforced, allow",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(role="worker")]})],
            "allow",
            reason=("ingress", "allow", f"{NS}/coord-in", "ingress[0]"),
        ),
        id="ingress allow naming the source: allow",
    ),
    pytest.param(
        Case([egress_of_worker({})], "deny", reason=("egress", "default-deny", f"{NS}/worker-out", "spec")),
        id="egress [{}] enforces egress and allows nothing: deny",
    ),
    pytest.param(
        Case(
            [cnp(spec=rule(sel(role="coord"), ingress=[], egress=[{"toEndpoints": [{}]}]))],
            "allow",
            sides=("allow", "allow"),
        ),
        id="ingress: [] does not enforce ingress: allow",
    ),
    pytest.param(
        Case(
            [cnp("d", spec=rule(sel(role="coord"), ingressDeny=[{"toPorts": [{"ports": [port(80)]}]}]))],
            "deny",
            reason=("ingress", "default-deny", f"{NS}/d", "spec"),
        ),
        id="a deny-only rule enforces ingress, other ports default-deny: deny",
    ),
    pytest.param(
        Case(
            [
                cnp(
                    "d",
                    spec=rule(
                        sel(role="coord"),
                        ingressDeny=[{"toPorts": [{"ports": [port(80)]}]}],
                        enableDefaultDeny={"ingress": False},
                    ),
                )
            ],
            "allow",
        ),
        id="deny-only rule with enableDefaultDeny false leaves other ports open: allow",
    ),
    pytest.param(
        Case(
            [
                cnp(
                    "d",
                    spec=rule(
                        sel(role="coord"),
                        ingressDeny=[{"toPorts": [{"ports": [port(80)]}]}],
                        enableDefaultDeny={"ingress": False},
                    ),
                )
            ],
            "deny",
            ports=PortRange.single(80),
            reason=("ingress", "deny", f"{NS}/d", "ingressDeny[0]"),
        ),
        id="deny entry still applies when default deny is off: deny",
    ),
    pytest.param(
        Case(
            [egress_of_worker({"toEndpoints": [sel(role="nobody")]}, enableDefaultDeny={"egress": False})],
            "allow",
            reason=("egress", "not-enforced", f"{NS}/worker-out", "spec"),
        ),
        id="enableDefaultDeny.egress false: not enforced, allow",
    ),
    pytest.param(
        Case(
            [
                egress_of_worker({"toEndpoints": [sel(role="nobody")]}, enableDefaultDeny={"egress": False}),
                cnp("strict", spec=rule(sel(zone="a"), egress=[{"toEndpoints": [sel(role="nobody")]}])),
            ],
            "deny",
            reason=("egress", "default-deny", f"{NS}/strict", "spec"),
        ),
        id="any selecting rule with default deny on enforces the direction: deny",
    ),
    pytest.param(
        Case([], "deny", enforcement="always", sides=("deny", "deny")), id="mode always with no policies: deny"
    ),
    pytest.param(
        Case(
            [
                ingress_to_coord({"fromEndpoints": [sel(role="worker")]}),
                egress_of_worker({"toEndpoints": [sel(role="coord")]}),
            ],
            "allow",
            enforcement="always",
        ),
        id="mode always with explicit allows on both sides: allow",
    ),
    pytest.param(
        Case(
            [egress_of_worker({}), ingress_to_coord({"fromEntities": ["world"]})],
            "allow",
            enforcement="never",
            sides=("allow", "allow"),
        ),
        id="mode never ignores every policy: allow",
    ),
    pytest.param(
        Case(
            [
                cnp(
                    specs=[
                        rule(sel(role="coord"), ingress=[{"fromEndpoints": [sel(role="x")]}]),
                        rule(sel(role="coord"), ingress=[{"fromEndpoints": [sel(role="worker")]}]),
                    ]
                )
            ],
            "allow",
            reason=("ingress", "allow", f"{NS}/p", "specs[1].ingress[0]"),
        ),
        id="specs[] rules are unioned, reason names specs[1]: allow",
    ),
    pytest.param(
        Case(
            [
                cnp(
                    spec=rule(sel(role="coord"), ingress=[{"fromEndpoints": [sel(role="x")]}]),
                    specs=[rule(sel(role="coord"), ingress=[{"fromEndpoints": [sel(role="worker")]}])],
                )
            ],
            "allow",
        ),
        id="spec and specs together both apply: allow",
    ),
]

SELECTORS = [
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [{"matchExpressions": [expr("role", "In", "a", "worker")]}]})], "allow"
        ),
        id="In matches one of the values: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [{"matchExpressions": [expr("zone", "NotIn", "b")]}]})], "allow"),
        id="NotIn with another value: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [{"matchExpressions": [expr("gpu", "NotIn", "x")]}]})], "allow"),
        id="NotIn matches an absent key: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [{"matchExpressions": [expr("zone", "NotIn", "a")]}]})], "deny"),
        id="NotIn with the pod's value: deny",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [{"matchExpressions": [expr("zone", "Exists")]}]})], "allow"),
        id="Exists on a present key: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [{"matchExpressions": [expr("zone", "DoesNotExist")]}]})], "deny"),
        id="DoesNotExist on a present key: deny",
    ),
    pytest.param(
        Case(
            [
                ingress_to_coord(
                    {
                        "fromEndpoints": [
                            {"matchLabels": {"role": "worker"}, "matchExpressions": [expr("zone", "In", "b")]}
                        ]
                    }
                )
            ],
            "deny",
        ),
        id="matchLabels and matchExpressions are ANDed: deny",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [sel(**{"k8s:role": "worker"})]})], "allow"),
        id="k8s: source matches pod labels: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [sel(**{"any:role": "worker"})]})], "allow"),
        id="any: source matches pod labels: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [sel(**{"reserved:host": ""})]})], "deny"),
        id="reserved: source never matches a pod: deny",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [sel(**{"$host": ""})]})], "unknown"),
        id="$ shorthand in matchLabels makes Cilium reject the policy: unknown",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [sel(**{"container:role": "worker"})]})], "deny"),
        id="another source never matches a pod: deny",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(**{"io.cilium.k8s.policy.serviceaccount": "trainer"})]})],
            "allow",
            src=endpoint(name="w", sa="trainer", role="worker"),
        ),
        id="service account identity label matches: allow",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(**{"io.cilium.k8s.policy.serviceaccount": "trainer"})]})],
            "deny",
            src=endpoint(name="w", role="worker", **{"io.cilium.k8s.policy.serviceaccount": "trainer"}),
        ),
        id="a pod label cannot fake the service account: deny",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(**{"io.cilium.k8s.namespace.labels.team": "ml"})]})],
            "allow",
            src=endpoint(name="w", ns_labels={"team": "ml"}, role="worker"),
        ),
        id="namespace label of the peer's namespace matches: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [sel(**{"io.cilium.k8s.policy.cluster": "default"})]})], "allow"),
        id="cluster identity label is default: allow",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(**{"pod-template-hash": "abc"})]})],
            "deny",
            src=endpoint(name="w", role="worker", **{"pod-template-hash": "abc"}),
        ),
        id="a label outside the identity filter never matches: deny",
    ),
    *[
        pytest.param(
            Case(
                [ingress_to_coord({"fromEndpoints": [sel(**{"topology.kubernetes.io/zone": "z1"})]})],
                want,
                src=endpoint(name="w", role="worker", **{"topology.kubernetes.io/zone": "z1"}),
                agent=CiliumAgent(version=version),
            ),
            id=f"topology.kubernetes.io/zone selector on Cilium {label}: {want}",
        )
        for version, label, want in [
            ((1, 15, 6), "1.15.6 (the label is part of the identity)", "allow"),
            ((1, 18, 0), "1.18.0 (the label is part of the identity)", "allow"),
            ((1, 19, 0), "1.19.0 (the default filter drops topology.kubernetes.io)", "deny"),
            ((1, 20, 2), "1.20.2 (the default filter drops topology.kubernetes.io)", "deny"),
            (None, "of unknown version (the versions disagree)", "unknown"),
        ]
    ],
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(**{"topology.kubernetes.io/zone": "z1"})]})],
            "allow",
            src=endpoint(name="w", role="worker", **{"topology.kubernetes.io/zone": "z1"}),
            agent=CiliumAgent(version=(1, 20, 2), labels=("topology.kubernetes.io",)),
        ),
        id="Cilium 1.20.2 with labels: topology.kubernetes.io (allow-list mode) keeps it: allow",
    ),
    pytest.param(
        Case(
            [cnp("all-in", spec=rule({}, ingress=[{"fromEndpoints": [sel(role="worker")]}]))],
            "deny",
            agent=CiliumAgent(version=(1, 20, 2), labels=("k8s:app",)),
        ),
        id="labels: k8s:app (allow-list mode) drops every other pod label, role matches nothing: deny",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(role="worker")]})],
            "allow",
            src=endpoint(name="w", role="worker", **{"topology.kubernetes.io/zone": "z1"}),
        ),
        id="unknown version but no selector reads the topology label: allow",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(**{"io.cilium.k8s.policy.cluster": "west"})]})],
            "allow",
            agent=CiliumAgent(version=(1, 20, 2), cluster_name="west"),
        ),
        id="cluster-name west: the identity carries io.cilium.k8s.policy.cluster=west: allow",
    ),
]

SCOPING = [
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(role="worker")]})],
            "deny",
            src=endpoint("other", name="w", role="worker"),
        ),
        id="CNP peer selector is scoped to the policy namespace: deny",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(role="worker", **{"io.kubernetes.pod.namespace": "other"})]})],
            "allow",
            src=endpoint("other", name="w", role="worker"),
        ),
        id="peer naming its namespace escapes the scoping: allow",
    ),
    pytest.param(
        Case(
            [
                ingress_to_coord(
                    {
                        "fromEndpoints": [
                            {"matchExpressions": [expr("k8s:io.kubernetes.pod.namespace", "NotIn", "kube-system")]}
                        ]
                    }
                )
            ],
            "allow",
            src=endpoint("other", name="w", role="worker"),
        ),
        id="a namespace NotIn expression also escapes: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [{}]})], "allow", src=endpoint(name="x", app="any")),
        id="fromEndpoints [{}] is every pod of the namespace: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [{}]})], "deny", src=endpoint("other", name="x")),
        id="fromEndpoints [{}] excludes other namespaces: deny",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(**{"io.cilium.k8s.namespace.labels.team": "ml"})]})],
            "unknown",
            src=endpoint("other", name="w", ns_labels={"team": "ml"}),
        ),
        id="namespace-label peer across namespaces is version dependent: unknown",
    ),
    *[
        pytest.param(
            Case(
                [ingress_to_coord({"fromEndpoints": [sel(**{"io.cilium.k8s.namespace.labels.team": "ml"})]})],
                want,
                src=endpoint("other", name="w", ns_labels={"team": "ml"}),
                agent=CiliumAgent(version=version),
            ),
            id=f"namespace-label peer across namespaces on Cilium {shown}: {want}",
        )
        for version, shown, want in [
            ((1, 15, 6), "1.15.6 (scoped to the policy namespace)", "deny"),
            ((1, 16, 0), "1.16.0 (left unscoped)", "allow"),
            ((1, 20, 2), "1.20.2 (left unscoped)", "allow"),
        ]
    ],
    pytest.param(
        Case(
            [ccnp(spec=rule(sel(role="coord"), ingress=[{"fromEndpoints": [sel(role="worker")]}]))],
            "allow",
            src=endpoint("other", name="w", role="worker"),
            dst=OTHER_NS_COORD,
        ),
        id="CCNP selectors are cluster-wide: allow",
    ),
    pytest.param(
        Case(
            [ccnp(spec=rule(sel(role="coord"), ingress=[{"fromEndpoints": [{}]}]))],
            "allow",
            src=endpoint("third", name="w"),
        ),
        id="CCNP fromEndpoints [{}] is every pod in every namespace: allow",
    ),
    pytest.param(
        Case([cnp("wide", spec=rule({}, ingress=[{}]))], "allow", dst=OTHER_NS_COORD),
        id="CNP endpointSelector {} only selects its own namespace: allow",
    ),
    pytest.param(
        Case([cnp("x", spec=rule(sel(**{"io.kubernetes.pod.namespace": "other"}), ingress=[{}]))], "allow"),
        id="CNP subject naming another namespace selects nothing: allow",
    ),
    pytest.param(
        Case(
            [
                ingress_to_coord(
                    {"fromEndpoints": []},
                )
            ],
            "deny",
        ),
        id="fromEndpoints [] selects nothing: deny",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [], "toPorts": [{"ports": [port(23456)]}]})], "deny"),
        id="fromEndpoints [] with toPorts still selects nothing: deny",
    ),
    pytest.param(
        Case([ingress_to_coord({"toPorts": [{"ports": [port(23456)]}]})], "allow", src=endpoint("other", name="w")),
        id="L4-only entry wildcards the peer across namespaces: allow",
    ),
]

ENTITIES = [
    pytest.param(Case([ingress_to_coord({"fromEntities": ["all"]})], "allow"), id="entity all: allow"),
    pytest.param(Case([ingress_to_coord({"fromEntities": ["cluster"]})], "allow"), id="entity cluster: allow"),
    pytest.param(Case([ingress_to_coord({"fromEntities": ["world"]})], "deny"), id="entity world: deny"),
    pytest.param(
        Case([ingress_to_coord({"fromEntities": ["host", "remote-node", "kube-apiserver"]})], "deny"),
        id="host, remote-node, kube-apiserver never a pod: deny",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEntities": ["cluster-mesh"]})], "unknown"),
        id="entity cluster-mesh membership: unknown",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEntities": ["cluster-mesh"]})], "allow", agent=CiliumAgent(version=(1, 20, 2))),
        id="entity cluster-mesh on Cilium 1.20 holds every pod with a cluster label: allow",
    ),
    pytest.param(
        Case([egress_of_worker({"toEntities": ["cluster"]})], "allow", dst=OTHER_NS_COORD),
        id="entities are not namespace-scoped: allow",
    ),
    pytest.param(
        Case([egress_of_worker({"toCIDR": ["10.0.0.0/8"]})], "deny", dst=endpoint(name="c", role="coord")),
        id="CIDR peer never matches a pod but enforces egress: deny",
    ),
    pytest.param(
        Case([egress_of_worker({"toFQDNs": [{"matchName": "coord.ml-demo.svc.cluster.local"}]})], "deny"),
        id="toFQDNs never matches a pod: deny",
    ),
    pytest.param(
        Case(
            [egress_of_worker({"toServices": [{"k8sService": {"serviceName": "coord", "namespace": NS}}]})], "unknown"
        ),
        id="toServices cannot be resolved: unknown",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromNodes": [sel(**{"topology.kubernetes.io/zone": "a"})]})], "deny"),
        id="fromNodes never matches a pod: deny",
    ),
]

PORTS = [
    pytest.param(
        Case([ingress_to_coord({"toPorts": [{"ports": [port(23456, "TCP")]}]})], "deny", protocol="UDP"),
        id="TCP rule does not cover UDP: deny",
    ),
    pytest.param(
        Case([ingress_to_coord({"toPorts": [{"ports": [port(23456, "ANY")]}]})], "allow", protocol="UDP"),
        id="ANY rule covers UDP: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"toPorts": [{"ports": [port(23456, None)]}]})], "allow", protocol="SCTP"),
        id="unset protocol covers SCTP: allow",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"toPorts": [{"ports": [port(23456, "TCP")]}]})],
            "deny",
            protocol="ANY",
            reason=("ingress", "default-deny", f"{NS}/coord-in", "spec"),
        ),
        id="flow over ANY needs every protocol: deny",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"toPorts": [{"ports": [port(80, "TCP", end=444)]}]})],
            "allow",
            ports=PortRange.single(443),
        ),
        id="port inside endPort range: allow",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"toPorts": [{"ports": [port(80, "TCP", end=444)]}]})],
            "deny",
            ports=PortRange.single(445),
        ),
        id="port past endPort: deny",
    ),
    pytest.param(
        Case([ingress_to_coord({"toPorts": [{"ports": [port(0, "TCP")]}]})], "allow", ports=PortRange(1, 65535)),
        id="port 0 covers every port: allow",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"toPorts": [{"ports": [port(23456, "TCP", end=23458)]}]})],
            "deny",
            ports=PortRange(23456, 23460),
        ),
        id="range only partly allowed: deny",
    ),
    pytest.param(
        Case(
            [
                ingress_to_coord(
                    {"toPorts": [{"ports": [port(1, "TCP", end=30000)]}]},
                    {"toPorts": [{"ports": [port(30001, "TCP", end=65535)]}]},
                )
            ],
            "allow",
            ports=PortRange(1, 65535),
        ),
        id="two entries together cover the range: allow",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(role="worker")], "toPorts": [{"ports": [port("rdzv", "TCP")]}]})],
            "allow",
        ),
        id="named port resolves against the destination's container port: allow",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(role="worker")], "toPorts": [{"ports": [port("rdzv", "UDP")]}]})],
            "deny",
        ),
        id="named port with another protocol: deny",
    ),
    pytest.param(
        Case([ingress_to_coord({"toPorts": [{"ports": [port("metrics", "TCP")]}]})], "deny"),
        id="named port the destination does not have: deny",
    ),
    pytest.param(
        Case([egress_of_worker({"toPorts": [{"ports": [port("rdzv", "ANY")]}]})], "allow"),
        id="egress named port resolves against the destination: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [sel(role="worker")], "icmps": [{"fields": [{"type": 8}]}]})], "deny"),
        id="ICMP-only entry does not allow TCP: deny",
    ),
    # A port rule that lists no port adds no L4 filter (pkg/policy/rule.go mergeL4Filter iterates
    # its ports, of which there are none), yet its rule still enforces the direction.
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [sel(role="worker")], "toPorts": [{}]})], "deny",
             reason=("ingress", "default-deny", f"{NS}/coord-in", "spec")),
        id="toPorts [{}] allows nothing, yet enforces ingress: deny",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [sel(role="worker")], "toPorts": [{"ports": []}]})], "deny"),
        id="toPorts [{ports: []}] allows nothing: deny",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [sel(role="worker")], "toPorts": [{}, {"ports": [port(23456)]}]})],
             "allow"),
        id="an empty port rule beside a real one: only the real one counts: allow",
    ),
    pytest.param(
        Case([
            ingress_to_coord({"fromEndpoints": [{}]}),
            cnp("d", spec=rule(sel(role="coord"), ingressDeny=[{"fromEndpoints": [{}], "toPorts": [{}]}])),
        ], "allow"),
        id="a deny entry with toPorts [{}] denies nothing: allow",
    ),
]

DENIES = [
    pytest.param(
        Case(
            [
                egress_of_worker({"toEntities": ["all"]}),
                cnp("no", spec=rule(sel(role="worker"), egressDeny=[{"toEndpoints": [sel(role="coord")]}])),
            ],
            "deny",
            reason=("egress", "deny", f"{NS}/no", "egressDeny[0]"),
        ),
        id="egressDeny beats an allow-all from another policy: deny",
    ),
    pytest.param(
        Case(
            [
                knp(podSelector={}, ingress=[{}]),
                ccnp(spec=rule({}, ingressDeny=[{"fromEndpoints": [sel(role="worker")]}])),
            ],
            "deny",
            reason=("ingress", "deny", "cw", "ingressDeny[0]"),
        ),
        id="CCNP deny beats a KNP allow: deny",
    ),
    pytest.param(
        Case(
            [
                cnp(
                    "no",
                    spec=rule(
                        sel(role="worker"),
                        egressDeny=[{"toEndpoints": [sel(role="coord")]}],
                        enableDefaultDeny={"egress": False},
                    ),
                )
            ],
            "allow",
            dst=OTHER_NS_COORD,
        ),
        id="CNP deny peer is namespace-scoped too: allow",
    ),
    pytest.param(
        Case(
            [
                cnp(
                    "no",
                    spec=rule(
                        sel(role="coord"),
                        ingressDeny=[{"toPorts": [{"ports": [port(80)]}]}],
                        ingress=[{"fromEndpoints": [{}]}],
                    ),
                )
            ],
            "deny",
            ports=PortRange(1, 100),
            reason=("ingress", "deny", f"{NS}/no", "ingressDeny[0]"),
        ),
        id="a denied port inside the range denies the range: deny",
    ),
    pytest.param(
        Case(
            [
                cnp(
                    "no",
                    spec=rule(
                        sel(role="coord"),
                        ingressDeny=[{"fromEntities": ["world"]}],
                        ingress=[{"fromEntities": ["all"]}],
                    ),
                )
            ],
            "allow",
        ),
        id="deny of world does not touch pods: allow",
    ),
    # Issue 24's hardening overlay: deny TCP 22 into every pod, pods not switched to default-deny. The
    # collectives' range (the kernel's ephemeral ports) and the rendezvous port stay open; ssh does not.
    *[
        pytest.param(
            Case([SSH_DENY_OVERLAY], want, ports=ports,
                 reason=("ingress", "deny", "deny-ssh", "ingressDeny[0]") if want == "deny" else None),
            id=f"ssh deny overlay, TCP {ports}: {want}",
        )
        for ports, want in ((PortRange(32768, 60999), "allow"), (RDZV, "allow"), (PortRange.single(40000), "allow"),
                            (PortRange.single(22), "deny"), (PortRange(1, 65535), "deny"))
    ],
]

KNPS = [
    pytest.param(
        Case(
            [knp(podSelector={}, policyTypes=["Ingress"])],
            "deny",
            reason=("ingress", "default-deny", f"{NS}/k", "spec"),
        ),
        id="KNP default-deny ingress: deny",
    ),
    pytest.param(
        Case([knp(podSelector={}, ingress=[{}])], "allow", src=endpoint("far", name="x")),
        id="KNP ingress [{}] allows every source: allow",
    ),
    pytest.param(
        Case([knp(podSelector=sel(role="coord"), ingress=[{"from": [{"podSelector": sel(role="worker")}]}])], "allow"),
        id="KNP podSelector peer: allow",
    ),
    pytest.param(
        Case(
            [knp(podSelector=sel(role="coord"), ingress=[{"from": [{"podSelector": sel(role="worker")}]}])],
            "deny",
            src=endpoint("other", name="w", role="worker"),
        ),
        id="KNP podSelector peer is same-namespace: deny",
    ),
    pytest.param(
        Case(
            [knp(podSelector={}, ingress=[{"from": [{"namespaceSelector": sel(team="ml")}]}])],
            "allow",
            src=endpoint("other", name="w", ns_labels={"team": "ml"}),
        ),
        id="KNP namespaceSelector on namespace labels: allow",
    ),
    pytest.param(
        Case(
            [knp(podSelector={}, ingress=[{"from": [{"namespaceSelector": {}}]}])],
            "allow",
            src=endpoint("other", name="w"),
        ),
        id="KNP empty namespaceSelector is every namespace: allow",
    ),
    pytest.param(
        Case(
            [
                knp(
                    podSelector={},
                    ingress=[{"from": [{"namespaceSelector": sel(team="ml"), "podSelector": sel(role="worker")}]}],
                )
            ],
            "deny",
            src=endpoint("other", name="w", ns_labels={"team": "ml"}, role="other"),
        ),
        id="KNP namespaceSelector and podSelector in one peer are ANDed: deny",
    ),
    pytest.param(
        Case([knp(podSelector={}, ingress=[{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}])], "deny"),
        id="KNP ipBlock never matches a pod: deny",
    ),
    pytest.param(
        Case([knp(podSelector={}, ingress=[{"ports": [{"port": 23000, "endPort": 24000}]}])], "allow"),
        id="KNP port with endPort: allow",
    ),
    pytest.param(
        Case([knp(podSelector={}, ingress=[{"ports": [{"port": 23000, "endPort": 24000}]}])], "deny", protocol="UDP"),
        id="KNP protocol defaults to TCP: deny",
    ),
    pytest.param(
        Case([knp(podSelector={}, ingress=[{"ports": [{"port": "rdzv"}]}])], "allow"), id="KNP named port: allow"
    ),
    pytest.param(
        Case([knp(podSelector={}, policyTypes=["Egress"])], "deny", sides=("deny", "allow")),
        id="KNP Egress type with no rules denies egress: deny",
    ),
    pytest.param(
        Case([knp(podSelector=sel(role="coord"), egress=[{}])], "deny", sides=("allow", "deny")),
        id="KNP without policyTypes always enforces ingress: deny",
    ),
    pytest.param(
        Case(
            [
                knp(
                    podSelector=sel(role="coord"),
                    policyTypes=["Egress"],
                    ingress=[{"from": [{"podSelector": sel(role="nobody")}]}],
                )
            ],
            "deny",
        ),
        id="KNP ingress section outside policyTypes is still enforced by Cilium: deny",
    ),
    pytest.param(
        Case(
            [
                knp(podSelector=sel(role="coord"), ingress=[{"ports": [{"port": 80}]}]),
                ingress_to_coord({"fromEndpoints": [sel(role="worker")], "toPorts": [{"ports": [port(23456)]}]}),
            ],
            "allow",
        ),
        id="KNP and CNP allows are unioned: allow",
    ),
]

UNKNOWNS = [
    pytest.param(
        Case(
            [ingress_to_coord({"toPorts": [{"ports": [port(23456)], "rules": {"http": [{"method": "GET"}]}}]})],
            "unknown",
            reason=("ingress", "unknown", f"{NS}/coord-in", "ingress[0]"),
        ),
        id="allowed only through L7 http rules: unknown",
    ),
    pytest.param(
        Case(
            [
                ingress_to_coord(
                    {"toPorts": [{"ports": [port(23456)], "rules": {"http": [{"method": "GET"}]}}]},
                    {"fromEndpoints": [sel(role="worker")]},
                )
            ],
            "allow",
        ),
        id="a plain L4 allow makes the L7 rule moot: allow",
    ),
    pytest.param(
        Case([ingress_to_coord({"toPorts": [{"ports": [port(23456)], "rules": {"http": [{}]}}]})], "allow"),
        id="an http rule that allows every request: allow",
    ),
    pytest.param(
        Case(
            [
                ingress_to_coord(
                    {"toPorts": [{"ports": [port(23456)], "rules": {"http": [{"path": "/x"}]}}]},
                    enableDefaultDeny={"ingress": False},
                )
            ],
            "unknown",
        ),
        id="L7 rules apply even with default deny off: unknown",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [sel(role="worker")], "authentication": {"mode": "required"}})],
            "unknown",
        ),
        id="mutual authentication required: unknown",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromRequires": [sel(env="prod")]})], "unknown"),
        id="fromRequires depends on the Cilium version: unknown",
    ),
    pytest.param(
        Case(
            [
                ingress_to_coord({"fromRequires": [sel(env="prod")]}),
                cnp("no", spec=rule(sel(role="coord"), ingressDeny=[{"fromEndpoints": [{}]}])),
            ],
            "deny",
        ),
        id="an explicit deny is certain next to an uncertain policy: deny",
    ),
    pytest.param(
        Case([ingress_to_coord({"fromEndpoints": [sel(role="worker")]})], "unknown",
             src=endpoint(name="w", role="worker", host_network=True)),
        id="hostNetwork source: allowed from its own node, denied from another: unknown",
    ),
    pytest.param(
        Case([], "allow", src=endpoint(name="w", host_network=True), enforcement="never"),
        id="hostNetwork source under mode never: allow",
    ),
    pytest.param(
        Case(
            [ingress_to_coord({"fromEndpoints": [{"matchExpressions": [expr("role", "in", "worker")]}]})],
            "unknown",
            reason=("ingress", "unknown", f"{NS}/coord-in", "spec"),
        ),
        id="invalid policy (lowercase operator) selecting the destination: unknown",
    ),
    pytest.param(
        Case(
            [
                cnp(
                    "bad",
                    spec=rule(sel(role="other"), ingress=[{"fromEndpoints": [sel(a="b")], "fromEntities": ["all"]}]),
                )
            ],
            "allow",
        ),
        id="invalid policy that selects neither pod: allow",
    ),
    pytest.param(
        Case([cnp("empty", spec=rule(sel(role="coord")))], "allow"),
        id="invalid rule without sections affects nothing on any version: allow",
    ),
    pytest.param(
        Case(
            [
                ingress_to_coord({"fromEndpoints": [sel(role="worker")]}),
                {**ingress_to_coord({}), "metadata": {"name": "v3", "namespace": NS}, "apiVersion": "cilium.io/v3"},
            ],
            "unknown",
        ),
        id="unknown apiVersion selecting the destination: unknown",
    ),
]


@pytest.mark.parametrize("case", ENFORCEMENT)
def test_enforcement(case: Case) -> None:
    run(case)


@pytest.mark.parametrize("case", SELECTORS)
def test_selectors(case: Case) -> None:
    run(case)


@pytest.mark.parametrize("case", SCOPING)
def test_namespace_scoping(case: Case) -> None:
    run(case)


@pytest.mark.parametrize("case", ENTITIES)
def test_entities_and_non_pod_peers(case: Case) -> None:
    run(case)


@pytest.mark.parametrize("case", PORTS)
def test_ports(case: Case) -> None:
    run(case)


@pytest.mark.parametrize("case", DENIES)
def test_denies(case: Case) -> None:
    run(case)


@pytest.mark.parametrize("case", KNPS)
def test_kubernetes_network_policy(case: Case) -> None:
    run(case)


@pytest.mark.parametrize("case", UNKNOWNS)
def test_unknowns(case: Case) -> None:
    run(case)


@pytest.mark.parametrize(
    "ports, protocol, enforcement",
    [
        pytest.param(PortRange(10, 5), "TCP", "default", id="descending range raises"),
        pytest.param(PortRange(1, 70000), "TCP", "default", id="port past 65535 raises"),
        pytest.param(PortRange.single(80), "ICMP", "default", id="unknown protocol raises"),
        pytest.param(PortRange.single(80), "TCP", "sometimes", id="unknown mode raises"),
    ],
)
def test_bad_arguments_raise_value_error(ports: PortRange, protocol: str, enforcement: str) -> None:
    with pytest.raises(ValueError):
        check_flow(snapshot(), WORKER, COORD, ports, protocol, enforcement=enforcement)  # type: ignore[arg-type]


def test_egress_named_port_mapped_to_several_numbers_is_flagged_approximate() -> None:
    pods = [
        {"kind": "Pod", "metadata": {"name": n, "namespace": NS},
         "spec": {"containers": [{"name": "c", "ports": [{"name": "rdzv", "containerPort": number}]}]}}
        for n, number in (("a", 23456), ("b", 29500))
    ]
    policy = egress_of_worker({"toPorts": [{"ports": [port("rdzv", "TCP")]}]})
    verdict = check_flow(snapshot(policy, *pods), WORKER, COORD, RDZV, "TCP")
    assert verdict.verdict == "allow"
    (egress_allow,) = verdict.egress.reasons
    assert "approximate, port name(s) rdzv=23456/29500" in egress_allow.message
    plain = check_flow(snapshot(policy), WORKER, COORD, RDZV, "TCP")
    assert "approximate" not in plain.egress.reasons[0].message
