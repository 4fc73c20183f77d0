"""app.http.server._OneWriteAnswer: an answer's head goes out with its first body bytes, in one write; interim
answers and later chunks pass at once; a held head is written before a close; and the wrapper keeps no request alive
(no reference cycle with the request's cycle, which holds it as its transport)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from app.http.server import _OneWriteAnswer


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class Cycle:  # what the wrapper reads of uvicorn's RequestResponseCycle
    def __init__(self) -> None:
        self.response_started = False
        self.transport: Any = None


def wrapped() -> tuple[Transport, Cycle, _OneWriteAnswer]:
    transport, cycle = Transport(), Cycle()
    cycle.transport = _OneWriteAnswer(transport, cycle)  # type: ignore[arg-type]
    return transport, cycle, cycle.transport


def test_the_head_goes_out_with_the_body_and_an_interim_answer_at_once() -> None:
    transport, cycle, out = wrapped()
    out.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # before the answer starts
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    cycle.response_started = True
    out.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert len(transport.writes) == 1  # held
    out.write(b"{}")
    out.write(b"")  # h11's end of a body with a length
    out.write(b"more")  # a later chunk
    assert transport.writes[1:] == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", b"", b"more"]
    assert out.is_closing() is False  # the rest is the transport's own


def test_a_held_head_is_written_before_a_close() -> None:
    transport, cycle, out = wrapped()
    cycle.response_started = True
    out.write(b"HTTP/1.1 500 Internal Server Error\r\n\r\n")
    out.close()
    assert transport.writes == [b"HTTP/1.1 500 Internal Server Error\r\n\r\n"] and transport.closed


def test_a_request_s_cycle_is_freed_by_reference_counting() -> None:
    enabled = gc.isenabled()
    gc.disable()
    try:
        _, cycle, out = wrapped()
        gone = weakref.ref(cycle)
        del cycle, out
        assert gone() is None
    finally:
        if enabled:
            gc.enable()
