"""The review worker pools (app/http/workers.py): fair shares, round-robin, shedding, slots held until the
thread is really done, the stuck watchdog, and the memory budget. Driven with events, not sleeps or timings."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Callable

import pytest

from app.http.workers import (
    BYTES_PER_STRUCTURAL_BYTE,
    BYTES_PER_TEXT_BYTE,
    MemoryBudget,
    Shed,
    Workers,
    estimated_memory,
)


def make(threads: int = 4, *, wait: float = 5.0, clock: Callable[[], float] | None = None) -> Workers:
    kwargs = {"clock": clock} if clock is not None else {}
    return Workers(threads, wait_seconds=wait, stuck_after_seconds=10.0, memory=MemoryBudget(1 << 20), **kwargs)


def blocker(started: list[str], gate: threading.Event, name: str) -> Callable[[], str]:
    def work() -> str:
        started.append(name)
        gate.wait(timeout=30)
        return name
    return work


async def until(predicate: Callable[[], bool]) -> None:
    for _ in range(2_000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never held")


def test_a_namespace_holds_at_most_half_of_the_workers_and_the_rest_serve_others() -> None:
    async def scenario() -> None:
        workers = make(4)
        gate = threading.Event()
        started: list[str] = []
        busy = [asyncio.create_task(workers.decide("noisy", blocker(started, gate, f"noisy-{i}"))) for i in range(5)]
        await until(lambda: len(started) == 2)
        assert sorted(started) == ["noisy-0", "noisy-1"]  # its share: two of four
        other = await workers.decide("quiet", lambda: "quiet")  # a free worker, at once
        assert other == "quiet" and len(started) == 2
        gate.set()
        assert sorted(await asyncio.gather(*busy)) == [f"noisy-{i}" for i in range(5)]  # the rest waited, not shed
        workers.shutdown()

    asyncio.run(scenario())


def test_waiting_reviews_are_served_round_robin_over_namespaces() -> None:
    async def scenario() -> None:
        workers = make(2)  # share: one worker per namespace
        gates = {name: threading.Event() for name in ("a0", "b0")}
        order: list[str] = []

        def work(name: str) -> Callable[[], str]:
            def run() -> str:
                order.append(name)
                if name in gates:
                    gates[name].wait(timeout=30)
                return name
            return run

        first = [asyncio.create_task(workers.decide(ns, work(f"{ns}0"))) for ns in ("a", "b")]
        await until(lambda: len(order) == 2)
        queued = [asyncio.create_task(workers.decide("a", work(f"a{i}"))) for i in (1, 2, 3)]
        queued.append(asyncio.create_task(workers.decide("c", work("c1"))))
        await asyncio.sleep(0.05)
        gates["a0"].set()  # a's slot frees: the next namespace in line that is under its share goes first
        await until(lambda: len(order) >= 3)
        assert order[2] in ("a1", "c1")
        gates["b0"].set()
        await asyncio.gather(*first, *queued)
        later = order[2:]
        assert later.index("c1") <= 1, f"c waited behind a's whole queue: {later}"
        workers.shutdown()

    asyncio.run(scenario())


def test_a_review_that_gets_no_worker_in_time_is_shed_with_the_reason() -> None:
    async def scenario() -> None:
        workers = make(2, wait=0.05)
        gate = threading.Event()
        started: list[str] = []
        busy = [asyncio.create_task(workers.decide(ns, blocker(started, gate, ns))) for ns in ("a", "b")]
        await until(lambda: len(started) == 2)
        with pytest.raises(Shed) as full:
            await workers.decide("c", lambda: "c")
        assert full.value.reason == "no-worker"
        with pytest.raises(Shed) as share:
            await workers.decide("a", lambda: "a")
        assert share.value.reason == "namespace-share"
        gate.set()
        await asyncio.gather(*busy)
        assert await workers.decide("c", lambda: "c") == "c"  # nothing was lost: the slots came back
        workers.shutdown()

    asyncio.run(scenario())


def test_a_slot_comes_back_only_when_its_thread_is_done_not_when_the_review_gave_up() -> None:
    async def scenario() -> None:
        workers = make(1)
        gate = threading.Event()
        started: list[str] = []
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(workers.decide("a", blocker(started, gate, "slow")), timeout=0.05)
        assert started == ["slow"] and workers.in_progress() == 1
        waiting = asyncio.create_task(workers.decide("b", lambda: "next"))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the thread still runs: its slot is not free
        gate.set()
        assert await waiting == "next"
        assert workers.in_progress() == 0
        workers.shutdown()

    asyncio.run(scenario())


def test_work_running_past_the_stuck_threshold_is_reported() -> None:
    now = [0.0]

    async def scenario() -> None:
        workers = make(2, clock=lambda: now[0])
        gate = threading.Event()
        started: list[str] = []
        task = asyncio.create_task(workers.decide("a", blocker(started, gate, "wedged")))
        await until(lambda: started == ["wedged"])
        assert workers.stuck() == 0
        now[0] = 11.0
        assert workers.stuck() == 1
        gate.set()
        await task
        await until(lambda: workers.in_progress() == 0)
        assert workers.stuck() == 0
        workers.shutdown()

    asyncio.run(scenario())


def test_the_memory_budget_refuses_what_would_pass_it_but_never_the_first_review() -> None:
    budget = MemoryBudget(100)
    assert budget.take(60) and not budget.take(50) and budget.take(40)
    budget.give(100)
    assert budget.take(500)  # alone, even past the total: the per-review limit (413) is what bounds one review
    assert not budget.take(1)


@pytest.mark.parametrize("size", [0, 1, 5_000, 64 * 1024 - 1, 64 * 1024, 64 * 1024 + 1, 3 * 64 * 1024 + 17])
def test_the_estimate_counts_every_structural_byte_across_the_pieces_it_reads(size: int) -> None:
    body = (b'{"a":[1,2],"b":"x:y"}' * (size // 21 + 1))[:size]
    structural = sum(body.count(c) for c in (b"{", b"[", b",", b":"))
    assert estimated_memory(body) == BYTES_PER_TEXT_BYTE * size + BYTES_PER_STRUCTURAL_BYTE * structural


def test_a_failed_task_is_freed_by_reference_counting_with_what_its_frames_held() -> None:
    """A review refused on a reader thread (a 413 for a decoded bomb) must not leave its body in a reference cycle
    (error -> traceback -> frame -> future -> error) that only the collector frees: with the collector off, the
    body goes as soon as the caller lets go of the error."""

    class Body:  # stands for the request's bytes, which cannot carry a weak reference
        pass

    async def scenario(kept: list[weakref.ref[Body]]) -> None:
        workers = make(2)

        def refuse() -> None:
            body = Body()
            kept.append(weakref.ref(body))
            raise ValueError("refused")

        with pytest.raises(ValueError, match="refused"):
            await workers.read(refuse)
        with pytest.raises(ValueError, match="refused"):
            await workers.decide("ns", refuse)
        workers.shutdown()

    kept: list[weakref.ref[Body]] = []
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        asyncio.run(scenario(kept))
        assert len(kept) == 2
        assert [ref() for ref in kept] == [None, None]
    finally:
        if enabled:
            gc.enable()
