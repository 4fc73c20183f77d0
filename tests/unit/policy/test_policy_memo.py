"""The per-snapshot verdict memo of `check_flow` is exact: it answers what `evaluate_flow` computes.

Property: on random policies (CNP, CCNP, KNP; `{}` selectors, expressions, entities, denies, named
ports, namespace selectors, invalid shapes) and random endpoints, every memoized verdict equals the
fresh one — also for a "twin" endpoint that differs only in labels no selector reads, which is the
case the memo answers from an earlier entry.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.models.cluster import ContainerPort
from app.models.network import Endpoint, PortRange
from app.policy import build_index, check_flow, evaluate_flow
from app.policy.verdicts import VERDICT_MEMO_KEY, VerdictMemo
from tests.unit.policy.builders import NS, ccnp, cnp, endpoint, knp, port, rule, sel, snapshot

OTHER_NS = "team-a"
POLICY_KEYS = ["app", "role", "tier", "k8s:app", "any:role", "io.kubernetes.pod.namespace",
               "io.cilium.k8s.policy.serviceaccount", "io.cilium.k8s.namespace.labels.team", "zone"]
POD_KEYS = ["app", "role", "tier", "zone", "extra", "pod-template-hash"]
VALUES = ["a", "b", NS, OTHER_NS, "trainer"]
UNREAD_KEY = "unread.example.com/marker"  # no generated policy names it
PORTS = (ContainerPort(80, "TCP", "http"), ContainerPort(8080, "TCP", "http"), ContainerPort(29500, "TCP", "rdzv"))

values = st.lists(st.sampled_from(VALUES), min_size=0, max_size=2)
expression = st.builds(
    lambda k, op, vs: {"key": k, "operator": op, **({"values": vs} if op in ("In", "NotIn") else {})},
    st.sampled_from(POLICY_KEYS), st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Bogus"]), values,
)
selector = st.one_of(
    st.just({}),
    st.dictionaries(st.sampled_from(POLICY_KEYS), st.sampled_from(VALUES), max_size=2).map(lambda d: sel(**d)),
    st.lists(expression, min_size=1, max_size=2).map(lambda es: {"matchExpressions": es}),
)
port_spec = st.one_of(
    st.sampled_from(["80", "8080", "http", "rdzv", "1-65535"]).map(
        lambda p: port(*p.split("-")) if "-" not in p else port(1, "TCP", 65535)
    ),
    st.just(port(53, "UDP")),
)
to_ports = st.lists(port_spec, min_size=1, max_size=2).map(lambda ps: [{"ports": ps}])


def _entry(peer_field: str) -> st.SearchStrategy[dict[str, Any]]:
    peers = st.one_of(
        st.lists(selector, min_size=1, max_size=2).map(lambda ss: {peer_field + "Endpoints": ss}),
        st.lists(st.sampled_from(["all", "cluster", "world", "host", "cluster-mesh"]), min_size=1, max_size=2).map(
            lambda es: {peer_field + "Entities": es}
        ),
        st.just({}),
    )
    return st.builds(lambda p, tp: {**p, **({"toPorts": tp} if tp else {})}, peers, st.one_of(st.none(), to_ports))


cnp_rule = st.builds(
    lambda subject, ing, eg, ing_deny, eg_deny, default_deny: rule(
        subject,
        **({"ingress": ing} if ing is not None else {}),
        **({"egress": eg} if eg is not None else {}),
        **({"ingressDeny": ing_deny} if ing_deny else {}),
        **({"egressDeny": eg_deny} if eg_deny else {}),
        **({"enableDefaultDeny": default_deny} if default_deny is not None else {}),
    ),
    selector,
    st.one_of(st.none(), st.lists(_entry("from"), max_size=2)),
    st.one_of(st.none(), st.lists(_entry("to"), max_size=2)),
    st.lists(_entry("from"), max_size=1),
    st.lists(_entry("to"), max_size=1),
    st.one_of(st.none(), st.fixed_dictionaries({"ingress": st.booleans()}), st.just("not-a-map")),
)
knp_peer = st.builds(
    lambda pod, ns: {**({"podSelector": pod} if pod is not None else {}),
                     **({"namespaceSelector": ns} if ns is not None else {})},
    st.one_of(st.none(), selector), st.one_of(st.none(), selector),
)
knp_body = st.builds(
    lambda subject, peers, ports, types: {
        "podSelector": subject, "policyTypes": types,
        "ingress": [{"from": peers, **({"ports": [{"port": p, "protocol": "TCP"} for p in ports]} if ports else {})}],
        "egress": [{"to": peers}],
    },
    selector, st.lists(knp_peer, max_size=2), st.lists(st.sampled_from([80, "http", 8080]), max_size=2),
    st.lists(st.sampled_from(["Ingress", "Egress"]), min_size=1, max_size=2, unique=True),
)
policy = st.one_of(
    st.builds(lambda i, r, ns: cnp(f"cnp-{i}", ns, spec=r), st.integers(0, 99), cnp_rule,
              st.sampled_from([NS, OTHER_NS])),
    st.builds(lambda i, rs: ccnp(f"ccnp-{i}", specs=rs), st.integers(0, 99),
              st.lists(cnp_rule, min_size=1, max_size=2)),
    st.builds(lambda i, body, ns: knp(f"knp-{i}", ns, **body), st.integers(0, 99), knp_body,
              st.sampled_from([NS, OTHER_NS])),
)
endpoints = st.builds(
    lambda ns, name, sa, team, labels, ports, host: endpoint(
        ns, name=name, sa=sa, ns_labels={"team": team} if team else None, ports=ports, host_network=host, **labels
    ),
    st.sampled_from([NS, OTHER_NS]),
    st.sampled_from(["", "llm-worker-0", "llm-worker-1"]),
    st.sampled_from(["default", "trainer"]),
    st.sampled_from(["", "a", "b"]),
    st.dictionaries(st.sampled_from(POD_KEYS), st.sampled_from(VALUES), max_size=4),
    st.lists(st.sampled_from(PORTS), max_size=2, unique=True).map(tuple),
    st.sampled_from([False, False, False, True]),
)
query = st.tuples(
    endpoints, endpoints,
    st.sampled_from([PortRange.single(80), PortRange.single(8080), PortRange(1, 65535), PortRange.single(29500)]),
    st.sampled_from(["TCP", "UDP", "ANY"]),
    st.sampled_from(["default", "always", "never"]),
    st.sampled_from(["", "x", "y"]),
)


def twin(ep: Endpoint, marker: str) -> Endpoint:
    """The same endpoint with one more label that no policy reads (no change when `marker` is empty)."""
    if not marker:
        return ep
    return Endpoint(ep.namespace, {**ep.labels, UNREAD_KEY: marker}, ep.namespace_labels, ep.service_account,
                    ep.ports, ep.host_network, ep.ips, ep.name)


@given(st.lists(policy, max_size=5), st.lists(query, min_size=1, max_size=6))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_memoized_verdicts_equal_fresh_ones(policies: list[dict[str, Any]], queries: list[Any]) -> None:
    snap = snapshot(*policies)
    assert UNREAD_KEY not in build_index(snap).keys_read
    for src, dst, ports, protocol, enforcement, marker in queries:
        for s, d in ((src, dst), (twin(src, marker), twin(dst, marker)), (src, dst)):
            memoized = check_flow(snap, s, d, ports, protocol, enforcement=enforcement)
            assert memoized == evaluate_flow(snap, s, d, ports, protocol, enforcement=enforcement)


def _memo_size(snap: Any) -> int:
    return len(snap.memo(VERDICT_MEMO_KEY, lambda _: VerdictMemo(), network=True))


WORKERS = cnp("workers", spec=rule(sel(role="worker"), ingress=[{"fromEndpoints": [sel(role="worker")]}]))


@pytest.mark.parametrize(
    ("second", "new_entries"),
    [
        pytest.param(endpoint(name="w-0", role="worker", other="x"), 0, id="unread-label-answers-from-the-memo"),
        pytest.param(endpoint(name="w-0", role="worker", **{"pod-template-hash": "1"}), 0,
                     id="label-no-selector-names-answers-from-the-memo"),
        pytest.param(endpoint(name="w-0", role="chief"), 1, id="read-label-with-another-value-is-a-new-entry"),
        pytest.param(endpoint(name="w-1", role="worker"), 1, id="another-name-is-a-new-entry-as-messages-name-it"),
        pytest.param(endpoint(name="w-0", sa="trainer", role="worker"), 1, id="service-account-is-a-new-entry"),
        pytest.param(endpoint(name="w-0", ports=(PORTS[0],), role="worker"), 1, id="ports-are-a-new-entry"),
        pytest.param(endpoint(name="w-0", ns_labels={"team": "a"}, role="worker"), 1,
                     id="namespace-labels-are-a-new-entry"),
    ],
)
def test_memo_key_keeps_what_a_verdict_reads(second: Endpoint, new_entries: int) -> None:
    snap = snapshot(WORKERS)
    first = endpoint(name="w-0", role="worker")
    check_flow(snap, first, first, PortRange.single(80), "TCP")
    before = _memo_size(snap)
    got = check_flow(snap, second, second, PortRange.single(80), "TCP")
    assert _memo_size(snap) - before == new_entries
    assert got == evaluate_flow(snap, second, second, PortRange.single(80), "TCP")


def test_unnamed_endpoint_keys_on_every_label_as_messages_list_them() -> None:
    snap = snapshot(WORKERS)
    a, b = endpoint(role="worker", other="x"), endpoint(role="worker", other="y")
    verdict_a = check_flow(snap, a, a, PortRange.single(80), "TCP")
    verdict_b = check_flow(snap, b, b, PortRange.single(80), "TCP")
    assert any("other=y" in r.message for r in verdict_b.reasons)
    assert verdict_a != verdict_b


def test_memo_drops_the_oldest_entry_when_full() -> None:
    snap = snapshot(WORKERS)
    memo = VerdictMemo(size=2)
    verdict = evaluate_flow(snap, endpoint(), endpoint(), PortRange.single(80), "TCP")
    for key in ("a", "b", "c"):
        memo.put((key,), verdict)
    assert (len(memo), memo.get(("a",)), memo.get(("c",))) == (2, None, verdict)
