"""`topoguard serve`: the admission webhook over HTTPS (wiring: settings, store, TLS, the server).

The server itself (connection limits, the drain on SIGTERM) is app/http/server.py: on SIGTERM every
answer carries `Connection: close` and /readyz says 503, so the apiserver's pooled connections
(which stick to a pod, kubernetes/kubernetes#127335) move to another replica; idle keep-alive
connections are closed before the listener, and in-flight reviews get up to
`SHUTDOWN_GRACE_SECONDS`.

With the watch cache (no --cluster) and `audit.enabled`, the app also runs the audit controller
(app/controller: the Lease, the audit loop, Events, PolicyReports); it starts after the cache and
stops, releasing the Lease, before it.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import uvicorn

from app.cache.errors import CacheError
from app.cache.files import SnapshotError, load_snapshot
from app.cache.store import StaticStore, Store
from app.config import ConfigError, Settings, load_settings
from app.engine.whatif import Change, JobImpact
from app.http import server as http_server
from app.http.app import create_app
from app.http.server import SHUTDOWN_GRACE_SECONDS, WebhookServer
from app.logs import configure_logging
from app.metrics import Metrics
from app.tls import (
    CertificateFiles,
    TLSConfigError,
    certificate_not_after,
    certificate_serial,
    generate_self_signed,
    self_signed_context,
)

if TYPE_CHECKING:
    from app.cache.access import AccessReviewer
    from app.http.app import BackgroundService

log = logging.getLogger(__name__)

EXIT_USAGE = 2
GIL_SWITCH_INTERVAL_SECONDS = 0.0002  # see run()
__all__ = ["SHUTDOWN_GRACE_SECONDS", "WebhookServer", "build_server", "build_store", "run"]


def build_store(args: argparse.Namespace, settings: Settings) -> Store:
    if args.cluster:
        return StaticStore(load_snapshot(args.cluster, gpu_resources=settings.gpu_resources,
                                         cilium_config=settings.cilium_config,
                                         collective_ports=settings.collective_ports))
    from app.cache.watchers import WatchStore  # the kubernetes client loads only when watching

    store: Store = WatchStore(settings, kubeconfig=args.kubeconfig)
    return store


def build_server(args: argparse.Namespace, settings: Settings, *, offload_decisions: bool = True) -> WebhookServer:
    """The configured server (raises ConfigError / SnapshotError / TLSConfigError / CacheError on bad input).

    `offload_decisions=False` decides on the event loop (no deadline); bench/bench_http.py compares both.
    """
    if args.cluster and args.kubeconfig:
        raise ConfigError("--cluster and --kubeconfig are mutually exclusive")
    if args.self_signed and (args.tls_cert or args.tls_key):
        raise ConfigError("--self-signed and --tls-cert/--tls-key are mutually exclusive")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ConfigError("--tls-cert and --tls-key go together")
    if not (args.self_signed or args.tls_cert):
        raise ConfigError("a webhook must serve HTTPS: give --tls-cert and --tls-key, or --self-signed")
    certificates = None
    not_after = None
    serial = ""
    if args.tls_cert:
        certificates = CertificateFiles(args.tls_cert, args.tls_key, client_ca=args.tls_client_ca)
        context = certificates.context
    else:
        pair = generate_self_signed()
        context = self_signed_context(pair, client_ca=args.tls_client_ca)
        not_after = certificate_not_after(pair.cert_pem)
        serial = certificate_serial(pair.cert_pem)
    store = build_store(args, settings)
    metrics = Metrics()
    app = create_app(settings, store, metrics=metrics, certificates=certificates, certificate_not_after=not_after,
                     certificate_serial=serial,
                     offload_decisions=offload_decisions, map_reviewer=build_map_reviewer(args, settings),
                     background=build_background(args, settings, store, metrics),
                     policy_events=build_policy_events(args))
    return http_server.build_server(app, context, settings=settings, host=args.host, port=args.port)


def build_background(args: argparse.Namespace, settings: Settings, store: Store,
                     metrics: Metrics) -> list[BackgroundService]:
    """The audit controller when it can run: `audit.enabled` and a cluster to write to (not --cluster)."""
    if not settings.audit.enabled:
        log.info("audit: off (audit.enabled: false)")
        return []
    if args.cluster:
        log.info("audit: not run with --cluster (no API to elect a leader on or write Events to); "
                 "`topoguard audit --cluster` audits a file")
        return []
    from app.controller.loop import build_controller  # the kubernetes client loads only when watching

    return [build_controller(settings, store, metrics, kubeconfig=args.kubeconfig)]


def build_policy_events(args: argparse.Namespace) -> Callable[[Change, Sequence[JobImpact]], object] | None:
    """Events on the jobs a stored policy change breaks (POST /validate-policy), when there is an API to write to."""
    if args.cluster:
        return None
    from app.controller.policy_events import build_policy_events as build  # the kubernetes client loads only here

    return build(kubeconfig=args.kubeconfig)


# --- /map access (mapAccess, app/http/maps.py): the reviewer and the loopback listener -------------


def build_map_reviewer(args: argparse.Namespace, settings: Settings) -> AccessReviewer | None:
    """The TokenReview/SubjectAccessReview checker for `mapAccess: authorized`, else None.

    With `--cluster FILE` there is no API to ask, so `authorized` is refused at startup (a server that
    could only ever answer 503 on /map would hide the misconfiguration).
    """
    if settings.map_access != "authorized":
        return None
    if args.cluster:
        raise ConfigError("mapAccess: authorized asks the cluster (TokenReview, SubjectAccessReview) who may "
                          "read /map, and --cluster has no API; use mapAccess: loopback or off")
    from app.cache.access_api import build_access_reviewer  # the kubernetes client loads only when used

    return build_access_reviewer(args.kubeconfig)


def listeners(config: uvicorn.Config, settings: Settings) -> list[socket.socket] | None:
    """The sockets to serve on: None lets uvicorn bind host:port itself; with `mapAccess: loopback`, that
    socket plus 127.0.0.1:mapPort, the only listener that serves /map (same TLS; not in the Service).

    Raises:
        OSError: a port cannot be bound.
    """
    if settings.map_access != "loopback":
        return None
    webhook = config.bind_socket()
    try:
        return [webhook, socket.create_server(("127.0.0.1", settings.map_port))]
    except OSError:
        webhook.close()
        raise


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    try:
        settings = load_settings(args.config)
        server = build_server(args, settings)
        sockets = listeners(server.config, settings)
    except (ConfigError, SnapshotError, TLSConfigError, CacheError) as e:
        print(f"topoguard serve: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"topoguard serve: cannot listen: {e}", file=sys.stderr)
        return EXIT_USAGE
    log.info("starting", extra={
        "listen": f"{args.host}:{args.port}",
        "cluster": args.cluster or ("kubeconfig " + args.kubeconfig if args.kubeconfig else "in-cluster"),
        "tls": "self-signed" if args.self_signed else args.tls_cert,
        "client_ca": args.tls_client_ca or "",
        "mode": settings.mode, "enforcement": settings.enforcement, "zone_label": settings.zone_label,
        "zone_identity_label": settings.zone_identity_label,
        "map_access": settings.map_access + (f" 127.0.0.1:{settings.map_port}" if sockets else ""),
        "header_timeout_seconds": settings.header_timeout_seconds, "max_connections": settings.max_connections,
        "open_files_limit": http_server.raise_fd_limit(settings.max_connections),
    })
    # A review hands the GIL between the event loop and the decision workers several times; while the
    # publisher builds a snapshot or the pod watch parses events, each hand-over waits up to the switch
    # interval. 0.2 ms instead of Python's 5 ms (bench/bench_scale.py --full, review p99 during 500 pod
    # events/s: 5 ms -> 78.7, 1 ms -> 44.5 then, after this round's publish work 17.8; 0.2 ms -> 16.0 and
    # 13.8, p50 unchanged, no more CPU: 0.11-0.15 core).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_SECONDS)
    server.run(sockets=sockets)
    return 0
