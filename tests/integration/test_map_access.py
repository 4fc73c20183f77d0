"""/map on the real server (uvicorn + TLS) per `mapAccess`: 404 where it is not served, 401/403/503 without
usable credentials, the map as before with them; POST /map's bad input is a 4xx, never a 500."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from app.cache.access import Access
from app.cache.files import build_snapshot
from app.cache.store import StaticStore
from app.config import Settings
from app.http.app import create_app
from app.models.cluster import Snapshot
from app.tls import KeyPair, self_signed_context
from tests.integration.conftest import (
    MAP_TOKEN,
    FakeAccessReviewer,
    RunningServer,
    client_context,
    https_client,
    load_scenario,
    map_reader,
    pytorchjob,
    scenario_objects,
)

DENIED_TOKEN = "bob-token"
BROKEN_TOKEN = "apiserver-down"


@pytest.fixture(scope="module")
def lab_snapshot() -> Snapshot:
    return build_snapshot(scenario_objects(load_scenario("lab-pytorchjob-managed-zone-label")))


@pytest.fixture(scope="module")
def reviewer() -> FakeAccessReviewer:
    fake = map_reader()
    fake.answers[DENIED_TOKEN] = Access("denied", user="system:serviceaccount:ml:bob", reason="no RBAC rule")
    fake.answers[BROKEN_TOKEN] = Access("error", reason="SubjectAccessReview failed: HTTP 500")
    return fake


@pytest.fixture(scope="module")
def authorized(serve: Callable[..., RunningServer], lab_snapshot: Snapshot, server_pair: KeyPair,
               reviewer: FakeAccessReviewer) -> Iterator[httpx.Client]:
    app = create_app(Settings(zone_identity_label="zone", map_access="authorized"), StaticStore(lab_snapshot),
                     map_reviewer=reviewer)
    with https_client(serve(app), server_pair) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_off_serves_no_map(serve: Callable[..., RunningServer], lab_snapshot: Snapshot, server_pair: KeyPair) -> None:
    server = serve(create_app(Settings(map_access="off"), StaticStore(lab_snapshot)))
    with https_client(server, server_pair) as c:
        got = [c.get("/map", params={"namespace": "kube-system"}), c.post("/map", json=pytorchjob())]
    assert [r.status_code for r in got] == [404, 404]
    assert "mapAccess: off" in got[0].json()["error"]


def test_the_default_is_off() -> None:
    assert Settings().map_access == "off"


@pytest.mark.parametrize(
    "headers, status",
    [
        pytest.param({}, 401, id="no credentials is a 401"),
        pytest.param({"authorization": "Basic YWxpY2U6cHc="}, 401, id="basic auth is a 401"),
        pytest.param(bearer("nobody-knows-me"), 401, id="a token the cluster rejects is a 401"),
        pytest.param(bearer(DENIED_TOKEN), 403, id="a user RBAC does not allow is a 403"),
        pytest.param(bearer(BROKEN_TOKEN), 503, id="a failed check is a 503, never the map"),
    ],
)
def test_authorized_refuses_without_usable_credentials(authorized: httpx.Client, headers: dict[str, str],
                                                        status: int) -> None:
    got = [authorized.get("/map", params={"namespace": "kube-system"}, headers=headers),
           authorized.post("/map", json=pytorchjob(), headers=headers)]
    assert [r.status_code for r in got] == [status, status]
    assert all("zones" not in r.json() and r.json()["error"] for r in got)
    if status == 401:
        assert got[0].headers["www-authenticate"].startswith("Bearer")


def test_authorized_serves_the_map_to_an_allowed_token(authorized: httpx.Client, reviewer: FakeAccessReviewer) -> None:
    reviewer.calls.clear()
    got = authorized.get("/map", params={"namespace": "ml-demo"}, headers=bearer(MAP_TOKEN))
    posted = authorized.post("/map", json=pytorchjob(), headers=bearer(MAP_TOKEN))
    assert (got.status_code, posted.status_code) == (200, 200)
    assert got.json()["namespace"]["name"] == "ml-demo" and posted.json()["job"]["zone"] == "zone-a"
    # The verb is the request's method in lower case, on the non-resource URL /map.
    assert reviewer.calls == [(MAP_TOKEN, "get", "/map"), (MAP_TOKEN, "post", "/map")]


def test_authorized_without_a_reviewer_says_so(serve: Callable[..., RunningServer], lab_snapshot: Snapshot,
                                               server_pair: KeyPair) -> None:
    server = serve(create_app(Settings(map_access="authorized"), StaticStore(lab_snapshot)))
    with https_client(server, server_pair) as c:
        got = c.get("/map", headers=bearer(MAP_TOKEN))
    assert got.status_code == 503 and "no access reviewer" in got.json()["error"]


def nested(levels: int) -> Any:
    node: Any = {}
    for _ in range(levels):
        node = {"x": node}
    return node


@pytest.mark.parametrize(
    "change, status, message",
    [
        pytest.param(lambda job: job["metadata"].update(deep=nested(300)), 400, "more than 100 levels deep",
                     id="a job nested past orjson's 254 levels is a 400"),
        pytest.param(lambda job: job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
                     .update(resources={"limits": {"nvidia.com/gpu": 1e30}}), 400, "more than any node has",
                     id="a GPU limit of 1e30 is a 400 naming the field"),
    ],
)
def test_bad_jobs_are_a_4xx_not_a_500(authorized: httpx.Client, change: Callable[[Any], None], status: int,
                                      message: str) -> None:
    job = pytorchjob()
    change(job)
    # orjson will not encode 300 levels; the stdlib encoder does.
    got = authorized.post("/map", content=json.dumps(job), headers={**bearer(MAP_TOKEN),
                                                                    "content-type": "application/json"})
    assert got.status_code == status and message in got.json()["error"]


def test_loopback_serves_the_map_only_on_its_own_listener(lab_snapshot: Snapshot, server_pair: KeyPair) -> None:
    map_sock = socket.create_server(("127.0.0.1", 0))
    map_port = map_sock.getsockname()[1]
    app = create_app(Settings(map_access="loopback", map_port=map_port), StaticStore(lab_snapshot))
    server = RunningServer(app, self_signed_context(server_pair))
    # What `topoguard serve` does with mapAccess loopback (serve.listeners): one server, both sockets.
    server.thread = threading.Thread(target=server.server.run, kwargs={"sockets": [server.sock, map_sock]},
                                     daemon=True)
    server.start()
    try:
        with https_client(server, server_pair) as webhook, \
                httpx.Client(base_url=f"https://127.0.0.1:{map_port}", verify=client_context(server_pair),
                             timeout=30) as local:
            refused = webhook.get("/map", headers=bearer(MAP_TOKEN))
            served = local.get("/map")
            posted = local.post("/map", content=orjson.dumps(pytorchjob()),
                                headers={"content-type": "application/json"})
    finally:
        server.stop()
        map_sock.close()
    assert refused.status_code == 404 and f"127.0.0.1:{map_port}" in refused.json()["error"]
    assert served.status_code == 200 and [z["zone"] for z in served.json()["zones"]] == ["zone-a", "zone-b"]
    assert posted.status_code == 200 and posted.json()["job"]["allowed"] is True
