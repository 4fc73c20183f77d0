"""Property: no policy body, however malformed, makes the evaluator raise.

Bodies are random JSON built from the real field names of CNP/CCNP/KNP, so the generator reaches
deep into rules, entries, selectors and ports rather than failing at the top level.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.models.network import PortRange
from app.policy import check_flow, label_keys_mentioned, policy_problems
from tests.unit.policy.builders import NS, endpoint, snapshot

FIELDS = [
    "endpointSelector",
    "nodeSelector",
    "ingress",
    "ingressDeny",
    "egress",
    "egressDeny",
    "enableDefaultDeny",
    "fromEndpoints",
    "toEndpoints",
    "fromEntities",
    "toEntities",
    "fromCIDR",
    "toCIDRSet",
    "fromRequires",
    "toServices",
    "toFQDNs",
    "toPorts",
    "ports",
    "port",
    "endPort",
    "protocol",
    "rules",
    "http",
    "dns",
    "icmps",
    "authentication",
    "mode",
    "listener",
    "matchLabels",
    "matchExpressions",
    "key",
    "operator",
    "values",
    "podSelector",
    "namespaceSelector",
    "ipBlock",
    "cidr",
    "except",
    "policyTypes",
    "from",
    "to",
    "role",
    # ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2)
    "tier",
    "priority",
    "subject",
    "namespaces",
    "pods",
    "action",
    "protocols",
    "tcp",
    "udp",
    "destinationPort",
    "destinationNamedPort",
    "number",
    "range",
    "start",
    "end",
    "networks",
    "nodes",
    "domainNames",
    "name",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70000),
    st.sampled_from(
        [
            "",
            "TCP",
            "tcp",
            "ANY",
            "In",
            "Exists",
            "all",
            "world",
            "10.0.0.0/8",
            "rdzv",
            "0",
            "80",
            "Ingress",
            "Egress",
            "required",
            "coord",
            "worker",
            "k8s:role",
            "$host",
            "Admin",
            "Baseline",
            "Accept",
            "Deny",
            "Pass",
        ]
    ),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(FIELDS), inner, max_size=4)),
    max_leaves=25,
)
KINDS = [
    ("cilium.io/v2", "CiliumNetworkPolicy"),
    ("cilium.io/v2", "CiliumClusterwideNetworkPolicy"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("policy.networking.k8s.io/v1alpha2", "ClusterNetworkPolicy"),
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), spec=JSON, specs=JSON, protocol=st.sampled_from(["TCP", "UDP", "ANY"]))
def test_any_body_yields_a_verdict(kind: tuple[str, str], spec: Any, specs: Any, protocol: str) -> None:
    policy = {"apiVersion": kind[0], "kind": kind[1], "metadata": {"name": "fuzz", "namespace": NS}, "spec": spec}
    if kind[1] not in ("NetworkPolicy", "ClusterNetworkPolicy"):
        policy["specs"] = specs
    snap = snapshot(policy)
    src = endpoint(name="w", role="worker")
    dst = endpoint(name="c", role="coord")
    verdict = check_flow(snap, src, dst, PortRange(1, 65535), protocol)
    assert verdict.verdict in ("allow", "deny", "unknown")
    assert isinstance(policy_problems(snap), list)
    assert isinstance(label_keys_mentioned(snap), frozenset)
    # The compilers handle every shape themselves; the index's last-resort catch is not what answers.
    assert not [p for _, p in policy_problems(snap) if "could not be read" in p], policy_problems(snap)
