"""Deadlines for reading request bodies, kept by one ticking task instead of a timer per request.

A client that sends the headers and then stalls mid-body must get HTTP 408, not hold its request (and
connection) open until the apiserver gives up. `asyncio.timeout` around each body read does that with
a timer per request (a TimerHandle pushed on and cancelled out of the loop's heap, about 5 µs per
review on the dev VM; issue 4). Bodies almost always arrive with the headers, so `BodyDeadlines`
watches the reading tasks in a dict and one task wakes every `tick` seconds to cancel those past their
deadline: a review pays for two dict operations. The price is precision: a stalled read is cut between
`seconds` and `seconds + tick` after it began.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

# A stalled read is cut at most this much after its deadline (and after a quarter of a short deadline).
MAX_TICK_SECONDS = 0.25


class BodyDeadlineExceeded(Exception):
    """The body did not arrive within the deadline."""


class BodyDeadlines:
    """Cancels body reads that take longer than `seconds` (one instance per app, used on its event loop)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.tick = min(MAX_TICK_SECONDS, seconds / 4)
        self._watched: dict[asyncio.Task[object], float] = {}  # reading task -> loop time of its deadline
        self._expired: set[asyncio.Task[object]] = set()
        self._ticker: asyncio.Task[None] | None = None

    async def read(self, reading: Awaitable[bytes]) -> bytes:
        """`await reading` in the current task, cut with BodyDeadlineExceeded past the deadline."""
        task = asyncio.current_task()
        assert task is not None  # NB: called from a request handler, always inside a task
        loop = asyncio.get_running_loop()
        self._watched[task] = loop.time() + self.seconds
        if self._ticker is None:
            self._ticker = loop.create_task(self._tick(), name="topoguard-body-deadlines")
        try:
            return await reading
        except asyncio.CancelledError:
            if task not in self._expired:
                raise  # someone else's cancellation (e.g. shutdown): not ours to turn into a 408
            self._expired.discard(task)
            task.uncancel()
            raise BodyDeadlineExceeded from None
        finally:
            self._watched.pop(task, None)
            self._expired.discard(task)

    async def _tick(self) -> None:
        """Wake every `tick` while some read is watched; cancel the reads past their deadline."""
        loop = asyncio.get_running_loop()
        try:
            while self._watched:
                await asyncio.sleep(self.tick)
                now = loop.time()
                for task, deadline in list(self._watched.items()):
                    if deadline <= now and task not in self._expired:
                        self._expired.add(task)
                        task.cancel()
        finally:
            self._ticker = None
