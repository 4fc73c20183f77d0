"""The building blocks: selector parsing and matching, peer scoping, identity labels, port sets."""

from __future__ import annotations

from typing import Any

import pytest

from app.models.cluster import ContainerPort
from app.policy import ports as portsets
from app.policy.identity import identity_labels, is_identity_label
from app.policy.ports import PortSpec, parse_cilium_port, parse_knp_port
from app.policy.selectors import (
    InvalidPolicy,
    PeerSelector,
    Requirement,
    Selector,
    parse_selector,
    scope_peer,
    split_key,
)
from tests.unit.policy.builders import endpoint


@pytest.mark.parametrize(
    "raw, want",
    [
        pytest.param("app", ("any", "app"), id="no prefix is any:"),
        pytest.param("k8s:app", ("k8s", "app"), id="k8s: prefix"),
        pytest.param("any:app", ("any", "app"), id="any: prefix"),
        pytest.param("reserved:host", ("reserved", "host"), id="reserved: prefix"),
        pytest.param("$host", ("reserved", "host"), id="$ is reserved shorthand"),
        pytest.param("k8s:io.kubernetes.pod.namespace", ("k8s", "io.kubernetes.pod.namespace"), id="namespace key"),
    ],
)
def test_split_key(raw: str, want: tuple[str, str]) -> None:
    assert split_key(raw, default_source="any") == want


@pytest.mark.parametrize(
    "raw, want",
    [
        pytest.param(None, Selector(), id="None is the empty selector"),
        pytest.param({}, Selector(), id="{} is the empty selector"),
        pytest.param(
            {"matchLabels": {"k8s:role": "w"}},
            Selector((Requirement("k8s", "role", "In", frozenset({"w"})),)),
            id="matchLabels become In requirements with their source",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a", "b"]}]},
            Selector((Requirement("any", "zone", "NotIn", frozenset({"a", "b"})),)),
            id="NotIn expression",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": []}]},
            Selector(
                (Requirement("any", "zone", "In"),), "x.matchExpressions[0]: operator In needs at least one value"
            ),
            id="In without values is broken",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]},
            Selector(
                (Requirement("any", "zone", "Exists", frozenset({"a"})),),
                "x.matchExpressions[0]: operator Exists takes no values",
            ),
            id="Exists with values is broken",
        ),
    ],
)
def test_parse_selector(raw: Any, want: Selector) -> None:
    assert parse_selector(raw, "x") == want


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param([], id="a list"),
        pytest.param({"matchLabels": {"a": 1}}, id="a number value"),
        pytest.param({"matchLabels": {"": "x"}}, id="an empty key"),
        pytest.param(
            {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["x"]}]}, id="an unknown operator"
        ),
        pytest.param(
            {"matchExpressions": [{"key": "a", "operator": "in", "values": ["x"]}]}, id="a lowercase operator"
        ),
        pytest.param({"matchExpressions": ["a=x"]}, id="an expression that is a string"),
    ],
)
def test_parse_selector_rejects(raw: Any) -> None:
    with pytest.raises(InvalidPolicy):
        parse_selector(raw, "x")


def test_knp_namespace_selector_keys_become_namespace_labels() -> None:
    got = parse_selector(
        {"matchLabels": {"team": "ml"}}, "x", default_source="k8s", key_prefix="io.cilium.k8s.namespace.labels."
    )
    assert got == Selector((Requirement("k8s", "io.cilium.k8s.namespace.labels.team", "In", frozenset({"ml"})),))


@pytest.mark.parametrize(
    "raw, namespace, want",
    [
        pytest.param(
            {"matchLabels": {"role": "w"}},
            "ns",
            PeerSelector(parse_selector({"matchLabels": {"role": "w"}}, "x"), "ns"),
            id="CNP peer is scoped to the policy namespace",
        ),
        pytest.param(
            {"matchLabels": {"io.kubernetes.pod.namespace": "o"}},
            "ns",
            PeerSelector(parse_selector({"matchLabels": {"io.kubernetes.pod.namespace": "o"}}, "x")),
            id="naming the namespace escapes",
        ),
        pytest.param(
            {"matchLabels": {"reserved:host": ""}},
            "ns",
            PeerSelector(parse_selector({"matchLabels": {"reserved:host": ""}}, "x")),
            id="a reserved key is left as written",
        ),
        pytest.param(
            {"matchLabels": {"io.cilium.k8s.namespace.labels.t": "x"}},
            "ns",
            PeerSelector(
                parse_selector({"matchLabels": {"io.cilium.k8s.namespace.labels.t": "x"}}, "x"),
                "ns",
                scope_uncertain=True,
            ),
            id="namespace labels make the scope version dependent",
        ),
        pytest.param(
            {},
            None,
            PeerSelector(Selector((Requirement("k8s", "io.kubernetes.pod.namespace", "Exists"),))),
            id="CCNP peer needs some namespace",
        ),
    ],
)
def test_scope_peer(raw: Any, namespace: str | None, want: PeerSelector) -> None:
    assert scope_peer(parse_selector(raw, "x"), policy_namespace=namespace) == want


def test_identity_labels() -> None:
    ep = endpoint(
        "ml",
        sa="trainer",
        ns_labels={"team": "a"},
        role="w",
        **{"pod-template-hash": "1", "io.cilium.k8s.policy.cluster": "fake", "app.kubernetes.io/name": "x"},
    )
    assert identity_labels(ep) == {
        "role": "w",
        "app.kubernetes.io/name": "x",
        "io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name": "ml",
        "io.cilium.k8s.namespace.labels.team": "a",
        "io.kubernetes.pod.namespace": "ml",
        "io.cilium.k8s.policy.serviceaccount": "trainer",
        "io.cilium.k8s.policy.cluster": "default",
    }


@pytest.mark.parametrize(
    "key, kept",
    [
        pytest.param("zone", True, id="plain key kept"),
        pytest.param("training.kubeflow.org/replica-type", True, id="kubeflow label kept"),
        pytest.param("topology.kubernetes.io/zone", True, id="topology zone kept (anchored filter)"),
        pytest.param("app.kubernetes.io/name", True, id="app.kubernetes.io kept"),
        pytest.param("kubernetes.io/hostname", False, id="kubernetes.io dropped"),
        pytest.param("failure-domain.beta.kubernetes.io/zone", False, id="beta.kubernetes.io dropped"),
        pytest.param("controller-revision-hash", False, id="controller-revision-hash dropped"),
        pytest.param("batch.kubernetes.io/job-completion-index", False, id="job completion index dropped"),
        pytest.param("io.cilium.k8s.policy.serviceaccount", False, id="Cilium-owned key dropped"),
    ],
)
def test_identity_label_filter(key: str, kept: bool) -> None:
    assert is_identity_label(key) is kept


@pytest.mark.parametrize(
    "raw, want",
    [
        pytest.param({"port": "80", "protocol": "TCP"}, PortSpec("TCP", 80, 80), id="single port"),
        pytest.param({"port": 80}, PortSpec("ANY", 80, 80), id="int port, protocol defaults to ANY"),
        pytest.param({"port": "80", "endPort": 90, "protocol": "UDP"}, PortSpec("UDP", 80, 90), id="range"),
        pytest.param({"port": "80", "endPort": 70}, PortSpec("ANY", 80, 80), id="endPort below port is ignored"),
        pytest.param({"port": "0", "protocol": "TCP"}, PortSpec("TCP", 0, 65535), id="port 0 is every port"),
        pytest.param({"port": "RDZV", "protocol": "TCP"}, PortSpec("TCP", name="rdzv"), id="named port lowercased"),
    ],
)
def test_parse_cilium_port(raw: Any, want: PortSpec) -> None:
    assert parse_cilium_port(raw, "p") == want


@pytest.mark.parametrize(
    "raw, want",
    [
        pytest.param({}, PortSpec("TCP"), id="no port: every TCP port"),
        pytest.param({"protocol": "UDP", "port": 53}, PortSpec("UDP", 53, 53), id="UDP port"),
        pytest.param({"port": 80, "endPort": 90}, PortSpec("TCP", 80, 90), id="range"),
        pytest.param({"port": "rdzv"}, PortSpec("TCP", name="rdzv"), id="named port"),
    ],
)
def test_parse_knp_port(raw: Any, want: PortSpec) -> None:
    assert parse_knp_port(raw, "p") == want


@pytest.mark.parametrize(
    "spec, protocol, want",
    [
        pytest.param(PortSpec("TCP", name="rdzv"), "TCP", [(23456, 23456)], id="name resolves to the container port"),
        pytest.param(PortSpec("ANY", name="rdzv"), "UDP", [], id="name with the container port's protocol only"),
        pytest.param(PortSpec("ANY", name="dns"), "UDP", [(53, 53)], id="ANY rule, UDP container port"),
        pytest.param(PortSpec("TCP", 1, 10), "UDP", [], id="protocol mismatch covers nothing"),
        pytest.param(PortSpec("GRE"), "TCP", [], id="a non-port protocol covers nothing"),
    ],
)
def test_port_spec_intervals(spec: PortSpec, protocol: str, want: list[tuple[int, int]]) -> None:
    ports = [ContainerPort(23456, "TCP", "rdzv"), ContainerPort(53, "UDP", "dns")]
    assert spec.intervals(protocol, ports) == want


@pytest.mark.parametrize(
    "span, intervals, want_subtract, want_intersect",
    [
        pytest.param((1, 100), [], [(1, 100)], [], id="nothing covered"),
        pytest.param((1, 100), [(0, 65535)], [], [(1, 100)], id="all covered"),
        pytest.param(
            (1, 100),
            [(10, 20), (15, 30), (31, 40)],
            [(1, 9), (41, 100)],
            [(10, 40)],
            id="overlapping and adjacent intervals merge",
        ),
        pytest.param((50, 60), [(1, 10), (70, 80)], [(50, 60)], [], id="disjoint intervals"),
        pytest.param((5, 5), [(5, 5)], [], [(5, 5)], id="single port"),
    ],
)
def test_interval_arithmetic(
    span: tuple[int, int],
    intervals: list[tuple[int, int]],
    want_subtract: list[tuple[int, int]],
    want_intersect: list[tuple[int, int]],
) -> None:
    assert portsets.subtract(span, intervals) == want_subtract
    assert portsets.intersect(span, intervals) == want_intersect
