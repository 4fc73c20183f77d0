"""app.logs: the JSON line of every record and of each review, as cheap as issue 4 asks, unchanged in content.

The reference below is the formatter as it was before (datetime per record, every attribute checked):
the line must stay the same JSON, key for key and in the same order.
"""

from __future__ import annotations

import datetime
import io
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app import logs

STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


def reference_line(record: logging.LogRecord) -> str:
    """The line JsonFormatter wrote before issue 4."""
    out: dict[str, Any] = {
        "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in record.__dict__.items():
        if key not in STANDARD and not key.startswith("_"):
            out[key] = value
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return orjson.dumps(out, default=str).decode()


def _iso(created: float) -> str:
    return datetime.datetime.fromtimestamp(created, datetime.UTC).isoformat(timespec="milliseconds")


@settings(max_examples=2000, deadline=None)
@given(created=st.floats(min_value=0, max_value=2**34, allow_nan=False))
def test_the_time_is_datetimes_text(created: float) -> None:
    assert logs.JsonFormatter().format_created(created) == _iso(created)


@pytest.mark.parametrize(
    "created",
    [
        pytest.param(1_767_225_599.9999996, id="rounds up into the next second, and the next year"),
        pytest.param(1_767_225_599.9994999, id="truncates to the millisecond"),
        pytest.param(1_700_000_000.0005, id="half a millisecond"),
        pytest.param(1_700_000_000.123, id="a fraction binary floats cannot hold exactly"),
        pytest.param(0.0, id="the epoch"),
        pytest.param(951_782_400.5, id="29 February 2000"),
    ],
)
def test_the_time_at_the_edges(created: float) -> None:
    assert logs.JsonFormatter().format_created(created) == _iso(created)


def test_the_cached_second_follows_the_clock_both_ways() -> None:
    formatter = logs.JsonFormatter()
    for created in (1_700_000_000.25, 1_700_000_000.75, 1_700_000_001.5, 1_700_000_000.5, 1_699_999_999.999):
        assert formatter.format_created(created) == _iso(created)


def _record(*, args: Any = (), exc: bool = False, **extra: Any) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.getLogger("topoguard.test").makeRecord(
        "topoguard.test", logging.WARNING, __file__, 1, "answer %s for %s" if args else "plain", args, exc_info,
        extra=extra,
    )


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(_record(), id="no extras"),
        pytest.param(_record(uid="u-1", kind="PyTorchJob", object="ml/train", zone="", duration_ms=1.25),
                     id="the review's extras in the order passed"),
        pytest.param(_record(args=("u-1", "ml/train"), status=400, _private="hidden"), id="args, a private extra"),
        pytest.param(_record(exc=True, error="boom"), id="an exception as one string"),
        pytest.param(_record(when=datetime.date(2026, 1, 31), ids={1, 2}), id="extras JSON lacks, as str"),
        pytest.param(_record(detail="line one\nline two"), id="a newline stays inside the one line"),
    ],
)
def test_the_line_is_the_same_json(record: logging.LogRecord) -> None:
    line = logs.JsonFormatter().format(record)
    assert line == reference_line(record)
    assert "\n" not in line
    assert list(json.loads(line))[:4] == ["time", "level", "logger", "msg"]


@pytest.fixture
def review_lines() -> Any:
    """The review logger writing through a JsonFormatter into a buffer, at info."""
    logger = logging.getLogger(logs.REVIEW_LOGGER)
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logs.JsonFormatter())
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield lambda: [json.loads(line) for line in buffer.getvalue().splitlines()]
    logger.removeHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate


def test_a_review_is_one_line_with_these_keys(review_lines: Any) -> None:
    logs.log_review(uid="u-1", kind="PyTorchJob", namespace="ml", name="train", operation="mutate",
                    outcome="denied", zone=None, duration_seconds=0.0012345, message="topoguard: no zone")
    [line] = review_lines()
    assert list(line) == ["time", "level", "logger", "msg", "uid", "kind", "object", "operation", "outcome", "zone",
                          "duration_ms", "detail"]
    assert {k: v for k, v in line.items() if k != "time"} == {
        "level": "info", "logger": "topoguard.review", "msg": "review", "uid": "u-1", "kind": "PyTorchJob",
        "object": "ml/train", "operation": "mutate", "outcome": "denied", "zone": "", "duration_ms": 1.234,
        "detail": "topoguard: no zone",
    }


def test_a_review_below_the_level_writes_nothing(review_lines: Any) -> None:
    logging.getLogger(logs.REVIEW_LOGGER).setLevel(logging.WARNING)
    logs.log_review(uid="u-1", kind="TFJob", namespace="", name="n", operation="validate", outcome="patched",
                    zone="zone-a", duration_seconds=0.001)
    assert review_lines() == []


def test_configure_logging_stops_gathering_what_no_line_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    for switch in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, switch, getattr(logging, switch))  # restored after the test
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access")]
    saved = [(lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    buffer = io.StringIO()
    try:
        logs.configure_logging("info", stream=buffer)
        assert (logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing) == (
            None, False, False, False)
        logging.getLogger("topoguard.test").info("served", extra={"port": 8443})
    finally:
        for lg, (handlers, level, propagate) in zip(loggers, saved, strict=True):
            lg.handlers[:], lg.propagate = handlers, propagate
            lg.setLevel(level)
    [line] = [json.loads(text) for text in buffer.getvalue().splitlines()]
    assert list(line) == ["time", "level", "logger", "msg", "port"]


@pytest.fixture
def configured() -> Any:
    """configure_logging into a buffer (as `topoguard serve` does), everything restored afterwards."""
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access")]
    saved = [(lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    switches = (logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    handler = logs._line_handler
    buffer = io.StringIO()
    logs.configure_logging("info", stream=buffer)
    yield buffer
    for lg, (handlers, level, propagate) in zip(loggers, saved, strict=True):
        lg.handlers[:], lg.propagate = handlers, propagate
        lg.setLevel(level)
    logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = switches
    logs._line_handler = handler


def _only_ours() -> None:
    """The root logger as `topoguard serve` runs it: pytest's log capture adds its own handler for each test."""
    assert logs._line_handler is not None
    logging.getLogger().handlers[:] = [logs._line_handler]


REVIEWS: list[dict[str, Any]] = [
    {"uid": "u-1", "kind": "PyTorchJob", "namespace": "ml", "name": "train", "operation": "mutate",
     "outcome": "patched", "zone": "zone-a", "duration_seconds": 0.0004},
    {"uid": "u-2", "kind": "TFJob", "namespace": "", "name": "n", "operation": "validate", "outcome": "denied",
     "zone": None, "duration_seconds": 1.5, "message": "topoguard: \"quoted\"\nnew line " + "x" * 600},
]


@pytest.mark.parametrize("review", REVIEWS)
def test_the_direct_line_is_the_line_the_logging_path_writes(configured: io.StringIO, review: dict[str, Any],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _only_ours()
    assert logs._direct_handler() is logs._line_handler is not None
    logs.log_review(**review)
    monkeypatch.setattr(logs, "_direct_handler", lambda: None)  # the logging path, same handler
    logs.log_review(**review)
    direct, through_logging = (json.loads(line) for line in configured.getvalue().splitlines())
    assert list(direct) == list(through_logging)
    assert {**direct, "time": ""} == {**through_logging, "time": ""}


def test_any_other_route_of_the_record_takes_the_logging_path(configured: io.StringIO) -> None:
    _only_ours()
    review_logger, root = logging.getLogger(logs.REVIEW_LOGGER), logging.getLogger()
    captured = io.StringIO()
    extra = logging.StreamHandler(captured)
    ours = logs._line_handler
    assert ours is not None
    changes: list[tuple[Callable[[], None], Callable[[], None]]] = [
        (lambda: review_logger.addHandler(extra), lambda: review_logger.removeHandler(extra)),
        (lambda: root.addHandler(extra), lambda: root.removeHandler(extra)),
        (lambda: root.addFilter(lambda r: True), lambda: root.filters.clear()),
        (lambda: ours.setLevel(logging.WARNING), lambda: ours.setLevel(logging.NOTSET)),
    ]
    for attach, detach in changes:
        attach()
        try:
            assert logs._direct_handler() is None
        finally:
            detach()
    assert logs._direct_handler() is logs._line_handler
    review_logger.addHandler(extra)
    try:
        logs.log_review(**REVIEWS[0])
    finally:
        review_logger.removeHandler(extra)
    assert captured.getvalue().strip() == "review"  # the extra handler saw the record
    assert json.loads(configured.getvalue())["uid"] == "u-1"  # and the root's handler still wrote the line
