"""What runs around two webhook replicas in a cluster, played by the test: the Deployment's pods, the
kubelet that stops them, the EndpointSlice controller, the Secret volume that rotates their
certificates, and clients creating training jobs under load (test_lossless.py drives them).

Routing is the real apiserver's own: started with `--enable-aggregator-routing=true`, it resolves
a webhook's `clientConfig.service` to one Ready endpoint of the Service's EndpointSlices when it
dials a new connection (k8s.io/apiserver pkg/util/webhook/client.go `cfg.Dial` calling
`ResolveEndpoint`, pkg/util/proxy/proxy.go), and pools connections by the Service's host name,
not by endpoint. Each replica is a `topoguard serve` on its own loopback address (127.0.0.N, one
per pod, never reused, as pod IPs are not) and the same port. The slice's addressType is FQDN:
discovery/v1 validation refuses loopback addresses in an IPv4 slice, while an IP literal is a
valid FQDN entry and the resolver dials it as it is.

The endpoints controller here probes /readyz itself (kubelet probes do not verify the serving
certificate, nor does it) and writes one EndpointSlice: a replica is Ready while its probe says
200 and it is not terminating; a terminating replica stays listed, `ready: false, terminating:
true`, until its process is gone, as the real controller lists a pod until it is deleted.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import re
import signal
import socket
import ssl
import statistics
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e import kube, pki, webhooks
from tests.e2e.controlplane import ControlPlane, free_port
from tests.e2e.topoguard import TopoguardServer

NAMESPACE = webhooks.RELEASE_NAMESPACE
SERVICE = "topoguard"
SERVER_NAME = f"{SERVICE}.{NAMESPACE}.svc"  # what the apiserver sends as SNI and verifies (client.go)
PORT_NAME = "https"
SLICE = f"{SERVICE}-e2e"
LOSSLESS_LABEL = "e2e.topoguard.io/lossless"
PROBE_PERIOD_SECONDS = 0.5
PROBE_TIMEOUT_SECONDS = 2.0
REQUEST_TIMEOUT_SECONDS = 30.0
ZONE_ANNOTATION = "topoguard.io/zone"
DECISION_ANNOTATION = "topoguard.io/decision"


# --- the Secret volume ------------------------------------------------------------------------------


def project_secret(volume: Path, pair: pki.IssuedPair) -> None:
    """Write pair into volume the way the kubelet updates a mounted Secret (its AtomicWriter): the files
    go into a fresh timestamped directory, a `..data_tmp` symlink to it is renamed over `..data`
    (one atomic switch of both files), and tls.crt / tls.key are symlinks through `..data`."""
    volume.mkdir(parents=True, exist_ok=True)
    generation = volume / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{uuid.uuid4().hex[:8]}"
    generation.mkdir()
    (generation / "tls.crt").write_bytes(pair.cert_pem)
    (generation / "tls.key").write_bytes(pair.key_pem)
    (generation / "tls.key").chmod(0o600)
    tmp = volume / "..data_tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(generation.name)
    previous = (volume / "..data").resolve() if (volume / "..data").is_symlink() else None
    tmp.rename(volume / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (volume / name).is_symlink():
            (volume / name).symlink_to(f"..data/{name}")
    if previous is not None and previous.is_dir():
        for file in previous.iterdir():
            file.unlink()
        previous.rmdir()


# --- the pods, the kubelet and the endpoints controller -----------------------------------------------


_addresses = itertools.count(2)


@dataclass
class Replica:
    """One pod: a `topoguard serve` on its own loopback address.

    The test's own requests to it (probes, /metrics) go over one kept-alive connection, and every
    connection the test opens to it is counted, so the replica's count of accepted connections minus
    the test's own is what the apiserver opened.
    """

    name: str
    server: TopoguardServer
    volume: Path
    terminating: bool = False
    exit_code: int | None = None
    killed_after_grace: bool = False
    own_connections: int = 0
    _conn: http.client.HTTPSConnection | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def address(self) -> str:
        return self.server.host

    def get(self, path: str) -> tuple[int, bytes] | None:
        """GET path over the test's kept-alive connection (certificate not verified, as kubelet probes
        do not verify it); None when nothing answers."""
        with self._lock:
            try:
                if self._conn is None:
                    self.own_connections += 1
                    self._conn = http.client.HTTPSConnection(self.address, self.server.port, context=_unverified(),
                                                             timeout=PROBE_TIMEOUT_SECONDS)
                self._conn.request("GET", path)
                response = self._conn.getresponse()
                body = response.read()
                if response.getheader("connection", "").lower() == "close":
                    self._conn.close()
                    self._conn = None
                return response.status, body
            except (OSError, http.client.HTTPException):
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                return None

    def probe(self) -> bool:
        """The readiness probe: GET /readyz answers 200."""
        answer = self.get("/readyz")
        return answer is not None and answer[0] == 200

    def connections_by_serial(self) -> dict[str, float]:
        """topoguard_tls_connections_total by serial, from the replica's /metrics."""
        answer = self.get("/metrics")
        assert answer is not None and answer[0] == 200, f"{self.name}: /metrics does not answer"
        return {sample.labels["serial"]: sample.value
                for family in text_string_to_metric_families(answer[1].decode())
                for sample in family.samples if sample.name == "topoguard_tls_connections_total"}

    def served_serial(self) -> str:
        """The serial (hex) of the certificate a new TLS handshake with the replica gets."""
        with self._lock:
            self.own_connections += 1
        with socket.create_connection((self.address, self.server.port), timeout=5) as raw, \
                _unverified().wrap_socket(raw, server_hostname=SERVER_NAME) as tls:
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return f"{x509.load_der_x509_certificate(der).serial_number:X}"

    def reloaded(self, serial: str) -> bool:
        """The replica's log says it loaded the certificate with this serial."""
        return f'"serial":"{serial}"' in self.server.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.server.process.running()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None


def _unverified() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class Deployment:
    """The webhook's pods: each started with the Secret's current serving pair, the same flags and port."""

    def __init__(self, work: Path, args: list[str], secret: pki.IssuedPair) -> None:
        self.work = work
        self.args = args
        self.secret = secret
        self.port = free_port()  # free on 127.0.0.1; every replica listens on it, each on its own 127.0.0.N
        self.replicas: list[Replica] = []
        self._lock = threading.Lock()
        self._names = itertools.count(1)

    def start_replica(self) -> Replica:
        """A new pod, returned once its /readyz says 200 (the endpoints controller then lists it)."""
        index = next(self._names)
        name = f"replica-{index}"
        volume = self.work / f"{name}-tls"
        project_secret(volume, self.secret)
        address = f"127.0.0.{next(_addresses)}"
        server = TopoguardServer(
            [*self.args, "--tls-cert", str(volume / "tls.crt"), "--tls-key", str(volume / "tls.key")],
            self.work / f"{name}.log", ca_file=None, port=self.port, host=address,
        )
        server.start(wait_for="/readyz")
        replica = Replica(name, server, volume)
        with self._lock:
            self.replicas.append(replica)
        return replica

    def rotate(self, pair: pki.IssuedPair) -> None:
        """The Secret changed (cert-manager renewed it): the kubelet projects it into every pod's volume."""
        self.secret = pair
        for replica in self.live():
            project_secret(replica.volume, pair)

    def live(self) -> list[Replica]:
        with self._lock:
            return list(self.replicas)

    def forget(self, replica: Replica) -> None:
        with self._lock:
            self.replicas.remove(replica)

    def stop_all(self) -> None:
        for replica in self.live():
            replica.close()
            replica.server.stop()
            self.forget(replica)


class EndpointsController:
    """Keeps the Service's one EndpointSlice in step with the replicas' probes (a thread)."""

    def __init__(self, cluster: kube.Cluster, deployment: Deployment) -> None:
        self.cluster = cluster
        self.deployment = deployment
        self.written: list[kube.RawObject] | None = None
        self.writes = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._written_cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="endpoints-controller", daemon=True)
        self.errors: list[str] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def sync_now(self) -> None:
        self._wake.set()

    def _endpoints(self) -> list[kube.RawObject]:
        out = []
        for replica in self.deployment.live():
            if not replica.alive():
                continue  # the pod is gone (or its container died: not ready, the probe cannot answer)
            serving = replica.probe()
            out.append({
                "addresses": [replica.address],
                "conditions": {"ready": serving and not replica.terminating, "serving": serving,
                               "terminating": replica.terminating},
                "targetRef": {"kind": "Pod", "namespace": NAMESPACE, "name": replica.name},
            })
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            endpoints = self._endpoints()
            if endpoints != self.written:
                try:
                    self._write(endpoints)
                except Exception as e:  # the apiserver may be restarting: try again next period
                    self.errors.append(str(e)[:200])
                else:
                    with self._written_cond:
                        self.written = endpoints
                        self.writes += 1
                        self._written_cond.notify_all()
            self._wake.wait(PROBE_PERIOD_SECONDS)
            self._wake.clear()

    def _write(self, endpoints: list[kube.RawObject]) -> None:
        path = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices/{SLICE}"
        current = self.cluster.request("GET", path)[0]
        current["endpoints"] = endpoints
        self.cluster.request("PUT", path, current)

    def wait_written(self, check: Callable[[list[kube.RawObject]], bool], timeout: float = 30.0) -> None:
        """Until the slice last written satisfies check."""
        deadline = time.monotonic() + timeout
        with self._written_cond:
            while not (self.written is not None and check(self.written)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the EndpointSlice never reached the expected state; last: {self.written}, "
                                       f"errors: {self.errors[-3:]}")
                self._written_cond.wait(min(left, 0.2))

    def wait_ready(self, replica: Replica) -> None:
        self.wait_written(lambda eps: any(e["addresses"] == [replica.address] and e["conditions"]["ready"]
                                          for e in eps))

    def wait_gone(self, replica: Replica) -> None:
        self.wait_written(lambda eps: all(e["addresses"] != [replica.address] for e in eps))


def service_objects(port: int) -> list[kube.RawObject]:
    """The Service (no selector: the test writes its EndpointSlice) and an empty slice for it."""
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
         "spec": {"type": "ClusterIP", "ports": [{"name": PORT_NAME, "port": 443, "targetPort": port,
                                                   "protocol": "TCP"}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": SLICE, "namespace": NAMESPACE,
                      "labels": {"kubernetes.io/service-name": SERVICE,
                                 "endpointslice.kubernetes.io/managed-by": "e2e.topoguard.io"}},
         "addressType": "FQDN", "ports": [{"name": PORT_NAME, "port": port, "protocol": "TCP"}], "endpoints": []},
    ]


@dataclass
class Termination:
    replica: str
    exit_code: int | None
    killed: bool
    seconds: float


class Kubelet:
    """Stops pods as the kubelet does: the endpoint goes not-ready (the endpoints controller sees the pod
    terminating) while the preStop hook runs, then SIGTERM, then SIGKILL once the grace period is over."""

    def __init__(self, deployment: Deployment, endpoints: EndpointsController, *, grace_seconds: float) -> None:
        self.deployment = deployment
        self.endpoints = endpoints
        self.grace_seconds = grace_seconds

    def terminate(self, replica: Replica, *, pre_stop_seconds: float = 0.0) -> Termination:
        started = time.monotonic()
        replica.terminating = True
        self.endpoints.sync_now()
        popen = replica.server.process.popen
        assert popen is not None
        time.sleep(pre_stop_seconds)
        popen.send_signal(signal.SIGTERM)
        try:
            replica.exit_code = popen.wait(max(0.0, self.grace_seconds - pre_stop_seconds))
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
            replica.killed_after_grace = True
        self.deployment.forget(replica)
        self.endpoints.sync_now()
        return Termination(replica.name, replica.exit_code, replica.killed_after_grace, time.monotonic() - started)

    def kill(self, replica: Replica) -> float:
        """SIGKILL: the process gets no drain (an OOM kill, a node lost); returns when it was sent."""
        popen = replica.server.process.popen
        assert popen is not None
        popen.kill()
        killed_at = time.monotonic()
        popen.wait()
        self.endpoints.sync_now()
        return killed_at


# --- the clients ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    started: float  # monotonic
    seconds: float
    failure: str | None  # None: created, and patched by topoguard


@dataclass
class Report:
    scenario: str
    attempts: list[Attempt]
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def failures(self) -> Counter[str]:
        return Counter(a.failure for a in self.attempts if a.failure is not None)

    def latency_ms(self, q: float) -> float:
        ok = sorted(a.seconds for a in self.attempts if a.failure is None)
        if len(ok) < 2:
            return float("nan")
        return statistics.quantiles(ok, n=1000, method="inclusive")[round(q * 1000) - 1] * 1000

    def row(self) -> str:
        failures = self.failures
        kinds = ", ".join(f"{n} {kind}" for kind, n in failures.most_common()) or "-"
        return (f"| {self.scenario} | {len(self.attempts)} | {sum(failures.values())} ({kinds}) | "
                f"{self.latency_ms(0.5):.1f} / {self.latency_ms(0.99):.1f} ms |")


CAUSES = (
    ("connection reset", "connection reset by peer"),
    ("connection refused", "connection refused"),
    ("EOF", "EOF"),
    ("deadline", "timeout"),
    ("timeout", "timeout"),
    ("x509", "certificate rejected"),
    ("tls:", "TLS error"),
    ("no endpoints available", "no endpoints"),
    ("not yet ready", "webhook plugin not ready"),
)


def classify(status: int, body: bytes) -> str | None:
    """None for a stored job topoguard patched; else a short kind: which side failed and how."""
    try:
        obj = json.loads(body)
    except ValueError:
        return f"apiserver {status}: not JSON"
    if status == 201:
        annotations = obj.get("metadata", {}).get("annotations") or {}
        if ZONE_ANNOTATION in annotations or DECISION_ANNOTATION in annotations:
            return None
        return "admitted unpatched"  # the webhook was skipped: a silent allow
    message = str(obj.get("message", ""))
    hook = re.search(r'failed calling webhook "(\w+)\.', message)
    if hook:
        cause = next((short for needle, short in CAUSES if needle in message), message[-80:])
        return f"webhook ({hook.group(1)}): {cause}"
    if status == 403 and "topoguard" in message:
        return "denied by topoguard"
    return f"apiserver {status} {obj.get('reason', '')}".rstrip()


class Load:
    """PyTorchJob creates at `rate` per second in all from `threads` threads, each over its own kept-alive
    HTTPS connection to the apiserver. No retries: every attempt counts once."""

    def __init__(self, control_plane: ControlPlane, job: kube.RawObject, *, prefix: str, rate: float = 30.0,
                 threads: int = 8) -> None:
        self.control_plane = control_plane
        self.job = job
        self.prefix = prefix
        self.interval = threads / rate
        self.threads = [threading.Thread(target=self._run, args=(i,), name=f"load-{i}", daemon=True)
                        for i in range(threads)]
        self.attempts: list[Attempt] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.path = f"/apis/kubeflow.org/v1/namespaces/{job['metadata']['namespace']}/pytorchjobs"

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self.threads:
            t.join()

    def _connect(self) -> http.client.HTTPSConnection:
        ctx = ssl.create_default_context(cafile=str(self.control_plane.ca.pair.cert_path))
        return http.client.HTTPSConnection("127.0.0.1", self.control_plane.port, context=ctx,
                                           timeout=REQUEST_TIMEOUT_SECONDS)

    def _run(self, index: int) -> None:
        conn: http.client.HTTPSConnection | None = None
        headers = {"Authorization": f"Bearer {self.control_plane.token}", "Content-Type": "application/json",
                   "Accept": "application/json"}
        # Threads start staggered over one interval, so the creates are spread evenly.
        next_at = time.monotonic() + self.interval * index / len(self.threads)
        for n in itertools.count():
            delay = next_at - time.monotonic()
            if self._stop.wait(max(0.0, delay)):
                break
            next_at = max(next_at + self.interval, time.monotonic())
            job = json.loads(json.dumps(self.job))
            job["metadata"]["name"] = f"{self.prefix}-{index}-{n}"
            body = json.dumps(job).encode()
            started = time.monotonic()
            try:
                conn = conn or self._connect()
                conn.request("POST", self.path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                failure = classify(response.status, data)
                if response.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                failure = f"apiserver unreachable ({type(e).__name__})"
                if conn is not None:
                    conn.close()
                conn = None
            with self._lock:
                self.attempts.append(Attempt(started, time.monotonic() - started, failure))
        if conn is not None:
            conn.close()

    def report(self, scenario: str) -> Report:
        with self._lock:
            return Report(scenario, sorted(self.attempts, key=lambda a: a.started))


@contextlib.contextmanager
def running(endpoints: EndpointsController) -> Iterator[EndpointsController]:
    endpoints.start()
    try:
        yield endpoints
    finally:
        endpoints.stop()
