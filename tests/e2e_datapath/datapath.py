"""Cilium's own agent and CNI plugin on this machine, without containers: one node, pods as netns.

Test infrastructure for `make e2e-datapath` (hack/e2e-datapath.sh). What runs is Cilium's real code
(hack/datapath/build.sh builds cilium-agent, cilium-cni and cilium-dbg from the Cilium Go module),
enforcing policy with the BPF programs it compiles at run time. What this module adds is only the
part a node's OS, kubelet and container runtime would play:

- network namespaces: the node (`eth0`, 192.168.100.10/24, whose veth peer sits in a second
  namespace acting as the gateway) and one per pod. They are persisted as bind mounts of files in
  the suite's work directory (`unshare --net=FILE`), not in /run/netns, and entered with nsenter.
- the agent, in the node's netns and in a private mount namespace that holds its own sysfs, bpffs,
  a tmpfs on /run (its hard-coded /var/run/cilium paths land in the work directory), an EMPTY child
  cgroup as --cgroup-root, and /proc/sys/kernel bind-mounted read-only. The last one matters: the
  agent's loader otherwise writes global sysctls (kernel.unprivileged_bpf_disabled=1 cannot be
  undone without a reboot). The agent logs "Failed to write sysctl setting" and carries on.
- the API server: the agent reaches the suite's kube-apiserver (127.0.0.1 of the root netns)
  through a forwarder whose listening socket was created inside the node's netns (setns on one
  thread), so no interface or route is added to the host.
- a pod: the Pod object (bound to the node), a netns, and CNI ADD of the real plugin, run inside
  the node's netns exactly as a runtime would call it (the host end of the veth lands in the node).
  Its "container" is whatever command the test runs in that netns.

Facts behind the flags: ../shared/research/cilium-datapath.md (a feasibility run on these machines)
and Cilium's docs for each flag. Nothing here writes to the host's network or sysctls; HostState
records what the suite asserts is unchanged afterwards. Processes are stopped by their own PID only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NODE_IP = "192.168.100.10"
GATEWAY_IP = "192.168.100.1"
NODE_CIDR_PREFIX = 24
POD_CIDR = "10.244.1.0/24"
CLUSTER_POD_CIDR = "10.244.0.0/16"
AGENT_READY_TIMEOUT_SECONDS = 240.0  # first start compiles the BPF datapath with clang on a busy 2-core box
ENDPOINT_READY_TIMEOUT_SECONDS = 120.0
CNI_TIMEOUT_SECONDS = 120.0
STOP_GRACE_SECONDS = 15.0
POLL_SECONDS = 0.5
CLONE_NEWNET = 0x40000000

# Sysctls the agent is known to write (kernel.*: global) or that a datapath could plausibly touch;
# the suite reads them in the root namespace before and after and asserts they are unchanged.
WATCHED_SYSCTLS = (
    "kernel/unprivileged_bpf_disabled", "kernel/timer_migration", "kernel/bpf_stats_enabled",
    "kernel/perf_event_paranoid", "kernel/printk",
    "net/core/bpf_jit_enable", "net/core/bpf_jit_harden", "net/core/bpf_jit_kallsyms",
    "net/ipv4/ip_forward", "net/ipv4/conf/all/forwarding", "net/ipv4/conf/all/rp_filter",
    "net/ipv4/conf/default/rp_filter", "net/ipv4/ip_local_port_range", "net/ipv4/ip_local_reserved_ports",
    "net/core/somaxconn", "net/ipv4/conf/all/send_redirects",
)


class DatapathError(RuntimeError):
    """A step of the datapath harness failed; the message carries the evidence (logs, output)."""


def run(argv: Sequence[str], *, check: bool = True, timeout: float = 60.0, env: dict[str, str] | None = None,
        input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env,
                            input=input_text, check=False)
    if check and result.returncode != 0:
        raise DatapathError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def log_tail(path: Path, limit: int = 6000) -> str:
    try:
        return path.read_bytes()[-limit:].decode(errors="replace")
    except OSError:
        return "(no log)"


# --- the host's state the suite must leave alone ---------------------------------------------------------------


@dataclass(frozen=True)
class HostState:
    """The root namespace's interfaces, routes, iptables rules and watched sysctls, as text."""

    links: str
    addresses: str
    routes: str
    iptables: str
    sysctls: tuple[tuple[str, str], ...]

    @classmethod
    def capture(cls) -> HostState:
        # ip -o link also prints per-interface counters on some versions: keep name, flags, mtu, state.
        links = "\n".join(sorted(re.sub(r"\s+link/.*$", "", line) for line in
                                 run(["ip", "-o", "link", "show"]).stdout.splitlines()))
        addresses = "\n".join(sorted(run(["ip", "-o", "addr", "show"]).stdout.splitlines()))
        routes = run(["ip", "route", "show", "table", "all"]).stdout
        iptables = ""
        if shutil.which("iptables-save"):
            saved = run(["iptables-save"], check=False)
            # Packet counters and the timestamp comment change on their own.
            iptables = "\n".join(line for line in saved.stdout.splitlines() if not line.startswith("#"))
            iptables = re.sub(r"\[\d+:\d+\]", "", iptables) + saved.stderr
        values = []
        for key in WATCHED_SYSCTLS:
            try:
                values.append((key, (Path("/proc/sys") / key).read_text().strip()))
            except OSError as e:
                values.append((key, f"unreadable: {e.strerror}"))
        return cls(links, addresses, routes, iptables, tuple(values))

    def differences(self, after: HostState) -> list[str]:
        out = []
        for name in ("links", "addresses", "routes", "iptables", "sysctls"):
            if getattr(self, name) != getattr(after, name):
                out.append(f"{name} changed:\nbefore: {getattr(self, name)}\nafter:  {getattr(after, name)}")
        return out


# --- network namespaces ---------------------------------------------------------------------------------------


@dataclass
class Netns:
    """A network namespace persisted as a bind mount on a file (unshare --net=FILE)."""

    path: Path

    @classmethod
    def create(cls, path: Path) -> Netns:
        path.touch()
        run(["unshare", f"--net={path}", "true"])
        ns = cls(path)
        ns.run(["ip", "link", "set", "lo", "up"])
        return ns

    def argv(self, command: Sequence[str]) -> list[str]:
        return ["nsenter", f"--net={self.path}", *command]

    def run(self, command: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return run(self.argv(command), **kwargs)

    def destroy(self) -> None:
        if self.path.exists():
            run(["umount", str(self.path)], check=False)
            self.path.unlink(missing_ok=True)


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def listen_in(netns: Netns, host: str, port: int) -> socket.socket:
    """A listening TCP socket that lives in netns (setns on a throw-away thread: only it switches)."""
    result: list[socket.socket | BaseException] = []

    def inside() -> None:
        try:
            with open(netns.path) as f:
                _setns(f.fileno())
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
            s.listen(64)
            result.append(s)
        except BaseException as e:  # handed to the caller's thread
            result.append(e)

    thread = threading.Thread(target=inside, name="setns-listen")
    thread.start()
    thread.join()
    (outcome,) = result
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


class Forwarder:
    """TCP from a socket listening inside a netns to an address of the root netns (the apiserver)."""

    def __init__(self, listener: socket.socket, target: tuple[str, int]) -> None:
        self.listener = listener
        self.target = target
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._accept, name="apiserver-forwarder", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(conn,), daemon=True).start()

    def _pipe(self, conn: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            conn.close()
            return
        upstream.settimeout(None)
        sel = selectors.DefaultSelector()
        sel.register(conn, selectors.EVENT_READ, upstream)
        sel.register(upstream, selectors.EVENT_READ, conn)
        try:
            while not self.closed.is_set():
                for key, _ in sel.select(timeout=1.0):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            conn.close()
            upstream.close()

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


# --- the agent ------------------------------------------------------------------------------------------------

# Run inside `nsenter --net=<node> unshare --mount --propagation private`: every mount below is
# private to the agent's mount namespace and disappears with it. $1 = work dir, $2 = cgroup name
# (an empty child of the cgroup2 hierarchy, created by the harness), rest = the agent's argv.
AGENT_WRAPPER = r"""
set -eu
work="$1"; cgroup_dir="$2"; shift 2
# The empty child cgroup as the agent's --cgroup-root (bind-mount shows it as a cgroup2 mount, so
# the agent does not mount the root hierarchy itself): no host process is in it.
mount --bind "$cgroup_dir" "$work/cgroup"
# sysfs of this netns (as `ip netns exec` does), and a bpffs of our own on it.
mount -t sysfs sysfs /sys
mount -t bpf bpffs /sys/fs/bpf
# Global sysctls read-only: the loader's writes to kernel.* fail instead of changing the host.
mount --bind /proc/sys/kernel /proc/sys/kernel
mount -o remount,bind,ro /proc/sys/kernel
# /var/run/cilium (sockets, state) -> the work directory, via a private tmpfs on /run.
mount -t tmpfs tmpfs /run
mkdir -p /run/cilium
mount --bind "$work/run" /run/cilium
exec "$@"
"""


@dataclass
class Agent:
    """cilium-agent as the node `node_name`: its netns, mounts, flags, log; stop() by PID."""

    bin_dir: Path
    work: Path
    node: Netns
    node_name: str
    kubeconfig: Path
    cgroup_dir: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def log_path(self) -> Path:
        return self.work / "cilium-agent.log"

    @property
    def socket_path(self) -> Path:
        return self.work / "run" / "cilium.sock"

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def argv(self) -> list[str]:
        return [
            str(self.bin_dir / "cilium-agent"),
            f"--k8s-kubeconfig-path={self.kubeconfig}",
            "--state-dir=/run/cilium",
            f"--lib-dir={self.bin_dir / 'lib'}",
            "--bpf-root=/sys/fs/bpf",
            f"--cgroup-root={self.work / 'cgroup'}",
            # The Node's spec.podCIDR is the pool, as with the kubelet's --allocate-node-cidrs.
            "--ipam=kubernetes", "--k8s-require-ipv4-pod-cidr=true",
            "--enable-ipv4=true", "--enable-ipv6=false",
            "--routing-mode=native", f"--ipv4-native-routing-cidr={CLUSTER_POD_CIDR}",
            "--devices=eth0",
            # What one node without kube-proxy, Envoy or Hubble can run (docs/e2e.md says so).
            "--kube-proxy-replacement=false", "--bpf-lb-sock=false",
            "--enable-l7-proxy=false", "--enable-hubble=false",
            "--install-iptables-rules=false", "--enable-ipv4-masquerade=false",
            "--enable-health-checking=false", "--enable-endpoint-health-checking=false",
            # No operator: the agent creates CiliumIdentity / CiliumEndpoint / CiliumNode itself.
            "--identity-allocation-mode=crd",
            "--enable-policy=default",
            # A relabelled pod gets its new identity at once (default: up to 30 s of jitter).
            "--identity-max-jitter=0s",
        ]

    def start(self) -> None:
        for sub in ("run", "cgroup", "bin"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        # The agent runs `clang` (and `llc` on older paths) from PATH: Debian names them clang-19.
        for tool in ("clang", "llc"):
            link = self.work / "bin" / tool
            target = shutil.which(f"{tool}-19")
            if target is None:
                raise DatapathError(f"{tool}-19 not found: run hack/datapath/deps.sh (Debian clang-19, llvm-19)")
            if not link.exists():
                link.symlink_to(target)
        env = {
            "PATH": f"{self.work / 'bin'}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
            "K8S_NODE_NAME": self.node_name,
            "HOME": str(self.work),
        }
        argv = self.node.argv(["unshare", "--mount", "--propagation", "private",
                               "sh", "-c", AGENT_WRAPPER, "agent", str(self.work), str(self.cgroup_dir),
                               *self.argv()])
        with self.log_path.open("ab") as log:
            # nsenter, unshare and sh each exec the next: the PID we get is the agent's.
            self.popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env, start_new_session=True)
        deadline = time.monotonic() + AGENT_READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise self.fail("exited before it was ready")
            status = self.dbg(["status", "--brief"], check=False, timeout=20)
            if status.returncode == 0 and status.stdout.strip().startswith("OK"):
                return
            time.sleep(POLL_SECONDS)
        raise self.fail(f"was not ready after {AGENT_READY_TIMEOUT_SECONDS:.0f}s")

    def fail(self, what: str) -> DatapathError:
        return DatapathError(f"cilium-agent {what}; last lines of {self.log_path}:\n{log_tail(self.log_path)}")

    def dbg(self, args: Sequence[str], *, check: bool = True,
            timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """cilium-dbg against this agent's REST socket (reachable from the host in the work dir)."""
        env = {**os.environ, "CILIUM_SOCK": str(self.socket_path)}
        return run([str(self.bin_dir / "cilium-dbg"), *args], check=check, timeout=timeout, env=env)

    def in_agent_namespaces(self, command: Sequence[str]) -> list[str]:
        """argv that runs command in the agent's mount + network namespaces (its monitor socket lives there)."""
        return ["nsenter", "-t", str(self.pid), "-m", "-n", *command]

    def endpoints(self) -> list[dict[str, Any]]:
        out = self.dbg(["endpoint", "list", "-o", "json"], check=False)
        if out.returncode != 0:
            return []
        data = json.loads(out.stdout or "[]")
        return data if isinstance(data, list) else []

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        os.kill(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


def endpoint_summary(endpoint: dict[str, Any]) -> tuple[str, str, int, list[str]]:
    """(IPv4, state, identity id, identity labels) of one `cilium-dbg endpoint list -o json` entry."""
    status = endpoint.get("status") or {}
    addressing = (status.get("networking") or {}).get("addressing") or [{}]
    ip = addressing[0].get("ipv4", "")
    identity = status.get("identity") or {}
    return ip, str(status.get("state", "")), int(identity.get("id", 0)), list(identity.get("labels") or [])


class Monitor:
    """`cilium-dbg monitor --type drop` in the agent's namespaces, its output collected to a file."""

    def __init__(self, agent: Agent, path: Path) -> None:
        self.path = path
        with path.open("ab") as out:
            self.popen = subprocess.Popen(
                agent.in_agent_namespaces([str(agent.bin_dir / "cilium-dbg"), "monitor", "--type", "drop"]),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        # The monitor prints a banner once it is attached to the agent's monitor socket.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "Listening for events" not in self.text():
            if self.popen.poll() is not None:
                raise DatapathError(f"cilium-dbg monitor exited: {self.text()}")
            time.sleep(0.2)

    def text(self) -> str:
        try:
            return self.path.read_text(errors="replace")
        except OSError:
            return ""

    def drops(self, *, dst: str, port: int) -> list[str]:
        """Drop lines for packets to dst:port."""
        needle = f"-> {dst}:{port} "
        return [line for line in self.text().splitlines() if "drop" in line and needle in line + " "]

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


# --- pods -----------------------------------------------------------------------------------------------------


@dataclass
class PodNet:
    """A pod's network: its netns (the "sandbox") and the IP the CNI plugin gave it."""

    namespace: str
    name: str
    netns: Netns
    container_id: str
    ip: str

    def argv(self, command: Sequence[str]) -> list[str]:
        return self.netns.argv(command)


def cni(bin_dir: Path, node: Netns, agent: Agent, command: str, *, namespace: str, name: str, container_id: str,
        netns_path: Path) -> subprocess.CompletedProcess[str]:
    """One call of the real cilium-cni, from inside the node's netns, as a container runtime makes it."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container_id,
        "CNI_NETNS": str(netns_path),
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(bin_dir),
        "CNI_ARGS": (f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};"
                     f"K8S_POD_INFRA_CONTAINER_ID={container_id}"),
        "CILIUM_SOCK": str(agent.socket_path),
    }
    netconf = json.dumps({"cniVersion": "0.3.1", "name": "cilium", "type": "cilium-cni"})
    return node.run([str(bin_dir / "cilium-cni")], check=False, timeout=CNI_TIMEOUT_SECONDS, env=env,
                    input_text=netconf)


def new_container_id() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


def wait_for(predicate: Callable[[], bool], *, timeout: float, what: str, evidence: Callable[[], str] = str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(POLL_SECONDS)
    raise DatapathError(f"{what} not reached after {timeout:.0f}s\n{evidence()}")


# --- probes ---------------------------------------------------------------------------------------------------

SERVER_SCRIPT = r"""
import socket, sys
proto, port = sys.argv[1], int(sys.argv[2])
if proto == "udp":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port))
    print("ready", flush=True)
    while True:
        data, peer = s.recvfrom(2048); s.sendto(b"pong:" + data, peer)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port)); s.listen(128)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    try:
        c.sendall(b"pong\n")
    finally:
        c.close()
"""

CLIENT_SCRIPT = r"""
import socket, sys
proto, host, port, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
try:
    if proto == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(timeout)
        s.sendto(b"ping", (host, port)); data, _ = s.recvfrom(2048)
        ok = data.startswith(b"pong")
    else:
        s = socket.create_connection((host, port), timeout=timeout); s.settimeout(timeout)
        ok = s.recv(16).startswith(b"pong")
except OSError as e:
    print(f"fail {e}"); sys.exit(1)
print("ok" if ok else "fail bad answer"); sys.exit(0 if ok else 1)
"""


class Server:
    """A TCP or UDP echo-ish server listening in a pod's netns (the "container" answering the probe)."""

    def __init__(self, pod: PodNet, port: int, protocol: str = "tcp") -> None:
        self.popen = subprocess.Popen(pod.argv([sys.executable, "-c", SERVER_SCRIPT, protocol, str(port)]),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        if b"ready" not in line:
            self.stop()
            raise DatapathError(f"probe server in {pod.name} did not start: {line!r}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


def probe(src: PodNet, dst_ip: str, port: int, protocol: str = "tcp", timeout: float = 1.5) -> bool:
    """Whether src reaches dst_ip:port now (a TCP connect + answer, or a UDP round trip)."""
    out = run(src.argv([sys.executable, "-c", CLIENT_SCRIPT, protocol, dst_ip, str(port), str(timeout)]),
              check=False, timeout=timeout + 30)
    return out.returncode == 0


def settle(check: Callable[[], bool], *, expect: bool, timeout: float) -> bool:
    """Poll check() until it gives `expect` (policy and identities are applied asynchronously); the last answer."""
    deadline = time.monotonic() + timeout
    answer = check()
    while answer != expect and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        answer = check()
    return answer


@contextlib.contextmanager
def stopping(*things: Any) -> Iterator[None]:
    try:
        yield
    finally:
        for thing in things:
            with contextlib.suppress(Exception):
                thing.stop()
