"""The decision memo's key object (engine/memo.py `DecisionKey`) against the tuple it replaced.

`DecisionKey` hashes once and holds flows and container ports as plain tuples of their fields; it
must make exactly the jobs share a memo entry that the plain tuple key did. `_tuple_key` below is
that key as memo.py built it before (commit 5e4810a), kept here as the reference: for pairs of
jobs that differ in fields the key must see and fields it must not, both keys agree on equality,
and equal keys hash equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from types import MappingProxyType
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app import jobs
from app.config import Settings
from app.engine import memo
from app.models.cluster import ContainerPort
from app.models.job import Flow, JobGroup, Replica
from app.models.network import ALL_PORTS, PortRange
from tests.builders import (
    GPU,
    make_cnp,
    make_group,
    make_namespace,
    make_placement,
    make_pytorchjob,
    make_replica,
    make_snapshot,
    make_template,
    tolerate,
)

NS = "ml"
# Policies read `tier` and `team`; no policy reads `owner`.
SNAPSHOT = make_snapshot(
    namespaces=[make_namespace(NS), make_namespace("other")],
    policies=[
        make_cnp(
            "tiers",
            {"endpointSelector": {"matchLabels": {"tier": "x", "team": "y"}}, "ingressDeny": [{"fromEndpoints": [{}]}]},
            namespace=NS,
        )
    ],
)
# The first two are equal but distinct objects.
SETTINGS = (Settings(), Settings(), Settings(zone_identity_label="zone"))


def _old_labels(labels: Mapping[str, str], read: frozenset[str]) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in labels.items() if k in read)


def _old_raw(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def _old_replica_key(replica: Replica, read: frozenset[str]) -> tuple[Hashable, ...]:
    placement = replica.placement
    return (
        replica.key,
        replica.role,
        replica.count,
        replica.index_label,
        _old_labels(replica.pod_labels, read),
        _old_labels(replica.leader_labels, read),
        tuple(replica.gpus.items()),
        replica.ports,
        replica.service_account,
        replica.host_network,
        replica.is_coordinator,
        tuple(placement.node_selector.items()),
        _old_raw(placement.node_selector_terms) if placement.node_selector_terms else b"",
        _old_raw(placement.tolerations) if placement.tolerations else b"",
    )


def _tuple_key(kind: memo.Kind, group: JobGroup, setting: Settings, *, colocated: bool) -> tuple[Hashable, ...]:
    read = memo.keys_read(SNAPSHOT)
    return (
        kind,
        setting,
        group.namespace,
        group.coordinator,
        group.flows,
        tuple(_old_replica_key(r, read) for r in group.replicas),
        colocated,
    )


def _flat(value: Any) -> tuple[Any, ...]:
    """`dataclasses.astuple` output with nested tuples spliced in."""
    out: list[Any] = []
    for item in value:
        out.extend(_flat(item) if isinstance(item, tuple) else (item,))
    return tuple(out)


def test_the_plain_forms_hold_every_field_of_a_flow_and_a_container_port() -> None:
    # NB: fails when a field is added to Flow, PortRange or ContainerPort until memo.py's form has it.
    flow = Flow("Worker", "Master", PortRange(29500, 29510), "UDP", "rendezvous", "c10d")
    port = ContainerPort(23456, "UDP", "pytorchjob-port")
    assert memo._flows((flow,)) == (_flat(dataclasses.astuple(flow)),)
    replica = dataclasses.replace(make_replica("Worker"), ports=(port,))
    assert (dataclasses.astuple(port),) in memo._replica_key(replica, frozenset())


# --- jobs described by a few fields, so two descriptions can share some and differ in others --------

LABELS = st.lists(
    st.tuples(st.sampled_from(["tier", "team", "owner"]), st.sampled_from(["x", "y"])),
    max_size=3,
    unique_by=lambda kv: kv[0],
)
PLACEMENTS: dict[str, Any] = {
    "none": lambda: make_placement(),
    "toleration": lambda: make_placement(tolerations=[tolerate()]),
    # JSON types kept apart: 1, 1.0 and true are three placements.
    "toleration-seconds-1": lambda: make_placement(tolerations=[{**tolerate(), "tolerationSeconds": 1}]),
    "toleration-seconds-1.0": lambda: make_placement(tolerations=[{**tolerate(), "tolerationSeconds": 1.0}]),
    "toleration-seconds-true": lambda: make_placement(tolerations=[{**tolerate(), "tolerationSeconds": True}]),
    "selector": lambda: make_placement({"pool": "spot"}),
    "terms": lambda: make_placement(terms=[{"matchExpressions": [{"key": "pool", "operator": "Exists"}]}]),
}
FLOWS: dict[str, Any] = {
    "default": None,
    "rendezvous-29500": lambda: [Flow("Worker", "Master", PortRange.single(29500), "TCP", "rendezvous")],
    "rendezvous-udp": lambda: [Flow("Worker", "Master", PortRange.single(29500), "UDP", "rendezvous")],
    "rendezvous-named": lambda: [Flow("Worker", "Master", PortRange.single(29500), "TCP", "rendezvous", "c10d")],
    "all-ports": lambda: [Flow("Worker", "Master", ALL_PORTS, "TCP", "collective")],
    "all-ports-launcher": lambda: [Flow("Worker", "Master", ALL_PORTS, "TCP", "launcher")],
    "reversed": lambda: [Flow("Master", "Worker", ALL_PORTS, "TCP", "collective")],
}
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "kind": st.sampled_from(["decide", "validate"]),
    "settings": st.integers(0, len(SETTINGS) - 1),
    "colocated": st.booleans(),
    "name": st.sampled_from(["a", "b"]),
    "namespace": st.sampled_from([NS, "other"]),
    "flows": st.sampled_from(sorted(FLOWS)),
    "master_labels": LABELS,
    "leader_labels": LABELS,
    "worker_labels": LABELS,
    "worker_count": st.integers(1, 2),
    "worker_gpus": st.sampled_from([0, 4]),
    "ports": st.lists(
        st.tuples(st.sampled_from([23456, 29500]), st.sampled_from(["TCP", "UDP"]), st.sampled_from(["", "p"])),
        max_size=2,
    ),
    "service_account": st.sampled_from(["default", "trainer"]),
    "host_network": st.booleans(),
    "placement": st.sampled_from(sorted(PLACEMENTS)),
    "index_label": st.sampled_from(["training.kubeflow.org/replica-index", ""]),
    "template": st.sampled_from([{}, {"metadata": {"annotations": {"note": "unread"}}}]),
    "annotations": st.sampled_from([{}, {"unread": "yes"}]),
}


def _group(spec: Mapping[str, Any]) -> JobGroup:
    """A fresh group (new objects every call) as `spec` describes it."""
    master = make_replica("Master", coordinator=True, job=spec["name"], labels=dict(spec["master_labels"]))
    master = dataclasses.replace(
        master,
        leader_labels=MappingProxyType(dict(spec["leader_labels"])),
        ports=tuple(ContainerPort(*p) for p in spec["ports"]),
        template=dict(spec["template"]),
    )
    worker = make_replica(
        "Worker",
        count=spec["worker_count"],
        gpus=spec["worker_gpus"],
        job=spec["name"],
        labels=dict(spec["worker_labels"]),
        placement=PLACEMENTS[spec["placement"]](),
        service_account=spec["service_account"],
        host_network=spec["host_network"],
    )
    worker = dataclasses.replace(worker, index_label=spec["index_label"])
    flows = FLOWS[spec["flows"]]
    group = make_group(master, worker, name=spec["name"], namespace=spec["namespace"], flows=flows and flows())
    return dataclasses.replace(group, annotations=MappingProxyType(dict(spec["annotations"])))


def _keys(spec: Mapping[str, Any]) -> tuple[memo.DecisionKey, tuple[Hashable, ...]]:
    group, setting = _group(spec), SETTINGS[spec["settings"]]
    new = memo.decision_key(spec["kind"], group, SNAPSHOT, setting, colocated=spec["colocated"])
    return new, _tuple_key(spec["kind"], group, setting, colocated=spec["colocated"])


@st.composite
def spec_pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A job description and a second one with up to two fields drawn again (often the same value;
    labels often the same ones in another order)."""
    first = draw(st.fixed_dictionaries(FIELDS))
    redrawn = draw(st.sets(st.sampled_from(sorted(FIELDS)), max_size=2))
    second = dict(first)
    for name in redrawn:
        again = FIELDS[name]
        if name.endswith("_labels"):
            again = st.one_of(again, st.permutations(first[name]))
        second[name] = draw(again)
    return first, second


def _assert_same_sharing(first: Mapping[str, Any], second: Mapping[str, Any]) -> bool:
    (new_a, old_a), (new_b, old_b) = _keys(first), _keys(second)
    assert (new_a == new_b) == (old_a == old_b)
    assert (new_a != new_b) == (old_a != old_b)
    if new_a == new_b:
        assert hash(new_a) == hash(new_b)
    return new_a == new_b


@settings(max_examples=500, deadline=None)
@given(pair=spec_pairs())
def test_keys_are_equal_exactly_when_the_tuple_keys_are(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    first, second = pair
    _assert_same_sharing(first, second)
    # The same job parsed again (new objects) finds its entry.
    assert _assert_same_sharing(first, first)


BASE: dict[str, Any] = {
    "kind": "decide",
    "settings": 0,
    "colocated": False,
    "name": "a",
    "namespace": NS,
    "flows": "default",
    "master_labels": [("tier", "x")],
    "leader_labels": [],
    "worker_labels": [("tier", "x"), ("team", "y")],
    "worker_count": 2,
    "worker_gpus": 4,
    "ports": [(23456, "TCP", "p")],
    "service_account": "default",
    "host_network": False,
    "placement": "toleration",
    "index_label": "training.kubeflow.org/replica-index",
    "template": {},
    "annotations": {},
}


@pytest.mark.parametrize(
    "change, shared",
    [
        pytest.param({"name": "b"}, True, id="the job name (no policy reads job-name here)"),
        pytest.param({"worker_labels": [("tier", "x"), ("team", "y"), ("owner", "z")]}, True, id="an unread label"),
        pytest.param({"settings": 1}, True, id="equal settings, another object"),
        pytest.param({"template": {"metadata": {"annotations": {"n": "1"}}}}, True, id="the template"),
        pytest.param({"annotations": {"unread": "yes"}}, True, id="the job's annotations"),
        pytest.param({"worker_labels": [("tier", "y"), ("team", "y")]}, False, id="a read label's value"),
        pytest.param({"worker_labels": [("team", "y"), ("tier", "x")]}, False, id="the order of two read labels"),
        pytest.param({"master_labels": []}, False, id="a read label dropped"),
        pytest.param({"leader_labels": [("team", "x")]}, False, id="a read leader label"),
        pytest.param({"settings": 2}, False, id="other settings"),
        pytest.param({"kind": "validate"}, False, id="validate"),
        pytest.param({"colocated": True}, False, id="colocated"),
        pytest.param({"namespace": "other"}, False, id="the namespace"),
        pytest.param({"flows": "rendezvous-29500"}, False, id="the flows"),
        pytest.param({"worker_count": 1}, False, id="a replica count"),
        pytest.param({"worker_gpus": 0}, False, id="the GPUs"),
        pytest.param({"ports": [(23456, "UDP", "p")]}, False, id="a port's protocol"),
        pytest.param({"ports": [(23456, "TCP", "")]}, False, id="a port's name"),
        pytest.param({"ports": [(29500, "TCP", "p")]}, False, id="a port number"),
        pytest.param({"service_account": "trainer"}, False, id="the service account"),
        pytest.param({"host_network": True}, False, id="hostNetwork"),
        pytest.param({"placement": "selector"}, False, id="the nodeSelector"),
        pytest.param({"placement": "terms"}, False, id="required node affinity"),
        pytest.param({"index_label": ""}, False, id="the index label"),
    ],
)
def test_jobs_share_a_key_exactly_when_they_did(change: dict[str, Any], shared: bool) -> None:
    assert _assert_same_sharing(BASE, {**BASE, **change}) is shared


@pytest.mark.parametrize(
    "first, second",
    [
        pytest.param("rendezvous-29500", "rendezvous-udp", id="protocol"),
        pytest.param("rendezvous-29500", "rendezvous-named", id="port name"),
        pytest.param("rendezvous-29500", "all-ports", id="port range"),
        pytest.param("all-ports", "all-ports-launcher", id="purpose"),
        pytest.param("all-ports", "reversed", id="direction"),
    ],
)
def test_flows_that_differ_in_any_field_do_not_share(first: str, second: str) -> None:
    assert _assert_same_sharing({**BASE, "flows": first}, {**BASE, "flows": second}) is False


@pytest.mark.parametrize(
    "first, second",
    [
        ("toleration-seconds-1", "toleration-seconds-1.0"),
        ("toleration-seconds-1", "toleration-seconds-true"),
        ("toleration", "toleration-seconds-1"),
    ],
)
def test_tolerations_keep_json_types_apart(first: str, second: str) -> None:
    assert _assert_same_sharing({**BASE, "placement": first}, {**BASE, "placement": second}) is False


def test_keys_whose_hashes_collide_are_told_apart_by_settings_and_parts() -> None:
    same = memo.DecisionKey(("decide", SETTINGS[0], NS), 7)
    assert same == memo.DecisionKey(("decide", SETTINGS[1], NS), 7)
    assert same != memo.DecisionKey(("decide", SETTINGS[2], NS), 7)
    assert same != memo.DecisionKey(("validate", SETTINGS[0], NS), 7)
    assert same != ("decide", SETTINGS[0], NS)


def test_settings_that_hash_alike_still_get_their_own_entry() -> None:
    decisions, group = memo.DecisionMemo(), _group(BASE)
    first = decisions.keys("decide", group, SNAPSHOT, SETTINGS[0])[0]
    decisions._settings_hash = (SETTINGS[2], hash(SETTINGS[0]))  # as if the two settings hashed alike
    other = decisions.keys("decide", group, SNAPSHOT, SETTINGS[2])[0]
    assert hash(first) == hash(other)
    assert first != other


def test_a_flows_tuple_seen_before_is_read_once_and_others_are_still_told_apart() -> None:
    # The kubeflow parser hands every job of one shape the same flows tuple; the memo keeps its form.
    decisions = memo.DecisionMemo()
    a = _group(BASE)
    b = dataclasses.replace(_group({**BASE, "name": "b"}), flows=a.flows)
    other = _group({**BASE, "flows": "rendezvous-29500"})
    first = decisions.keys("decide", a, SNAPSHOT, SETTINGS[0])[0]
    assert decisions.keys("decide", b, SNAPSHOT, SETTINGS[0])[0] == first
    assert decisions.keys("decide", other, SNAPSHOT, SETTINGS[0])[0] != first
    assert decisions.keys("decide", a, SNAPSHOT, SETTINGS[0])[0] == first


@pytest.mark.parametrize(
    "worker, shared",
    [
        pytest.param(make_template(gpus=4, labels={"owner": "alice"}), True, id="an unread label"),
        pytest.param(make_template(gpus=4, labels={"tier": "x"}), False, id="a label a policy reads"),
        pytest.param(
            make_template(gpus=4, ports=[{"name": "pytorchjob-port", "containerPort": 29500}]), False, id="the port"
        ),
    ],
)
def test_parsed_jobs_share_a_key_exactly_when_they_did(worker: dict[str, Any], shared: bool) -> None:
    decisions, base = memo.DecisionMemo(), make_template(gpus=4)
    groups = [
        jobs.parse_job(make_pytorchjob(name, namespace=NS, worker=template), gpu_resources=(GPU,))
        for name, template in (("a", base), ("b", base), ("c", worker), ("a", base))
    ]
    new = [decisions.keys("decide", g, SNAPSHOT, SETTINGS[0])[0] for g in groups]
    old = [_tuple_key("decide", g, SETTINGS[0], colocated=False) for g in groups]
    assert (new[0] == new[1], new[0] == new[2], new[2] == new[3]) == (
        old[0] == old[1],
        old[0] == old[2],
        old[2] == old[3],
    )
    assert (new[0] == new[1], new[0] == new[2], new[0] == new[3]) == (True, shared, True)


def test_a_key_with_non_string_json_keys_is_the_exact_form() -> None:
    # orjson refuses a non-str key without OPT_NON_STR_KEYS; the key then takes the option's bytes.
    assert memo._raw(({1: "a"},)) == orjson.dumps(({1: "a"},), option=orjson.OPT_NON_STR_KEYS)
    assert memo._raw(({"a": 1.0, "b": True},)) == orjson.dumps(({"a": 1.0, "b": True},), option=orjson.OPT_NON_STR_KEYS)
