"""Where a review's work runs: on the event loop when it is small, else on bounded, fair worker pools (issue 18).

Each review is placed by its cost (routes._answer), so that it crosses threads at most once unless it is
both big and needs a decision:

1. **Reading** (decode the JSON, read the AdmissionReview, parse the job, look its decision up in the
   snapshot's memo; a review whose answer is known, a memo hit, a refusal or a skip, is finished and encoded
   right there). A body up to `routes.INLINE_BODY_BYTES` is decoded on the event loop itself, and its job read
   there too when it writes at most `routes.INLINE_REPLICA_TYPES` replica types (reading costs with their
   square: at most ~4 ms of loop time, within the GIL's switch interval, which is how long a reader thread may
   keep the loop waiting anyway); a bigger body, or a job with
   more types, is read on `READER_THREADS` threads of their own (`Workers.read`), first come, first served, so
   that the loop only moves its bytes and big reads never wait behind a slow decision.
2. **Deciding** (`Workers.decide`): a decision to compute runs on `decisionWorkers` threads, under the
   review's deadline (engine.budget: the engine stops itself once the answer was given up). Each
   namespace may hold at most its share of them (half, at least one) and waits beyond that; waiting
   reviews are served round-robin over namespaces, so one user's burst of slow jobs cannot starve
   another namespace. A review that cannot get a worker within its wait (a quarter of the deadline) is
   `Shed`: the caller answers it at once per the namespace's enforcement, with a metric and a log line.

A hand-off costs one wake-up of the loop (`_run`: the worker's result is set from a single
`call_soon_threadsafe`, without `wrap_future`'s second one).

A worker slot is released only when its thread has really finished, so what the pools count is what
runs. `stuck()` reports work running far past any deadline (a loop the engine does not check, a C call
that does not return): /healthz then fails so that Kubernetes restarts the wedged replica.

Memory (`MemoryBudget`): a review's parsed size is estimated from its bytes before it is decoded, and
every review in flight holds its estimate until it is answered: a review alone over `reviewMemoryBytes`
is refused (413), and one that would take all reviews in flight past `READER_THREADS x reviewMemoryBytes`
(two worst-case reviews decoding at once) is refused at once (503), so a flood of large bodies cannot
exhaust the pod. A real review is tens of kilobytes, so thousands fit.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal, TypeVar

T = TypeVar("T")

READER_THREADS = 2
# What decoding costs at its peak, bounded from above (tests/integration/test_adversarial.py holds the bound on
# adversarial shapes: `[{},{},...]`, `[[],...]`, `["a",...]`, many-key objects, long strings, big integers):
# orjson's parser holds a document of its own of about 12-14 bytes per byte of text while it builds the Python
# objects, and those cost up to ~100 bytes per structural byte (`{`, `[`, `,`, `:`): an empty dict is 64 bytes
# plus the 8-byte slot that holds it, for 3 bytes of text.
BYTES_PER_TEXT_BYTE = 16
BYTES_PER_STRUCTURAL_BYTE = 128
ShedReason = Literal["namespace-share", "no-worker"]


class Shed(Exception):
    """No decision worker could take the review in time."""

    def __init__(self, reason: ShedReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def estimated_memory(body: bytes) -> int:
    """An upper bound of what decoding `body` costs at its peak (bytes): a bound per byte of text plus one per
    structural byte.

    The structural bytes are counted in the raw text, strings included, so the count only errs high: 64 KiB at a
    time, each piece copied and its structural bytes dropped in one C pass (`bytes.translate`), so that at most
    64 KiB is copied at once. About 0.7 ms per MiB on the dev VM, a quarter of four `count` scans; nothing is
    decoded.
    """
    view = memoryview(body)
    structural = 0
    for start in range(0, len(body), _PIECE_BYTES):
        piece = view[start:start + _PIECE_BYTES].tobytes()
        structural += len(piece) - len(piece.translate(None, _STRUCTURAL))
    return BYTES_PER_TEXT_BYTE * len(body) + BYTES_PER_STRUCTURAL_BYTE * structural


_STRUCTURAL = b"{[,:"
_PIECE_BYTES = 64 * 1024


class MemoryBudget:
    """The estimated memory of the reviews in flight, against a total (thread-safe)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        with self._lock:
            if self.used + size > self.total and self.used > 0:
                return False
            self.used += size
            return True

    def give(self, size: int) -> None:
        with self._lock:
            self.used -= size


@dataclass
class _Waiter:
    future: asyncio.Future[None]
    namespace: str


class Workers:
    """The reader pool and the fair decision pool of one app (used from its event loop)."""

    def __init__(self, decision_threads: int, *, wait_seconds: float, stuck_after_seconds: float,
                 memory: MemoryBudget, clock: Callable[[], float] = time.monotonic) -> None:
        self.decision_threads = decision_threads
        self.per_namespace = max(1, decision_threads // 2)
        self.wait_seconds = wait_seconds
        self.stuck_after_seconds = stuck_after_seconds
        self.memory = memory
        self._clock = clock
        self._readers = ThreadPoolExecutor(READER_THREADS, thread_name_prefix="read")
        self._deciders = ThreadPoolExecutor(decision_threads, thread_name_prefix="decide")
        self._free = decision_threads
        self._busy: collections.Counter[str] = collections.Counter()
        self._waiting: dict[str, collections.deque[_Waiter]] = {}  # namespace -> waiters, in arrival order
        self._running: dict[object, float] = {}  # token -> start (clock), every task on either pool

    # --- running ---------------------------------------------------------------------------------------

    async def read(self, work: Callable[[], T]) -> T:
        """`work()` on a reader thread."""
        return await self._run(self._readers, work)

    async def decide(self, namespace: str, work: Callable[[], T]) -> T:
        """`work()` on a decision worker, once one is free for `namespace`.

        Raises:
            Shed: the namespace holds its share already, or no worker was free within `wait_seconds`.
        """
        await self._acquire(namespace)
        return await self._run(self._deciders, work, on_done=lambda: self._release(namespace))

    async def _run(self, pool: ThreadPoolExecutor, work: Callable[[], T],
                   on_done: Callable[[], None] | None = None) -> T:
        loop = asyncio.get_running_loop()
        token = object()
        self._running[token] = self._clock()
        answer: asyncio.Future[T] = loop.create_future()

        def settle(done: Future[T]) -> None:  # on the loop: one wake-up per task (no wrap_future chain)
            self._running.pop(token, None)
            if on_done is not None:
                on_done()
            if answer.done():  # the caller gave up (its deadline): nobody reads this
                return
            if done.cancelled():
                answer.cancel()
            elif (error := done.exception()) is not None:
                answer.set_exception(error)
            else:
                answer.set_result(done.result())

        # On the worker thread when it finishes (or here, if cancelled before it ran). Awaiting `answer` may be
        # cancelled (the review's deadline); the thread runs on to its next deadline check, and the slot is
        # given back only then.
        pool.submit(work).add_done_callback(lambda done: loop.call_soon_threadsafe(settle, done))
        try:
            return await answer
        except BaseException:
            # The error's traceback holds this frame, the frame holds `answer`, and `answer` holds the error: a cycle
            # that only the garbage collector frees, and with it whatever the frames below kept (a refused body of
            # megabytes). A settled stand-in breaks it; `settle`, when it runs later, finds it done and returns.
            answer = loop.create_future()
            answer.cancel()
            raise

    # --- the decision slots ----------------------------------------------------------------------------

    async def _acquire(self, namespace: str) -> None:
        waiter = _Waiter(asyncio.get_running_loop().create_future(), namespace)
        self._waiting.setdefault(namespace, collections.deque()).append(waiter)
        self._grant()
        if waiter.future.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout=self.wait_seconds)
        except TimeoutError:
            if waiter.future.done():  # granted just as the wait ran out: keep it
                return
            self._forget(waiter)
            if self._busy[namespace] >= self.per_namespace:
                raise Shed("namespace-share", (
                    f"namespace {namespace or '(none)'} held its share of the decision workers "
                    f"({self.per_namespace} of {self.decision_threads}) for {self.wait_seconds:g}s"
                )) from None
            raise Shed("no-worker", (
                f"no decision worker was free within {self.wait_seconds:g}s (all {self.decision_threads} busy)"
            )) from None
        except asyncio.CancelledError:
            if waiter.future.done():
                self._release(namespace)  # granted, but nobody will use it
            else:
                self._forget(waiter)
            raise

    def _take(self, namespace: str) -> None:
        self._free -= 1
        self._busy[namespace] += 1

    def _release(self, namespace: str) -> None:
        self._free += 1
        self._busy[namespace] -= 1
        if self._busy[namespace] <= 0:
            del self._busy[namespace]
        self._grant()

    def _forget(self, waiter: _Waiter) -> None:
        queue = self._waiting.get(waiter.namespace)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(waiter)
            if not queue:
                del self._waiting[waiter.namespace]

    def _grant(self) -> None:
        """Hand free slots to waiters, one namespace at a time in turn, each within its share."""
        granted = True
        while self._free > 0 and granted:
            granted = False
            for namespace in list(self._waiting):
                if self._free <= 0:
                    return
                if self._busy[namespace] >= self.per_namespace:
                    continue  # it waits for one of its own to finish
                queue = self._waiting.pop(namespace)  # put back at the end: round-robin
                waiter = queue.popleft()
                if queue:
                    self._waiting[namespace] = queue
                self._take(namespace)
                waiter.future.set_result(None)
                granted = True

    # --- health ----------------------------------------------------------------------------------------

    def stuck(self) -> int:
        """How many tasks have been running longer than `stuck_after_seconds`."""
        now = self._clock()
        return sum(1 for started in self._running.values() if now - started > self.stuck_after_seconds)

    def in_progress(self) -> int:
        return len(self._running)

    def shutdown(self) -> None:
        self._readers.shutdown(wait=False, cancel_futures=True)
        self._deciders.shutdown(wait=False, cancel_futures=True)
