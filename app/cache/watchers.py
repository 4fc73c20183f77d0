"""The live cache: list+watch every kind topoguard reads and publish immutable Snapshots.

`WatchStore` implements app.cache.store.Store. One daemon thread per kind runs a Reflector
(reflector.py) with the official, synchronous `kubernetes` client; a publisher thread turns the
kinds' projections into a new `Snapshot` at most once per `publish_interval_seconds` after a change
(bursts coalesce), and swaps it in with one reference assignment, so `snapshot()` takes no lock.

Why threads and the sync client rather than kubernetes_asyncio: the sync client is already our
dependency and the official one; blocking reads stay off the event loop that serves admission
requests; and stop() can still be prompt, because it shuts down the sockets the threads read.

Not here: what a snapshot means (app.models.cluster), how objects are projected (projections.py).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import operator
import threading
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, TypeVar

import yaml
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from app.cache import resources
from app.cache.errors import CacheNotReadyError, ClientConfigError
from app.cache.reflector import KindCache, Reflector, WatchTuning
from app.cache.store import SyncStatus
from app.config import Settings
from app.models.cluster import NetworkMemo, Snapshot
from app.models.pods import PodIndex

T = TypeVar("T")

log = logging.getLogger(__name__)

POLICY_KINDS = ("NetworkPolicy", "CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy", "ClusterNetworkPolicy")
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
# The kinds no verdict reads (models/cluster.py NetworkMemo): a change to them keeps the network memo (the
# pods' named ports aside). Any other kind, present or added later, counts as a network input.
NOT_NETWORK_KINDS = frozenset({"Node", "Pod", *RUNTIME_KINDS, *resources.JOB_KINDS, *resources.DRA_KINDS})
# Kinds whose absence is no missing input: no Trainer runtimes, no ClusterNetworkPolicy CRD (nothing to enforce),
# no DRA API or ComputeDomain CRD (no device is published through them; reported in the status as absent).
# Kinds held in the snapshot in no order (read through aggregates or counted as a whole): not sorted on a publish.
UNORDERED_KINDS = frozenset({"Pod", "ResourceClaim"})
UNNEEDED_WHEN_ABSENT = (*RUNTIME_KINDS, "ClusterNetworkPolicy", *resources.DRA_KINDS)


def build_api_client(kubeconfig: str | None, *, pool_size: int) -> client.ApiClient:
    """An ApiClient from `kubeconfig`, else in-cluster config, else the default kubeconfig.

    Raises:
        ClientConfigError: no usable configuration (the message says which sources were tried).
    """
    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration, persist_config=False
            )
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except ConfigException:
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration, persist_config=False
                )
    except (ConfigException, OSError, ValueError, TypeError, yaml.YAMLError) as e:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config or the default kubeconfig"
        raise ClientConfigError(f"cannot configure the Kubernetes client from {where}: {e}") from e
    # One long-lived connection per watch, plus room for relists.
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, pool_size)
    # TCP keepalive as client-go dials (30 s idle): a half-open watch is noticed in minutes, not when
    # its read timeout finally expires. Clients older than this option ignore the attribute.
    configuration.keep_alive = True
    return client.ApiClient(configuration)


class WatchStore:
    """A Store fed by list+watch (see the module docstring).

    `status().detail` maps each kind to "listing", "synced", "absent (CRD not installed)" or
    "failing since <UTC time>: <error>"; `counts()` maps each kind to the number of objects held
    (for Pods: bound, non-terminal pods that request a configured GPU resource).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        kubeconfig: str | None = None,
        api_client: client.ApiClient | None = None,
        tuning: WatchTuning | None = None,
    ) -> None:
        self._settings = settings
        self._tuning = tuning or WatchTuning()
        specs = resources.build_resources(settings)
        self._owns_client = api_client is None
        self._client = api_client or build_api_client(kubeconfig, pool_size=len(specs) + 2)
        self._lock = threading.Lock()  # guards every Reflector's KindCache
        self._changed = threading.Event()
        self._stop = threading.Event()
        apis = resources.Apis.build(self._client)
        self._reflectors = [
            Reflector(spec, apis=apis, tuning=self._tuning, lock=self._lock, on_change=self._changed.set)
            for spec in specs
        ]
        self._threads: list[threading.Thread] = []
        self._preparers: list[Callable[[Snapshot], None]] = []
        self._subscribers: list[Callable[[Snapshot], None]] = []
        self._publish_observers: list[Callable[[float], None]] = []
        self._snapshot: Snapshot | None = None  # swapped atomically; None until the first sync
        self._revision = 0
        self._built: dict[str, tuple[KindCache, int, tuple[Any, ...]]] = {}  # kind -> (cache, generation, values)
        # Snapshot fields made of several kinds (or remapped), by kinds: (their tuples, the value); `_combine`.
        self._combined: dict[tuple[str, ...], tuple[tuple[tuple[Any, ...], ...], Any]] = {}
        self._published_at = time.monotonic()
        self._absent: tuple[str, ...] = ()  # the absent kinds of the last snapshot built
        self._last_publish_seconds = 0.0

    # -- Store -----------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The latest published snapshot.

        Raises:
            CacheNotReadyError: the first list of some kind has not finished yet; callers must
                refuse to decide rather than decide on partial data.
        """
        current = self._snapshot
        if current is None:
            pending = [r.resource.kind for r in self._reflectors if not r.listed]
            raise CacheNotReadyError(f"cluster cache not synced yet (waiting for {', '.join(pending) or 'publish'})")
        return current

    def status(self) -> SyncStatus:
        now = time.monotonic()
        return SyncStatus(
            synced=self._snapshot is not None,
            stale=self._stale(now),
            age_seconds=max(now - self._published_at, 0.0),
            detail={r.resource.kind: r.detail(now) for r in self._reflectors},
        )

    def healthy_snapshot(self) -> Snapshot | None:
        current = self._snapshot
        return None if current is None or self._stale(time.monotonic()) else current

    def _stale(self, now: float) -> bool:
        """Whether some kind's watch has been failing longer than `cache_stale_seconds`."""
        bound = self._settings.cache_stale_seconds
        return any(r.failing_for(now) > bound for r in self._reflectors)

    def counts(self) -> dict[str, int]:
        """Objects held per kind (for the `cache_objects{kind}` metric)."""
        with self._lock:
            return {r.resource.kind: len(r.cache.items) for r in self._reflectors}

    def before_publish(self, callback: Callable[[Snapshot], None]) -> None:
        """Call `callback(snapshot)` on every new snapshot before the swap makes it the one readers get
        (see Store.before_publish); on the publisher thread, an exception logged like a subscriber's."""
        self._preparers.append(callback)
        current = self._snapshot
        if current is not None:
            self._notify(callback, current)

    def subscribe(self, callback: Callable[[Snapshot], None]) -> None:
        """Call `callback(snapshot)` for every snapshot published from now on.

        Callbacks run on the publisher thread: keep them short and thread-safe. An exception is
        logged and does not stop publishing. If a snapshot exists already, the callback gets it now.
        """
        self._subscribers.append(callback)
        current = self._snapshot
        if current is not None:
            self._notify(callback, current)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every watch and the publisher in background threads; returns immediately."""
        if self._threads:
            raise RuntimeError("WatchStore already started")
        self._published_at = time.monotonic()
        for reflector in self._reflectors:
            name = f"topoguard-watch-{reflector.resource.kind}"
            self._threads.append(threading.Thread(target=reflector.run, args=(self._stop,), name=name, daemon=True))
        self._threads.append(threading.Thread(target=self._publish_loop, name="topoguard-publish", daemon=True))
        for thread in self._threads:
            thread.start()

    async def stop(self) -> None:
        """Stop every watch promptly: cut the open streams and wait (bounded) for the threads."""
        self._stop.set()
        self._changed.set()
        for reflector in self._reflectors:
            reflector.interrupt()
        deadline = time.monotonic() + self._tuning.stop_grace_seconds
        while any(t.is_alive() for t in self._threads) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        lingering = [t.name for t in self._threads if t.is_alive()]
        if lingering:
            log.warning("cache threads still finishing a request after stop: %s", ", ".join(lingering))
        elif self._owns_client:
            self._client.close()  # type: ignore[no-untyped-call]

    # -- publishing ------------------------------------------------------------------------

    def _publish_loop(self) -> None:
        interval = self._tuning.publish_interval_seconds
        while not self._stop.is_set():
            self._changed.wait()
            # Let a burst of events land in the same snapshot; under steady churn, wait at least as long as
            # the last publish took, so publishing takes at most about half a core however large the
            # cluster, and an event is visible within two publishes' time.
            if self._stop.wait(max(interval, self._last_publish_seconds)):
                return
            self._changed.clear()
            try:
                self._publish()
            except Exception:  # publishing must outlive a bad object
                log.exception("building the cluster snapshot failed")

    def observe_publish(self, callback: Callable[[float], None]) -> None:
        """Call `callback(seconds)` after every publish: building the snapshot and running its subscribers."""
        self._publish_observers.append(callback)

    def _publish(self) -> None:
        if not all(r.listed for r in self._reflectors):
            return
        started = time.perf_counter()
        snapshot = self._build()
        for callback in list(self._preparers):
            self._notify(callback, snapshot)
        self._snapshot = snapshot  # the atomic swap readers rely on
        self._published_at = time.monotonic()
        for callback in list(self._subscribers):
            self._notify(callback, snapshot)
        took = self._last_publish_seconds = time.perf_counter() - started
        for observer in list(self._publish_observers):
            try:
                observer(took)
            except Exception:
                log.exception("publish observer %r failed", observer)

    def _build(self) -> Snapshot:
        """A new Snapshot; kinds that did not change since the last one reuse its tuples."""
        copied: dict[str, tuple[KindCache, int, list[tuple[str, Any]] | tuple[Any, ...]]] = {}
        # NB: the copies below are large young containers (under churn: every pod held, the pod index's maps); a
        # young collection that finds them visits each object they hold, scattered over the whole cache (about
        # 9 ms per collection with 100,000 pods, holding the GIL from reviews). So the young generations are
        # collected first, while small, and the copies are frozen as soon as made (as list pages are:
        # reflector.parse_json; app/http/app.py settle_heap bounds what a freeze keeps).
        gc.collect(1)
        with self._lock:  # copy what changed under the lock, sort outside it
            for r in self._reflectors:
                built = self._built.get(r.resource.kind)
                if built is None or built[0] is not r.cache or built[1] != r.cache.generation:
                    # NB: pods are read through their aggregates (models/pods.py), and claims are counted by what
                    # they hold (engine/devices.py), in no order: their values are copied as they are (C speed;
                    # tens of thousands of them on every publish under churn).
                    items: list[tuple[str, Any]] | tuple[Any, ...] = (
                        tuple(r.cache.items.values()) if r.resource.kind in UNORDERED_KINDS
                        else list(r.cache.items.items())
                    )
                    copied[r.resource.kind] = (r.cache, r.cache.generation, items)
            # A job kind whose CRD is absent has no jobs: reported in the status, not as missing input.
            absent = tuple(
                r.resource.kind for r in self._reflectors if r.absent and r.resource.kind not in resources.JOB_KINDS
            )
            # The pods' aggregates at the same moment as the pods copied (models/pods.py).
            pods = next(r.cache for r in self._reflectors if r.resource.kind == "Pod").aggregate.freeze()
        gc.freeze()
        for kind, (cache, generation, items) in copied.items():
            if isinstance(items, list):
                items.sort(key=lambda kv: kv[0])
                items = tuple(v for _, v in items)
            self._built[kind] = (cache, generation, items)
        held = {kind: built[2] for kind, built in self._built.items()}
        config_maps: tuple[Any, ...] = held.get("ConfigMap", ())
        images: tuple[Any, ...] = held.get("DaemonSet", ())
        self._revision += 1
        network = self._network_memo(set(copied), absent, pods)
        combine = functools.partial(self._combine, held)
        return Snapshot(
            nodes=held["Node"],
            namespaces=combine(("Namespace",), lambda parts: MappingProxyType({v.name: v for v in parts[0]})),
            pods=held["Pod"],
            policies=combine(POLICY_KINDS, lambda parts: tuple(p for part in parts for p in part)),
            cidr_groups=combine(("CiliumCIDRGroup",), lambda parts: MappingProxyType({v.name: v for v in parts[0]})),
            revision=f"watch-{self._revision}",
            # A cluster without Kubeflow Trainer has no runtime CRDs; no verdict depends on them.
            missing_kinds=tuple(kind for kind in absent if kind not in UNNEEDED_WHEN_ABSENT),
            training_runtimes=combine(RUNTIME_KINDS, lambda parts: MappingProxyType(
                {(v.kind, v.namespace, v.name): v for part in parts for v in part})),
            jobs=combine(resources.JOB_KINDS, lambda parts: tuple(job for part in parts for job in part)),
            network_memo=network,
            pod_index=pods,
            # The field selectors hold at most one of each (ciliumConfig; None/"" when not read or absent).
            cilium_config=config_maps[0].data if config_maps else None,
            cilium_config_labels=config_maps[0].labels if config_maps else MappingProxyType({}),
            cilium_image=images[0] if images else "",
            device_classes=combine(("DeviceClass",), lambda parts: MappingProxyType({v.name: v for v in parts[0]})),
            resource_slices=held.get("ResourceSlice", ()),
            resource_claims=held.get("ResourceClaim", ()),
            claim_templates=combine(("ResourceClaimTemplate",), lambda parts: MappingProxyType(
                {(v.namespace, v.name): v for v in parts[0]})),
            compute_domains=held.get("ComputeDomain", ()),
        )

    def _combine(self, held: dict[str, tuple[Any, ...]], kinds: tuple[str, ...],
                 make: Callable[[tuple[tuple[Any, ...], ...]], T]) -> T:
        """`make` over the kinds' tuples; the previous snapshot's value when none of them changed, so that
        values derived from it by identity (engine.ledger's stored jobs, say) carry over too."""
        parts = tuple(held.get(kind, ()) for kind in kinds)
        last = self._combined.get(kinds)
        if last is not None and all(map(operator.is_, last[0], parts)):
            return last[1]  # type: ignore[no-any-return]
        value = make(parts)
        self._combined[kinds] = (parts, value)
        return value

    def _network_memo(self, changed: set[str], absent: tuple[str, ...], pods: PodIndex) -> NetworkMemo:
        """The previous snapshot's network memo when this one's network inputs are the same, else a new one.

        Every kind counts as a network input except those listed in NOT_NETWORK_KINDS; of the pods only
        their named ports do (`PodIndex.named_ports`).
        """
        previous = self._snapshot.network_memo if self._snapshot is not None else None
        if previous is None or absent != self._absent or any(k not in NOT_NETWORK_KINDS for k in changed):
            self._absent = absent
            return NetworkMemo(pods.named_ports)
        if pods.named_ports != previous.named_ports:
            return NetworkMemo(pods.named_ports)
        return previous


    @staticmethod
    def _notify(callback: Callable[[Snapshot], None], snapshot: Snapshot) -> None:
        try:
            callback(snapshot)
        except Exception:  # a subscriber must not break the cache
            log.exception("snapshot subscriber %r failed", callback)
