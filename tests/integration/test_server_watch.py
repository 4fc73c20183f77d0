"""`topoguard serve --kubeconfig` against the fake API server (tests/integration/fakeapi.py).

The whole path a deployment uses: the CLI builds a WatchStore, the app's lifespan starts it, /readyz
stays 503 while a kind cannot be listed and reviews are refused naming the cache, then the cache syncs,
the server turns ready, decides on the watched objects and follows changes (the zone gauges move).
"""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import SCENARIOS, admission_review, check_review_envelope, patch_ops, pytorchjob
from tests.integration.fakeapi import FakeApiServer, make_node, wait_until
from tests.integration.test_server_shutdown import free_port, unverified

WAIT_SECONDS = 30.0


def call(port: int, path: str, body: Any = None) -> tuple[int, dict[str, Any] | str]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, context=unverified(), timeout=10) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def status_of(port: int, path: str) -> int | None:
    try:
        return call(port, path)[0]
    except (OSError, ssl.SSLError):
        return None


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for obj in yaml.safe_load_all((SCENARIOS / "_lab-cluster.yaml").read_text()):
            if obj:
                server.apply(obj)
        yield server


def test_serve_with_kubeconfig_is_ready_only_after_sync_and_follows_the_cluster(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.fail("Node", status=500)  # the node list fails until the test clears it
    port = free_port()
    log = tmp_path / "serve.log"
    config = tmp_path / "config.yaml"
    map_port = free_port()  # mapAccess loopback: /map only on 127.0.0.1:map_port
    config.write_text(f"zoneIdentityLabel: zone\nmapAccess: loopback\nmapPort: {map_port}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")),
         "--self-signed", "--host", "127.0.0.1", "--port", str(port), "--config", str(config)],
        stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )
    try:
        wait_until(lambda: status_of(port, "/healthz") == 200 or proc.poll() is not None,
                   timeout=WAIT_SECONDS, what="the server to listen")
        assert proc.poll() is None, log.read_text()[-2000:]

        status, ready = call(port, "/readyz")
        assert status == 503 and isinstance(ready, dict)
        assert ready["detail"]["Node"].startswith("failing since") and ready["synced"] is False
        review = admission_review(pytorchjob())
        status, answer = call(port, "/mutate", review)
        response = check_review_envelope(answer, review["request"]["uid"])
        assert (response["allowed"], response["status"]["code"]) == (False, 503)
        assert "cache not synced" in response["status"]["message"]

        api.clear_failures()
        wait_until(lambda: status_of(port, "/readyz") == 200, timeout=WAIT_SECONDS, what="readiness after sync")
        status, answer = call(port, "/mutate", admission_review(pytorchjob()))
        response = check_review_envelope(answer, None)
        assert response["allowed"] is True and patch_ops(response)
        assert "zone-a" in json.dumps(patch_ops(response))

        api.apply(make_node("gpu-c-1", zone="zone-c", gpus=8))

        def zone_c_listed() -> bool:
            _, zone_map = call(map_port, "/map")
            return isinstance(zone_map, dict) and any(z["zone"] == "zone-c" for z in zone_map["zones"])

        wait_until(zone_c_listed, timeout=WAIT_SECONDS, what="the new zone on the map")
        assert status_of(port, "/map") == 404  # not on the webhook port
        _, metrics = call(port, "/metrics")
        assert 'topoguard_zone_free_gpus{zone="zone-c"} 8.0' in str(metrics)
        assert 'topoguard_cache_synced 1.0' in str(metrics)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, -signal.SIGTERM)


def test_serve_refuses_mutually_exclusive_sources(tmp_path: Path) -> None:
    got = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--cluster", str(SCENARIOS / "_lab-cluster.yaml"),
         "--kubeconfig", str(tmp_path / "k"), "--self-signed"],
        capture_output=True, text=True, timeout=60,
    )
    assert got.returncode == 2 and "mutually exclusive" in got.stderr


@pytest.mark.parametrize(
    "extra, message",
    [
        pytest.param([], "must serve HTTPS", id="no certificate at all is refused"),
        pytest.param(["--tls-cert", "x.crt"], "go together", id="a certificate without key is refused"),
        pytest.param(["--tls-cert", "missing.crt", "--tls-key", "missing.key"], "No such file",
                     id="missing certificate files are refused"),
        pytest.param(["--self-signed", "--config", "missing.yaml"], "config", id="a missing config file is refused"),
    ],
)
def test_serve_usage_errors_exit_2(tmp_path: Path, extra: list[str], message: str) -> None:
    got = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--cluster", str(SCENARIOS / "_lab-cluster.yaml"), *extra],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert got.returncode == 2, got.stderr
    assert message in got.stderr
