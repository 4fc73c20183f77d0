"""What every route reads: the per-app state (settings, store, metrics, workers) and its FastAPI alias.

One `AppState` per app instance, hung on `app.state.topoguard`; nothing module-global, so tests can
run many apps in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from app.admission.inflight import InFlight
from app.cache.store import Store, SyncStatus
from app.config import Settings
from app.engine.whatif import Change, JobImpact
from app.http.deadlines import BodyDeadlines
from app.http.workers import READER_THREADS, MemoryBudget, Workers
from app.metrics import Metrics
from app.models.cluster import BoundedMemo, Snapshot
from app.models.decision import Decision

if TYPE_CHECKING:  # the kubernetes client loads only where it is used
    from app.cache.access import AccessReviewer

# What a request decides on while the cache has not synced: nothing. answer() refuses (or warns) on
# the cache problem before it looks at the snapshot, so an empty one is never used to place a job.
EMPTY_SNAPSHOT = Snapshot(revision="unsynced")
# Decisions whose metric facts are kept (AppState.decision_metrics); the oldest goes first.
DECISION_METRICS_KEPT = 1024


@dataclass
class AppState:
    """Per-app wiring. `workers` None means reviews run inline on the event loop (benchmarks, unit tests)."""

    settings: Settings
    store: Store
    metrics: Metrics
    workers: Workers | None
    draining: bool = False  # SIGTERM seen: answer with `Connection: close`, report not ready
    # Called on the event loop after the serving certificate was reloaded (the server recycles the
    # connections handshaked with the previous one: WebhookServer.recycle_connections).
    certificate_reloaded: list[Callable[[], None]] = field(default_factory=list)
    last_full_gc: float = float("-inf")  # monotonic time of the last full collection (app.settle_heap)
    # What the metrics take from a decision, per decision object (routes.decision_metrics).
    decision_metrics: BoundedMemo[int, tuple[Decision, dict[str, int], dict[str, int]]] = field(
        default_factory=lambda: BoundedMemo(DECISION_METRICS_KEPT)
    )
    body_deadlines: BodyDeadlines = field(init=False)
    memory: MemoryBudget = field(init=False)  # the reviews in flight (the workers' budget when there are any)
    # Checks the bearer tokens of /map callers when settings.map_access is `authorized` (app.cache.access).
    map_reviewer: AccessReviewer | None = None
    # This replica's in-flight reservations (jobs admitted, not yet in its watch): admission/inflight.py.
    in_flight: InFlight = field(default_factory=InFlight)
    # Leaves an Event on each job a stored policy change breaks (app/controller/policy_events.py, wired by
    # `topoguard serve`; None: no API to write to). Called off the event loop.
    policy_events: Callable[[Change, Sequence[JobImpact]], object] | None = None

    def __post_init__(self) -> None:
        self.body_deadlines = BodyDeadlines(self.settings.request_deadline_seconds)
        self.memory = self.workers.memory if self.workers is not None else MemoryBudget(
            READER_THREADS * self.settings.review_memory_bytes)

    def cache_problem(self) -> tuple[SyncStatus, str | None]:
        """The store's status and, when decisions must not trust it, why (passed to admission.answer)."""
        status = self.store.status()
        if not status.synced:
            waiting = sorted(k for k, v in status.detail.items() if not v.startswith(("synced", "absent")))
            return status, "cache not synced yet" + (f" (waiting for {', '.join(waiting)})" if waiting else "")
        if status.stale:
            return status, f"cache is stale: watches have been failing, snapshot {status.age_seconds:.0f}s old"
        return status, None


    def snapshot(self) -> tuple[Snapshot, str | None]:
        """The snapshot a request decides on (taken once) and the cache problem, if any.

        Stores may refuse `snapshot()` before their first sync (WatchStore raises
        CacheNotReadyError); the status is asked first so that case never raises. A healthy store
        is asked only for its snapshot (`healthy_snapshot`): the status is for wording a problem.
        """
        healthy = self.store.healthy_snapshot()
        if healthy is not None:
            return healthy, None
        status, problem = self.cache_problem()
        if not status.synced:
            return EMPTY_SNAPSHOT, problem
        return self.store.snapshot(), problem

    def object_counts(self) -> dict[str, int]:
        """Objects per kind for `cache_objects{kind}`: the store's own counts when it has them."""
        counts = getattr(self.store, "counts", None)
        if callable(counts):
            return dict(counts())
        snapshot, _ = self.snapshot()
        return count_objects(snapshot)


def count_objects(snapshot: Snapshot) -> dict[str, int]:
    counts = {"Node": len(snapshot.nodes), "Namespace": len(snapshot.namespaces), "Pod": len(snapshot.pods),
              "CiliumCIDRGroup": len(snapshot.cidr_groups)}
    for kind in ("CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy", "NetworkPolicy"):
        counts[kind] = 0
    for policy in snapshot.policies:
        counts[policy.kind] = counts.get(policy.kind, 0) + 1
    return counts


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.topoguard
    return state


StateDep = Annotated[AppState, Depends(get_state)]
