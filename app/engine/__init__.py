"""PURE placement engine: candidate zones, capacity, flow checks, zone choice, JSON Patch building.

Never does I/O and never sees the live cache: callers pass one immutable `Snapshot` per request.
Must not import kubernetes, fastapi, starlette, uvicorn or prometheus_client (import-linter).
"""

from app.engine.budget import Deadline, DeadlineExceeded, within
from app.engine.cached import Pending, decide, pending, validate
from app.engine.decide import decide_fresh, job_key, prepare
from app.engine.flows import IndexValuesLimitError
from app.engine.memo import JOB_PLACEHOLDER, render, render_json
from app.engine.validation import validate_fresh

__all__ = [
    "JOB_PLACEHOLDER",
    "Deadline",
    "DeadlineExceeded",
    "IndexValuesLimitError",
    "Pending",
    "decide",
    "decide_fresh",
    "job_key",
    "pending",
    "prepare",
    "render",
    "render_json",
    "validate",
    "validate_fresh",
    "within",
]
