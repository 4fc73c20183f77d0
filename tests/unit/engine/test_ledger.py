"""The reservation ledger: stored, pinned jobs hold demand minus bound pods; in-flight holds on top."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import engine
from app.cache import projections
from app.config import Settings
from app.engine import ledger
from app.models.cluster import IdentityMemo, JobInfo, PodInfo, Snapshot
from app.models.pods import PodIndexBuilder
from tests.builders import (
    GPU,
    in_flight_totals,
    make_group,
    make_namespace,
    make_node,
    make_placement,
    make_pod,
    make_replica,
    make_snapshot,
    tolerate,
)

NS = "research"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}


def pytorchjob(
    name: str,
    *,
    zone: str | None = "zone-a",
    workers: int = 2,
    gpus: int = 4,
    suspend: bool | None = None,
    conditions: list[dict[str, str]] | None = None,
    labels: dict[str, str] | None = None,
) -> JobInfo:
    """A stored PyTorchJob (Master + Workers, `gpus` each), projected as the cache projects it."""
    template = {"spec": {"containers": [{"name": "pytorch", "resources": {"limits": {GPU: gpus}}}]}}
    spec: dict[str, Any] = {"pytorchReplicaSpecs": {
        "Master": {"replicas": 1, "template": template}, "Worker": {"replicas": workers, "template": template}}}
    if suspend is not None:
        spec["runPolicy"] = {"suspend": suspend}
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": labels or {},
                            "creationTimestamp": "2026-12-01T10:00:00Z"}
    if zone:
        meta["annotations"] = {"topoguard.io/zone": zone}
    raw = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta, "spec": spec,
           "status": {"conditions": conditions or []}}
    job = projections.project_job(raw)
    assert job is not None
    return job


def job_pod(job: str, index: int, *, node: str = "a100-a-1", gpus: int = 4, operator: str = "pytorchjob-controller",
            phase: str = "Running") -> PodInfo:
    labels = {"training.kubeflow.org/job-name": job, "training.kubeflow.org/operator-name": operator}
    return make_pod(f"{job}-worker-{index}", namespace=NS, node=node, gpus=gpus, labels=labels, phase=phase)


def reserved(jobs: list[JobInfo], pods: list[PodInfo] = ()) -> dict[str, int]:  # type: ignore[assignment]
    snapshot = make_snapshot(pods=pods, jobs=jobs)
    built = ledger.build_ledger(snapshot, gpu_resources=(GPU,))
    return {h.job: h.total for h in built.holds}


@pytest.mark.parametrize(
    "jobs, pods, want",
    [
        pytest.param([pytorchjob("pending")], [], {"PyTorchJob research/pending": 12},
                     id="a pinned job none of whose pods is bound reserves its whole demand"),
        pytest.param([pytorchjob("partly")], [job_pod("partly", 0), job_pod("partly", 1, node="a100-a-2")],
                     {"PyTorchJob research/partly": 4}, id="partly bound: demand minus the bound pods' GPUs"),
        pytest.param([pytorchjob("running")], [job_pod("running", i) for i in range(3)], {},
                     id="every pod bound: the pods hold the GPUs, the job reserves nothing"),
        pytest.param([pytorchjob("done", conditions=[{"type": "Succeeded", "status": "True"}])], [], {},
                     id="a finished job reserves nothing"),
        pytest.param([pytorchjob("failed", conditions=[{"type": "Failed", "status": "True"}])], [], {},
                     id="a failed job reserves nothing"),
        pytest.param([pytorchjob("queued", suspend=True)], [], {}, id="a suspended job reserves nothing"),
        pytest.param([pytorchjob("kueue", labels={"kueue.x-k8s.io/queue-name": "team"})], [], {},
                     id="a job waiting in a Kueue queue (label, no suspend: false yet) reserves nothing"),
        pytest.param([pytorchjob("admitted", suspend=False, labels={"kueue.x-k8s.io/queue-name": "team"})], [],
                     {"PyTorchJob research/admitted": 12}, id="a job Kueue has admitted (suspend: false) reserves"),
        pytest.param([pytorchjob("free", zone=None)], [], {}, id="a job topoguard did not pin reserves nothing"),
        pytest.param([], [job_pod("deleted", 0)], {},
                     id="a job deleted before its pods appear reserves nothing (its pods still count as bound)"),
        pytest.param([pytorchjob("mine")], [job_pod("mine", 0, operator="tfjob-controller")],
                     {"PyTorchJob research/mine": 12}, id="a TFJob's pods of the same name are not the PyTorchJob's"),
        pytest.param([pytorchjob("owned")], [dataclasses.replace(make_pod("owned-worker-0", namespace=NS,
                     node="a100-a-1", gpus=4), owner=("PyTorchJob", "owned"))],
                     {"PyTorchJob research/owned": 8}, id="a pod the job controls is its pod, labels or not"),
        pytest.param([pytorchjob("ended")], [job_pod("ended", 0, phase="Succeeded")],
                     {"PyTorchJob research/ended": 12}, id="a terminal pod holds nothing"),
    ],
)
def test_ledger(jobs: list[JobInfo], pods: list[PodInfo], want: dict[str, int]) -> None:
    assert reserved(jobs, pods) == want


def three_zones(jobs: list[JobInfo] = ()) -> Any:  # type: ignore[assignment]
    nodes = [
        make_node("a100-a-1", zone="zone-a", gpus=8, taints=[GPU_TAINT]),
        make_node("a100-a-2", zone="zone-a", gpus=8, taints=[GPU_TAINT]),
        make_node("a100-c-1", zone="zone-c", gpus=8, taints=[GPU_TAINT]),
    ]
    return make_snapshot(nodes, namespaces=[make_namespace(NS)], jobs=jobs)


def newcomer(name: str = "newcomer", workers: int = 1, gpus: int = 4) -> Any:
    worker = make_replica("Worker", count=workers, gpus=gpus, placement=make_placement(tolerations=[tolerate()]),
                          job=name)
    master = make_replica("Master", coordinator=True, gpus=gpus, placement=make_placement(tolerations=[tolerate()]),
                          job=name)
    return make_group(master, worker, name=name, namespace=NS)


def test_an_admitted_job_sends_the_next_one_to_the_zone_where_it_fits_now() -> None:
    snapshot = three_zones([pytorchjob("admitted")])  # 12 GPUs reserved in zone-a (16 free on its nodes)

    decision = engine.decide(newcomer(), snapshot, Settings())

    assert (decision.zone, decision.capacity) == ("zone-c", "now")
    assert {z.zone: (z.gpus_free, z.gpus_reserved) for z in decision.zones} == {"zone-a": (16, 12), "zone-c": (8, 0)}


def test_a_job_does_not_count_its_own_reservation() -> None:
    # The stored job reviewed again (an UPDATE): without its own 12 GPUs, zone-a has room for it.
    snapshot = three_zones([pytorchjob("newcomer", workers=1)])

    decision = engine.decide(newcomer(), snapshot, Settings())

    assert (decision.zone, decision.capacity) == ("zone-a", "now")
    assert {z.zone: z.gpus_reserved for z in decision.zones} == {"zone-a": 0, "zone-c": 0}


def in_flight(name: str, zone: str, gpus: int) -> ledger.Hold:
    return ledger.Hold(f"PyTorchJob {NS}/{name}", ("PyTorchJob", NS, name), zone, {GPU: gpus}, in_flight=True)


@pytest.mark.parametrize(
    "holds, stored, want_zone, want_reserved",
    [
        pytest.param([], [], "zone-a", {"zone-a": 0, "zone-c": 0}, id="nothing held: most free"),
        pytest.param([in_flight("burst-1", "zone-a", 12)], [], "zone-c", {"zone-a": 12, "zone-c": 0},
                     id="an in-flight hold counts like a stored reservation"),
        pytest.param([in_flight("burst-1", "zone-a", 12)], [pytorchjob("burst-1")], "zone-c",
                     {"zone-a": 12, "zone-c": 0}, id="once the job is stored, its stored reservation counts, once"),
        pytest.param([in_flight("newcomer", "zone-a", 12)], [], "zone-a", {"zone-a": 0, "zone-c": 0},
                     id="a re-review (reinvocation) does not count the job's own in-flight hold"),
    ],
)
def test_in_flight_holds(
    holds: list[ledger.Hold], stored: list[JobInfo], want_zone: str, want_reserved: dict[str, int]
) -> None:
    snapshot = three_zones(stored)
    totals = in_flight_totals(holds, job=engine.job_key(newcomer()), stored=ledger.stored_jobs(snapshot))
    decision = engine.pending("decide", newcomer(), snapshot, Settings(), in_flight=totals).result()

    assert decision.zone == want_zone
    assert {z.zone: z.gpus_reserved for z in decision.zones} == want_reserved


def test_the_memo_never_serves_a_decision_made_with_other_holds() -> None:
    snapshot = three_zones()
    group = newcomer()
    before = engine.pending("decide", group, snapshot, Settings()).result()
    totals = in_flight_totals([in_flight("burst-1", "zone-a", 12)], job=engine.job_key(group))
    held = engine.pending("decide", group, snapshot, Settings(), in_flight=totals)
    after = engine.pending("decide", group, snapshot, Settings())

    assert held.known is None
    assert (before.zone, held.result().zone) == ("zone-a", "zone-c")
    assert after.known is before  # the same holds (none) share the entry again


@settings(max_examples=40, deadline=None)
@given(
    burst=st.lists(st.tuples(st.sampled_from(["zone-a", "zone-c"]), st.integers(0, 24)), min_size=1, max_size=8),
    workers=st.integers(0, 4),
    strategy=st.sampled_from(["most-free", "binpack"]),
    policy=st.sampled_from(["wait", "refuse"]),
    suspended=st.booleans(),
)
def test_a_shape_decided_again_under_other_holds_is_decided_as_if_for_the_first_time(
    burst: list[tuple[str, int]], workers: int, strategy: str, policy: str, suspended: bool
) -> None:
    # One snapshot keeps what a job's shape shares (verdicts, fits, each zone's row but its reservations); a
    # fresh snapshot per review shares nothing. Under every growing set of holds the two decide alike.
    settings_ = Settings(zone_strategy=strategy, capacity_policy=policy)
    shared = three_zones()
    group = newcomer(workers=workers)
    holds: list[ledger.Hold] = []
    for i, (zone, gpus) in enumerate(burst):
        holds.append(in_flight(f"burst-{i}", zone, gpus))
        totals = in_flight_totals(holds, job=engine.job_key(group))
        again = engine.pending("decide", group, shared, settings_, suspended=suspended, in_flight=totals).result()
        first = engine.pending("decide", group, three_zones(), settings_, suspended=suspended,
                               in_flight=totals).result()
        assert again == first


def test_a_shape_decided_once_is_cheap_to_decide_again_under_new_holds() -> None:
    snapshot = three_zones()
    group = newcomer()
    first = engine.pending("decide", group, snapshot, Settings())
    assert (first.known, first.cheap) == (None, False)  # nothing of its shape is known yet
    first.result()

    totals = in_flight_totals([in_flight("burst-1", "zone-a", 12)], job=engine.job_key(group))
    held = engine.pending("decide", group, snapshot, Settings(), in_flight=totals)
    assert held.known is None and held.cheap  # only the reservations are new
    assert not engine.pending("decide", group, snapshot, Settings(), suspended=True, in_flight=totals).cheap
    assert not engine.pending("validate", group, snapshot, Settings(), in_flight=totals).cheap
    assert not engine.pending("decide", group, three_zones(), Settings(), in_flight=totals).cheap  # another snapshot


def test_reserved_for_costs_the_zones_not_the_jobs() -> None:
    # 5,000 stored jobs all pinned to zone-a: the per-decision view is the ledger's per-zone totals.
    jobs = [pytorchjob(f"job-{i}", workers=0, gpus=1) for i in range(5000)]
    snapshot = three_zones(jobs)
    view = ledger.reserved_for(snapshot, gpu_resources=(GPU,), job=("PyTorchJob", NS, "other"))
    built = ledger.ledger_of(snapshot, gpu_resources=(GPU,))

    assert view.by_zone is built.by_zone  # shared, not copied per review
    assert view.in_zone("zone-a", (GPU,)) == 5000


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "bind", "rezone", "same"]), st.integers(0, 2),
                          st.integers(0, 3)), min_size=1, max_size=15))
def test_after_pod_and_job_changes_the_ledger_is_the_one_built_from_scratch(
    monkeypatch: pytest.MonkeyPatch, steps: list[tuple[str, int, int]]
) -> None:
    """Each snapshot's ledger starts from the previous one (`_LAST`) and holds are kept by the identity of the
    job and its pod groups (`_HOLDS`), as the watch cache makes them (the pod index kept one pod at a time,
    the jobs' tuple the same while no job changes); it must be the one built with nothing kept."""
    jobs = tuple(pytorchjob(f"j{k}", workers=3, zone=("zone-a", "zone-b", None)[k]) for k in range(3))
    builder = PodIndexBuilder()
    pods: dict[str, PodInfo] = {}
    for what, k, i in steps:
        name = f"j{k}-worker-{i}"
        if what == "rezone":  # a job changed: a new tuple of jobs
            jobs = (*jobs[:k], pytorchjob(f"j{k}", workers=3, zone=("zone-c", None, "zone-a")[i % 3]), *jobs[k + 1:])
        elif name in pods and what in ("remove", "bind"):
            builder.remove(pods.pop(name))
        if what in ("add", "bind"):
            pod = job_pod(f"j{k}", i, node="" if what == "add" else "a100-a-1")  # pending pods hold nothing yet
            if name in pods:
                builder.remove(pods.pop(name))
            pods[name] = pod
            builder.add(pod)
        snapshot = Snapshot(jobs=jobs, pod_index=builder.freeze())
        kept = ledger.build_ledger(snapshot, gpu_resources=(GPU,))
        with monkeypatch.context() as m:
            for memo in ("_HOLDS", "_MATCHED", "_LAST", "_BY_GROUP"):
                m.setattr(ledger, memo, IdentityMemo(16))
            fresh = ledger.build_ledger(snapshot, gpu_resources=(GPU,))
        assert (kept.holds, dict(kept.by_zone), dict(kept.by_job)) == (
            fresh.holds, dict(fresh.by_zone), dict(fresh.by_job))
        assert list(kept.by_zone) == sorted(kept.by_zone)


def test_a_pod_change_holds_again_only_the_job_it_belongs_to(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = tuple(pytorchjob(f"j{k}", workers=3) for k in range(50))
    builder = PodIndexBuilder.of(job_pod(f"j{k}", 0) for k in range(50))
    ledger.build_ledger(Snapshot(jobs=jobs, pod_index=builder.freeze()), gpu_resources=(GPU,))
    held: list[str] = []
    real = ledger._hold
    monkeypatch.setattr(ledger, "_hold", lambda job, *rest: held.append(job.name) or real(job, *rest))
    builder.add(job_pod("j7", 1))
    after = ledger.build_ledger(Snapshot(jobs=jobs, pod_index=builder.freeze()), gpu_resources=(GPU,))

    assert held == ["j7"]
    assert after.by_job[("PyTorchJob", NS, "j7")].total == 4 * 4 - 2 * 4  # Master + 3 Workers, 2 pods bound
    assert after.by_zone == {"zone-a": {GPU: 49 * 12 + 8}}
