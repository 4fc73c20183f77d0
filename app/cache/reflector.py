"""One kind's list+watch loop (a "reflector", as client-go calls it), run in its own thread.

The loop: list (paginated) → replace the kind's projections → watch from the list's
resourceVersion with bookmarks → apply events → on a clean stream end, watch again from the last
resourceVersion seen. A 410 Gone (HTTP status or ERROR event) means the resourceVersion was
compacted away: relist. A 404 on the list of an optional CRD marks the kind absent and retries
discovery slowly. Every other error backs off exponentially with jitter, bounded, and is reported
through `failing_since` so the store can call itself stale. This module never builds snapshots.
"""

from __future__ import annotations

import gc
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from app.cache import resources
from app.cache.errors import ApiError, StreamError
from app.cache.resources import Resource

log = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED, BOOKMARK, ERROR = "ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"


@dataclass(frozen=True)
class WatchTuning:
    """Timing knobs of the watch cache. The defaults suit production; tests shrink them."""

    backoff_initial_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    absent_retry_seconds: float = 60.0  # re-discover a CRD that was not installed
    publish_interval_seconds: float = 0.15  # coalesce bursts: at most one snapshot per interval
    watch_timeout_seconds: int = 300  # server-side; jittered to [t, 2t) like client-go's reflector
    connect_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 60.0  # list pages; watches get their timeout + this margin
    list_page_size: int = 500
    stop_grace_seconds: float = 2.0  # stop() waits this long for threads, then leaves daemons behind


def backoff_delay(attempt: int, *, initial: float, maximum: float, rng: random.Random) -> float:
    """Seconds to wait before retry number `attempt` (1-based): capped exponential, "equal jitter".

    The delay lies in [d/2, d] with d = min(maximum, initial * 2**(attempt-1)), so replicas that
    failed together do not retry in lockstep, and the wait never exceeds `maximum`.
    """
    exponent = min(max(attempt - 1, 0), 32)
    ceiling = min(maximum, initial * float(1 << exponent))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Newline-delimited records from a byte stream whose chunks may cut records anywhere."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


_PAGE_PARSE_LOCK = threading.Lock()


def parse_json(data: bytes, what: str, *, page: bool = False) -> dict[str, Any]:
    """A JSON object from the API, or StreamError naming what was being read.

    `page`: a list page, up to `list_page_size` whole objects held while they are projected. It is parsed
    with the cyclic collector off and then taken out of its generations (gc.freeze): otherwise each young
    collection during the parse and the projection scans the page's tens of thousands of containers again,
    and, promoted, they count toward full collections of the whole cache (measured listing 150,000
    kubelet-shaped pods: 229 -> 134 µs of CPU a pod). JSON holds no reference cycles, so reference counting
    still frees the page once projected; the app's heap settling (app/http/app.py `settle_heap`) bounds
    what a freeze can keep of other threads' cyclic garbage.
    """
    try:
        if page:
            # NB: under a lock: two reflectors interleaving isenabled/disable/enable could leave the
            # collector off for good (orjson holds the GIL while it parses, so this serialises nothing more).
            with _PAGE_PARSE_LOCK:
                enabled = gc.isenabled()
                gc.disable()
                try:
                    value = orjson.loads(data)
                finally:
                    if enabled:
                        gc.enable()
            gc.freeze()
        else:
            value = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise StreamError(f"{what}: not JSON: {e}") from e
    if not isinstance(value, dict):
        raise StreamError(f"{what}: expected a JSON object, got {type(value).__name__}")
    return value


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    namespace = meta.get("namespace") or ""
    return f"{namespace}/{meta.get('name', '')}" if namespace else str(meta.get("name", ""))


def resource_version_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""


class KindCache:
    """The projections of one kind, keyed by namespace/name, and the resourceVersion they reflect.

    Not thread-safe by itself: the store's lock guards every call.
    """

    def __init__(self, resource: Resource, api_version: str = "") -> None:
        self.resource = resource
        self.api_version = api_version or resource.api_versions[0]
        self.items: dict[str, Any] = {}
        self.resource_version = ""
        self.generation = 0  # bumped on every content change, so readers can reuse what they built
        # Aggregates kept as items come and go (Resource.aggregate; e.g. the pods' PodIndexBuilder).
        self.aggregate: Any = resource.aggregate() if resource.aggregate is not None else None

    def _typed(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        # NB: items of a built-in List carry no kind/apiVersion; projections need them.
        if obj.get("kind") and obj.get("apiVersion"):
            return obj
        return {**obj, "kind": self.resource.kind, "apiVersion": self.api_version}

    def project(self, obj: Mapping[str, Any]) -> Any:
        return self.resource.project(self._typed(obj))

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Apply one ADDED/MODIFIED/DELETED event; True when the kept content changed."""
        self.resource_version = resource_version_of(obj) or self.resource_version
        key = object_key(obj)
        projection = None if event_type == DELETED else self.project(obj)
        old = self.items.get(key)
        if projection is None:
            if self.items.pop(key, None) is None:
                return False
        elif old == projection:
            return False
        else:
            self.items[key] = projection
        if self.aggregate is not None:
            self.aggregate.replace(old, projection)
        self.generation += 1
        return True

    def put(self, key: str, projection: Any) -> None:
        """Keep a listed object's projection (a list fills a fresh cache with this)."""
        old = self.items.get(key)
        self.items[key] = projection
        if self.aggregate is not None:
            self.aggregate.replace(old, projection)


def describe(error: BaseException) -> str:
    text = str(error) if isinstance(error, ApiError) else f"{type(error).__name__}: {error}"
    return text if len(text) <= 300 else text[:297] + "..."


class Reflector:
    """Keeps one KindCache current. `run(stop)` is the thread body; the other members are status."""

    def __init__(
        self,
        resource: Resource,
        *,
        apis: resources.Apis,
        tuning: WatchTuning,
        lock: threading.Lock,
        on_change: Callable[[], None],
        rng: random.Random | None = None,
    ) -> None:
        self.resource = resource
        self.cache = KindCache(resource)
        self.listed = False  # first list finished, or the CRD was found absent
        self.absent = False
        self.connected = False  # a watch stream is open
        self.failing_since: float | None = None  # wall clock, for humans
        self.failing_since_monotonic: float | None = None
        self.last_error = ""
        self._apis = apis
        self._tuning = tuning
        self._lock = lock
        self._on_change = on_change
        self._rng = rng or random.Random()
        self._active: Any = None  # the urllib3 response being read, so stop() can cut it
        self._interrupted = False
        self._progress = False

    # -- status ----------------------------------------------------------------------------

    def failing_for(self, now_monotonic: float) -> float:
        """Seconds this kind has been unable to list or watch (0 while healthy or connected)."""
        if self.failing_since_monotonic is None or self.connected:
            return 0.0
        return max(now_monotonic - self.failing_since_monotonic, 0.0)

    def detail(self, now_monotonic: float) -> str:
        if self.failing_for(now_monotonic) > 0 and self.failing_since is not None:
            since = datetime.fromtimestamp(self.failing_since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            return f"failing since {since}: {self.last_error}"
        if self.absent:
            return resources.CRD_ABSENT
        return "synced" if self.listed else "listing"

    def interrupt(self) -> None:
        """Cut the open list/watch response, now and any opened later (stop() calls this)."""
        self._interrupted = True  # NB: set before reading _active; _request sets _active, then reads this
        self._cut(self._active)

    def _cut(self, response: Any) -> None:
        if response is None:
            return
        try:
            shutdown = getattr(response, "shutdown", None)  # urllib3 >= 2.3 unblocks a pending read
            (shutdown or response.close)()
        except Exception:  # best effort while stopping
            log.debug("interrupting the %s request failed", self.resource.kind, exc_info=True)

    # -- the loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        attempt, gone_in_row, need_list = 0, 0, True
        while not stop.is_set():
            self._progress = False
            try:
                if need_list:
                    if not self._list():
                        stop.wait(self._tuning.absent_retry_seconds)
                        continue
                    need_list, gone_in_row = False, 0
                self._watch(stop)
                attempt = 0
                self._healthy()
                continue
            except ApiError as e:
                if stop.is_set():
                    break
                if e.gone or (e.not_found and self.resource.optional):
                    # 410: our resourceVersion was compacted; 404: the CRD went away. Both: list again.
                    log.info("%s: %s; relisting", self.resource.kind, e)
                    need_list, gone_in_row = True, gone_in_row + 1
                    if gone_in_row == 1:
                        continue
                error: Exception = e
            except Exception as e:  # a watch thread must never die
                if stop.is_set():
                    break
                error = e
            attempt = 1 if self._progress else attempt + 1
            self._fail(error)
            delay = backoff_delay(
                attempt, initial=self._tuning.backoff_initial_seconds, maximum=self._tuning.backoff_max_seconds,
                rng=self._rng,
            )
            log.warning("%s: %s; retrying in %.1fs", self.resource.kind, self.last_error, delay)
            stop.wait(delay)

    def _healthy(self) -> None:
        self.failing_since = self.failing_since_monotonic = None
        self.last_error = ""

    def _fail(self, error: BaseException) -> None:
        if self.failing_since_monotonic is None or self._progress:
            self.failing_since, self.failing_since_monotonic = time.time(), time.monotonic()
        self.last_error = describe(error)

    def _request(self, api_version: str, *, read_timeout: float, **query: Any) -> Any:
        timeout = (self._tuning.connect_timeout_seconds, read_timeout)
        response = resources.open_collection(self._apis, self.resource, api_version, timeout=timeout, **query)
        self._active = response
        if self._interrupted:  # stop() ran while the request was being sent: it could not cut this one
            self._cut(response)
        return response

    def _list(self) -> bool:
        """List every page; False when an optional CRD is not served in any candidate version."""
        for api_version in self.resource.api_versions:
            try:
                fresh = self._list_version(api_version)
            except ApiError as e:
                if e.not_found and self.resource.optional:
                    continue
                raise
            with self._lock:
                self.cache = fresh
                self.listed, self.absent = True, False
            self._healthy()
            log.info("%s: listed %d (%s, rv %s)", self.resource.kind, len(fresh.items), api_version,
                     fresh.resource_version)
            self._on_change()
            return True
        with self._lock:
            changed = not self.absent
            self.cache = KindCache(self.resource)
            self.listed, self.absent = True, True
        self._healthy()
        if changed:
            log.info("%s: %s; checking again every %.0fs", self.resource.kind, resources.CRD_ABSENT,
                     self._tuning.absent_retry_seconds)
            self._on_change()
        return False

    def _list_version(self, api_version: str) -> KindCache:
        """Every page of the list, projected. While one page is projected the next is already being fetched
        and parsed (client-go's pager buffers pages the same way, tools/pager `PageBufferSize`): the server's
        time to produce a page overlaps ours to project the last one instead of adding to it (with 150,000
        pods from a server on another core: about 3 of 23 s to ready). At most two pages are held."""
        fresh = KindCache(self.resource, api_version)
        with ThreadPoolExecutor(1, thread_name_prefix=f"topoguard-list-{self.resource.kind}") as fetcher:
            upcoming: Future[dict[str, Any]] | None = fetcher.submit(self._page, api_version, None)
            while upcoming is not None:
                body = upcoming.result()
                items = body.get("items")
                if not isinstance(items, list):
                    raise StreamError(f"{self.resource.kind} list: no items")
                meta = body.get("metadata")
                meta = meta if isinstance(meta, Mapping) else {}
                token = meta.get("continue") or None
                upcoming = fetcher.submit(self._page, api_version, token) if token else None
                try:
                    for obj in items:
                        if isinstance(obj, Mapping):
                            projection = fresh.project(obj)
                            if projection is not None:
                                fresh.put(object_key(obj), projection)
                except BaseException:
                    self._cut(self._active)  # the next page's request, if still open: no wait for it to end
                    raise
                fresh.resource_version = str(meta.get("resourceVersion") or "")
        return fresh

    def _page(self, api_version: str, token: str | None) -> dict[str, Any]:
        """One list page, read and parsed (on the list's fetcher thread)."""
        response = self._request(
            api_version, read_timeout=self._tuning.read_timeout_seconds, limit=self._tuning.list_page_size,
            _continue=token,
        )
        clean = False
        try:
            body = parse_json(response.data, f"{self.resource.kind} list", page=True)
            clean = True
        finally:
            self._finish(response, clean=clean)
        return body

    def _watch(self, stop: threading.Event) -> None:
        """One watch request, until the server ends it (returns) or it fails (raises)."""
        server_timeout = self._tuning.watch_timeout_seconds
        server_timeout = int(server_timeout * (1 + self._rng.random()))
        response = self._request(
            self.cache.api_version,
            read_timeout=server_timeout + self._tuning.read_timeout_seconds,
            watch=True,
            resource_version=self.cache.resource_version or None,
            allow_watch_bookmarks=True,
            timeout_seconds=server_timeout,
        )
        self.connected, clean = True, False
        try:
            for line in split_lines(response.stream(None, decode_content=False)):
                if stop.is_set():
                    return
                self._handle(parse_json(line, f"{self.resource.kind} watch event"))
            clean = True
        finally:
            self.connected = False
            self._finish(response, clean=clean)

    def _finish(self, response: Any, *, clean: bool) -> None:
        """Give the connection back to the pool; a half-read one is closed first, never reused."""
        self._active = None
        if not clean:
            response.close()
        response.release_conn()

    def _handle(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object")
        if kind == ERROR:
            raise ApiError.from_status(obj)
        if not isinstance(obj, Mapping):
            raise StreamError(f"{self.resource.kind} watch event {kind!r} without an object")
        if kind == BOOKMARK:
            # A bookmark only moves our resourceVersion forward, so a reconnect does not replay
            # (or 410 on) history we have already seen.
            with self._lock:
                self.cache.resource_version = resource_version_of(obj) or self.cache.resource_version
        elif kind in (ADDED, MODIFIED, DELETED):
            with self._lock:
                changed = self.cache.apply(kind, obj)
            if changed:
                self._on_change()
        else:
            log.warning("%s: ignoring watch event of unknown type %r", self.resource.kind, kind)
        self._progress = True
        if self.failing_since is not None:
            self._healthy()
