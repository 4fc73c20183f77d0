"""`topoguard serve` as a process: SIGTERM drains in-flight reviews, closes idle connections, exits 0.

A subprocess (not a thread) because the test is about the real signal path: uvicorn installs its
SIGTERM handler only in the main thread of the process it serves from.
"""

from __future__ import annotations

import json
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests.integration.conftest import SCENARIOS, admission_review, check_review_envelope, pytorchjob

WAIT_SECONDS = 30.0


def unverified() -> ssl.SSLContext:
    # The server made its own certificate in memory; this test is about shutdown, not trust.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def connect(port: int) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=WAIT_SECONDS)
    return unverified().wrap_socket(raw, server_hostname="localhost")


def read_until_closed(conn: ssl.SSLSocket) -> bytes:
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def read_response(conn: ssl.SSLSocket) -> bytes:
    """One HTTP/1.1 response with a Content-Length body, leaving the connection open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def get(port: int, path: str) -> bytes:
    with connect(port) as conn:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return read_until_closed(conn)


@pytest.fixture
def server_process(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--cluster", str(SCENARIOS / "_lab-cluster.yaml"), "--self-signed",
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            if get(port, "/readyz").startswith(b"HTTP/1.1 200"):
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"server did not become ready: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    yield proc, port, log
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_sigterm_finishes_in_flight_review_with_connection_close(
    server_process: tuple[subprocess.Popen[bytes], int, Path],
) -> None:
    proc, port, log = server_process
    review = admission_review(pytorchjob())
    body = orjson.dumps(review)
    in_flight = connect(port)
    in_flight.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body[: len(body) // 2])
    idle = connect(port)
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(idle).startswith(b"HTTP/1.1 200")  # a kept-alive, now idle connection

    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + WAIT_SECONDS
    while True:  # the listener closes first: new connections are refused
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            break
        assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
        time.sleep(0.02)
    assert idle.recv(65536) == b""  # idle keep-alive connections are closed, not left to time out
    idle.close()

    in_flight.sendall(body[len(body) // 2:])  # the review that was mid-upload completes
    answer = read_until_closed(in_flight)
    in_flight.close()  # as the apiserver does on `Connection: close`; lets the TLS shutdown complete
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"connection: close" in head.lower()
    check_review_envelope(json.loads(payload), review["request"]["uid"])

    # uvicorn re-raises the captured SIGTERM once it has drained, so the exit status is "killed by
    # SIGTERM", which is what Kubernetes expects from a terminated container.
    assert proc.wait(timeout=WAIT_SECONDS) in (0, -signal.SIGTERM)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(line["msg"] == "shutdown requested: draining" for line in lines)
    reviews = [line for line in lines if line["msg"] == "review"]
    assert [r["uid"] for r in reviews] == [review["request"]["uid"]]
    assert {"kind", "object", "operation", "outcome", "zone", "duration_ms"} <= reviews[0].keys()
