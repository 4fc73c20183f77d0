"""The per-snapshot index: memoized, subject lookup equal to a full scan, keys and problems."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from app.models.network import Endpoint
from app.policy import build_index, label_keys_mentioned, label_values_mentioned, policy_problems
from app.policy.identity import identity_labels
from tests.unit.policy.builders import NS, ccnp, cnp, endpoint, expr, knp, rule, sel, snapshot

POLICIES = [
    cnp("by-role", spec=rule(sel(role="coord"), ingress=[{}])),
    cnp("by-in", spec=rule({"matchExpressions": [expr("role", "In", "coord", "worker")]}, egress=[{}])),
    cnp("by-exists", spec=rule({"matchExpressions": [expr("zone", "Exists")]}, ingress=[{}])),
    cnp("by-notin", spec=rule({"matchExpressions": [expr("zone", "NotIn", "b")]}, ingress=[{}])),
    cnp("all-here", spec=rule({}, egress=[{}])),
    cnp("other-ns", "other", spec=rule({}, egress=[{}])),
    ccnp("cw-role", spec=rule(sel(role="worker"), ingress=[{}])),
    ccnp("cw-all", spec=rule({}, ingress=[{}])),
    ccnp("cw-ns", spec=rule(sel(**{"k8s:io.kubernetes.pod.namespace": "other"}), ingress=[{}])),
    knp("k-role", podSelector=sel(role="worker"), ingress=[{}]),
    knp("k-all", "other", podSelector={}),
    cnp("bad", spec=rule({"matchExpressions": [expr("role", "in", "x")]}, ingress=[{}])),
]
ENDPOINTS = [
    endpoint(role="coord", zone="a"),
    endpoint(role="worker", zone="b"),
    endpoint(role="worker"),
    endpoint("other", role="worker", zone="a"),
    endpoint("third"),
]


@pytest.mark.parametrize("ep", [pytest.param(e, id=f"{e.namespace}:{dict(e.labels)}") for e in ENDPOINTS])
def test_rules_for_equals_a_full_scan(ep: Endpoint) -> None:
    index = build_index(snapshot(*POLICIES))
    identity = identity_labels(ep)
    every_rule = itertools.chain.from_iterable(p.rules for p in index.policies)
    want = sorted((r.policy, r.path) for r in every_rule if r.selects(identity, ep.namespace))
    assert sorted((r.policy, r.path) for r in index.rules_for(identity, ep.namespace)) == want
    assert want  # every endpoint is selected by something here, so the comparison means something


def test_index_is_built_once_per_snapshot() -> None:
    snap = snapshot(*POLICIES)
    assert build_index(snap) is build_index(snap)


def test_label_keys_mentioned_strips_sources_and_covers_every_selector() -> None:
    snap = snapshot(
        cnp(
            spec=rule(
                sel(**{"k8s:role": "coord"}),
                ingress=[{"fromEndpoints": [sel(**{"any:zone": "a"})]}],
                egressDeny=[{"toEndpoints": [{"matchExpressions": [expr("tier", "Exists")]}]}],
            )
        ),
        knp(podSelector=sel(app="x"), ingress=[{"from": [{"namespaceSelector": sel(team="t")}]}]),
        ccnp(spec=rule({"matchExpressions": [expr("gpu", "in", "yes")]}, ingress=[{}])),  # invalid, still counted
        cnp("r", spec=rule(sel(**{"reserved:host": ""}), ingress=[{}])),
    )
    assert label_keys_mentioned(snap) == frozenset({"role", "zone", "tier", "app", "team", "gpu", "reserved:host"})


IDX = "training.kubeflow.org/replica-index"


@pytest.mark.parametrize(
    "policies, want",
    [
        pytest.param([], frozenset(), id="no policy: no value"),
        pytest.param(
            [
                cnp(spec=rule(sel(**{f"k8s:{IDX}": "7"}), ingress=[{"fromEndpoints": [sel(**{IDX: "3"})]}])),
                knp(podSelector={"matchExpressions": [expr(IDX, "NotIn", "0", "1")]}),
                ccnp(spec=rule(sel(app="x"), egressDeny=[{"toEndpoints": [{"matchExpressions": [
                    expr(f"any:{IDX}", "In", "12")]}]}])),
            ],
            frozenset({"7", "3", "0", "1", "12"}),
            id="matchLabels, In and NotIn values of subjects and peers, sources stripped",
        ),
        pytest.param(
            [cnp(spec=rule({"matchExpressions": [expr(IDX, "Exists")]}, ingress=[{"fromEndpoints": [
                {"matchExpressions": [expr(IDX, "DoesNotExist")]}]}]))],
            frozenset(),
            id="Exists and DoesNotExist name no value",
        ),
        pytest.param(
            [cnp(spec=rule(sel(role="a", zone="b"), ingress=[{}]))], frozenset(), id="other keys do not count"
        ),
        pytest.param(
            [cnp(spec=rule({"matchExpressions": [expr(IDX, "Gt", "3")]}, ingress=[{}]))],
            None,
            id="an operator outside the four is not enumerable",
        ),
        pytest.param(
            [cnp(spec=rule({"matchExpressions": [{"key": IDX, "operator": "In", "values": "3"}]}, ingress=[{}]))],
            None,
            id="values that are not a list are not enumerable",
        ),
    ],
)
def test_label_values_mentioned(policies: list[Any], want: frozenset[str] | None) -> None:
    assert label_values_mentioned(snapshot(*policies), IDX) == want


def test_policy_problems_are_sorted_and_name_the_policy() -> None:
    snap = snapshot(
        knp("z", podSelector={}, policyTypes=["Egress"], ingress=[{}]),
        cnp("a", spec=rule({}, ingress=[{"fromEntities": ["nope"]}])),
    )
    assert policy_problems(snap) == [
        (
            f"{NS}/a",
            "invalid (Cilium rejects it and does not enforce it): ingress[0].fromEntities: unknown entity 'nope'",
        ),
        (
            f"{NS}/z",
            "warning: spec.ingress is not in policyTypes; Cilium enforces it anyway (cilium/cilium#48703), "
            "upstream Kubernetes would ignore it",
        ),
    ]
