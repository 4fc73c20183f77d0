"""Decisions memoized per snapshot (engine/memo.py, engine/cached.py).

The memo key must hold everything a decision reads of the job: a memoized decision is always the
one a fresh evaluation gives (property-based, over one long-lived snapshot so that many different
jobs meet in one memo), jobs that differ only where no decision looks share one entry, and a
difference a policy can see (a label it selects on, the job name when a policy reads job-name)
gets its own.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import engine, policy
from app.config import Settings
from app.engine import ledger, memo
from app.models.job import JobGroup
from tests.builders import (
    GPU_TAINT,
    in_flight_totals,
    make_cnp,
    make_group,
    make_intra_zone_cnp,
    make_namespace,
    make_node,
    make_placement,
    make_replica,
    make_snapshot,
    tolerate,
)

NS = "ml"
ZONE = "topology.kubernetes.io/zone"
KF_JOB_NAME = "training.kubeflow.org/job-name"


def _policies() -> list[Any]:
    intra = [make_intra_zone_cnp(zone, namespace=NS) for zone in ("zone-a", "zone-c")]
    quarantine = make_cnp(
        "quarantine",
        {"endpointSelector": {"matchLabels": {"tier": "untrusted"}}, "ingressDeny": [{"fromEndpoints": [{}]}]},
        namespace=NS,
    )
    return [*intra, quarantine]


SNAPSHOT = make_snapshot(
    [
        make_node("a100-a-1", zone="zone-a", gpus=8, taints=[GPU_TAINT]),
        make_node("a100-a-2", zone="zone-a", gpus=8, taints=[GPU_TAINT]),
        make_node("a100-c-1", zone="zone-c", gpus=8, taints=[GPU_TAINT], labels={"pool": "spot"}),
        make_node("cpu-b-1", zone="zone-b"),
    ],
    namespaces=[make_namespace(NS), make_namespace("other")],
    policies=_policies(),
)
SETTINGS = (Settings(), Settings(zone_identity_label="zone"), Settings(zone_strategy="binpack"))

labels = st.dictionaries(
    st.sampled_from(["zone", "tier", "team", "app"]),
    st.sampled_from(["zone-a", "zone-c", "untrusted", "x", "y"]),
    max_size=3,
)
placements = st.one_of(
    st.just(None),
    st.builds(lambda t: make_placement(tolerations=t), st.just([tolerate()])),
    st.builds(lambda z: make_placement({ZONE: z}, tolerations=[tolerate()]), st.sampled_from(["zone-a", "zone-c"])),
    st.builds(
        lambda v: make_placement(
            terms=[{"matchExpressions": [{"key": "pool", "operator": "In", "values": [v]}]}], tolerations=[tolerate()]
        ),
        st.sampled_from(["spot", "on-demand"]),
    ),
)


@st.composite
def groups(draw: st.DrawFn) -> JobGroup:
    name = draw(st.sampled_from(["a", "b", "train"]))
    master = make_replica("Master", coordinator=True, labels=draw(labels), job=name, placement=draw(placements))
    worker = make_replica(
        "Worker",
        count=draw(st.integers(1, 5)),
        gpus=draw(st.integers(0, 8)),
        job=name,
        labels=draw(labels),
        placement=draw(placements) or make_placement(tolerations=[tolerate()]),
    )
    return make_group(master, worker, name=name, namespace=draw(st.sampled_from([NS, "other"])))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(group=groups(), which=st.integers(0, len(SETTINGS) - 1))
def test_a_memoized_decision_is_the_fresh_one(group: JobGroup, which: int) -> None:
    chosen = SETTINGS[which]
    assert engine.decide(group, SNAPSHOT, chosen) == engine.decide_fresh(group, SNAPSHOT, chosen)
    assert engine.validate(group, SNAPSHOT, chosen) == engine.validate_fresh(group, SNAPSHOT, chosen)


def _torch(name: str, **worker_labels: str) -> JobGroup:
    return make_group(
        make_replica("Master", coordinator=True, job=name),
        make_replica(
            "Worker",
            count=3,
            gpus=2,
            job=name,
            labels=worker_labels,
            placement=make_placement(tolerations=[tolerate()]),
        ),
        name=name,
        namespace=NS,
    )


def test_jobs_that_differ_only_in_name_share_one_decision() -> None:
    snapshot = make_snapshot(SNAPSHOT.nodes, namespaces=[make_namespace(NS)], policies=_policies())
    first = engine.decide(_torch("sweep-1"), snapshot, Settings())
    assert engine.decide(_torch("sweep-2"), snapshot, Settings()) is first
    assert len(memo.memo_of(snapshot)) == 1


def test_a_label_a_policy_reads_is_a_different_decision() -> None:
    snapshot = make_snapshot(SNAPSHOT.nodes, namespaces=[make_namespace(NS)], policies=_policies())
    open_job = engine.decide(_torch("a", tier="trusted"), snapshot, Settings())
    quarantined = engine.decide(_torch("b", tier="untrusted"), snapshot, Settings())
    assert (open_job.allowed, quarantined.allowed) == (True, False)
    # A label no policy reads does not split the memo.
    engine.decide(_torch("c", tier="trusted", owner="alice"), snapshot, Settings())
    assert len(memo.memo_of(snapshot)) == 2


def test_the_job_name_counts_when_a_policy_selects_on_it() -> None:
    deny_one = make_cnp(
        "deny-job-b",
        {"endpointSelector": {"matchLabels": {KF_JOB_NAME: "b"}}, "ingressDeny": [{"fromEndpoints": [{}]}]},
        namespace=NS,
    )
    snapshot = make_snapshot(SNAPSHOT.nodes, namespaces=[make_namespace(NS)], policies=[deny_one])
    assert engine.decide(_torch("a"), snapshot, Settings()).allowed
    denied = engine.decide(_torch("b"), snapshot, Settings())
    assert not denied.allowed
    assert any("deny-job-b" in r for r in denied.reasons)


def test_messages_name_pods_by_a_placeholder_the_surfaces_fill_in() -> None:
    denied = engine.decide(_torch("a", tier="untrusted"), SNAPSHOT, Settings())
    text = " ".join(denied.reasons)
    assert memo.JOB_PLACEHOLDER not in text or "ml/<job>-" in text
    assert engine.render("ingress of ml/<job>-worker-1", "llm") == "ingress of ml/llm-worker-1"
    assert engine.render_json({"a": ["ml/<job>-master-0", 3]}, "llm") == {"a": ["ml/llm-master-0", 3]}


def test_jobs_of_one_shape_share_their_flow_verdicts_whatever_their_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    # In a burst every admission changes the in-flight totals, so each decision is made afresh; its
    # flows are not judged again: one checker per shape and snapshot, one verdict per pod pair.
    snapshot = make_snapshot(SNAPSHOT.nodes, namespaces=[make_namespace(NS)], policies=_policies())
    calls: list[int] = []
    real = policy.check_flow

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(policy, "check_flow", counting)
    first = engine.pending("decide", _torch("sweep-1"), snapshot, Settings()).result()
    judged = len(calls)
    held = in_flight_totals([ledger.Hold("x", ("PyTorchJob", NS, "x"), first.zone or "", {"nvidia.com/gpu": 2})],
                                   job=("", "", ""))
    second = engine.pending("decide", _torch("sweep-2"), snapshot, Settings(), in_flight=held)

    assert second.known is None  # other capacity: a decision of its own ...
    assert second.result().zones != first.zones  # ... that counts the hold
    assert judged > 0
    assert len(calls) == judged  # ... on the verdicts the first one found


def test_a_snapshot_with_decisions_is_freed_without_a_collection() -> None:
    # The server freezes its heap after each publish (settle_heap): a snapshot kept alive by a reference
    # cycle would outlive its replacement until the next full collection, minutes and hundreds of MB later.
    import gc
    import weakref

    snapshot = make_snapshot(SNAPSHOT.nodes, namespaces=[make_namespace(NS)], policies=_policies())
    engine.prepare(snapshot, Settings())
    engine.decide(_torch("sweep-1"), snapshot, Settings())
    engine.validate(_torch("sweep-1"), snapshot, Settings())
    gone = weakref.ref(snapshot)
    gc.disable()
    try:
        del snapshot
        assert gone() is None
    finally:
        gc.enable()


def test_the_memo_keeps_the_newest_decisions_and_drops_the_oldest_first() -> None:
    decisions = memo.DecisionMemo(size=3)
    keys = [memo.DecisionKey(("decide", i), i) for i in range(5)]
    made = [engine.decide(_torch(f"j{i}"), SNAPSHOT, Settings()) for i in range(5)]
    for key, decision in zip(keys[:3], made[:3], strict=True):
        decisions.put(key, decision)
    decisions.put(keys[0], made[0])  # kept again: nothing goes
    assert [decisions.get(k) for k in keys[:3]] == made[:3]

    decisions.put(keys[3], made[3])
    decisions.put(keys[4], made[4])

    assert len(decisions) == 3
    assert [decisions.get(k) for k in keys] == [None, None, *made[2:]]
