"""`create_app(settings, store)`: the ASGI application and its lifespan.

Wiring only. The review endpoints are dispatched before FastAPI (see routes.py for why); every other
path goes to a FastAPI app. The lifespan starts the store when it has a lifecycle (the watch store),
subscribes index pre-warming and the zone gauges to every published snapshot, and polls the
certificate files for rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from app import engine
from app.cache.store import Store
from app.config import Settings
from app.engine.whatif import Change, JobImpact
from app.http import maps, routes
from app.http.deps import AppState
from app.http.workers import READER_THREADS, MemoryBudget, Workers
from app.metrics import Metrics
from app.models.cluster import Snapshot
from app.tls import CertificateFiles

if TYPE_CHECKING:
    from app.cache.access import AccessReviewer

log = logging.getLogger(__name__)

# Work on a worker running this many deadlines long counts as stuck (/healthz fails): the engine stops
# itself within one verdict of the deadline, so only a loop it does not check gets there.
STUCK_AFTER_DEADLINES = 2.0
CERT_POLL_SECONDS = 5.0
# How often a published snapshot may trigger a full, unfrozen collection (see `settle_heap`).
FULL_GC_EVERY_SECONDS = 600.0


class BackgroundService(Protocol):
    """Something the lifespan starts after the store and stops before it (the audit controller)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class TopoguardApp:
    """The ASGI callable served by uvicorn: review fast path + FastAPI for everything else."""

    def __init__(self, api: FastAPI, state: AppState) -> None:
        self.api = api
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if self.state.draining:
                send = _closing(send)
            operation = routes.REVIEW_PATHS.get(scope["path"])
            if operation is not None:
                await routes.handle_review(self.state, operation, scope, receive, send)
                return
            if scope["path"] == routes.POLICY_PATH:
                await routes.handle_policy_review(self.state, scope, receive, send)
                return
        await self.api(scope, receive, send)


def _closing(send: Send) -> Send:
    """Add `Connection: close` to the response (draining: the client must reconnect elsewhere)."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return wrapped


def settle_heap(last_full_gc: float, *, now: float | None = None) -> float:
    """Take the objects alive now (the snapshot just published and its indexes) out of the collector's
    scans, so a full collection does not stall the event loop on them. Returns the time of the last
    full collection.

    Measured with 5,000 nodes (bench/bench_http.py): a full `gc.collect()` over the warm cache takes
    on the order of 100 ms; after `gc.freeze()` almost nothing is left to scan (research/
    perf-rel-sec.md A.6, goal P6). Frozen objects are still freed by reference counting, and a
    snapshot holds no reference cycles, so replaced snapshots are reclaimed. What freezing could keep
    alive is cyclic garbage that exists at that moment: a young collection runs first, and at most
    every FULL_GC_EVERY_SECONDS everything is unfrozen and fully collected, bounding that leak.
    """
    now = time.monotonic() if now is None else now
    if now - last_full_gc >= FULL_GC_EVERY_SECONDS:
        gc.unfreeze()
        gc.collect()
        last_full_gc = now
    else:
        gc.collect(1)
    gc.freeze()
    return last_full_gc


def _warm(state: AppState, snapshot: Snapshot) -> None:
    """Called for every snapshot before it is published: build the engine's indexes now, so that no review
    waits for them (a review that read a snapshot while the publisher still built its indexes waited for
    the build: under churn, a p99 of about the publish time)."""
    # NB: never raise from here: a bad snapshot must not kill the watcher that publishes it.
    try:
        engine.prepare(snapshot, state.settings)
    except Exception:
        log.exception("could not pre-warm indexes for a snapshot", extra={"revision": snapshot.revision})


def _settle(state: AppState, snapshot: Snapshot) -> None:
    """Called for every published snapshot: its gauges, the in-flight holds of the jobs it stores released
    (a job created and deleted between two reviews is seen here, or its hold would last its whole window),
    and the heap settled (the snapshot it replaced is no longer what readers get)."""
    if len(state.in_flight):
        state.in_flight.current(snapshot)
    try:
        zones = maps.zone_capacity(
            snapshot, zone_label=state.settings.zone_label, gpu_resources=state.settings.gpu_resources,
            gpu_device_classes=state.settings.gpu_device_classes,
        )
        state.metrics.record_zones({zone: info["gpusFree"] for zone, info in zones.items()})
        state.metrics.record_reserved({zone: info["gpusReserved"] for zone, info in zones.items()})
        state.metrics.record_cache(synced=state.store.status().synced, age_seconds=0.0, objects=state.object_counts())
    except Exception:
        log.exception("could not export the zone gauges for a snapshot", extra={"revision": snapshot.revision})
    state.last_full_gc = settle_heap(state.last_full_gc)


async def _poll_certificates(certificates: CertificateFiles, state: AppState, interval: float) -> None:
    while True:
        if certificates.reload_if_changed():
            for reloaded in state.certificate_reloaded:
                reloaded()
        state.metrics.record_certificate(certificates.not_after, certificates.serial)
        await asyncio.sleep(interval)


def create_app(
    settings: Settings,
    store: Store,
    *,
    metrics: Metrics | None = None,
    certificates: CertificateFiles | None = None,
    certificate_not_after: float | None = None,
    certificate_serial: str = "",
    offload_decisions: bool = True,
    cert_poll_seconds: float = CERT_POLL_SECONDS,
    map_reviewer: AccessReviewer | None = None,
    background: Sequence[BackgroundService] = (),
    policy_events: Callable[[Change, Sequence[JobImpact]], object] | None = None,
) -> TopoguardApp:
    """The webhook application.

    Args:
        settings: decision and server settings.
        store: where each request takes its snapshot; `start()`/`stop()` are awaited when present.
        metrics: a fresh registry per app by default.
        certificates: serving certificate files to poll for rotation (None for self-signed or plain HTTP).
        certificate_not_after: notAfter to export when the certificate never changes (self-signed).
        certificate_serial: that certificate's serial (hex), the label of the connections it serves.
        offload_decisions: run reviews on the worker pools, with the deadline and fairness (default), or
            inline on the event loop (benchmarks compare the two).
        cert_poll_seconds: how often to look at the certificate files.
        map_reviewer: checks /map callers' tokens (settings.map_access `authorized`; app.cache.access).
        background: started after the store, stopped (in reverse order) before it; never on the request path.
        policy_events: leaves Events on the jobs a stored policy change breaks (POST /validate-policy).
    """
    deadline = settings.request_deadline_seconds
    workers = Workers(
        settings.decision_workers,
        wait_seconds=deadline / 4,
        stuck_after_seconds=deadline * STUCK_AFTER_DEADLINES,
        memory=MemoryBudget(READER_THREADS * settings.review_memory_bytes),
    ) if offload_decisions else None
    state = AppState(settings=settings, store=store, metrics=metrics or Metrics(), workers=workers,
                     map_reviewer=map_reviewer, policy_events=policy_events)
    if certificates is not None:
        state.metrics.record_certificate(certificates.not_after, certificates.serial)
    elif certificate_not_after is not None:
        state.metrics.record_certificate(certificate_not_after, certificate_serial)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        store.before_publish(lambda snapshot: _warm(state, snapshot))
        start: Any = getattr(store, "start", None)
        if callable(start):
            await start()
        store.subscribe(lambda snapshot: _settle(state, snapshot))
        observe: Any = getattr(store, "observe_publish", None)
        if callable(observe):
            observe(state.metrics.record_publish)
        started: list[BackgroundService] = []
        for service in background:
            await service.start()
            started.append(service)
        poller = (
            asyncio.create_task(_poll_certificates(certificates, state, cert_poll_seconds))
            if certificates is not None else None
        )
        try:
            yield
        finally:
            if poller is not None:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
            for service in reversed(started):
                try:
                    await service.stop()
                except Exception:  # the store and the workers must still stop
                    log.exception("stopping a background service failed")
            stop: Any = getattr(store, "stop", None)
            if callable(stop):
                await stop()
            if state.workers is not None:
                state.workers.shutdown()

    api = FastAPI(title="topoguard", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    api.state.topoguard = state
    api.include_router(routes.router)
    api.include_router(maps.router)
    return TopoguardApp(api, state)
