"""Pods as policy endpoints (representatives vs enumerated indices) and the flow/verdict messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from app.engine import flows
from app.models.cluster import PolicyObject
from app.models.job import Flow, JobGroup
from app.models.network import ALL_PORTS, PortRange, Reason, SideVerdict, Verdict
from tests.builders import make_cnp, make_group, make_namespace, make_replica, make_snapshot

INDEX = "training.kubeflow.org/replica-index"
ROLE = "training.kubeflow.org/job-role"
LEADER = {ROLE: "master"}


def checker(
    mentioned: frozenset[str], workers: int = 3, policies: Sequence[PolicyObject] = ()
) -> tuple[flows.FlowChecker, JobGroup]:
    group = make_group(
        make_replica("Master", coordinator=True, labels={"zone": "zone-b"}),
        replace(make_replica("Worker", count=workers, gpus=1, service_account="trainer"), leader_labels=LEADER),
        namespace="ml",
    )
    snapshot = make_snapshot(namespaces=[make_namespace("ml", {"team": "research"})], policies=policies)
    return flows.FlowChecker(group=group, snapshot=snapshot, enforcement="default", mentioned=mentioned), group


def index_policy(*expressions: Mapping[str, Any]) -> PolicyObject:
    return make_cnp("by-index", {"endpointSelector": {"matchExpressions": list(expressions)}, "ingress": [{}]},
                    namespace="ml")


def index_in(*values: str, operator: str = "In") -> dict[str, Any]:
    return {"key": INDEX, "operator": operator, "values": list(values)}


@pytest.mark.parametrize(
    "mentioned, workers, policies, want",
    [
        pytest.param(frozenset({"zone"}), 3, [], [(0, 3)], id="one class when no policy reads the index or leader"),
        pytest.param(frozenset({INDEX}), 1, [index_policy(index_in("0"))], [(0, 1)], id="a single pod is one class"),
        pytest.param(
            frozenset({INDEX}), 3, [index_policy(index_in("1"))], [(0, 1), (1, 1), (2, 1)],
            id="three workers, index 1 named: pod 0, pod 1 and pod 2 for the rest",
        ),
        pytest.param(
            frozenset({INDEX}), 64, [index_policy(index_in("7"))], [(0, 1), (7, 1), (1, 62)],
            id="index 7 of 64 named: three classes stand for every pod",
        ),
        pytest.param(
            frozenset({INDEX}), 4, [index_policy(index_in("99", "07", "-1", "x", operator="NotIn"))], [(0, 1), (1, 3)],
            id="values no pod carries add no class",
        ),
        pytest.param(
            frozenset({INDEX}), 3, [index_policy(index_in("1", "2"))], [(0, 1), (1, 1), (2, 1)],
            id="every index named: no class for the rest",
        ),
        pytest.param(
            frozenset({INDEX}), 50, [index_policy({"key": INDEX, "operator": "Exists"})], [(0, 1), (1, 49)],
            id="Exists names no value: pod 0 and the rest",
        ),
        pytest.param(
            frozenset({ROLE}), 5, [], [(0, 1), (1, 4)], id="a read leader label splits pod 0 from the rest"
        ),
    ],
)
def test_pod_classes(
    mentioned: frozenset[str], workers: int, policies: list[PolicyObject], want: list[tuple[int, int]]
) -> None:
    check, group = checker(mentioned, workers, policies)
    got = check.classes(group.replica("Worker"))
    assert [(c.index, c.size) for c in got] == want
    assert sum(c.size for c in got) == workers
    assert check.truncated == {}


@pytest.mark.parametrize(
    "workers, want_indices, truncated",
    [
        pytest.param(5, ["0", "1", "2", "3", "4"], False, id="under the bound every index is checked"),
        pytest.param(
            40, [str(i) for i in range(flows.MAX_ENUMERATED_PODS - 1)] + ["39"], True,
            id="beyond the bound the first and the last are checked and the rest recorded",
        ),
    ],
)
def test_values_that_cannot_be_enumerated_fall_back_to_a_bounded_enumeration(
    workers: int, want_indices: list[str], truncated: bool
) -> None:
    check, group = checker(frozenset({INDEX}), workers, [index_policy({"key": INDEX, "operator": "Gt", "values": "3"})])
    got = check.endpoints(group.replica("Worker"), {})
    assert [e.labels[INDEX] for e in got] == want_indices
    assert ("Worker" in check.truncated) is truncated


def test_leader_labels_are_on_pod_zero_only() -> None:
    check, group = checker(frozenset({ROLE}), 3)
    got = check.endpoints(group.replica("Worker"), {})
    assert [(e.labels[INDEX], e.labels.get(ROLE)) for e in got] == [("0", "master"), ("1", None)]


def test_endpoint_carries_the_pod_identity_and_overrides() -> None:
    check, group = checker(frozenset())
    (got,) = check.endpoints(group.replica("Master"), {"zone": "zone-a"})
    assert (got.namespace, dict(got.labels), dict(got.namespace_labels), got.service_account, got.name) == (
        "ml",
        {
            "training.kubeflow.org/job-name": "train",
            "training.kubeflow.org/replica-type": "master",
            "zone": "zone-a",
            INDEX: "0",
        },
        {"team": "research", "kubernetes.io/metadata.name": "ml"},
        "default",
        "<job>-master-0",  # the job name goes in at the surfaces (engine.render)
    )


@pytest.mark.parametrize(
    "flow, want",
    [
        pytest.param(
            Flow("Worker", "Master", PortRange.single(23456), "TCP", "rendezvous", "pytorchjob-port"),
            "Worker → Master TCP/23456 (pytorchjob-port)",
            id="a named rendezvous port",
        ),
        pytest.param(
            Flow("Worker", "Worker", ALL_PORTS, "TCP", "collective"),
            "Worker → Worker TCP/1-65535",
            id="collective traffic over every port",
        ),
    ],
)
def test_describe_flow(flow: Flow, want: str) -> None:
    assert flows.describe_flow(flow) == want


DENY = Reason("ingress", "deny", "ingressDeny matches", "ml/quarantine", "CiliumNetworkPolicy", "ingressDeny[0]")
ENFORCING = Reason("egress", "default-deny", "no rule allows 23456/TCP", "ml/intra-a", "CiliumNetworkPolicy", "spec")
ENFORCING_KNP = Reason("egress", "default-deny", "no rule allows 23456/TCP", "ml/deny-all", "NetworkPolicy", "spec")
ALLOW = Reason("egress", "allow", "allowed by this entry", "ml/intra-a", "CiliumNetworkPolicy", "egress[0]")
L7 = Reason("egress", "unknown", "L7 rule on 23456", "ml/l7", "CiliumNetworkPolicy", "egress[0]")
NOT_ENFORCED = Reason("ingress", "not-enforced", "no policy enforces ingress")


@pytest.mark.parametrize(
    "verdict, want",
    [
        pytest.param(
            Verdict("deny", SideVerdict("allow", (ALLOW,)), SideVerdict("deny", (DENY,))),
            ("ingress denied by CiliumNetworkPolicy ml/quarantine ingressDeny[0]",),
            id="a deny rule is named with its rule, the allowing side is left out",
        ),
        pytest.param(
            Verdict("deny", SideVerdict("deny", (ENFORCING, ENFORCING_KNP)), SideVerdict("allow", (NOT_ENFORCED,))),
            ("egress default-deny: no rule of CiliumNetworkPolicy ml/intra-a; NetworkPolicy ml/deny-all allows it",),
            id="a default-deny names every policy that enforces the side, grouped by kind",
        ),
        pytest.param(
            Verdict("unknown", SideVerdict("unknown", (L7,)), SideVerdict("allow", (NOT_ENFORCED,))),
            ("egress cannot be evaluated: CiliumNetworkPolicy ml/l7 egress[0]: L7 rule on 23456",),
            id="an unknown says what cannot be evaluated and where",
        ),
        pytest.param(
            Verdict(
                "unknown",
                SideVerdict("unknown", (Reason("egress", "unknown", "uses hostNetwork"),)),
                SideVerdict("unknown", (Reason("ingress", "unknown", "uses hostNetwork"),)),
            ),
            ("egress and ingress cannot be evaluated: uses hostNetwork",),
            id="both sides with the same reason are said once",
        ),
    ],
)
def test_blocking_reasons(verdict: Verdict, want: tuple[str, ...]) -> None:
    assert flows.blocking_reasons(verdict) == want


@pytest.mark.parametrize(
    "side, want",
    [
        pytest.param(
            SideVerdict("allow", (ALLOW,)),
            "egress allowed by CiliumNetworkPolicy ml/intra-a egress[0]",
            id="allowed names the allowing rule",
        ),
        pytest.param(
            SideVerdict("allow", (NOT_ENFORCED,)),
            "egress not enforced (no policy selects the pod in this direction)",
            id="no policy selects the pod",
        ),
        pytest.param(
            SideVerdict("allow", (Reason("egress", "allow", "hostNetwork ml/w-0 is host traffic: not enforced"),)),
            "egress allowed: hostNetwork ml/w-0 is host traffic: not enforced",
            id="an allow no policy decides (hostNetwork host traffic, allow-localhost) says why",
        ),
    ],
)
def test_describe_side(side: SideVerdict, want: str) -> None:
    assert flows.describe_side("egress", side) == want


def test_describe_sides_says_a_shared_state_once() -> None:
    quiet = Verdict("allow", SideVerdict("allow", (NOT_ENFORCED,)), SideVerdict("allow", (NOT_ENFORCED,)))
    assert flows.describe_sides(quiet) == (
        "egress and ingress not enforced (no policy selects the pod in this direction)",
    )
