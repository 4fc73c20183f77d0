"""Structured logs: one JSON object per line on stderr, and the one-line-per-review record.

Owns the log format only. What is logged per review is fixed here (uid, kind, namespace/name,
operation, outcome, zone, duration): never the object, a patch or a certificate at info level, so
no Secret content or user payload reaches the logs by accident.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any

import orjson

REVIEW_LOGGER = "topoguard.review"
_review_log = logging.getLogger(REVIEW_LOGGER)  # the same object getLogger returns, without its lock per call

# LogRecord attributes that are plumbing, not data (everything else passed via `extra=` is emitted).
_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys() | {"message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "msg", ...extra}`; exceptions as one `exc` string.

    Every answered review logs a line, so this runs once per request (issue 4 counts the microseconds):
    the time is formatted without a datetime per record.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The last second formatted and its text, as one tuple so that concurrent records never
        # pair one second with another's text.
        self._second: tuple[int, str] = (0, _format_utc_second(0))

    def format(self, record: logging.LogRecord) -> str:
        out = self.head(record.created, record.levelname.lower(), record.name, record.getMessage())
        # A plain scan of the ~30 attributes: a set difference first, or skipping the LogRecord's own
        # leading keys, measured no cheaper (about 3 µs either way).
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()

    def head(self, created: float, level: str, logger: str, msg: str) -> dict[str, Any]:
        """The keys every line starts with, in their order; the record's extras follow."""
        return {"time": self.format_created(created), "level": level, "logger": logger, "msg": msg}

    def format_created(self, created: float) -> str:
        """`created` (seconds since the epoch) as `2026-01-31T12:00:00.123+00:00`: the text of
        `datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")` without building
        datetimes, the date and time of day formatted once per second.

        The same arithmetic as datetime's: the fraction rounded half-even to the microsecond (which may
        carry into the next second), then truncated to the millisecond.
        """
        fraction, whole = math.modf(created)
        second, micros = int(whole), round(fraction * 1e6)
        if micros >= 1_000_000:
            second, micros = second + 1, micros - 1_000_000
        elif micros < 0:
            second, micros = second - 1, micros + 1_000_000
        cached, text = self._second
        if second != cached:
            text = _format_utc_second(second)
            self._second = (second, text)
        return f"{text}.{micros // 1000:03d}+00:00"


def _format_utc_second(second: int) -> str:
    """`2026-01-31T12:00:00`: the UTC date and time of day of `second` since the epoch."""
    t = time.gmtime(second)
    return f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"


def configure_logging(level: str = "info", *, stream: Any = None) -> None:
    """Route every logger (ours, uvicorn's) through one JSON handler at `level`."""
    global _line_handler
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    _line_handler = handler
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    # Record fields no line shows (JsonFormatter emits none of them), so not gathered per record, as
    # the logging HOWTO's "Optimization" section describes: the caller's file, line and function (a
    # walk up the stack), thread, process id and process name. These switches are process-wide, so
    # they are set here, where the server takes the process's logging over, never on import.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def log_review(
    *,
    uid: str,
    kind: str,
    namespace: str,
    name: str,
    operation: str,
    outcome: str,
    zone: str | None,
    duration_seconds: float,
    message: str = "",
) -> None:
    """The one line per answered review.

    Written straight to the JSON handler `configure_logging` installed when that handler is the only
    place the record would go (`_direct_handler`): the same line, byte for byte, without a LogRecord
    and the handler chain, which cost about twice the line itself (issue 4). Any other set-up (more
    handlers, filters, a level on the handler, tests capturing logs) takes the logging path.
    """
    if not _review_log.isEnabledFor(logging.INFO):
        return
    fields = {
        "uid": uid,
        "kind": kind,
        "object": f"{namespace}/{name}" if namespace else name,
        "operation": operation,
        "outcome": outcome,
        "zone": zone or "",
        "duration_ms": round(duration_seconds * 1000, 3),
        **({"detail": message[:500]} if message else {}),
    }
    handler = _direct_handler()
    if handler is None:
        _review_log.info("review", extra=fields)
        return
    formatter: JsonFormatter = handler.formatter  # type: ignore[assignment]  # checked by _direct_handler
    out = formatter.head(time.time(), "info", REVIEW_LOGGER, "review")
    out.update(fields)
    line = orjson.dumps(out, default=str).decode()
    with handler.lock:  # type: ignore[union-attr]  # a StreamHandler always has its lock
        try:
            handler.stream.write(line + handler.terminator)
            handler.flush()
        except Exception:  # as StreamHandler.emit: report on stderr, never fail the review
            handler.handleError(_review_log.makeRecord(REVIEW_LOGGER, logging.INFO, "", 0, "review", (), None,
                                                       extra=fields))


# The JSON handler `configure_logging` put on the root logger (None until it runs).
_line_handler: logging.StreamHandler[Any] | None = None


def _direct_handler() -> logging.StreamHandler[Any] | None:
    """The handler a review record would reach, alone, unfiltered and unchanged on the way, or None.

    The logging path would pass the record through the review logger's filters and handlers, then
    (propagating) the root logger's, each handler applying its level and filters. When the review
    logger is the root's direct child with no handlers or filters of its own, and the root holds just
    our handler with neither, writing the formatted line to that handler is exactly what it would do.
    """
    handler = _line_handler
    root = logging.root
    if (
        handler is None
        or _review_log.handlers
        or _review_log.filters
        or not _review_log.propagate
        or _review_log.parent is not root
        or root.filters
        or root.handlers != [handler]
        or handler.filters
        or handler.level > logging.INFO
        or type(handler.formatter) is not JsonFormatter
    ):
        return None
    return handler
