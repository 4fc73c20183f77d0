"""Malformed and invalid policies never crash: the sides they may affect answer `unknown`, or the
policy is ignored, always with the reason in `policy_problems` and in the verdict's reasons.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.models.network import PortRange
from app.policy import check_flow, policy_problems
from tests.unit.policy.builders import NS, cnp, endpoint, expr, knp, port, rule, sel, snapshot

WORKER = endpoint(name="worker", role="worker")
COORD = endpoint(name="coord", role="coord")


def coord_in(*entries: Any, **extra: Any) -> dict[str, Any]:
    return cnp("bad", spec=rule(sel(role="coord"), ingress=list(entries), **extra))


def ports_rule(*ports: Any, **rest: Any) -> dict[str, Any]:
    return {"toPorts": [{"ports": list(ports), **rest}]}


CASES = [
    # Structure.
    pytest.param(cnp("bad", spec="hello"), "unknown", "a rule must be a mapping", id="spec is a string: unknown"),
    pytest.param(cnp("bad"), "unknown", "neither spec nor specs", id="no spec nor specs: unknown"),
    pytest.param(cnp("bad", specs={"a": 1}), "unknown", "specs must be a list", id="specs is a mapping: unknown"),
    pytest.param(
        cnp("bad", specs=[None, 5, rule({}, ingress=[{}])]),
        "unknown",
        "specs[0]: a rule must be a mapping",
        id="specs with junk items: unknown",
    ),
    pytest.param(
        cnp("bad", spec={"endpointSelector": "role=coord", "ingress": [{}]}),
        "unknown",
        "a label selector must be a mapping",
        id="endpointSelector is a string: unknown",
    ),
    pytest.param(
        cnp("bad", spec={"ingress": [{}]}),
        "unknown",
        "exactly one of endpointSelector and nodeSelector",
        id="no subject selector: unknown",
    ),
    pytest.param(
        cnp("bad", spec={"endpointSelector": {}, "nodeSelector": {}, "ingress": [{}]}),
        "unknown",
        "exactly one of",
        id="both endpointSelector and nodeSelector: unknown",
    ),
    pytest.param(
        cnp("bad", spec={"nodeSelector": {}, "ingress": [{}]}),
        "allow",
        "cannot use nodeSelector",
        id="CNP with nodeSelector is a host policy shape: ignored, allow",
    ),
    pytest.param(
        coord_in({"fromEndpoints": [{}]}, ingres=[{}]),
        "unknown",
        "unknown field(s) ingres",
        id="typo in a rule field: unknown",
    ),
    pytest.param(
        cnp("bad", spec={"endpointSelector": sel(role="coord"), "ingress": "all"}),
        "unknown",
        "spec.ingress: must be a list",
        id="ingress is a string: unknown",
    ),
    pytest.param(coord_in("x"), "unknown", "ingress[0]: must be a mapping", id="ingress entry is a string: unknown"),
    pytest.param(
        coord_in({"fromEndpoints": "role=worker"}), "unknown", "must be a list", id="fromEndpoints is a string: unknown"
    ),
    pytest.param(
        coord_in({"fromEndpoints": [{"matchLabels": ["role"]}]}),
        "unknown",
        "matchLabels: must be a mapping",
        id="matchLabels is a list: unknown",
    ),
    pytest.param(
        coord_in({"fromEndpoints": [{"matchLabels": {"replicas": 2}}]}),
        "unknown",
        "must be a string",
        id="matchLabels value is a number: unknown",
    ),
    pytest.param(
        coord_in({"fromEndpoints": [{"matchExpressions": [{"key": "role"}]}]}),
        "unknown",
        "operator: must be a string",
        id="expression without operator: unknown",
    ),
    pytest.param(
        coord_in({"fromEndpoints": [{"matchExpressions": [expr("role", "in", "worker")]}]}),
        "unknown",
        "'in' is not one of",
        id="lowercase operator: unknown",
    ),
    pytest.param(
        coord_in({"fromEndpoints": [{"matchExpressions": [{"key": "role", "operator": "In", "values": "x"}]}]}),
        "unknown",
        "values: must be a list",
        id="values is a string: unknown",
    ),
    pytest.param(
        coord_in({"fromEndpoints": [{"matchLabels": {"role": "worker"}, "matchLabel": {}}]}),
        "unknown",
        "unknown selector field",
        id="typo in a selector field: unknown",
    ),
    # Selectors the agent fails to parse match nothing (valid policy).
    pytest.param(
        coord_in({"fromEndpoints": [{"matchExpressions": [expr("role", "In")]}]}),
        "deny",
        "needs at least one value",
        id="In without values matches nothing: deny",
    ),
    pytest.param(
        coord_in({"fromEndpoints": [sel(role="a b")]}),
        "deny",
        "not a valid label value",
        id="invalid label value matches nothing: deny",
    ),
    # Ports.
    pytest.param(coord_in(ports_rule(port(99999))), "unknown", "outside 0-65535", id="port past 65535: unknown"),
    pytest.param(
        coord_in(ports_rule(port("http_x"))),
        "unknown",
        "neither a port number nor a valid port name",
        id="invalid port name: unknown",
    ),
    pytest.param(
        coord_in(ports_rule(port(80, "tcp"))), "unknown", "'tcp' is not one of", id="lowercase protocol: unknown"
    ),
    pytest.param(coord_in(ports_rule({"protocol": "TCP"})), "unknown", "port: missing", id="port missing: unknown"),
    pytest.param(
        coord_in(ports_rule(*[port(p) for p in range(1, 42)])),
        "unknown",
        "at most 40",
        id="41 ports in one rule: unknown",
    ),
    pytest.param(coord_in({"toPorts": "80"}), "unknown", "toPorts: must be a list", id="toPorts is a string: unknown"),
    pytest.param(
        coord_in({**ports_rule(port(80)), "icmps": [{"fields": [{"type": 8}]}]}),
        "unknown",
        "icmps and toPorts",
        id="icmps with toPorts: unknown",
    ),
    # Peers.
    pytest.param(
        coord_in({"fromEndpoints": [sel(role="worker")], "fromEntities": ["all"]}),
        "unknown",
        "one entry may use only one L3 peer field",
        id="two L3 fields in one entry: unknown",
    ),
    pytest.param(coord_in({"fromCIDR": ["not-a-cidr"]}), "unknown", "is not a CIDR", id="bad CIDR: unknown"),
    pytest.param(
        coord_in({"fromCIDRSet": [{"cidr": "10.0.0.0/8", "except": ["192.168.0.0/16"]}]}),
        "unknown",
        "is not inside",
        id="except outside its CIDR: unknown",
    ),
    pytest.param(
        coord_in({"fromCIDRSet": [{"cidr": "10.0.0.0/8", "cidrGroupRef": "g"}]}),
        "unknown",
        "exactly one of cidr",
        id="cidr and cidrGroupRef together: unknown",
    ),
    pytest.param(coord_in({"fromEntities": ["everything"]}), "unknown", "unknown entity", id="unknown entity: unknown"),
    pytest.param(
        coord_in({"fromEndpoints": [{}]}, enableDefaultDeny="yes"),
        "unknown",
        "enableDefaultDeny",
        id="enableDefaultDeny is a string: unknown",
    ),
    # L7 and friends.
    pytest.param(
        coord_in(ports_rule(port(53, "UDP"), rules={"dns": [{"matchPattern": "*"}]})),
        "unknown",
        "only allowed on egress",
        id="DNS rules on ingress: unknown",
    ),
    pytest.param(
        coord_in(ports_rule(port(80, "UDP"), rules={"http": [{}]})),
        "unknown",
        "need a TCP port",
        id="http rules on a UDP port: unknown",
    ),
    pytest.param(
        coord_in(ports_rule(port(0, "TCP"), rules={"http": [{}]})),
        "unknown",
        "port 0",
        id="L7 rules with port 0: unknown",
    ),
    pytest.param(
        coord_in(ports_rule(port(80), listener={"envoyConfig": {"kind": "x", "name": "y"}, "name": "z"})),
        "unknown",
        "listener: only on egress",
        id="listener on ingress: unknown",
    ),
    pytest.param(
        coord_in({"fromEndpoints": [{}], "authentication": {"mode": "sometimes"}}),
        "unknown",
        "authentication.mode",
        id="unknown authentication mode: unknown",
    ),
    pytest.param(
        cnp(
            "bad",
            spec=rule(sel(role="coord"), ingressDeny=[{"toPorts": [{"ports": [port(80)], "rules": {"http": [{}]}}]}]),
        ),
        "unknown",
        "not supported here",
        id="L7 in a deny entry: unknown",
    ),
    pytest.param(
        {**coord_in({}), "extra": 1}, "unknown", "unknown field(s) extra", id="unknown top-level field: unknown"
    ),
    # KNP.
    pytest.param(knp("bad") | {"spec": None}, "unknown", "spec must be a mapping", id="KNP without spec: unknown"),
    pytest.param(knp("bad", ingress=[{}]), "unknown", "podSelector is required", id="KNP without podSelector: unknown"),
    pytest.param(
        knp("bad", podSelector={}, policyTypes=["Both"]), "unknown", "policyTypes", id="KNP bad policyTypes: unknown"
    ),
    pytest.param(
        knp("bad", podSelector={}, ingress=[{"from": [{}]}]),
        "unknown",
        "needs podSelector",
        id="KNP empty peer: unknown",
    ),
    pytest.param(
        knp("bad", podSelector={}, ingress=[{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]),
        "unknown",
        "ipBlock cannot be combined",
        id="KNP ipBlock with podSelector: unknown",
    ),
    pytest.param(
        knp("bad", podSelector={}, ingress=[{"from": [{"ipBlock": {"cidr": "ten"}}]}]),
        "unknown",
        "ipBlock",
        id="KNP bad ipBlock: unknown",
    ),
    pytest.param(
        knp("bad", podSelector={}, ingress=[{"ports": [{"port": "rdzv", "endPort": 9}]}]),
        "unknown",
        "named port",
        id="KNP endPort with a named port: unknown",
    ),
    pytest.param(
        knp("bad", podSelector={}, ingress=[{"ports": [{"port": 90, "endPort": 80}]}]),
        "unknown",
        "below port",
        id="KNP endPort below port: unknown",
    ),
    pytest.param(
        knp("bad", podSelector={}, ingress=[{"ports": [{"protocol": "ICMP"}]}]),
        "unknown",
        "'ICMP' is not one of",
        id="KNP ICMP protocol: unknown",
    ),
    pytest.param(
        knp("bad", podSelector={}, ingress="all"), "unknown", "must be a list", id="KNP ingress is a string: unknown"
    ),
    pytest.param(
        knp("bad", podSelector={}, ingres=[{}]), "unknown", "unknown spec field", id="KNP typo field: unknown"
    ),
    pytest.param(
        {**knp("bad", podSelector={}), "apiVersion": "extensions/v1beta1"},
        "unknown",
        "apiVersion",
        id="KNP old apiVersion: unknown",
    ),
]


@pytest.mark.parametrize("policy, want, problem", CASES)
def test_malformed_policy_is_reported_never_crashes(policy: dict[str, Any], want: str, problem: str) -> None:
    snap = snapshot(policy)
    verdict = check_flow(snap, WORKER, COORD, PortRange(1, 65535), "ANY")
    assert verdict.verdict == want, verdict.reasons
    problems = policy_problems(snap)
    assert any(problem in text for _, text in problems), problems
    if want == "unknown":
        assert any(r.effect == "unknown" and r.policy == f"{NS}/bad" for r in verdict.reasons)


def test_invalid_policy_selecting_neither_pod_is_ignored() -> None:
    snap = snapshot(cnp("bad", spec=rule(sel(role="db"), ingress=[{"fromEntities": ["everything"]}])))
    assert check_flow(snap, WORKER, COORD, PortRange.single(80), "TCP").verdict == "allow"
    assert policy_problems(snap) == [
        (
            f"{NS}/bad",
            "invalid (Cilium rejects it and does not enforce it): ingress[0].fromEntities: unknown entity 'everything'",
        ),
    ]
