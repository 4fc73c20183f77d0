"""`topoguard serve` as a process: SIGTERM drains in-flight reviews, closes idle connections before
the listener, loses no request under keep-alive load, exits 0.

A subprocess (not a thread) because the test is about the real signal path: uvicorn installs its
SIGTERM handler only in the main thread of the process it serves from.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
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
    # Idle keep-alive connections are closed (once idle a moment), not left to time out ...
    assert idle.recv(65536) == b""
    idle.close()
    deadline = time.monotonic() + WAIT_SECONDS
    while True:  # ... and then the listener: new connections are refused
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except (ConnectionRefusedError, ConnectionResetError):
            # Reset: this probe sat in the listen backlog when the listener closed (a loaded machine's
            # event loop had not accepted it yet); closed all the same.
            break
        assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
        time.sleep(0.02)

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


# --- SIGTERM under keep-alive load -------------------------------------------------------------

LOAD_CLIENTS = 6
LOAD_ANSWERS = 5 * LOAD_CLIENTS  # answered before SIGTERM: every client has reused its connection


def seen_closed(conn: ssl.SSLSocket) -> bool:
    """What Go's transport knows before it reuses an idle connection: its read loop has seen EOF (or
    any unexpected byte) on it. An idle HTTP/1.1 connection has nothing to read otherwise."""
    return bool(conn.pending() or select.select([conn], [], [], 0)[0])


def read_answer(conn: ssl.SSLSocket) -> tuple[bytes, bytes] | None:
    """One response (head, body); None when the connection ends first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head, body


@dataclass
class GoLikeClient:
    """One apiserver-like client: keeps one connection alive and reuses it, never reuses one it has
    seen closed or that answered `Connection: close`; after SIGTERM it dials no new connection (the
    preStop hook has taken the pod out of the Service, so a new connection goes to another replica)."""

    port: int
    sigterm: threading.Event
    deadline: float
    answered: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def run(self) -> None:
        conn: ssl.SSLSocket | None = None
        while time.monotonic() < self.deadline:
            if conn is not None and seen_closed(conn):
                conn.close()
                conn = None
            if conn is None:
                if self.sigterm.is_set():
                    return
                conn = connect(self.port)
            uid = str(uuid.uuid4())
            body = orjson.dumps(admission_review(pytorchjob(name=f"sweep-{uid[:8]}"), uid=uid))
            try:
                conn.sendall(b"POST /mutate HTTP/1.1\r\nHost: topoguard\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                answer = read_answer(conn)
            except OSError as e:
                answer = None
                self.failures.append(f"{uid}: {e!r}")
            if answer is None:
                self.failures.append(f"{uid}: connection ended without an answer")
                conn.close()
                return
            head, payload = answer
            if not head.startswith(b"HTTP/1.1 200"):
                self.failures.append(f"{uid}: {head.splitlines()[0]!r}")
            check_review_envelope(json.loads(payload), uid)
            self.answered.append(uid)
            if b"connection: close" in head.lower():
                conn.close()
                conn = None
        if conn is not None:
            conn.close()


@pytest.mark.parametrize("run", range(3))
def test_sigterm_under_keep_alive_load_loses_no_request(
    server_process: tuple[subprocess.Popen[bytes], int, Path], run: int,
) -> None:
    proc, port, log = server_process
    sigterm = threading.Event()
    clients = [GoLikeClient(port, sigterm, time.monotonic() + WAIT_SECONDS) for _ in range(LOAD_CLIENTS)]
    threads = [threading.Thread(target=client.run, daemon=True) for client in clients]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + WAIT_SECONDS
    while sum(len(c.answered) for c in clients) < LOAD_ANSWERS and time.monotonic() < deadline:
        time.sleep(0.02)
    before = sum(len(c.answered) for c in clients)
    sigterm.set()
    proc.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(timeout=WAIT_SECONDS)
    assert not any(thread.is_alive() for thread in threads)
    assert proc.wait(timeout=WAIT_SECONDS) in (0, -signal.SIGTERM)

    assert [f for c in clients for f in c.failures] == []
    answered = [uid for c in clients for uid in c.answered]
    assert before >= LOAD_ANSWERS  # there was load: the connections were kept alive and reused
    # Every review the server decided was answered, and every answer was a review it logged.
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert sorted(line["uid"] for line in lines if line["msg"] == "review") == sorted(answered)
