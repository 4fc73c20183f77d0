"""The HTTP/1.1 server under the webhook: uvicorn's h11 protocol plus the connection limits it lacks,
the drain on SIGTERM, and `build_server`, which `topoguard serve` and the integration tests share.

What uvicorn 0.54 (h11) does and does not do, read from its source:
- its keep-alive timer starts when a response completes and is cancelled by ANY byte received, so
  a client that trickles a request head one byte at a time holds a connection forever, and before
  the first request there is no timer at all (slowloris);
- `limit_concurrency` answers 503 only once a request head has arrived, so idle connections still
  pile up to the fd limit;
- asyncio's `create_server` gets no `ssl_handshake_timeout` (60 s default) from uvicorn;
- at shutdown it closes the listener first, then every idle connection at once, in the same loop
  iteration: a request already in the socket buffer of an "idle" connection is reset, and so is a
  connection waiting in the listen backlog.

What this module adds, and owns:
- a header timeout (`headerTimeoutSeconds`): a connection must deliver a complete request head
  within that time of connecting (so it also bounds the idle time before the first request) and
  within that time of the first byte of every later head. The TLS handshake gets the same bound,
  as Go's net/http bounds it with ReadHeaderTimeout (server.go `tlsHandshakeTimeout`);
- a connection cap (`maxConnections`): one connection over it is answered `503` +
  `Connection: close` the moment it is established, without reading anything;
- accept errors (EMFILE/ENFILE/ENOBUFS/ENOMEM) and the two cuts above logged once per interval with
  a count, not one line each;
- the drain (see `WebhookServer.drain`);
- after a certificate reload, the connections handshaked with the previous certificate closed by
  their next answer (see `WebhookServer.recycle_connections`).

Must not decide anything or import the engine: it moves bytes. The app it serves is opaque here.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import resource
import select
import socket
import ssl
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, ClassVar, cast

import h11
import uvicorn
from uvicorn.protocols.http.flow_control import CLOSE_HEADER
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.config import Settings
from app.http.app import TopoguardApp

log = logging.getLogger(__name__)

# Below the Helm chart's terminationGracePeriodSeconds minus preStopSleepSeconds (40 - 10 s), above
# the 8 s decision deadline.
SHUTDOWN_GRACE_SECONDS = 20.0
# client-go keeps up to 25 idle connections per host and reuses them. Longer than the client's own idle
# timeout, so the client, not this server, closes a keep-alive connection that fell idle: a server that
# closes an idle connection races the client's next request on it, which is lost (Go does not resend a
# POST, and the apiserver does not retry a webhook call). client-go's transports take Go's
# DefaultTransport IdleConnTimeout, 90 s (k8s.io/apimachinery pkg/util/net/http.go SetTransportDefaults,
# client-go transport/cache.go); Prometheus' scraper is a Go client too.
KEEP_ALIVE_SECONDS = 120
# h11's own default, spelled out: the largest request head (request line + headers) accepted.
MAX_REQUEST_HEAD_BYTES = 16 * 1024
# asyncio waits 30 s by default for the peer's close_notify; a client that never answers would hold
# its fd (and its place under maxConnections) that long after we closed.
TLS_SHUTDOWN_SECONDS = 2.0
# Drain: a keep-alive connection is closed once it has been idle this long since the drain began (a
# client that is using it gets its next answer with `Connection: close` instead); see WebhookServer.drain.
DRAIN_IDLE_SECONDS = 2.0
# Drain: the listener closes once no connection has been accepted for this long.
DRAIN_LISTENER_QUIET_SECONDS = 0.25
DRAIN_TICK_SECONDS = 0.05
THROTTLED_LOG_INTERVAL_SECONDS = 10.0
# accept(2) failures that mean "out of a resource", which asyncio retries after 1 s.
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# File descriptors the process needs besides client connections (listener, logs, certificates, the
# kubernetes client's watch connections, the decision threads' imports).
FD_RESERVE = 64
REFUSAL_BODY = b"too many connections\n"
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nretry-after: 1\r\nconnection: close\r\n\r\n%s" % (len(REFUSAL_BODY), REFUSAL_BODY)
)


class ThrottledLog:
    """A warning that may happen thousands of times a second: the first at once, then at most one
    line per interval carrying how many happened since the last line (a pending count is flushed by
    a timer when the events stop)."""

    def __init__(self, message: str, *, interval: float = THROTTLED_LOG_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.monotonic, logger: logging.Logger = log) -> None:
        self.message = message
        self.interval = interval
        self.clock = clock
        self.logger = logger
        self.total = 0
        self.pending = 0
        self.last_logged: float | None = None
        self.detail: dict[str, Any] = {}
        self._flush_scheduled = False

    def record(self, loop: asyncio.AbstractEventLoop | None = None, **detail: Any) -> None:
        self.total += 1
        self.pending += 1
        self.detail = detail
        now = self.clock()
        if self.last_logged is None or now - self.last_logged >= self.interval:
            self.flush()
        elif loop is not None and not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_later(self.interval - (now - self.last_logged), self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if not self.pending:
            return
        since = 0.0 if self.last_logged is None else self.clock() - self.last_logged
        self.logger.warning(self.message, extra={**self.detail, "count": self.pending, "total": self.total,
                                                 "seconds": round(since, 1)})
        self.pending = 0
        self.last_logged = self.clock()


@dataclass
class ConnectionGuard:
    """The limits and the shared counters of one server's connections (one per server, shared by
    every protocol instance it creates)."""

    header_timeout_seconds: float
    max_connections: int
    on_connection: Callable[[], None] | None = None  # each accepted connection (TLS handshake done)
    accepted: int = 0
    last_accept: float = 0.0
    cut: ThrottledLog = field(default_factory=lambda: ThrottledLog(
        "connections closed: no complete request head within headerTimeoutSeconds"))
    refused: ThrottledLog = field(default_factory=lambda: ThrottledLog(
        "connections refused: maxConnections reached (answered 503)"))
    accept_errors: ThrottledLog = field(default_factory=lambda: ThrottledLog(
        "accepting connections fails: out of file descriptors or memory (asyncio retries every second)"))

    def flush(self) -> None:
        """Log what the throttled logs still hold (at shutdown)."""
        for throttled in (self.cut, self.refused, self.accept_errors):
            throttled.flush()

    def handle_loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The event loop's exception handler: resource errors of accept(2) are counted and logged by
        interval (each would otherwise be one line with a traceback); everything else as asyncio does."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
            self.accept_errors.record(loop, errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)))
            return
        if isinstance(exc, (OSError, ValueError)) and "._start_serving(" in str(context.get("message", "")):
            # NB: CPython 3.11's accept loop does not stop at EMFILE: it goes on for `backlog`
            # (2048) attempts, each logged and each scheduling its own retry of the listener one
            # second later (selector_events._accept_connection). Retries that fire after the
            # listener closed fail on fd -1; they are the tail of the same accept errors.
            self.accept_errors.record(loop, errno="listener closed")
            return
        loop.default_exception_handler(context)


def _readable(transport: asyncio.BaseTransport) -> bool:
    """Bytes are waiting in the kernel for this connection (asyncio has not read them yet)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    poller = select.poll()  # not select(): fds above 1024
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol with the header timeout, the connection cap and drain support."""

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None
        self._refused = False
        self.retired = False  # handshaked with a certificate since replaced: to be closed (recycle_connections)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        guard = self.guard
        guard.accepted += 1
        guard.last_accept = self.loop.time()
        if len(self.connections) > guard.max_connections:
            # Refused before anything is read: no parsing, no task; the fd is back within
            # TLS_SHUTDOWN_SECONDS even if the client never answers the close_notify.
            self._refused = True
            guard.refused.record(self.loop, max_connections=guard.max_connections)
            transport.write(REFUSAL)
            transport.close()
            return
        self._idle_since = guard.last_accept
        self._head_timer = self.loop.call_later(guard.header_timeout_seconds, self._on_head_timeout)
        if guard.on_connection is not None:
            guard.on_connection()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._idle_since = None
        super().data_received(data)
        self._watch_head()

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and cycle is not before:  # a request just began: its answer goes out in one write
            # NB: duck-typed: all but write and close is the transport's own (_OneWriteAnswer.__getattr__).
            cycle.transport = cast(asyncio.Transport, _OneWriteAnswer(self.transport, cycle))
        if self.retired:
            self._answer_with_close()

    def retire(self) -> None:
        """This connection's TLS session carries a replaced certificate: its next answer says
        `Connection: close` (the client reconnects, handshaking with the current certificate)."""
        self.retired = True
        self._answer_with_close()

    def _answer_with_close(self) -> None:
        # NB: uvicorn's h11 cycle adds `Connection: close` to a response whose request scope carries
        # that header (RequestResponseCycle.send), and then closes the connection after the response;
        # a response already started is left alone (its connection's next request gets the header).
        cycle = self.cycle
        if cycle is None or cycle.response_started:
            return
        headers = cycle.scope["headers"]
        if isinstance(headers, list) and CLOSE_HEADER not in headers:  # the protocol's own list
            headers.append(CLOSE_HEADER)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_head()
        if self._waiting_for_request() and not self.conn.trailing_data[0]:
            self._idle_since = self.loop.time()

    def _waiting_for_request(self) -> bool:
        return self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)

    def _watch_head(self) -> None:
        """Arm the header timer when a request head has started and is not complete; disarm it when
        the head is complete (h11 leaves IDLE only on a whole head). NB: checks the state first, so
        the common case (a whole request in one read) costs no timer at all."""
        if self.conn.their_state is not h11.IDLE:
            self._cancel_head_timer()
        elif self._head_timer is None and self.conn.trailing_data[0]:
            self._head_timer = self.loop.call_later(self.guard.header_timeout_seconds, self._on_head_timeout)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _on_head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.guard.cut.record(self.loop, header_timeout_seconds=self.guard.header_timeout_seconds)
            self.transport.abort()  # a client that stalls its head gets no TLS goodbye either

    def close_if_idle(self, now: float, *, quiet: float, since: float) -> bool:
        """Close this keep-alive connection if no request is on it, none has started, none is waiting
        in the kernel, and it has been idle `quiet` seconds, counted from `since` at the earliest. True
        when closed."""
        if self._refused or self._idle_since is None or now - max(self._idle_since, since) < quiet:
            return False
        if self.transport.is_closing() or not self._waiting_for_request() or self.conn.trailing_data[0]:
            return False
        if _readable(self.transport):
            return False  # a request is arriving: let it be read and answered with Connection: close
        self._cancel_head_timer()
        self._unset_keepalive_if_required()
        self.conn.send(h11.ConnectionClosed())
        self.transport.close()
        return True


class _OneWriteAnswer:
    """The connection as one request's cycle writes to it: the answer's head is held back and written with the
    first bytes of its body.

    uvicorn's h11 cycle writes the head on `http.response.start` and the body on `http.response.body`, so every
    answer cost two TLS records, two send(2) calls and two reads for the client (the apiserver) before it has the
    whole answer; here it is one of each. Writes before the answer starts (a `100 Continue`) pass at once, as do
    those after the first body bytes (a streamed body's next chunks); a head still held goes out before a close,
    and `abort` drops it with the connection. Everything else is the transport's own.
    """

    __slots__ = ("_cycle", "_head", "_transport", "_waiting")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        # NB: weak: the cycle holds this as its transport, and a strong reference back would make every request a
        # reference cycle that only the garbage collector frees (with the request's scope and everything it holds).
        self._cycle = weakref.ref(cycle)
        self._head: bytes | None = None
        self._waiting = True  # for the answer's head (the first write once the answer has started)

    def write(self, data: bytes) -> None:
        if self._head is not None:
            data, self._head = self._head + data, None
        elif self._waiting and getattr(self._cycle(), "response_started", False):
            self._waiting = False
            self._head = data
            return
        self._transport.write(data)

    def close(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def raise_fd_limit(max_connections: int) -> int:
    """Raise the soft open-files limit to the hard one (as Go's runtime does at start, golang/go#46279)
    and warn when `maxConnections` does not fit under it; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, FD_RESERVE + max_connections)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as e:
            log.warning("could not raise the open-files limit", extra={"soft": soft, "hard": hard, "error": str(e)})
    if soft != resource.RLIM_INFINITY and max_connections + FD_RESERVE > soft:
        log.warning("maxConnections does not fit under the open-files limit: accept(2) will fail before the cap",
                    extra={"max_connections": max_connections, "open_files_limit": soft, "reserve": FD_RESERVE})
    return soft


def protocol_for(guard: ConnectionGuard) -> type[GuardedProtocol]:
    """A protocol class bound to one server's guard (uvicorn builds protocols from a class)."""

    class BoundProtocol(GuardedProtocol):
        pass

    BoundProtocol.guard = guard
    return BoundProtocol


class WebhookServer(uvicorn.Server):
    """uvicorn's server with topoguard's listener options, loop exception handler and drain."""

    def __init__(self, config: uvicorn.Config, app: TopoguardApp, guard: ConnectionGuard,
                 *, drain_seconds: float = SHUTDOWN_GRACE_SECONDS) -> None:
        super().__init__(config)
        self.topoguard = app
        self.guard = guard
        self.drain_seconds = drain_seconds
        app.state.certificate_reloaded.append(self.recycle_connections)
        # asyncio calls connection_made once the TLS handshake is done; OpenSSL gave the connection the
        # context's certificate when it was accepted, a handshake earlier (app/tls.py).
        guard.on_connection = app.state.metrics.record_connection

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.topoguard.state.draining = True
        log.info("shutdown requested: draining", extra={"signal": sig})
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self.guard.handle_loop_exception)
        # NB: uvicorn 0.54 has no option for asyncio's TLS handshake/shutdown timeouts and calls
        # `loop.create_server` itself; for the duration of its startup that name on this (asyncio)
        # loop carries ours. `build_server` pins loop="asyncio", whose loop objects take attributes.
        loop.create_server = functools.partial(  # type: ignore[method-assign]
            loop.create_server, ssl_handshake_timeout=self.guard.header_timeout_seconds,
            ssl_shutdown_timeout=TLS_SHUTDOWN_SECONDS,
        )
        try:
            await super().startup(sockets=sockets)
        finally:
            del loop.create_server

    def recycle_connections(self) -> None:
        """After the serving certificate was reloaded: retire every open connection, so clients handshake
        again with the new certificate instead of whenever their keep-alive ends.

        A client that sends a request every few seconds (the apiserver under steady load) would
        otherwise keep its connections, and the old certificate, for as long as the pod lives: a
        rotated certificate the client cannot verify would show only at the next restart. A retired
        connection is closed by its own next answer (`Connection: close`), which the client reads before
        it could reuse the connection. It is never closed while idle: a client may be writing a request
        on it at that very moment (the HTTP/1.1 keep-alive race; Go reuses its most recently used idle
        connection first, so one that stays idle is one the client does not need, and the client's idle
        timeout, shorter than KEEP_ALIVE_SECONDS, closes it).
        """
        connections = [c for c in self.server_state.connections if isinstance(c, GuardedProtocol)]
        for connection in connections:
            connection.retire()
        log.info("certificate reloaded: connections made with the previous certificate close with their next "
                 "answer", extra={"connections": len(connections)})

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if not self.force_exit:
            await self.drain()
        await super().shutdown(sockets=sockets)
        self.guard.flush()

    async def drain(self) -> None:
        """Empty the server before uvicorn's own shutdown runs (it then finds nothing to cut).

        The HTTP/1.1 keep-alive race: a request the client writes on a connection while the server
        closes it is lost (the apiserver does not retry a POST), so the drain never closes a
        connection that may be carrying one. Since SIGTERM every answer says `Connection: close`, so
        a connection in use is closed by its own next answer, which the client reads before reusing
        it. A connection is closed by the server only when it has been idle DRAIN_IDLE_SECONDS since
        the drain began with nothing buffered or waiting in the kernel: a client that reuses
        connections (Go's transport picks the most recently used one first) is then unlikely to be
        writing on it, and Go's transport sees the close on an idle connection before it would reuse
        it. Idle time before SIGTERM does not count: at SIGTERM the apiserver may still be routing
        here at full rate, and a connection it had left idle a second is the next it takes in a burst
        (the lossless e2e suite lost a review to exactly that when such connections were closed at
        once). Still a race in principle (HTTP/1.1 has no way to retire an idle connection), made
        rare, not impossible: the Go client sees a close within its scheduling latency. The listener
        stays open meanwhile (a connection routed here late is answered, once, with `Connection:
        close`) and is closed after the idle connections, once no connection has arrived for
        DRAIN_LISTENER_QUIET_SECONDS, which is the only moment the listen backlog can be reset without
        resetting a client. The whole drain is bounded by `drain_seconds`; what is still running then
        is left to uvicorn's shutdown.
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.drain_seconds
        listening = True
        connections = self.server_state.connections
        while loop.time() < deadline and not self.force_exit:
            now = loop.time()
            for connection in list(connections):
                if isinstance(connection, GuardedProtocol):
                    connection.close_if_idle(now, quiet=DRAIN_IDLE_SECONDS, since=start)
            quiet_since = max(start + DRAIN_IDLE_SECONDS, self.guard.last_accept + DRAIN_LISTENER_QUIET_SECONDS)
            if listening and now >= quiet_since:
                for server in self.servers:
                    server.close()
                listening = False
                log.info("drain: listener closed", extra={"connections": len(connections)})
            if not listening and not connections:
                break
            await asyncio.sleep(DRAIN_TICK_SECONDS)
        log.info("drain: done", extra={"connections": len(connections), "seconds": round(loop.time() - start, 2)})


def build_server(app: TopoguardApp, context: ssl.SSLContext, *, settings: Settings, host: str | None = None,
                 port: int = 8443, drain_seconds: float = SHUTDOWN_GRACE_SECONDS) -> WebhookServer:
    """The webhook's server over `context` (the one builder: `topoguard serve` and the tests use it)."""
    guard = ConnectionGuard(header_timeout_seconds=settings.header_timeout_seconds,
                            max_connections=settings.max_connections)
    config = uvicorn.Config(
        app,
        host=host or "127.0.0.1",
        port=port,
        loop="asyncio",
        http=protocol_for(guard),
        log_config=None,
        access_log=False,
        server_header=False,
        date_header=False,
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        # The drain (above) already waited; this is what uvicorn waits for the rest.
        timeout_graceful_shutdown=1,
        h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES,
    )
    config.load()
    # uvicorn builds its own context only from file paths; ours carries the policy (TLS 1.2+ AEAD,
    # ALPN http/1.1, client CA) and is the live object the rotation reloads (Kludex/uvicorn#806).
    config.ssl = context
    return WebhookServer(config, app, guard, drain_seconds=drain_seconds)
