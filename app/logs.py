"""Structured logs: one JSON object per line on stderr, and the one-line-per-review record.

Owns the log format only. What is logged per review is fixed here (uid, kind, namespace/name,
operation, outcome, zone, duration): never the object, a patch or a certificate at info level, so
no Secret content or user payload reaches the logs by accident.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Any

import orjson

REVIEW_LOGGER = "topoguard.review"

# LogRecord attributes that are plumbing, not data (everything else passed via `extra=` is emitted).
_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys() | {"message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "msg", ...extra}`; exceptions as one `exc` string."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure_logging(level: str = "info", *, stream: Any = None) -> None:
    """Route every logger (ours, uvicorn's) through one JSON handler at `level`."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True


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
    """The one line per answered review."""
    logging.getLogger(REVIEW_LOGGER).info(
        "review",
        extra={
            "uid": uid,
            "kind": kind,
            "object": f"{namespace}/{name}" if namespace else name,
            "operation": operation,
            "outcome": outcome,
            "zone": zone or "",
            "duration_ms": round(duration_seconds * 1000, 3),
            **({"detail": message[:500]} if message else {}),
        },
    )
