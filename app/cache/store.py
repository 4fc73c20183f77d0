"""Snapshot stores: where a request gets its immutable Snapshot.

`Store` is the interface the HTTP layer reads (one `snapshot()` call per request, no locks on the
read path). `StaticStore` serves a file snapshot; the watch-based store lives in watchers.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from app.models.cluster import Snapshot


@dataclass(frozen=True)
class SyncStatus:
    """What /readyz and the metrics report about the cache."""

    synced: bool  # every watched kind has finished its first list
    stale: bool  # watches have been failing longer than the configured bound
    age_seconds: float  # since the snapshot was last published
    detail: dict[str, str] = field(default_factory=dict)  # per kind: "synced", "absent (CRD not installed)", ...


class Store(Protocol):
    def snapshot(self) -> Snapshot: ...

    def status(self) -> SyncStatus: ...

    def healthy_snapshot(self) -> Snapshot | None:
        """The latest snapshot when decisions may trust it (synced, watches not failing past the bound),
        else None, and then `status()` says why. What every admission review asks first: it must cost
        next to nothing (no per-kind detail)."""
        ...

    def before_publish(self, callback: Callable[[Snapshot], None]) -> None:
        """Call `callback(snapshot)` on every snapshot from now on before any reader can get it: what it
        builds (the engine's indexes) is ready when the first review reads the snapshot, so no review
        waits for a build. Register before the store starts; the current snapshot, if any, gets it now."""
        ...

    def subscribe(self, callback: Callable[[Snapshot], None]) -> None:
        """Call `callback(snapshot)` for every snapshot published from now on (after readers can get it)."""
        ...


class StaticStore:
    """A snapshot that never changes (`--cluster PATH`): always synced."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def status(self) -> SyncStatus:
        return SyncStatus(synced=True, stale=False, age_seconds=0.0, detail={"source": "file"})

    def healthy_snapshot(self) -> Snapshot | None:
        return self._snapshot

    def before_publish(self, callback: Callable[[Snapshot], None]) -> None:
        callback(self._snapshot)

    def subscribe(self, callback: Callable[[Snapshot], None]) -> None:
        callback(self._snapshot)
