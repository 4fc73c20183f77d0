"""A fake Kubernetes API server for tests: real HTTP on 127.0.0.1, the real list/watch protocol.

What it speaks (JSON shapes as the kube-apiserver sends them):
  * `GET <collection>` → `<Kind>List` with `metadata.resourceVersion`; `limit` + `continue` paginate
    over a consistent snapshot; items of built-in kinds carry no kind/apiVersion (as upstream).
  * `GET <collection>?watch=1&resourceVersion=N&allowWatchBookmarks=true&timeoutSeconds=T` → a
    chunked stream of newline-delimited `{"type": ..., "object": ...}` events after N (no N or
    "0": synthetic ADDED events for the current state first). `fieldSelector` (`a=b`, `a!=b`,
    comma = AND) filters lists and watches; an object leaving the selector is sent as DELETED.
  * A compacted resourceVersion: watch → 200 + ERROR event with a 410 `Status`; list with that
    resourceVersion or an old continue token → HTTP 410.
  * Collections of CRDs that are not installed → 404 `Status`, like a missing API group.
  * `/version`, `/api`, `/apis` and `/apis/<group>/<version>` discovery documents.
  * Writes, as the controller makes them (Leases, Events, PolicyReports, and any other kind):
    `GET`/`POST` on a namespaced collection (`.../namespaces/<ns>/<plural>`, with `labelSelector`
    `k=v` terms on lists), `GET`/`PUT`/`PATCH` (JSON merge patch, RFC 7386)/`DELETE` on an object.
    POST of an existing name is 409 AlreadyExists; PUT with a stale `metadata.resourceVersion` is 409
    Conflict; a missing object is 404; an events.k8s.io/v1 Event whose `series` lacks count >= 2 or
    lastObservedTime is 422 Invalid, as the apiserver validates it. `writes(kind)` lists the writes.

What a test controls: `apply`/`delete` objects, `compact()`, `bookmark()`, `drop_watches()`
(connection cut mid-stream, no chunked terminator), `fail(...)` (inject HTTP errors),
`watch_error()` (an ERROR event with a Status code ends the stream), `install_cilium` /
`uninstall_cilium`, `stop()` (connection refused afterwards); it can read `requests` (every
request: path, query, Authorization header), `open_watches()` and `bookmarks_sent`.
`running_store(api, tmp_path)` runs a WatchStore against it with fast test timings.

    with FakeApiServer() as api:
        api.apply(make_node("gpu-a-1", zone="a", gpus=8))
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")

Also usable by other tests (e.g. server readiness against a cache that cannot sync).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from app.cache.reflector import WatchTuning
from app.cache.watchers import WatchStore
from app.config import Settings

TOKEN = "fake-token"
# Timings for WatchStore in tests: fast retries and publishes, watches that outlive any test.
FAST_TUNING = WatchTuning(
    backoff_initial_seconds=0.02, backoff_max_seconds=0.1, absent_retry_seconds=0.1,
    publish_interval_seconds=0.02, watch_timeout_seconds=300, connect_timeout_seconds=2.0,
    read_timeout_seconds=10.0,
)
REASONS = {
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


@dataclass
class Collection:
    """One served resource (one apiVersion of one kind)."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool
    builtin: bool
    installed: bool = True
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    # (resourceVersion, old object or None, new object or None); kept until compact()
    history: list[tuple[int, dict[str, Any] | None, dict[str, Any] | None]] = field(default_factory=list)

    @property
    def path(self) -> str:
        prefix = "/api/" if "/" not in self.api_version else "/apis/"
        return f"{prefix}{self.api_version}/{self.plural}"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    authorization: str

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("1", "true")


@dataclass
class Failure:
    status: int
    path: str | None  # None: every collection
    watch: bool | None  # None: lists and watches
    times: int | None  # None: until clear_failures()
    methods: tuple[str, ...] = ("GET",)

    def matches(self, path: str, watch: bool, method: str) -> bool:
        return self.path in (None, path) and self.watch in (None, watch) and method in self.methods


@dataclass
class _Watch:
    collection: Collection
    bookmarks: bool
    sock: socket.socket
    bookmark_pending: bool = False
    dropped: bool = False
    error: dict[str, Any] | None = None  # a Status to send as an ERROR event, ending the stream


def _collections() -> list[Collection]:
    return [
        Collection("v1", "Node", "nodes", namespaced=False, builtin=True),
        Collection("v1", "Namespace", "namespaces", namespaced=False, builtin=True),
        Collection("v1", "Pod", "pods", namespaced=True, builtin=True),
        Collection("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", namespaced=True, builtin=True),
        Collection("cilium.io/v2", "CiliumNetworkPolicy", "ciliumnetworkpolicies", namespaced=True, builtin=False),
        Collection(
            "cilium.io/v2", "CiliumClusterwideNetworkPolicy", "ciliumclusterwidenetworkpolicies",
            namespaced=False, builtin=False,
        ),
        Collection("cilium.io/v2", "CiliumCIDRGroup", "ciliumcidrgroups", namespaced=False, builtin=False),
        Collection("cilium.io/v2alpha1", "CiliumCIDRGroup", "ciliumcidrgroups", namespaced=False, builtin=False),
        Collection("policy.networking.k8s.io/v1alpha2", "ClusterNetworkPolicy", "clusternetworkpolicies",
                   namespaced=False, builtin=False),
        # The Cilium agent's settings and version (read in one namespace, by name).
        Collection("v1", "ConfigMap", "configmaps", namespaced=True, builtin=True),
        Collection("apps/v1", "DaemonSet", "daemonsets", namespaced=True, builtin=True),
        Collection(
            "trainer.kubeflow.org/v1alpha1", "TrainingRuntime", "trainingruntimes", namespaced=True, builtin=False
        ),
        Collection(
            "trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime", "clustertrainingruntimes",
            namespaced=False, builtin=False,
        ),
        # The training jobs (the reservation ledger): CRDs, served like the cluster's operators serve them.
        *(
            Collection(api_version, kind, plural, namespaced=True, builtin=False)
            for api_version, kind, plural in (
                ("kubeflow.org/v1", "PyTorchJob", "pytorchjobs"),
                ("kubeflow.org/v1", "TFJob", "tfjobs"),
                ("kubeflow.org/v2beta1", "MPIJob", "mpijobs"),
                ("kubeflow.org/v1", "XGBoostJob", "xgboostjobs"),
                ("kubeflow.org/v1", "PaddleJob", "paddlejobs"),
                ("kubeflow.org/v1", "JAXJob", "jaxjobs"),
                ("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets"),
                ("trainer.kubeflow.org/v1alpha1", "TrainJob", "trainjobs"),
            )
        ),
        # Dynamic Resource Allocation (built in since 1.34) and NVIDIA's ComputeDomain CRD.
        Collection("resource.k8s.io/v1", "DeviceClass", "deviceclasses", namespaced=False, builtin=True),
        Collection("resource.k8s.io/v1", "ResourceSlice", "resourceslices", namespaced=False, builtin=True),
        Collection("resource.k8s.io/v1", "ResourceClaim", "resourceclaims", namespaced=True, builtin=True),
        Collection("resource.k8s.io/v1", "ResourceClaimTemplate", "resourceclaimtemplates", namespaced=True,
                   builtin=True),
        Collection("resource.nvidia.com/v1beta1", "ComputeDomain", "computedomains", namespaced=True, builtin=False),
        # What the audit controller writes.
        Collection("coordination.k8s.io/v1", "Lease", "leases", namespaced=True, builtin=True),
        Collection("events.k8s.io/v1", "Event", "events", namespaced=True, builtin=True),
        Collection("wgpolicyk8s.io/v1alpha2", "PolicyReport", "policyreports", namespaced=True, builtin=False,
                   installed=False),
    ]


def _field(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def matches_field_selector(obj: Mapping[str, Any], selector: str) -> bool:
    """`a=b`, `a==b`, `a!=b` terms joined by commas (AND), as the apiserver reads fieldSelector."""
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if _field(obj, key) == value:
                return False
        else:
            key, value = term.replace("==", "=").split("=", 1)
            if _field(obj, key) != value:
                return False
    return True


def matches_label_selector(obj: Mapping[str, Any], selector: str) -> bool:
    """`k=v` terms joined by commas (AND); the only form the tests' clients send."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.replace("==", "=").partition("=")
        if labels.get(key) != value:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def validate(coll: Collection, obj: Mapping[str, Any]) -> str:
    """What the apiserver's validation would refuse ("" when nothing), for the kinds tests write."""
    if not (obj.get("metadata") or {}).get("name"):
        return "metadata.name: Required value"
    if coll.kind == "Event" and coll.api_version == "events.k8s.io/v1":
        for required in ("eventTime", "reportingController", "reportingInstance", "action", "reason", "regarding"):
            if not obj.get(required):
                return f"{required}: Required value"
        series = obj.get("series")
        if series is not None:
            count = series.get("count") if isinstance(series, dict) else None
            if not isinstance(count, int) or count < 2:
                return "series.count: Invalid value: should be at least 2"
            if not series.get("lastObservedTime"):
                return "series.lastObservedTime: Required value"
        if len(str(obj.get("note", "")).encode()) > 1024:
            return "note: Too long: may not be more than 1024 bytes"
    return ""


def status(code: int, message: str, reason: str = "") -> dict[str, Any]:
    return {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason or REASONS.get(code, "Unknown"), "code": code,
    }


class FakeApiServer:
    """See the module docstring. Thread-safe; every mutation wakes the open watches."""

    def __init__(self, *, cilium: bool = True, cidr_group_versions: tuple[str, ...] = ("v2",)) -> None:
        self._cond = threading.Condition()
        self._rv = 100
        self._compacted = 0
        self._collections = _collections()
        self._watches: list[_Watch] = []
        self._continues: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        self._failures: list[Failure] = []
        self._sockets: set[socket.socket] = set()
        self._stopping = False
        self.requests: list[Request] = []
        self.write_log: list[tuple[str, str, str, str]] = []  # (method, kind, namespace, name) of each accepted write
        self.bookmarks_sent = 0
        if cilium:
            self.install_cilium(cidr_group_versions)
        else:
            self.uninstall_cilium()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.fake = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="fakeapi", daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: new connections are refused and open ones (watches included) are cut."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()
        for sock in list(self._sockets):
            _shutdown(sock)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def write_kubeconfig(self, path: Path, *, token: str = TOKEN) -> Path:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # -- state -------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def _collection(self, api_version: str, kind: str) -> Collection:
        for c in self._collections:
            if c.api_version == api_version and c.kind == kind:
                return c
        raise KeyError(f"fake apiserver does not serve {api_version} {kind}")

    @staticmethod
    def _key(obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata", {})
        return f"{meta.get('namespace', '')}/{meta['name']}"

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace an object (by apiVersion, kind, namespace, name); returns the stored copy."""
        with self._cond:
            coll = self._collection(str(obj["apiVersion"]), str(obj["kind"]))
            new = copy.deepcopy(dict(obj))
            meta = new.setdefault("metadata", {})
            if coll.namespaced:
                meta.setdefault("namespace", "default")
            return self._commit(coll, new)

    def _commit(self, coll: Collection, new: dict[str, Any]) -> dict[str, Any]:
        """Store `new` (create or replace) under the lock: a new resourceVersion, uid kept, watches woken."""
        meta = new["metadata"]
        key = self._key(new)
        old = coll.objects.get(key)
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        coll.objects[key] = new
        coll.history.append((self._rv, old, new))
        self._cond.notify_all()
        return copy.deepcopy(new)

    def delete(self, kind: str, name: str, namespace: str = "", *, api_version: str | None = None) -> None:
        with self._cond:
            key = f"{namespace}/{name}"
            found = [c for c in self._collections
                     if c.kind == kind and api_version in (None, c.api_version) and key in c.objects]
            if not found:
                raise KeyError(f"fake apiserver has no {kind} {key}")
            coll = found[0]
            old = coll.objects.pop(key)
            self._rv += 1
            coll.history.append((self._rv, old, None))
            self._cond.notify_all()

    def install_policy_reports(self, installed: bool = True) -> None:
        """Serve (or stop serving) the wgpolicyk8s.io/v1alpha2 PolicyReport CRD."""
        with self._cond:
            coll = self._collection("wgpolicyk8s.io/v1alpha2", "PolicyReport")
            coll.installed = installed
            if not installed:
                coll.objects.clear()

    def get(self, kind: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        with self._cond:
            for c in self._collections:
                if c.kind == kind and f"{namespace}/{name}" in c.objects:
                    return copy.deepcopy(c.objects[f"{namespace}/{name}"])
            return None

    def writes(self, kind: str | None = None, method: str | None = None) -> list[tuple[str, str, str, str]]:
        """The accepted writes (method, kind, namespace, name), oldest first."""
        return [w for w in list(self.write_log) if kind in (None, w[1]) and method in (None, w[0])]

    def objects(self, kind: str) -> list[dict[str, Any]]:
        with self._cond:
            return [copy.deepcopy(o) for c in self._collections if c.kind == kind for o in c.objects.values()]

    def compact(self) -> int:
        """Forget history up to now (like etcd compaction); older resourceVersions answer 410."""
        with self._cond:
            self._compacted = self._rv
            for c in self._collections:
                c.history.clear()
            self._continues.clear()
            return self._compacted

    def install_cilium(self, cidr_group_versions: tuple[str, ...] = ("v2",)) -> None:
        with self._cond:
            for c in self._collections:
                if c.api_version.startswith("cilium.io/"):
                    version = c.api_version.split("/")[1]
                    c.installed = c.kind != "CiliumCIDRGroup" or version in cidr_group_versions

    def uninstall_cilium(self) -> None:
        with self._cond:
            for c in self._collections:
                if c.api_version.startswith("cilium.io/"):
                    c.installed = False
                    c.objects.clear()
            self._drop(lambda w: w.collection.api_version.startswith("cilium.io/"))

    # -- fault injection -----------------------------------------------------------------------

    def fail(self, kind: str | None = None, *, status: int = 500, watch: bool | None = None,
             times: int | None = None, methods: tuple[str, ...] = ("GET",)) -> None:
        """Answer matching requests with HTTP `status` (a Status body), `times` times or until cleared
        (`methods`: which HTTP methods; the collection's lists and watches, or its objects' writes)."""
        with self._cond:
            paths = [c.path for c in self._collections if c.kind == kind] if kind else [None]
            for path in paths:
                self._failures.append(Failure(status, path, watch, times, methods))

    def clear_failures(self) -> None:
        with self._cond:
            self._failures.clear()

    def watch_error(self, kind: str | None = None, *, code: int = 500) -> int:
        """End open watches with an ERROR event carrying a Status `code`; returns how many."""
        with self._cond:
            hit = [w for w in self._watches if kind in (None, w.collection.kind) and not w.dropped]
            for w in hit:
                w.error = status(code, f"injected watch error {code}")
            self._cond.notify_all()
            return len(hit)

    def bookmark(self, kind: str | None = None) -> None:
        """Send a BOOKMARK (at the current resourceVersion) on the open watches that asked for them."""
        with self._cond:
            for w in self._watches:
                if kind in (None, w.collection.kind):
                    w.bookmark_pending = True
            self._cond.notify_all()

    def drop_watches(self, kind: str | None = None) -> int:
        """Cut open watch connections mid-stream (no chunked terminator); returns how many."""
        with self._cond:
            return self._drop(lambda w: kind in (None, w.collection.kind))

    def _drop(self, which: Any) -> int:
        dropped = [w for w in self._watches if which(w)]
        for w in dropped:
            w.dropped = True
            _shutdown(w.sock)
        self._cond.notify_all()
        return len(dropped)

    def open_watches(self, kind: str | None = None) -> int:
        with self._cond:
            return sum(1 for w in self._watches if kind in (None, w.collection.kind) and not w.dropped)

    def requests_for(self, kind: str, *, watch: bool | None = None) -> list[Request]:
        paths = {c.path for c in self._collections if c.kind == kind}
        return [r for r in list(self.requests) if r.path in paths and watch in (None, r.watch)]

    # -- serving (called from handler threads) -------------------------------------------------

    def _failure_for(self, path: str, watch: bool, method: str = "GET") -> int | None:
        with self._cond:
            for f in self._failures:
                if f.matches(path, watch, method):
                    if f.times is not None:
                        f.times -= 1
                        if f.times <= 0:
                            self._failures.remove(f)
                    return f.status
        return None

    def _failing(self, path: str, *, watch: bool, method: str = "GET") -> bool:
        """Whether a failure until cleared matches (no count consumed; the caller holds the lock)."""
        return any(f.times is None and f.matches(path, watch, method) for f in self._failures)

    def _find(self, path: str) -> Collection | None:
        for c in self._collections:
            if c.path == path and c.installed:
                return c
        return None

    def route(self, path: str) -> tuple[Collection, str, str] | None:
        """(collection, namespace, name) of a collection or object URL; None when nothing installed serves it.

        `/api/v1/namespaces/<name>` is the Namespace object; `.../namespaces/<ns>/<plural>[/<name>]` a
        namespaced collection or object; `<prefix>/<plural>[/<name>]` a cluster-wide one.
        """
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "v1"]:
            api_version, rest = "v1", parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            api_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            return None
        served = {c.plural: c for c in self._collections if c.api_version == api_version and c.installed}
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] in served and served[rest[2]].namespaced:
            if len(rest) > 4:
                return None
            return served[rest[2]], rest[1], rest[3] if len(rest) == 4 else ""
        if not rest or rest[0] not in served or len(rest) > 2:
            return None
        return served[rest[0]], "", rest[1] if len(rest) == 2 else ""

    def discovery(self, api_version: str) -> dict[str, Any] | None:
        """The APIResourceList of one group version, or None when nothing installed is served there."""
        with self._cond:
            served = [c for c in self._collections if c.api_version == api_version and c.installed]
        if not served:
            return None
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": api_version, "resources": [
            {"name": c.plural, "singularName": c.kind.lower(), "namespaced": c.namespaced, "kind": c.kind,
             "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]} for c in served]}

    def read(self, coll: Collection, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        with self._cond:
            obj = coll.objects.get(f"{namespace}/{name}")
            if obj is None:
                return 404, status(404, f'{coll.plural} "{name}" not found', "NotFound")
            return 200, self._visible(coll, obj, listed=False)

    def write(self, method: str, coll: Collection, namespace: str, name: str,
              body: Any) -> tuple[int, dict[str, Any]]:
        """One POST / PUT / PATCH (merge) / DELETE, with the apiserver's answers (module docstring)."""
        with self._cond:
            if method == "POST":
                if name or not isinstance(body, dict):
                    return 405, status(405, "the server does not allow this method on the requested resource")
                new = copy.deepcopy(body)
                meta = new.setdefault("metadata", {})
                name = str(meta.get("name", ""))
                if coll.namespaced:
                    if meta.get("namespace", namespace) != namespace:
                        return 400, status(400, "the namespace of the provided object does not match the request")
                    meta["namespace"] = namespace
                if f"{namespace}/{name}" in coll.objects:
                    return 409, status(409, f'{coll.plural} "{name}" already exists', "AlreadyExists")
                for key in ("resourceVersion", "uid"):
                    meta.pop(key, None)
            else:
                old = coll.objects.get(f"{namespace}/{name}")
                if not name:
                    return 405, status(405, "the server does not allow this method on the requested resource")
                if old is None:
                    return 404, status(404, f'{coll.plural} "{name}" not found', "NotFound")
                if method == "DELETE":
                    del coll.objects[f"{namespace}/{name}"]
                    self._rv += 1
                    coll.history.append((self._rv, old, None))
                    self._cond.notify_all()
                    self.write_log.append((method, coll.kind, namespace, name))
                    return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}
                if not isinstance(body, dict):
                    return 400, status(400, "the body is not a JSON object")
                if method == "PATCH":
                    new = merge_patch(old, body)
                else:
                    new = copy.deepcopy(body)
                    asked = str((new.get("metadata") or {}).get("resourceVersion", ""))
                    if asked and asked != old["metadata"]["resourceVersion"]:
                        return 409, status(409, f'Operation cannot be fulfilled on {coll.plural} "{name}": the '
                                                "object has been modified; please apply your changes to the latest "
                                                "version and try again", "Conflict")
                meta = new.setdefault("metadata", {})
                meta["name"], meta["uid"] = name, old["metadata"]["uid"]
                meta["creationTimestamp"] = old["metadata"].get("creationTimestamp")
                if coll.namespaced:
                    meta["namespace"] = namespace
            new.pop("kind", None)
            new.pop("apiVersion", None)
            new = {"apiVersion": coll.api_version, "kind": coll.kind, **new}
            problem = validate(coll, new)
            if problem:
                return 422, status(422, f'{coll.kind} "{name}" is invalid: {problem}', "Invalid")
            stored = self._commit(coll, new)
            self.write_log.append((method, coll.kind, namespace, name))
            return (201 if method == "POST" else 200), stored

    def _visible(self, coll: Collection, obj: dict[str, Any], *, listed: bool) -> dict[str, Any]:
        out = copy.deepcopy(obj)
        if listed and coll.builtin:
            return out  # NB: upstream omits kind/apiVersion on items of built-in lists
        return {"kind": coll.kind, "apiVersion": coll.api_version, **out}

    def list_body(self, coll: Collection, query: dict[str, str], namespace: str = "") -> tuple[int, dict[str, Any]]:
        selector = query.get("fieldSelector", "")
        labels = query.get("labelSelector", "")
        limit = int(query.get("limit") or 0)
        with self._cond:
            token = query.get("continue")
            if token:
                if token not in self._continues:
                    return 410, status(410, "The provided continue parameter is too old to display a consistent "
                                            "list result. You can start a new list without the continue parameter.")
                rv, items = self._continues.pop(token)
            else:
                asked = query.get("resourceVersion", "")
                if asked not in ("", "0") and int(asked) < self._compacted:
                    return 410, status(410, f"too old resource version: {asked} ({self._compacted})")
                rv = self._rv
                items = [self._visible(coll, o, listed=True) for _, o in sorted(coll.objects.items())
                         if matches_field_selector(o, selector) and matches_label_selector(o, labels)
                         and namespace in ("", o["metadata"].get("namespace"))]
            meta: dict[str, Any] = {"resourceVersion": str(rv)}
            if limit and len(items) > limit:
                items, rest = items[:limit], items[limit:]
                next_token = base64.b64encode(f"{rv}:{uuid.uuid4()}".encode()).decode()
                self._continues[next_token] = (rv, rest)
                meta["continue"] = next_token
        return 200, {"kind": f"{coll.kind}List", "apiVersion": coll.api_version, "metadata": meta, "items": items}

    def watch_events(self, coll: Collection, query: dict[str, str], sock: socket.socket) -> Iterator[dict[str, Any]]:
        """Events for one watch request, until timeoutSeconds, a drop, or stop()."""
        selector = query.get("fieldSelector", "")
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        asked = query.get("resourceVersion", "")
        watch = _Watch(coll, query.get("allowWatchBookmarks") == "true", sock)
        with self._cond:
            if asked not in ("", "0") and int(asked) < self._compacted:
                yield {"type": "ERROR", "object": status(410, f"too old resource version: {asked} ({self._compacted})")}
                return
            if asked in ("", "0"):
                position = self._rv
                initial = [o for _, o in sorted(coll.objects.items()) if matches_field_selector(o, selector)]
            else:
                position, initial = int(asked), []
            if not coll.installed or self._failing(coll.path, watch=True):
                # The CRD went away or the outage began after this request was routed, before it got here: it
                # is cut like the watches open then (drop_watches/uninstall hold the same lock).
                raise ConnectionAbortedError("dropped")
            self._watches.append(watch)
        try:
            for obj in initial:
                yield {"type": "ADDED", "object": self._visible(coll, obj, listed=False)}
            while True:
                with self._cond:
                    events: list[dict[str, Any]] = []
                    while True:
                        if self._stopping or watch.dropped:
                            raise ConnectionAbortedError("dropped")
                        if watch.error is not None:
                            break
                        events = list(self._events(coll, position, selector))
                        if events or watch.bookmark_pending or time.monotonic() >= deadline:
                            break
                        self._cond.wait(min(0.2, max(deadline - time.monotonic(), 0.001)))
                    error, watch.error = watch.error, None
                    if error is not None:
                        events = []
                    if events:
                        position = max(e[0] for e in events)
                    bookmark = watch.bookmark_pending and watch.bookmarks and not events
                    if bookmark:
                        watch.bookmark_pending = False
                        position = max(position, self._rv)
                    current = self._rv
                if error is not None:
                    yield {"type": "ERROR", "object": error}
                    return
                for _, event in events:
                    yield event
                if bookmark:
                    self.bookmarks_sent += 1
                    yield {"type": "BOOKMARK", "object": {"kind": coll.kind, "apiVersion": coll.api_version,
                                                           "metadata": {"resourceVersion": str(current)}}}
                if not events and not bookmark:
                    if watch.bookmark_pending:  # asked for, but this watch did not allow bookmarks
                        watch.bookmark_pending = False
                        continue
                    return  # timeoutSeconds elapsed: a clean end of the stream
        finally:
            with self._cond:
                if watch in self._watches:
                    self._watches.remove(watch)

    def _events(self, coll: Collection, after: int, selector: str) -> Iterator[tuple[int, dict[str, Any]]]:
        for rv, old, new in coll.history:
            if rv <= after:
                continue
            was = old is not None and matches_field_selector(old, selector)
            if new is not None and matches_field_selector(new, selector):
                yield rv, {"type": "MODIFIED" if was else "ADDED", "object": self._visible(coll, new, listed=False)}
            elif was:
                gone = copy.deepcopy(new if new is not None else old) or {}
                gone["metadata"]["resourceVersion"] = str(rv)
                yield rv, {"type": "DELETED", "object": self._visible(coll, gone, listed=False)}


def wait_until(predicate: Callable[[], Any], *, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `predicate()` until it is true; tests use this instead of sleeping."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


@contextlib.contextmanager
def running_store(
    api: FakeApiServer,
    tmp_path: Path,
    *,
    settings: Settings | None = None,
    tuning: WatchTuning | None = None,
    wait_synced: bool = True,
) -> Iterator[WatchStore]:
    """A started app.cache.watchers.WatchStore pointed at `api` (fast test timings); stopped on exit."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    store = WatchStore(settings or Settings(), kubeconfig=str(kubeconfig), tuning=tuning or FAST_TUNING)
    asyncio.run(store.start())
    try:
        if wait_synced:
            wait_until(lambda: store.status().synced, what="the cache to sync")
        yield store
    finally:
        asyncio.run(store.stop())


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default backlog of 5 drops SYNs when every watch connects at once
    allow_reuse_address = True
    fake: FakeApiServer

    def process_request(self, request: Any, client_address: Any) -> None:
        self.fake._sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.fake._sockets.discard(request)
        super().shutdown_request(request)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # stdlib signature
        pass

    def setup(self) -> None:
        super().setup()
        # A response is two writes (head, then body): with Nagle on, the body waits for the client's
        # delayed ACK of the head, 40 ms per request. The apiserver (Go) sets TCP_NODELAY too.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self) -> None:  # stdlib naming
        fake = self.server.fake
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        request = Request("GET", url.path, query, self.headers.get("Authorization", ""))
        fake.requests.append(request)
        if request.authorization != f"Bearer {TOKEN}":
            return self._json(401, status(401, "Unauthorized"))
        if url.path == "/version":
            return self._json(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake"})
        if url.path == "/api":
            return self._json(200, {"kind": "APIVersions", "versions": ["v1"]})
        if url.path == "/apis":
            return self._json(200, self._groups())
        parts = url.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "apis":
            found = fake.discovery(f"{parts[1]}/{parts[2]}")
            if found is None:
                return self._json(404, status(404, "the server could not find the requested resource"))
            return self._json(200, found)
        routed = fake.route(url.path)
        injected = fake._failure_for(routed[0].path if routed else url.path, request.watch)
        if injected is not None:
            return self._json(injected, status(injected, f"injected failure {injected}"))
        if routed is None:
            return self._json(404, status(404, "the server could not find the requested resource"))
        coll, namespace, name = routed
        if name:
            return self._json(*fake.read(coll, namespace, name))
        if not request.watch:
            return self._json(*fake.list_body(coll, query, namespace))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if namespace:  # a namespaced watch sees that namespace only
            scoped = ",".join(filter(None, (query.get("fieldSelector"), f"metadata.namespace={namespace}")))
            query = {**query, "fieldSelector": scoped}
        try:
            for event in fake.watch_events(coll, query, self.connection):
                self._chunk(json.dumps(event).encode() + b"\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (ConnectionAbortedError, OSError):
            self.close_connection = True

    def _write(self, method: str) -> None:
        fake = self.server.fake
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        request = Request(method, url.path, query, self.headers.get("Authorization", ""))
        fake.requests.append(request)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if request.authorization != f"Bearer {TOKEN}":
            return self._json(401, status(401, "Unauthorized"))
        routed = fake.route(url.path)
        if routed is None:
            return self._json(404, status(404, "the server could not find the requested resource"))
        coll, namespace, name = routed
        injected = fake._failure_for(coll.path, False, method)
        if injected is not None:
            return self._json(injected, status(injected, f"injected failure {injected}"))
        if method == "PATCH" and self.headers.get("Content-Type") != "application/merge-patch+json":
            return self._json(415, status(415, "the fake apiserver takes merge patches only"))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return self._json(400, status(400, "the body is not JSON"))
        self._json(*fake.write(method, coll, namespace, name, body))

    def do_POST(self) -> None:  # stdlib naming
        self._write("POST")

    def do_PUT(self) -> None:  # stdlib naming
        self._write("PUT")

    def do_PATCH(self) -> None:  # stdlib naming
        self._write("PATCH")

    def do_DELETE(self) -> None:  # stdlib naming
        self._write("DELETE")

    def _groups(self) -> dict[str, Any]:
        fake = self.server.fake
        groups: dict[str, list[str]] = {}
        for c in fake._collections:
            if "/" in c.api_version and c.installed:
                group, version = c.api_version.split("/")
                groups.setdefault(group, [])
                if version not in groups[group]:
                    groups[group].append(version)
        return {
            "kind": "APIGroupList", "apiVersion": "v1",
            "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in groups.items()
            ],
        }


# -- raw object builders (the shapes `kubectl get -o json` prints) ------------------------------


def make_node(name: str, *, zone: str = "a", gpus: int = 8, ready: bool = True,
              labels: Mapping[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone, **(labels or {})},
                     "managedFields": [{"manager": "kubelet"}]},
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def make_namespace(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **(labels or {})}}}


def make_pod(name: str, *, namespace: str = "train", node: str = "gpu-a-1", gpus: int = 1,
             phase: str = "Running", labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {"requests": {"cpu": "1"}}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "trainer", "resources": resources}]},
        "status": {"phase": phase, "podIP": "10.0.0.1"},
    }


def make_cnp(name: str, *, namespace: str = "train", zone: str = "a") -> dict[str, Any]:
    return {
        "apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"endpointSelector": {"matchLabels": {"zone": zone}},
                 "ingress": [{"fromEndpoints": [{"matchLabels": {"zone": zone}}]}]},
        "status": {"conditions": [{"type": "Valid", "status": "True"}]},
    }


def make_ccnp(name: str) -> dict[str, Any]:
    return {"apiVersion": "cilium.io/v2", "kind": "CiliumClusterwideNetworkPolicy",
            "metadata": {"name": name}, "spec": {"endpointSelector": {}, "egress": [{"toEntities": ["cluster"]}]}}


def make_runtime(name: str, *, namespace: str = "") -> dict[str, Any]:
    """A (Cluster)TrainingRuntime (namespace "" for the cluster-scoped kind) with one `node` job."""
    kind = "TrainingRuntime" if namespace else "ClusterTrainingRuntime"
    pod = {"spec": {"containers": [{"name": "node", "image": "pytorch"}],
                    "tolerations": [{"key": "pool", "operator": "Exists", "effect": "NoSchedule"}]}}
    ancestor = {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    rjob = {"name": "node", "template": {"metadata": {"labels": ancestor}, "spec": {"template": pod}}}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": kind,
            "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [rjob]}}}}


def make_knp(name: str, *, namespace: str = "train") -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}


def make_cidr_group(name: str, *cidrs: str, api_version: str = "cilium.io/v2") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "CiliumCIDRGroup",
            "metadata": {"name": name}, "spec": {"externalCIDRs": list(cidrs)}}

