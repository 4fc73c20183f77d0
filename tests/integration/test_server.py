"""The real server (uvicorn + TLS on 127.0.0.1): bad input, errors, deadline, readiness, metrics.

Each module-scoped server is started once (starting uvicorn costs far more than one request) and
serves every test of its group; tests only send requests, they never change the server's state,
except the readiness test, which owns its server.
"""

from __future__ import annotations

import gc
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app import cli, policy
from app.cache.files import build_snapshot, load_snapshot
from app.cache.store import StaticStore, SyncStatus
from app.config import Settings, load_settings
from app.engine import cached
from app.http.app import create_app, settle_heap
from app.models.cluster import Snapshot
from app.tls import KeyPair
from tests.integration.conftest import (
    MAP_TOKEN,
    ControlledStore,
    RunningServer,
    admission_review,
    check_review_envelope,
    client_context,
    https_client,
    load_scenario,
    map_reader,
    pytorchjob,
    scenario_objects,
)

BODY_LIMIT_BYTES = 64 * 1024
DATA = Path(__file__).resolve().parents[1] / "data"
LAB = DATA / "clusters" / "lab.yaml"
LAB_CONFIG = DATA / "clusters" / "lab-config.yaml"
LAB_REVIEW = DATA / "reviews" / "lab-pytorchjob-create.json"


@pytest.fixture(scope="module")
def lab_snapshot() -> Snapshot:
    return build_snapshot(scenario_objects(load_scenario("lab-pytorchjob-managed-zone-label")))


@pytest.fixture(scope="module")
def lab_server(serve: Callable[..., RunningServer], lab_snapshot: Snapshot) -> RunningServer:
    settings = Settings(zone_identity_label="zone", max_body_bytes=BODY_LIMIT_BYTES)
    return serve(create_app(settings, StaticStore(lab_snapshot)))


@pytest.fixture(scope="module")
def client(lab_server: RunningServer, server_pair: KeyPair) -> Iterator[httpx.Client]:
    with https_client(lab_server, server_pair) as c:
        yield c


@pytest.fixture(scope="module")
def map_client(
    serve: Callable[..., RunningServer], lab_snapshot: Snapshot, server_pair: KeyPair
) -> Iterator[httpx.Client]:
    """The lab server with `mapAccess: authorized`, and a client holding a token allowed to read the map."""
    settings = Settings(zone_identity_label="zone", max_body_bytes=BODY_LIMIT_BYTES, map_access="authorized")
    server = serve(create_app(settings, StaticStore(lab_snapshot), map_reviewer=map_reader()))
    with https_client(server, server_pair, headers={"authorization": f"Bearer {MAP_TOKEN}"}) as c:
        yield c


def post_raw(
    client: httpx.Client, path: str, body: bytes, content_type: str | None = "application/json"
) -> httpx.Response:
    headers = {"content-type": content_type} if content_type else {}
    return client.post(path, content=body, headers=headers)


def review_bytes(**changes: Any) -> bytes:
    review = admission_review(pytorchjob())
    for key, value in changes.items():
        if value is _DELETE:
            review["request"].pop(key, None)
        else:
            review["request"][key] = value
    return orjson.dumps(review)


_DELETE = object()


@pytest.mark.parametrize(
    "path, body, content_type, status, error",
    [
        pytest.param("/mutate", b"{", "application/json", 400, "not valid JSON", id="invalid JSON is a 400"),
        pytest.param("/mutate", b"[1, 2]", "application/json", 400, "got array", id="a JSON array is a 400"),
        pytest.param("/validate", orjson.dumps({"apiVersion": "v1", "kind": "Pod"}), "application/json", 400,
                     "apiVersion must be", id="not an AdmissionReview is a 400"),
        pytest.param("/mutate", orjson.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
                                              "request": {}}), "application/json", 400, "apiVersion must be",
                     id="v1beta1 reviews are a 400"),
        pytest.param("/mutate", orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
                     "application/json", 400, "request is missing", id="missing request is a 400"),
        pytest.param("/mutate", review_bytes(uid=_DELETE), "application/json", 400, "uid",
                     id="missing uid is a 400"),
        pytest.param("/mutate", review_bytes(object=_DELETE), "application/json", 400, "object is required",
                     id="missing object on CREATE is a 400"),
        pytest.param("/mutate", b"[" * 5000 + b"]" * 5000, "application/json", 400, "not valid JSON",
                     id="deep nesting is a 400 not a crash"),
        pytest.param("/mutate", review_bytes(), "text/plain", 415, "application/json",
                     id="wrong content type is a 415"),
        pytest.param("/mutate", review_bytes(), None, 415, "application/json", id="no content type is a 415"),
        pytest.param("/mutate", b" " * (BODY_LIMIT_BYTES + 1), "application/json", 413, "exceeds the limit",
                     id="declared body over the limit is a 413"),
    ],
)
def test_malformed_reviews_get_4xx_json_errors(
    client: httpx.Client, path: str, body: bytes, content_type: str | None, status: int, error: str
) -> None:
    got = post_raw(client, path, body, content_type)
    assert got.status_code == status
    assert got.headers["content-type"] == "application/json"
    assert error in got.json()["error"]


def test_get_on_a_review_path_is_405(client: httpx.Client) -> None:
    got = client.get("/mutate")
    assert (got.status_code, "POST" in got.json()["error"]) == (405, True)


def test_content_type_with_charset_is_accepted(client: httpx.Client) -> None:
    review = admission_review(pytorchjob())
    got = post_raw(client, "/mutate", orjson.dumps(review), "application/json; charset=utf-8")
    assert got.status_code == 200
    check_review_envelope(got.json(), review["request"]["uid"])


def test_chunked_body_over_the_limit_is_refused_before_it_ends(lab_server: RunningServer, server_pair: KeyPair) -> None:
    """No Content-Length: the server must answer 413 while the client is still sending."""
    chunk = b" " * 8192
    with (
        socket.create_connection(("127.0.0.1", lab_server.port), timeout=10) as raw,
        client_context(server_pair).wrap_socket(raw, server_hostname="localhost") as conn,
    ):
        conn.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for _ in range(BODY_LIMIT_BYTES // len(chunk) + 2):
            conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        # The terminating 0-chunk is never sent: a server that buffers the whole body would hang here.
        head = conn.recv(4096)
    assert head.startswith(b"HTTP/1.1 413")
    assert b"connection: close" in head.lower()


@pytest.mark.parametrize(
    "path, want_allowed",
    [
        pytest.param("/mutate", True, id="mutate answers an allowed review with the uid"),
        # Strict: the Master as written cannot tolerate the GPU nodes' taint, so the group would split.
        pytest.param("/validate", False, id="validate answers a refusal with the uid"),
    ],
)
def test_review_answers_with_same_uid_and_envelope(client: httpx.Client, path: str, want_allowed: bool) -> None:
    review = admission_review(pytorchjob(), uid=str(uuid.uuid4()))
    got = client.post(path, json=review)
    assert got.status_code == 200
    response = check_review_envelope(got.json(), review["request"]["uid"])
    assert response["allowed"] is want_allowed, response


def test_healthz(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_metrics_report_reviews_cache_zones_and_certificate(client: httpx.Client) -> None:
    client.post("/mutate", json=admission_review(pytorchjob()))
    post_raw(client, "/mutate", b"{")
    got = client.get("/metrics")
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(got.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert samples[("topoguard_reviews_total", (("kind", "PyTorchJob"), ("operation", "mutate"),
                                                 ("outcome", "patched")))] >= 1
    bad = ("topoguard_reviews_total", (("kind", ""), ("operation", "mutate"), ("outcome", "bad-request")))
    assert samples[bad] >= 1
    assert samples[("topoguard_zone_free_gpus", (("zone", "zone-a"),))] == 8
    assert samples[("topoguard_cache_objects", (("kind", "Node"),))] == 4
    assert samples[("topoguard_cache_objects", (("kind", "CiliumNetworkPolicy"),))] == 3
    assert samples[("topoguard_cache_synced", ())] == 1
    assert any(name == "topoguard_review_duration_seconds_bucket" and dict(labels).get("le") == "0.025"
               for name, labels in samples)


class BrokenStore:
    """A store that fails on every read (a bug in a cache implementation)."""

    def snapshot(self) -> Snapshot:
        raise RuntimeError("the cache exploded")

    def status(self) -> SyncStatus:
        return SyncStatus(synced=True, stale=False, age_seconds=0.0)

    def healthy_snapshot(self) -> Snapshot:
        raise RuntimeError("the cache exploded")

    def before_publish(self, callback: Callable[[Snapshot], None]) -> None:
        return None

    def subscribe(self, callback: Callable[[Snapshot], None]) -> None:
        return None


def test_unexpected_error_is_a_200_refusal_with_code_500(
    serve: Callable[..., RunningServer], server_pair: KeyPair
) -> None:
    server = serve(create_app(Settings(), BrokenStore()))
    review = admission_review(pytorchjob())
    with https_client(server, server_pair) as c:
        got = c.post("/mutate", json=review)
    assert got.status_code == 200
    response = check_review_envelope(got.json(), review["request"]["uid"])
    assert (response["allowed"], response["status"]["code"]) == (False, 500)
    assert review["request"]["uid"] in response["status"]["message"]


@pytest.mark.parametrize(
    "enforcement, want_allowed",
    [
        pytest.param("deny", False, id="missed deadline denies under enforcement deny"),
        pytest.param("warn", True, id="missed deadline admits with a warning under enforcement warn"),
    ],
)
def test_missed_deadline_answers_per_enforcement(
    serve: Callable[..., RunningServer], server_pair: KeyPair, enforcement: str, want_allowed: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A decision that cannot finish in time, without depending on how fast this machine is: the
    # engine's computation waits for a gate the test opens afterwards. A fresh snapshot, so that the
    # decision is not in any memo and goes to the decision pool, where the deadline is kept.
    gate = threading.Event()
    fresh = cached.decide_fresh

    def gated(*args: Any, **kwargs: Any) -> Any:
        gate.wait(timeout=60)
        return fresh(*args, **kwargs)

    monkeypatch.setattr(cached, "decide_fresh", gated)
    snapshot = build_snapshot(scenario_objects(load_scenario("lab-pytorchjob-managed-zone-label")))
    server = serve(create_app(Settings(request_deadline_seconds=0.3, enforcement=enforcement), StaticStore(snapshot)))
    review = admission_review(pytorchjob())
    try:
        with https_client(server, server_pair) as c:
            got = c.post("/mutate", json=review)
    finally:
        gate.set()
    response = check_review_envelope(got.json(), review["request"]["uid"])
    assert response["allowed"] is want_allowed
    text = response.get("status", {}).get("message", "") + " ".join(response.get("warnings", []))
    assert "deadline" in text
    if not want_allowed:
        assert (response["status"]["code"], response["status"]["reason"]) == (504, "Timeout")


def test_the_server_sends_exactly_the_bytes_topoguard_review_prints(
    serve: Callable[..., RunningServer], server_pair: KeyPair, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """One wire shape: POST /mutate and `topoguard review` answer the same review with the same bytes."""
    server = serve(create_app(load_settings(LAB_CONFIG, environ={}), StaticStore(load_snapshot(LAB))))
    body = LAB_REVIEW.read_bytes()
    with https_client(server, server_pair) as c:
        got = post_raw(c, "/mutate", body)
    code = cli.main(["review", "--cluster", str(LAB), "--config", str(LAB_CONFIG), str(LAB_REVIEW)])
    printed = capsysbinary.readouterr().out
    assert (got.status_code, code) == (200, 0)
    assert json.loads(got.content)["response"]["patch"]  # a real answer, not an empty admission
    assert got.content + b"\n" == printed


def test_readiness_follows_cache_sync(
    serve: Callable[..., RunningServer], server_pair: KeyPair, lab_snapshot: Snapshot
) -> None:
    store = ControlledStore()
    server = serve(create_app(Settings(), store))
    review = admission_review(pytorchjob())
    with https_client(server, server_pair) as c:
        before = c.get("/readyz")
        early = c.post("/mutate", json=review)
        store.publish(lab_snapshot)
        after = c.get("/readyz")
        metrics = c.get("/metrics").text
    assert before.status_code == 503
    assert before.json()["detail"] == {"Node": "listing", "CiliumNetworkPolicy": "listing"}
    assert "waiting for CiliumNetworkPolicy, Node" in before.json()["problem"]
    early_response = check_review_envelope(early.json(), review["request"]["uid"])
    assert early_response["allowed"] is False and "cache not synced" in early_response["status"]["message"]
    assert after.status_code == 200
    assert after.json()["detail"] == {"Node": "synced", "CiliumNetworkPolicy": "synced"}
    assert 'topoguard_zone_free_gpus{zone="zone-a"} 8.0' in metrics  # the subscription saw the publish


def test_stale_cache_stays_ready_but_decisions_name_the_problem(
    serve: Callable[..., RunningServer], server_pair: KeyPair, lab_snapshot: Snapshot
) -> None:
    store = ControlledStore()
    store.publish(lab_snapshot)
    store.stale = True
    server = serve(create_app(Settings(), store))
    review = admission_review(pytorchjob())
    with https_client(server, server_pair) as c:
        ready = c.get("/readyz")
        got = c.post("/mutate", json=review)
    assert ready.status_code == 200 and ready.json()["stale"] is True
    response = check_review_envelope(got.json(), review["request"]["uid"])
    assert response["allowed"] is False and "stale" in response["status"]["message"]


def test_plain_http_is_not_served(lab_server: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", lab_server.port), timeout=10) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = raw.recv(4096)
    assert not data.startswith(b"HTTP/1.1 200")


def test_map_lists_zones_with_gpu_capacity(map_client: httpx.Client) -> None:
    got = map_client.get("/map")
    assert got.status_code == 200
    assert got.json()["zones"] == [
        {"zone": "zone-a", "nodes": 2, "gpuNodes": 2, "gpusFree": 8, "gpusReserved": 0},
        {"zone": "zone-b", "nodes": 2, "gpuNodes": 0, "gpusFree": 0, "gpusReserved": 0},
    ]


def test_map_for_a_namespace_lists_its_policies_and_open_zones(map_client: httpx.Client) -> None:
    got = map_client.get("/map", params={"namespace": "ml-demo"}).json()["namespace"]
    assert [p["policy"] for p in got["policies"]] == [
        "ml-demo/allow-intra-zone-a", "ml-demo/allow-intra-zone-b", "ml-demo/deny-cross-zone-gpu-traffic",
    ]
    verdicts = {flow["zone"]: flow["verdict"] for flow in got["flows"]}
    # zoneIdentityLabel=zone: a pod labelled zone=zone-a may talk to its peers under allow-intra-zone-a.
    assert verdicts == {"zone-a": "allow", "zone-b": "allow"}
    assert got["enforcement"] == "deny"
    zone_a = next(flow for flow in got["flows"] if flow["zone"] == "zone-a")
    # Collective traffic: the collectives' range (settings collectivePorts), as admission judges it.
    assert zone_a["flow"] == "pod → pod TCP/32768-60999"
    assert zone_a["reasons"][0]["message"].startswith(
        "egress of ml-demo/<pod in zone-a> to ml-demo/<pod in zone-a> on 32768-60999/TCP is allowed"
    )


def test_map_for_a_job_gives_the_per_zone_table(map_client: httpx.Client) -> None:
    got = map_client.post("/map", json=pytorchjob())
    assert got.status_code == 200
    job = got.json()["job"]
    assert (job["job"], job["allowed"], job["zone"]) == ("PyTorchJob ml-demo/resnet", True, "zone-a")
    zone_a = next(z for z in job["zones"] if z["zone"] == "zone-a")
    assert (zone_a["gpusNeeded"], zone_a["gpusFree"], zone_a["eligible"]) == (2, 8, True)
    assert zone_a["flows"] and all(f["verdict"] == "allow" for f in zone_a["flows"])


@pytest.mark.parametrize(
    "body, status",
    [
        pytest.param(b"{", 400, id="map of invalid JSON is a 400"),
        pytest.param(b"[]", 400, id="map of a non-object is a 400"),
        pytest.param(orjson.dumps({"apiVersion": "v1", "kind": "Pod"}), 400, id="map of a non-job is a 400"),
    ],
)
def test_map_refuses_bad_jobs(map_client: httpx.Client, body: bytes, status: int) -> None:
    got = post_raw(map_client, "/map", body)
    assert got.status_code == status and got.json()["error"]


@pytest.mark.parametrize(
    "last_full, now, want_last_full",
    [
        pytest.param(float("-inf"), 1000.0, 1000.0, id="first snapshot gets a full collection"),
        pytest.param(900.0, 1000.0, 900.0, id="a snapshot soon after only gets a young collection"),
        pytest.param(100.0, 1000.0, 1000.0, id="a snapshot after the interval gets a full collection"),
    ],
)
def test_settle_heap_freezes_the_live_heap(last_full: float, now: float, want_last_full: float) -> None:
    try:
        assert settle_heap(last_full, now=now) == want_last_full
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_deeply_nested_job_is_a_400_not_a_crash(client: httpx.Client) -> None:
    job = pytorchjob()
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(900):  # below orjson's 1,024 limit, above Python's default recursion limit
        node["x"] = {}
        node = node["x"]
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"] = {"annotations": {}, "deep": deep}
    review = admission_review(job)
    body = json.dumps(review).encode()  # orjson refuses to encode this deep; the stdlib encoder does not
    got = client.post("/mutate", content=body, headers={"content-type": "application/json"})
    assert got.status_code == 400
    assert "more than 100 levels deep" in got.json()["error"]


def test_draining_server_is_not_ready_and_closes_connections(
    serve: Callable[..., RunningServer], server_pair: KeyPair, lab_snapshot: Snapshot
) -> None:
    app = create_app(Settings(), StaticStore(lab_snapshot))
    server = serve(app)
    review = admission_review(pytorchjob())
    with https_client(server, server_pair) as c:
        assert c.get("/readyz").status_code == 200
        app.state.draining = True  # what WebhookServer.handle_exit does on SIGTERM
        ready = c.get("/readyz")
        answered = c.post("/mutate", json=review)
    assert (ready.status_code, ready.json()["draining"], ready.headers["connection"]) == (503, True, "close")
    assert answered.status_code == 200 and answered.headers["connection"] == "close"
    check_review_envelope(answered.json(), review["request"]["uid"])


def test_stalled_body_is_refused_at_the_deadline(
    serve: Callable[..., RunningServer], server_pair: KeyPair, lab_snapshot: Snapshot
) -> None:
    server = serve(create_app(Settings(request_deadline_seconds=0.2), StaticStore(lab_snapshot)))
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        client_context(server_pair).wrap_socket(raw, server_hostname="localhost") as conn,
    ):
        conn.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"apiVersion\":")  # ... and nothing more
        head = conn.recv(4096)  # a server without a body deadline would leave this waiting
    assert head.startswith(b"HTTP/1.1 408")
    assert b"connection: close" in head.lower()


def test_stalled_job_map_body_is_refused_at_the_deadline(
    serve: Callable[..., RunningServer], server_pair: KeyPair, lab_snapshot: Snapshot
) -> None:
    settings = Settings(request_deadline_seconds=0.2, map_access="authorized")
    server = serve(create_app(settings, StaticStore(lab_snapshot), map_reviewer=map_reader()))
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        client_context(server_pair).wrap_socket(raw, server_hostname="localhost") as conn,
    ):
        conn.sendall(b"POST /map HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + MAP_TOKEN.encode() + b"\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"apiVersion\":")  # ... and nothing more
        head = conn.recv(4096)  # a server without a body deadline would leave this waiting
    assert head.startswith(b"HTTP/1.1 408")


class CountingExecutor(ThreadPoolExecutor):
    """The decision workers' pool, counting what is sent to it."""

    def __init__(self) -> None:
        super().__init__(2)
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def test_admitted_jobs_hold_gpus_and_the_next_decisions_count_them_without_a_decision_worker(
    serve: Callable[..., RunningServer], server_pair: KeyPair
) -> None:
    """Each admission holds its GPUs, so no two decisions share a memo entry; but only the first job of the shape
    goes to a decision worker: the next ones only count the new holds (engine Pending.cheap), where they were read."""
    snapshot = build_snapshot(scenario_objects(load_scenario("lab-pytorchjob-managed-zone-label")))
    app = create_app(Settings(zone_identity_label="zone"), StaticStore(snapshot))
    pool = CountingExecutor()
    assert app.state.workers is not None
    app.state.workers._deciders = pool
    server = serve(app)
    with https_client(server, server_pair) as c:
        for name in ("sweep-1", "sweep-2", "sweep-3"):
            review = admission_review(pytorchjob(name))
            assert check_review_envelope(c.post("/mutate", json=review).json(), review["request"]["uid"])["allowed"]
    assert pool.submitted == 1
    assert len(app.state.in_flight) == 3


def test_a_decision_in_the_memo_is_answered_without_a_decision_worker(
    serve: Callable[..., RunningServer], server_pair: KeyPair
) -> None:
    """The first job of a shape is decided on a decision worker (deadline kept); the next ones, which differ
    only in name, come from the snapshot's decision memo and are answered where they were read, with their own
    names.

    Dry runs, so that no review holds in-flight GPUs: a real admission's hold changes what the next
    decision counts, and a decision made with other holds is never served from the memo (below)."""
    snapshot = build_snapshot(scenario_objects(load_scenario("lab-pytorchjob-managed-zone-label")))
    app = create_app(Settings(zone_identity_label="zone"), StaticStore(snapshot))
    pool = CountingExecutor()
    assert app.state.workers is not None
    app.state.workers._deciders = pool
    server = serve(app)
    answers = []
    with https_client(server, server_pair) as c:
        for name in ("sweep-1", "sweep-2", "sweep-3"):
            review = admission_review(pytorchjob(name))
            review["request"]["dryRun"] = True
            got = c.post("/mutate", json=review)
            answers.append(check_review_envelope(got.json(), review["request"]["uid"]))
    assert pool.submitted == 1
    assert [a["allowed"] for a in answers] == [True, True, True]
    assert len({a["patch"] for a in answers}) == 1, "jobs of one shape get the same patch"


def test_a_decision_past_its_deadline_stops_and_frees_its_worker(
    serve: Callable[..., RunningServer], server_pair: KeyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18: a review answered 504 must not keep its worker. Every verdict is made slow (50 ms) and the job
    needs hundreds of them (~30 s of work): the engine sees the deadline at its next verdict and stops, so the
    worker is free long before the work could have finished, and the next review is decided."""
    slow = policy.check_flow

    def slow_verdict(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)
        return slow(*args, **kwargs)

    monkeypatch.setattr(policy, "check_flow", slow_verdict)
    snapshot = build_snapshot(scenario_objects(load_scenario("lab-pytorchjob-managed-zone-label")))
    app = create_app(Settings(request_deadline_seconds=0.5, decision_workers=1), StaticStore(snapshot))
    server = serve(app)
    types = {f"Worker{i}": {"replicas": 1, "template": {"metadata": {"labels": {"slot": str(i)}}, "spec": {
        "nodeSelector": {"gpu": "true"},
        "tolerations": [{"key": "gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}],
        "containers": [{"name": "tensorflow", "image": "tf"}]}}}
        for i in range(24)}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "wide", "namespace": "ml-demo"},
           "spec": {"tfReplicaSpecs": types}}
    review = admission_review(job)
    workers = app.state.workers
    assert workers is not None
    with https_client(server, server_pair) as c:
        started = time.monotonic()
        got = c.post("/mutate", json=review)
        response = check_review_envelope(got.json(), review["request"]["uid"])
        assert response["status"]["code"] == 504
        while workers.in_progress() and time.monotonic() - started < 20:
            time.sleep(0.01)
        freed_after = time.monotonic() - started
        assert workers.in_progress() == 0
        assert freed_after < 10, f"the worker ran on for {freed_after:.1f}s after the deadline"
        monkeypatch.setattr(policy, "check_flow", slow)
        again = check_review_envelope(c.post("/mutate", json=admission_review(pytorchjob())).json(), None)
    assert "status" not in again or again["status"]["code"] != 504
