"""A real etcd + kube-apiserver on 127.0.0.1, as controller-runtime's envtest runs them.

No kubelet, scheduler or controller-manager: Nodes are plain API objects whose status the tests
write through the status subresource, which is all an admission webhook ever sees. The binaries
come from hack/envtest/build.sh (env TOPOGUARD_ENVTEST_BIN names their directory).

Every process logs to a file in the work directory; a start that fails raises with the log tail,
because "apiserver did not become ready" alone is useless when it happens in CI.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.e2e import pki

# Cold starts on a loaded 2-core CI box: etcd is up in about a second, kube-apiserver needs its
# post-start hooks (RBAC bootstrap, priority-and-fairness config, CRD controller) to finish.
ETCD_READY_TIMEOUT_SECONDS = 60.0
APISERVER_READY_TIMEOUT_SECONDS = 180.0
STOP_GRACE_SECONDS = 15.0
POLL_INTERVAL_SECONDS = 0.25
LOG_TAIL_BYTES = 4000
START_ATTEMPTS = 3

ADMIN_USER = "e2e-admin"
# system:masters bypasses RBAC: the suite is the cluster administrator, like envtest's admin user.
ADMIN_GROUP = "system:masters"
SERVICE_CIDR = "10.96.0.0/24"


class ControlPlaneError(RuntimeError):
    """A control-plane process did not start, or died."""


def free_port() -> int:
    """A port nothing listens on right now (the kernel picks it; racy in theory, fine on loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def log_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-limit:].decode(errors="replace")


@dataclass
class Process:
    """A child process with its log file; stop() is idempotent."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        log = self.log_path.open("ab")
        try:
            self.popen = subprocess.Popen(
                list(self.argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                start_new_session=True,
            )
        finally:
            log.close()

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()

    def fail(self, what: str) -> ControlPlaneError:
        code = None if self.popen is None else self.popen.poll()
        state = "still running" if code is None else f"exited with {code}"
        return ControlPlaneError(f"{self.name} {what} ({state}); last log lines of {self.log_path}:\n"
                                 f"{log_tail(self.log_path)}")


def wait_until(process: Process, probe: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll probe() until it is true; raise with the process log if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.running():
            raise process.fail(f"died before it was {what}")
        if probe():
            return
        time.sleep(POLL_INTERVAL_SECONDS)
    raise process.fail(f"was not {what} after {timeout:.0f}s")


def client_context(ca_file: Path | None) -> ssl.SSLContext:
    """TLS client context trusting ca_file; without one (a --self-signed server) nothing is verified."""
    if ca_file is not None:
        return ssl.create_default_context(cafile=str(ca_file))
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def https_ok(url: str, *, ca_file: Path | None, token: str | None = None, timeout: float = 5.0) -> bool:
    """True when GET url answers 200 (TLS verified against ca_file, or unverified when None)."""
    ctx = client_context(ca_file)
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


@dataclass
class ControlPlane:
    """etcd + kube-apiserver in one work directory, with an admin kubeconfig."""

    bin_dir: Path
    work_dir: Path
    apiserver_args: Sequence[str] = ()  # added to the suite's flags (e.g. --enable-aggregator-routing=true)
    ca: pki.CertificateAuthority = field(init=False)
    token: str = field(init=False)
    port: int = field(init=False)
    kubeconfig: Path = field(init=False)
    processes: list[Process] = field(default_factory=list, init=False)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start etcd then kube-apiserver; return once /readyz says 200. Stops both on failure."""
        for binary in ("etcd", "kube-apiserver"):
            if not os.access(self.bin_dir / binary, os.X_OK):
                raise ControlPlaneError(f"{self.bin_dir / binary} is missing or not executable "
                                        "(run hack/envtest/build.sh)")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                etcd_url = self._start_etcd()
                self._start_apiserver(etcd_url)
                break
            except ControlPlaneError as e:
                self.stop()
                # free_port() can lose a race with another process on this machine; try new ports.
                if attempt == START_ATTEMPTS or "address already in use" not in str(e):
                    raise
                self.processes.clear()
            except BaseException:
                self.stop()
                raise
        self.kubeconfig = self._write_kubeconfig()

    def stop(self) -> None:
        """Stop in reverse order (the apiserver first, so it does not log etcd errors on the way down)."""
        for process in reversed(self.processes):
            process.stop()

    def _start_etcd(self) -> str:
        client, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        etcd = Process("etcd", [
            str(self.bin_dir / "etcd"),
            "--name=e2e",
            f"--data-dir={self.work_dir / f'etcd-data-{client}'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=e2e={peer_url}",
            # Throw-away data: skip fsync like envtest does; it is most of etcd's write latency.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ], self.work_dir / "etcd.log")
        self.processes.append(etcd)
        etcd.start()
        wait_until(etcd, lambda: _http_ok(f"{client_url}/health"), timeout=ETCD_READY_TIMEOUT_SECONDS,
                   what="healthy")
        return client_url

    def _start_apiserver(self, etcd_url: str) -> None:
        certs = self.work_dir / "pki"
        certs.mkdir(exist_ok=True)
        self.ca = pki.CertificateAuthority(certs)
        serving = self.ca.issue_serving("apiserver", common_name="kube-apiserver")
        sa_key, sa_pub = pki.write_service_account_keys(certs)
        self.token = secrets.token_urlsafe(32)
        tokens = certs / "tokens.csv"
        # --token-auth-file format: token,user,uid,"group1,group2"
        tokens.write_text(f'{self.token},{ADMIN_USER},{ADMIN_USER},"{ADMIN_GROUP}"\n')
        tokens.chmod(0o600)
        self.port = free_port()
        apiserver = Process("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--tls-cert-file={serving.cert_path}",
            f"--tls-private-key-file={serving.key_path}",
            f"--client-ca-file={self.ca.pair.cert_path}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=RBAC",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            # Added to the default set (which already holds both): the suite is about these two.
            "--enable-admission-plugins=MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
            f"--cert-dir={certs}",
            "--v=1",
            *self.apiserver_args,
        ], self.work_dir / "kube-apiserver.log")
        self.processes.append(apiserver)
        apiserver.start()
        self._wait_apiserver_ready(apiserver)

    def _wait_apiserver_ready(self, apiserver: Process) -> None:
        wait_until(apiserver, lambda: https_ok(f"{self.url}/readyz", ca_file=self.ca.pair.cert_path,
                                               token=self.token),
                   timeout=APISERVER_READY_TIMEOUT_SECONDS, what="ready (/readyz)")

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver (SIGTERM: its own graceful shutdown) and start it again with the same flags,
        port, certificates and etcd; return once /readyz says 200 again."""
        apiserver = self.processes[-1]
        apiserver.stop()
        apiserver.start()
        self._wait_apiserver_ready(apiserver)

    def _write_kubeconfig(self) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {
                "server": self.url,
                "certificate-authority-data": base64.b64encode(self.ca.cert_pem).decode(),
            }}],
            "users": [{"name": ADMIN_USER, "user": {"token": self.token}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": ADMIN_USER}}],
            "current-context": "e2e",
        }
        path = self.work_dir / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path


def _http_ok(url: str) -> bool:
    with contextlib.suppress(urllib.error.URLError, OSError), urllib.request.urlopen(url, timeout=5) as resp:
        return bool(resp.status == 200)
    return False
