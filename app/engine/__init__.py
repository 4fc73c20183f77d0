"""PURE placement engine: candidate zones, capacity, flow checks, zone choice, JSON Patch building.

Never does I/O and never sees the live cache: callers pass one immutable `Snapshot` per request.
Must not import kubernetes, fastapi, starlette, uvicorn or prometheus_client (import-linter).
"""

from app.engine.decide import decide, prepare
from app.engine.validation import validate

__all__ = ["decide", "prepare", "validate"]
