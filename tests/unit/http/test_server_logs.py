"""The server's throttled warnings: accept errors at the fd limit are one line per interval with a count."""

from __future__ import annotations

import asyncio
import errno
import logging

import pytest

from app.http.server import ConnectionGuard, ThrottledLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, int]]:
    return [(r.getMessage(), r.__dict__["count"], r.__dict__["total"]) for r in caplog.records
            if r.name == "app.http.server"]


def test_a_burst_is_one_line_then_one_line_per_interval_with_the_count(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="app.http.server")
    clock = Clock()
    throttled = ThrottledLog("accept fails", interval=10.0, clock=clock)
    for _ in range(2048):  # what one readiness of the listener produces at EMFILE (CPython 3.11)
        throttled.record(errno="EMFILE")
    assert lines(caplog) == [("accept fails", 1, 1)]
    clock.now += 10.0
    throttled.record(errno="EMFILE")
    assert lines(caplog) == [("accept fails", 1, 1), ("accept fails", 2048, 2049)]
    throttled.flush()  # nothing pending: no line
    assert len(lines(caplog)) == 2


def test_a_pending_count_is_flushed_by_a_timer_when_errors_stop(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="app.http.server")

    async def main() -> None:
        throttled = ThrottledLog("accept fails", interval=0.05)
        loop = asyncio.get_running_loop()
        for _ in range(5):
            throttled.record(loop)
        await asyncio.sleep(0.2)

    asyncio.run(main())
    assert lines(caplog) == [("accept fails", 1, 1), ("accept fails", 4, 5)]


def test_the_loop_handler_counts_resource_errors_and_passes_everything_else_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    guard = ConnectionGuard(header_timeout_seconds=1.0, max_connections=10)
    loop = asyncio.new_event_loop()
    try:
        for code in (errno.EMFILE, errno.ENFILE, errno.EMFILE):
            guard.handle_loop_exception(loop, {"message": "socket.accept() out of system resource",
                                               "exception": OSError(code, "Too many open files")})
        guard.handle_loop_exception(loop, {
            "message": "Exception in callback BaseSelectorEventLoop._start_serving(<function>, <socket>)",
            "exception": ValueError("Invalid file descriptor: -1")})
        guard.handle_loop_exception(loop, {"message": "something else", "exception": RuntimeError("boom")})
    finally:
        loop.close()
    assert guard.accept_errors.total == 4
    ours = [r for r in caplog.records if r.name == "app.http.server"]
    assert [(r.__dict__["errno"], r.__dict__["count"]) for r in ours] == [("EMFILE", 1)]
    others = [r for r in caplog.records if r.name == "asyncio"]
    assert [r.getMessage() for r in others] == ["something else"]
