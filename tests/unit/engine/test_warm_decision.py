"""A warm decision (a shape decided already on the snapshot, only the reservations new) is the fresh one.

What a shape keeps on its snapshot (engine/decide.py `Shape`, `_Plan`): the zone index, each candidate's
bases, the summaries per chosen zone and capacity state, the warnings; the admitted lead is built from the
decision's parts (`lead.admitted`). Each must give what a decision on a fresh snapshot gives.
"""

from __future__ import annotations

import importlib
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import engine
from app.config import Settings
from app.engine import lead, ledger
from app.models.job import JobGroup
from tests.builders import (
    GPU,
    GPU_TAINT,
    in_flight_totals,
    make_group,
    make_namespace,
    make_node,
    make_placement,
    make_replica,
    make_snapshot,
    tolerate,
)

decide_module = importlib.import_module("app.engine.decide")  # `app.engine.decide` is also the function

NS = "ml"


def cluster() -> Any:
    nodes = [
        make_node("a-1", zone="zone-a", gpus=8, taints=[GPU_TAINT]),
        make_node("a-2", zone="zone-a", gpus=8, taints=[GPU_TAINT]),
        make_node("b-1", zone="zone-b", gpus=4, taints=[GPU_TAINT]),
        make_node("c-1", zone="zone-c", gpus=8, taints=[GPU_TAINT]),
        make_node("d-1", zone="zone-d"),  # no GPUs: never a candidate
    ]
    return make_snapshot(nodes, namespaces=[make_namespace(NS)])


def job(workers: int, gpus: int) -> JobGroup:
    placement = make_placement(tolerations=[tolerate()])
    return make_group(
        make_replica("Master", coordinator=True, gpus=gpus, placement=placement, job="warm"),
        make_replica("Worker", count=workers, gpus=gpus, placement=placement, job="warm"),
        name="warm",
        namespace=NS,
    )


def hold(i: int, zone: str, gpus: int) -> ledger.Hold:
    return ledger.Hold(f"PyTorchJob {NS}/burst-{i}", ("PyTorchJob", NS, f"burst-{i}"), zone, {GPU: gpus},
                       in_flight=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    burst=st.lists(st.tuples(st.sampled_from(["zone-a", "zone-b", "zone-c"]), st.integers(0, 20)),
                   min_size=1, max_size=8),
    workers=st.integers(0, 3),
    gpus=st.integers(0, 4),
    strategy=st.sampled_from(["most-free", "binpack"]),
    policy=st.sampled_from(["wait", "refuse"]),
    identity=st.sampled_from(["", "zone"]),
    mode=st.sampled_from(["pin", "colocate"]),
    suspended=st.booleans(),
)
def test_a_warm_decision_is_the_fresh_one_with_the_lead_lead_for_gives(
    burst: list[tuple[str, int]], workers: int, gpus: int, strategy: str, policy: str, identity: str, mode: str,
    suspended: bool,
) -> None:
    config = Settings(zone_strategy=strategy, capacity_policy=policy, zone_identity_label=identity, mode=mode)
    shared = cluster()
    group = job(workers, gpus)
    holds: list[ledger.Hold] = []
    for i, (zone, n) in enumerate(burst):
        holds.append(hold(i, zone, n))
        totals = in_flight_totals(holds, job=engine.job_key(group))
        warm = engine.pending("decide", group, shared, config, suspended=suspended, in_flight=totals).result()
        fresh = engine.pending("decide", group, cluster(), config, suspended=suspended, in_flight=totals).result()
        assert warm == fresh
        assert lead.with_lead(group, warm) == warm  # the lead built from the parts is `lead_for`'s


def test_the_warnings_follow_what_the_checker_truncates() -> None:
    # The shape keeps its warnings; a replica the checker truncates afterwards must still be warned about.
    snapshot = cluster()
    group = job(2, 4)
    run = decide_module.start_run(group, snapshot, Settings(), strict=False)
    before = decide_module.warnings_for(run)
    assert decide_module.warnings_for(run) is before  # kept

    run.checker.truncated["Worker"] = "Worker has 2 pods and ... the flows of the others cannot be evaluated"
    after = decide_module.warnings_for(run)

    assert after == (*before, run.checker.truncated["Worker"])
    again = decide_module.start_run(group, snapshot, Settings(), strict=False)  # the same shape
    assert decide_module.warnings_for(again) == after


def test_a_zone_row_is_made_again_only_when_its_reserved_gpus_change() -> None:
    # A burst admits into one zone at a time: the rows of the others repeat (the same objects) until they change.
    snapshot = cluster()
    group = job(1, 4)

    def decide(*holds: ledger.Hold) -> Any:
        totals = in_flight_totals(holds, job=engine.job_key(group))
        return engine.pending("decide", group, snapshot, Settings(), in_flight=totals).result()

    first = decide(hold(1, "zone-a", 8))
    second = decide(hold(1, "zone-a", 8), hold(2, "zone-c", 4))
    rows = {r.zone: r for r in first.zones}
    again = {r.zone: r for r in second.zones}

    assert again["zone-a"] is rows["zone-a"] and again["zone-b"] is rows["zone-b"]
    assert again["zone-c"] is not rows["zone-c"]
    assert (rows["zone-c"].gpus_reserved, again["zone-c"].gpus_reserved) == (0, 4)


def _reference_rank(report: Any, strategy: str) -> tuple[Any, ...]:
    """rank_key as it was written with Fractions: the order the exact, cheaper key must keep."""
    from fractions import Fraction

    value = report.gpus_free - report.gpus_reserved
    if report.capacity == "now":
        return (0, value if strategy == "binpack" else -value, report.zone)
    return (1, -Fraction(value, max(report.gpus_allocatable, 1)), report.zone)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.tuples(st.sampled_from(["now", "wait"]), st.integers(0, 64),
                            st.integers(0, 200) | st.sampled_from([2**60, 2**60 + 1, 10**400, 10**400 + 1]),
                            st.integers(0, 64) | st.just(10**400), st.sampled_from(["zone-a", "zone-b", "zone-c"])),
                  min_size=2, max_size=6),
    strategy=st.sampled_from(["most-free", "binpack"]),
)
def test_rank_key_orders_zones_as_exact_fractions_do(rows: list[tuple[str, int, int, int, str]], strategy: str) -> None:
    # Shares that round to one float (2**60 and 2**60 + 1 reserved) or beyond any (10**400) rank exactly.
    import dataclasses

    template = engine.decide(job(1, 4), cluster(), Settings()).zones[0]
    reports = [dataclasses.replace(template, capacity=state, gpus_free=free, gpus_reserved=reserved,
                                   gpus_allocatable=allocatable, zone=zone)
               for state, free, reserved, allocatable, zone in rows]
    for a in reports:
        for b in reports:
            ours = decide_module.rank_key(a, strategy), decide_module.rank_key(b, strategy)
            theirs = _reference_rank(a, strategy), _reference_rank(b, strategy)
            assert (ours[0] < ours[1], ours[0] == ours[1]) == (theirs[0] < theirs[1], theirs[0] == theirs[1])
    ours_first = min(reports, key=lambda r: decide_module.rank_key(r, strategy))
    assert ours_first is min(reports, key=lambda r: _reference_rank(r, strategy))
