"""Connections on the real server (app.http.server via the shared builder): the header timeout cuts
slowloris heads, idle connections before a first request and stalled TLS handshakes; keep-alive
idle time is not cut by it; over `maxConnections` a connection is answered 503 at once.

Every test is bounded (BOUND_SECONDS) and on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.cache.files import build_snapshot
from app.cache.store import StaticStore
from app.config import Settings
from app.http.app import create_app
from app.tls import KeyPair
from tests.integration.conftest import SCENARIOS, RunningServer, client_context
from tests.integration.test_server_shutdown import free_port, get

HEADER_TIMEOUT_SECONDS = 0.5
BOUND_SECONDS = 10.0
SLOWLORIS = 20
HEAD = b"POST /mutate HTTP/1.1\r\nHost: topoguard\r\nContent-Type: application/json\r\n" + b"X-Pad: a\r\n" * 200


def tls_connect(port: int, pair: KeyPair) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=BOUND_SECONDS)
    return client_context(pair).wrap_socket(raw, server_hostname="localhost")


def closed_by_server(conn: socket.socket) -> bool:
    """The server closed (EOF, reset or a TLS close) without answering anything."""
    if not select.select([conn], [], [], 0)[0] and not (isinstance(conn, ssl.SSLSocket) and conn.pending()):
        return False
    try:
        return conn.recv(65536) == b""
    except (ConnectionResetError, ssl.SSLError, ssl.SSLEOFError):
        return True


def wait_closed(conn: socket.socket) -> bool:
    deadline = time.monotonic() + BOUND_SECONDS
    while time.monotonic() < deadline:
        if closed_by_server(conn):
            return True
        time.sleep(0.02)
    return False


def get_healthz(conn: ssl.SSLSocket) -> bytes:
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: topoguard\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, "closed before answering"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, "closed before the whole body"
        body += chunk
    return head + b"\r\n\r\n" + body


@pytest.fixture(scope="module")
def server(serve: Callable[..., RunningServer]) -> RunningServer:
    return serve(create_app(Settings(header_timeout_seconds=HEADER_TIMEOUT_SECONDS), StaticStore(build_snapshot([]))))


def test_slowloris_heads_are_cut_at_the_header_timeout(server: RunningServer, server_pair: KeyPair) -> None:
    conns = [tls_connect(server.port, server_pair) for _ in range(SLOWLORIS)]
    sent = dict.fromkeys(range(SLOWLORIS), 0)
    cut: dict[int, float] = {}
    start = time.monotonic()
    while len(cut) < SLOWLORIS and time.monotonic() - start < BOUND_SECONDS:
        for i, conn in enumerate(conns):  # one byte of the head per connection every 20 ms, never the end
            if i in cut:
                continue
            try:
                conn.send(HEAD[sent[i]:sent[i] + 1])
                sent[i] += 1
            except OSError:
                cut[i] = time.monotonic() - start
                continue
            if closed_by_server(conn):
                cut[i] = time.monotonic() - start
        time.sleep(0.02)
    for conn in conns:
        conn.close()
    assert len(cut) == SLOWLORIS, f"{SLOWLORIS - len(cut)} trickling connections still open after {BOUND_SECONDS} s"
    # They were cut mid-head: each was still sending (its head is far longer than what it sent).
    assert all(0 < sent[i] < len(HEAD) for i in cut)
    # The server itself is fine: a whole request on a fresh connection is answered.
    with tls_connect(server.port, server_pair) as conn:
        assert get_healthz(conn).startswith(b"HTTP/1.1 200")


def test_a_connection_that_sends_nothing_is_closed(server: RunningServer, server_pair: KeyPair) -> None:
    with tls_connect(server.port, server_pair) as conn:
        assert wait_closed(conn)


def test_a_stalled_tls_handshake_is_closed(server: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=BOUND_SECONDS) as raw:
        raw.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello, and then nothing
        assert wait_closed(raw)


def test_keep_alive_idle_time_is_not_cut_by_the_header_timeout(server: RunningServer, server_pair: KeyPair) -> None:
    with tls_connect(server.port, server_pair) as conn:
        assert get_healthz(conn).startswith(b"HTTP/1.1 200")
        time.sleep(HEADER_TIMEOUT_SECONDS * 3)  # idle between requests: uvicorn's keep-alive governs it
        assert get_healthz(conn).startswith(b"HTTP/1.1 200")


def test_a_head_after_a_kept_alive_response_is_cut_when_it_stalls(server: RunningServer, server_pair: KeyPair) -> None:
    with tls_connect(server.port, server_pair) as conn:
        assert get_healthz(conn).startswith(b"HTTP/1.1 200")
        conn.sendall(HEAD[:40])  # the next head starts and stalls
        assert wait_closed(conn)


def test_connections_over_the_cap_are_answered_503_at_once(
    serve: Callable[..., RunningServer], server_pair: KeyPair,
) -> None:
    cap = 4
    server = serve(create_app(Settings(max_connections=cap, header_timeout_seconds=BOUND_SECONDS * 3),
                              StaticStore(build_snapshot([]))))
    held = [tls_connect(server.port, server_pair) for _ in range(cap)]
    assert get_healthz(held[0]).startswith(b"HTTP/1.1 200")
    try:
        with tls_connect(server.port, server_pair) as extra:  # sends nothing: the answer comes anyway
            answer = b""
            while chunk := extra.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503")
        assert b"connection: close" in head.lower() and b"retry-after: 1" in head.lower()
        assert body == b"too many connections\n"
        held.pop().close()  # a place frees up: new connections are served again
        deadline = time.monotonic() + BOUND_SECONDS
        while True:
            with tls_connect(server.port, server_pair) as conn:
                answer = get_healthz(conn)
            if answer.startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert answer.startswith(b"HTTP/1.1 200")
    finally:
        for conn in held:
            conn.close()


def test_accept_errors_at_the_fd_limit_are_logged_once_per_interval(tmp_path: Path) -> None:
    """A real `topoguard serve` with 96 file descriptors and 150 clients: accept(2) fails with EMFILE
    (thousands of times: CPython retries it `backlog` times per wakeup), the log gets a few counted
    lines instead of one per failure, and the server serves again once the clients are gone."""
    limit = 96
    port = free_port()
    log = tmp_path / "serve.log"

    def low_fd_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--cluster", str(SCENARIOS / "_lab-cluster.yaml"), "--self-signed",
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=log.open("wb"), preexec_fn=low_fd_limit,
        env={**os.environ, "TOPOGUARD_MAX_CONNECTIONS": "1000"},
    )
    clients: list[socket.socket] = []
    try:
        deadline = time.monotonic() + BOUND_SECONDS * 2
        while True:
            try:
                if get(port, "/readyz").startswith(b"HTTP/1.1 200"):
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        for _ in range(150):  # the kernel completes these; the server runs out of fds accepting them
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=BOUND_SECONDS))
        deadline = time.monotonic() + BOUND_SECONDS
        while b"accepting connections fails" not in log.read_bytes():
            assert time.monotonic() < deadline, "no accept error logged"
            time.sleep(0.05)
        time.sleep(1.5)  # at least one more retry round of the listener
        for client in clients:
            client.close()
        deadline = time.monotonic() + BOUND_SECONDS
        while True:  # the listener recovers (asyncio retries every second) once fds are free
            try:
                if get(port, "/healthz").startswith(b"HTTP/1.1 200"):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the server did not recover"
            time.sleep(0.1)
    finally:
        for client in clients:
            client.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=BOUND_SECONDS * 3)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    accept = [line for line in lines if line["msg"].startswith("accepting connections fails")]
    assert 1 <= len(accept) <= 3, accept
    assert sum(line["count"] for line in accept) == accept[-1]["total"] > len(accept)  # many, counted
    assert [line for line in lines if line["logger"] == "asyncio"] == []


def test_an_answer_comes_in_one_tls_record(server: RunningServer, server_pair: KeyPair) -> None:
    """The head and the body of an answer go out in one write (app.http.server._OneWriteAnswer): the client's first
    read, which returns one TLS record at most, has the whole answer."""
    with tls_connect(server.port, server_pair) as conn:
        for _ in range(2):  # the first request on the connection, and one kept alive
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: topoguard\r\n\r\n")
            select.select([conn], [], [], BOUND_SECONDS)
            time.sleep(0.2)  # whatever the server wrote for this answer has arrived
            first = conn.recv(65536)
            head, _, body = first.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            assert length > 0 and len(body) == length, first


def test_a_client_that_expects_100_continue_gets_it_before_it_sends_the_body(
    server: RunningServer, server_pair: KeyPair,
) -> None:
    """Only the answer's head is held back (with its body): an interim `100 Continue` goes out at once."""
    body = b'{"not": "a review"}'
    with tls_connect(server.port, server_pair) as conn:
        conn.sendall(b"POST /mutate HTTP/1.1\r\nHost: topoguard\r\nContent-Type: application/json\r\n"
                     b"Expect: 100-continue\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        assert select.select([conn], [], [], BOUND_SECONDS)[0], "no 100 Continue"
        assert conn.recv(65536).startswith(b"HTTP/1.1 100")
        conn.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = conn.recv(65536)
            assert chunk, "closed before answering"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 400")  # read, and refused: not an AdmissionReview
