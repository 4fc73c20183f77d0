"""The time a decision may take: a deadline its caller sets and its loops check (issue 18).

A review whose answer was already given up (the server answered 504 at `requestDeadlineSeconds`)
must not keep a decision worker busy: Python cannot stop a thread, so the engine stops itself. The
caller runs the decision `within(deadline)`, and the engine's loops call `check()` (every verdict, every
zone): past the deadline it raises `DeadlineExceeded`, the decision is dropped unfinished and never
memoized, and the worker is free for the next review within one verdict's time.

The engine reads no clock of its own: `Deadline` carries the clock it was given, and without one set
(`topoguard explain`, `review`, the tests) `check()` does nothing. The deadline travels in a context
variable rather than through every signature, so it reaches the policy loops without each layer
passing it on; a worker thread sets it for exactly one decision.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass


class DeadlineExceeded(Exception):
    """The decision's deadline passed: the answer was given up, so the work stops."""


@dataclass(frozen=True, slots=True)
class Deadline:
    """`at` on the clock `clock` (seconds, e.g. time.monotonic)."""

    at: float
    clock: Callable[[], float]

    def check(self) -> None:
        if self.clock() >= self.at:
            raise DeadlineExceeded(f"the decision deadline passed {self.clock() - self.at:.3f}s ago")


_CURRENT: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("topoguard_deadline", default=None)


@contextlib.contextmanager
def within(deadline: Deadline | None) -> Iterator[None]:
    """Run the block's decisions under `deadline` (None: no deadline)."""
    token = _CURRENT.set(deadline)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def check() -> None:
    """Raise DeadlineExceeded when the current decision's deadline has passed (no deadline: nothing)."""
    deadline = _CURRENT.get()
    if deadline is not None:
        deadline.check()
