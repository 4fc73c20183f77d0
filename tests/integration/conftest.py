"""Integration fixtures and helpers: the REAL uvicorn server with TLS on 127.0.0.1, in a thread, on a free port.

Servers are bound to a socket we open on port 0 (no port race) and driven through their real TLS
stack with httpx. Certificates are made once per session: ECDSA key generation is cheap, but every
test would otherwise pay it and the test would not be about certificates.
"""

from __future__ import annotations

import base64
import copy
import json
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.cache.store import SyncStatus
from app.http import server as http_server
from app.http.app import TopoguardApp
from app.models.cluster import Snapshot
from app.tls import KeyPair, generate_self_signed, self_signed_context
from tests.builders import match_expression

FIXTURES = Path(__file__).parent / "fixtures"
STARTUP_TIMEOUT_SECONDS = 20.0


@dataclass
class ControlledStore:
    """A Store whose sync state the test sets (implements app.cache.store.Store)."""

    current: Snapshot = field(default_factory=Snapshot)
    synced: bool = False
    stale: bool = False
    detail: dict[str, str] = field(default_factory=lambda: {"Node": "listing", "CiliumNetworkPolicy": "listing"})
    subscribers: list[Callable[[Snapshot], None]] = field(default_factory=list)
    preparers: list[Callable[[Snapshot], None]] = field(default_factory=list)

    def snapshot(self) -> Snapshot:
        return self.current

    def status(self) -> SyncStatus:
        return SyncStatus(synced=self.synced, stale=self.stale, age_seconds=1.5, detail=dict(self.detail))

    def healthy_snapshot(self) -> Snapshot | None:
        return self.current if self.synced and not self.stale else None

    def before_publish(self, callback: Callable[[Snapshot], None]) -> None:
        self.preparers.append(callback)

    def subscribe(self, callback: Callable[[Snapshot], None]) -> None:
        self.subscribers.append(callback)

    def publish(self, snapshot: Snapshot, *, detail: dict[str, str] | None = None) -> None:
        for callback in self.preparers:
            callback(snapshot)
        self.current = snapshot
        self.synced = True
        self.detail = detail or {k: "synced" for k in self.detail}
        for callback in self.subscribers:
            callback(snapshot)


class RunningServer:
    """One server in a background thread; `url` is https://127.0.0.1:PORT.

    Built by `app.http.server.build_server`, the same builder `topoguard serve` uses (protocol,
    limits, drain, TLS options), so the tests exercise what ships; the server's limits come from
    the app's settings.
    """

    def __init__(self, app: TopoguardApp, context: ssl.SSLContext, *, drain_seconds: float = 5.0) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = http_server.build_server(app, context, settings=app.state.settings, port=self.port,
                                               drain_seconds=drain_seconds)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> RunningServer:
        self.thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self, *, drain: bool = False) -> None:
        """Stop the server; without `drain` at once (no idle wait), as most tests do not test it."""
        if not drain:
            self.server.drain_seconds = 0.0
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def client_context(pair: KeyPair) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=pair.cert_pem.decode())
    return ctx


@pytest.fixture(scope="session")
def server_pair() -> KeyPair:
    # Session scope: one certificate serves every server of the run (see the module docstring).
    return generate_self_signed(["topoguard.test.svc"])


@pytest.fixture(scope="session")
def serve(server_pair: KeyPair) -> Iterator[Callable[..., RunningServer]]:
    """Start a server for an app; every server started this way is stopped at the end of the session."""
    started: list[RunningServer] = []

    def start(app: TopoguardApp, context: ssl.SSLContext | None = None, **options: float) -> RunningServer:
        server = RunningServer(app, context or self_signed_context(server_pair), **options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        if server.thread.is_alive():
            server.stop()


def https_client(server: RunningServer, pair: KeyPair, **kwargs: object) -> httpx.Client:
    return httpx.Client(base_url=server.url, verify=client_context(pair), timeout=30, **kwargs)  # type: ignore[arg-type]


# --- AdmissionReviews: builders and checks ---------------------------------------------------

PLURALS = {"PyTorchJob": "pytorchjobs", "TFJob": "tfjobs", "MPIJob": "mpijobs", "XGBoostJob": "xgboostjobs",
           "PaddleJob": "paddlejobs", "JAXJob": "jaxjobs", "JobSet": "jobsets", "TrainJob": "trainjobs"}
SCENARIOS = FIXTURES / "scenarios"


def admission_review(obj: dict[str, Any], *, operation: str = "CREATE", uid: str | None = None) -> dict[str, Any]:
    """An admission.k8s.io/v1 AdmissionReview as the kube-apiserver sends it."""
    group, _, version = obj["apiVersion"].rpartition("/")
    kind = obj["kind"]
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": PLURALS.get(kind, kind.lower() + "s")}
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()), "kind": gvk, "resource": gvr, "requestKind": gvk,
            "requestResource": gvr, "name": meta.get("name", ""), "namespace": meta.get("namespace", "default"),
            "operation": operation, "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": obj, "oldObject": None, "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def load_scenario(name: str) -> dict[str, Any]:
    scenario: dict[str, Any] = yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())
    return scenario


def scenario_objects(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    docs: list[Any] = []
    if "cluster_file" in scenario:
        docs += list(yaml.safe_load_all((SCENARIOS / scenario["cluster_file"]).read_text()))
    docs += scenario.get("cluster") or []
    out: list[dict[str, Any]] = []
    for doc in docs:
        if doc and doc.get("kind") == "List":
            out += doc.get("items") or []
        elif doc:
            out.append(doc)
    return out


def pytorchjob(name: str = "resnet", namespace: str = "ml-demo", *, workers: int = 2) -> dict[str, Any]:
    """A small PyTorchJob: CPU master, GPU workers that tolerate the lab's GPU taint."""
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": {"spec": {"containers": [{"name": "pytorch", "image": "pytorch"}]}}},
            "Worker": {"replicas": workers, "template": {"spec": {
                "tolerations": [{"key": "gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}],
                "containers": [{"name": "pytorch", "image": "pytorch",
                                "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            }}},
        }},
    }


def check_review_envelope(answer: Any, uid: str | None) -> dict[str, Any]:
    """Assert `answer` is a well-formed response AdmissionReview; returns its `response`."""
    assert isinstance(answer, dict)
    assert answer.get("apiVersion") == "admission.k8s.io/v1"
    assert answer.get("kind") == "AdmissionReview"
    response = answer.get("response")
    assert isinstance(response, dict)
    if uid is not None:
        assert response.get("uid") == uid
    assert isinstance(response.get("allowed"), bool)
    if not response["allowed"]:
        status = response.get("status")
        assert isinstance(status, dict) and isinstance(status.get("code"), int) and status.get("message")
        assert "patch" not in response
    if "patch" in response:
        assert response.get("patchType") == "JSONPatch"
        ops = json.loads(base64.b64decode(response["patch"]))
        assert isinstance(ops, list) and all(isinstance(op, dict) and "op" in op and "path" in op for op in ops)
    return response


def patch_ops(response: dict[str, Any]) -> list[dict[str, Any]]:
    if not response.get("patch"):
        return []
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/replace/remove (what the webhook emits), on a copy."""
    out = copy.deepcopy(doc)
    for op in ops:
        tokens = [_unescape(t) for t in op["path"].split("/")[1:]]
        parent: Any = out
        for t in tokens[:-1]:
            parent = parent[int(t)] if isinstance(parent, list) else parent[t]
        last = tokens[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif op["op"] == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise AssertionError(f"unexpected patch op {op['op']}")
    return out


def replica_templates(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = job.get("spec") or {}
    for key, value in spec.items():
        if key.endswith("ReplicaSpecs"):
            return {name: r["template"] for name, r in value.items()}
    return {rj["name"]: rj["template"]["spec"]["template"] for rj in spec.get("replicatedJobs", [])}


def schedulable_zones(pod_spec: dict[str, Any], nodes: list[dict[str, Any]], zone_label: str) -> set[str]:
    """Zones with a node that the template's nodeSelector and required node affinity accept (taints ignored)."""
    zones = set()
    terms = ((((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms"))
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
            continue
        if terms is not None and not any(
            all(match_expression(e, labels) for e in term.get("matchExpressions") or []) for term in terms
        ):
            continue
        if zone_label in labels:
            zones.add(labels[zone_label])
    return zones


# --- /map access -------------------------------------------------------------------------------

MAP_TOKEN = "map-reader-token"


@dataclass
class FakeAccessReviewer:
    """An app.cache.access.AccessReviewer answering from a table of token -> Access; counts its calls."""

    answers: dict[str, Any] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)

    def review(self, token: str, *, verb: str, path: str) -> Any:
        from app.cache.access import Access

        self.calls.append((token, verb, path))
        return self.answers.get(token, Access("unauthenticated", reason="token not known"))


def map_reader() -> FakeAccessReviewer:
    """A reviewer that lets MAP_TOKEN (user `alice`) read and post to /map."""
    from app.cache.access import Access

    return FakeAccessReviewer({MAP_TOKEN: Access("allowed", user="alice")})
