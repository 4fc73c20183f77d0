"""HTTP benchmark of `topoguard serve`: wrk against POST /mutate over TLS, next to a raw echo baseline.

    .venv/bin/python bench/bench_http.py [--duration 10] [--connections 8] [--quick]

Every server is a real process on 127.0.0.1 (TLS, keep-alive, HTTP/1.1), pinned to CPU 0 when
`taskset` exists, with wrk (1 thread, 8 connections, a Lua script posting the review) on CPU 1.
The review: a 16-replica PyTorchJob (1 CPU Master + 15 Workers x 4 GPUs) as the apiserver sends it
(~5 KB with managedFields and the last-applied annotation), into a generated cluster of 5,000 nodes
in three zones with 1,000 policies (3 zone-identity CNPs in the job's namespace, the rest spread over
team namespaces plus some cluster-wide ones) and a busy GPU pod on every third node.

Every request is a new job: wrk's script gives each one its own job name, uid and training seed
(`llm-1 ... --seed=1`, `llm-2 ... --seed=2`, ..., as a sweep submits runs from one template), so no
two reviews have the same content and nothing is answered from a copy of an earlier answer; what
topoguard does keep per snapshot (the decision for a job of that shape, the verdicts) is what it
keeps in production. One extra run repeats one review byte for byte.

Reported: requests/s and p99 of the echo app, of topoguard at 5,000 and at 60 nodes (same
policies), of the HTTP layer alone (a review the pipeline skips), of one review repeated, and the
latency with one connection (no queueing); the ratios (targets: topoguard/echo
>= 0.5 for new jobs and >= 0.6 for the repeated review, one-connection p99 <= 1 ms,
5,000-node/60-node >= 0.8); cold start to ready with 5,000 nodes; RSS; and the full-GC pause
with the cache warm (measured in this process on the same snapshot). Traffic stays on loopback,
each run is bounded by --duration.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import engine
from app.admission import pipeline
from app.cache.files import load_snapshot
from app.config import Settings
from app.http.app import settle_heap
from app.tls import generate_self_signed

ROOT = Path(__file__).resolve().parent.parent

ZONES = ("zone-a", "zone-b", "zone-c")
NS = "ml"
OPTED_OUT = "sandbox"  # no topoguard.io/enabled label: reviews there skip the decision
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
READY_TIMEOUT_SECONDS = 120.0
TARGET_VS_ECHO = 0.5
TARGET_REPEATED_VS_ECHO = 0.6
TARGET_ONE_CONNECTION_P99_MS = 1.0
TARGET_5K_VS_60 = 0.8
SKIPPED = "topoguard 5,000 nodes, decision skipped"
BIG = "topoguard 5,000 nodes"
REPEATED = "topoguard 5,000 nodes, one review repeated"
SEQ = "__SEQ__"  # replaced by wrk's script with a per-request number (job name, uid and seed)


# --- the generated cluster and review ------------------------------------------------------------


def node(i: int) -> dict[str, Any]:
    zone = ZONES[i % len(ZONES)]
    gpu = (i // len(ZONES)) % 3 != 2  # two thirds GPU nodes in every zone
    labels = {"kubernetes.io/hostname": f"node-{i}", "topology.kubernetes.io/zone": zone,
              "node.kubernetes.io/instance-type": "p4d.24xlarge" if gpu else "m6i.8xlarge",
              "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    allocatable = {"cpu": "96", "memory": "1Ti", "pods": "110", **({"nvidia.com/gpu": "8"} if gpu else {})}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{i}", "labels": labels},
            "spec": {"taints": [GPU_TAINT]} if gpu else {},
            "status": {"allocatable": allocatable, "capacity": allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def busy_pod(i: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"busy-{i}", "namespace": f"team-{i % 50}"},
            "spec": {"nodeName": f"node-{i}", "containers": [
                {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
            "status": {"phase": "Running"}}


def policy(i: int) -> dict[str, Any]:
    if i < len(ZONES):
        zone = ZONES[i]
        return {"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
                "metadata": {"name": f"allow-intra-{zone}", "namespace": NS},
                "spec": {"endpointSelector": {"matchLabels": {"zone": zone}},
                         "ingress": [{"fromEndpoints": [{"matchLabels": {"zone": zone}}]}],
                         "egress": [
                             {"toEndpoints": [{"matchLabels": {"zone": zone}}]},
                             {"toEndpoints": [{"matchLabels": {"io.kubernetes.pod.namespace": "kube-system"}}]},
                         ]}}
    if i % 100 == 3:
        return {"apiVersion": "cilium.io/v2", "kind": "CiliumClusterwideNetworkPolicy",
                "metadata": {"name": f"ccnp-{i}"},
                "spec": {"endpointSelector": {"matchLabels": {"app": f"infra-{i}"}},
                         "ingress": [{"fromEntities": ["cluster"]}]}}
    if i % 10 == 5:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": f"knp-{i}", "namespace": f"team-{i % 50}"},
                "spec": {"podSelector": {"matchLabels": {"app": f"db-{i}"}}, "policyTypes": ["Ingress"],
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": f"api-{i}"}}}],
                                      "ports": [{"port": 5432, "protocol": "TCP"}]}]}}
    return {"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
            "metadata": {"name": f"svc-{i}", "namespace": f"team-{i % 50}"},
            "spec": {"endpointSelector": {"matchLabels": {"app": f"svc-{i}"}},
                     "ingress": [{"fromEndpoints": [{"matchLabels": {"app": f"client-{i}"}}],
                                  "toPorts": [{"ports": [{"port": str(8000 + i % 1000), "protocol": "TCP"}]}]}]}}


def cluster(nodes: int, policies: int) -> dict[str, Any]:
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, "topoguard.io/enabled": "true"}}}
        for name in (NS, "kube-system", *(f"team-{t}" for t in range(50)))
    ]
    objects.append({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": OPTED_OUT, "labels": {"kubernetes.io/metadata.name": OPTED_OUT}}})
    objects += [node(i) for i in range(nodes)]
    objects += [busy_pod(i) for i in range(nodes) if (i // len(ZONES)) % 3 == 0]  # half the GPU nodes hold 4
    objects += [policy(i) for i in range(policies)]
    return {"apiVersion": "v1", "kind": "List", "items": objects}


def job(seed: str = "1") -> dict[str, Any]:
    def template(role: str, gpus: int) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": "pytorch", "image": "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
            "command": ["torchrun", "--nnodes=16", "--nproc-per-node=4", "train.py", "--config=/etc/llm/config.yaml",
                        f"--seed={seed}"],
            "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}],
            "resources": {"requests": {"cpu": "16", "memory": "128Gi"}, "limits": {"cpu": "16", "memory": "128Gi"}},
            "volumeMounts": [{"name": "config", "mountPath": "/etc/llm"}, {"name": "shm", "mountPath": "/dev/shm"}],
        }
        spec: dict[str, Any] = {"containers": [container], "volumes": [
            {"name": "config", "configMap": {"name": "llm-config"}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}]}
        if gpus:
            container["resources"]["limits"]["nvidia.com/gpu"] = gpus
            spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        return {"metadata": {"labels": {"app": "llm", "role": role}}, "spec": spec}

    body: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "llm", "namespace": NS, "labels": {"app": "llm", "team": "research"}},
        "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template("coordinator", 0)},
            "Worker": {"replicas": 15, "restartPolicy": "OnFailure", "template": template("worker", 4)},
        }},
    }
    last_applied = json.dumps(body, separators=(",", ":"))
    body["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": last_applied}
    body["metadata"]["managedFields"] = [{
        "manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "kubeflow.org/v1",
        "time": "2026-11-30T23:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {".": {},
                                                      "f:kubectl.kubernetes.io/last-applied-configuration": {}},
                                    "f:labels": {".": {}, "f:app": {}, "f:team": {}}},
                     "f:spec": {".": {}, "f:pytorchReplicaSpecs": {".": {}, "f:Master": {}, "f:Worker": {}}}},
    }]
    return body


def review(namespace: str = NS, *, name: str = "llm", seed: str = "1") -> dict[str, Any]:
    obj = job(seed)
    obj["metadata"]["namespace"] = namespace
    obj["metadata"]["name"] = name
    gvk = {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob"}
    gvr = {"group": "kubeflow.org", "version": "v1", "resource": "pytorchjobs"}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": f"0b1e5ab4-9d0c-4f7e-8f55-{name}", "kind": gvk, "resource": gvr, "requestKind": gvk,
        "requestResource": gvr, "name": name, "namespace": namespace, "operation": "CREATE",
        "userInfo": {"username": "alice", "uid": "u-1", "groups": ["research", "system:authenticated"]},
        "object": obj, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": "kubectl"}}}


# --- processes -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pinned(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    ready_seconds: float

    def rss_mib(self) -> tuple[float, float]:
        """(current, peak) resident set size."""
        fields = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start(name: str, argv: list[str], port: int, ctx: ssl.SSLContext, log: Path) -> Server:
    began = time.perf_counter()
    proc = subprocess.Popen([*pinned(0), *argv], stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    deadline = began + READY_TIMEOUT_SECONDS
    while True:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=5) as r:
                if r.status == 200:
                    return Server(name, proc, port, time.perf_counter() - began)
        except OSError:
            pass
        if proc.poll() is not None or time.perf_counter() > deadline:
            proc.kill()
            raise RuntimeError(f"{name} did not become ready; log tail:\n{log.read_text()[-2000:]}")
        time.sleep(0.02)


def post_once(port: int, body: bytes, ctx: ssl.SSLContext) -> dict[str, Any]:
    request = urllib.request.Request(f"https://127.0.0.1:{port}/mutate", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=ctx, timeout=30) as r:
        answer: dict[str, Any] = json.loads(r.read())
        return answer


UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def review_buckets(port: int, ctx: ssl.SSLContext) -> dict[str, float]:
    """Cumulative counts of topoguard_review_duration_seconds{operation="mutate"} by bucket edge."""
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=10) as r:
        text = r.read().decode()
    pattern = r'^topoguard_review_duration_seconds_bucket\{le="([^"]+)",operation="mutate"\} ([\d.e+]+)$'
    return {le: float(v) for le, v in re.findall(pattern, text, re.M)}


def lua(path: Path, body_file: Path) -> Path:
    """A wrk script that POSTs the file's bytes as application/json, with every SEQ in them replaced by the
    request's own number (a new job per request; the file without SEQ is sent as it is)."""
    path.write_text(
        f'local f = assert(io.open("{body_file}", "rb"))\nlocal template = f:read("*a")\nf:close()\n'
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = template\n'
        'local n = 0\n'
        'request = function()\n'
        '  n = n + 1\n'
        f'  local body = template:gsub("{SEQ}", tostring(n))\n'
        '  return wrk.format(nil, nil, nil, body)\n'
        'end\n'
    )
    return path


def wrk(port: int, script: Path, *, duration: int, connections: int) -> dict[str, float]:
    out = subprocess.run(
        [*pinned(1), "wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(script),
         f"https://127.0.0.1:{port}/mutate"],
        capture_output=True, text=True, timeout=duration + 60, check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p = {q: float(v) * UNITS[u] for q, v, u in re.findall(r"^\s+(50|75|90|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)}
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {"rps": rps, "p50_ms": p.get("50", float("nan")), "p99_ms": p.get("99", float("nan")),
            "non2xx": float(bad.group(1)) if bad else 0.0,
            "socket_errors": float(sum(int(g) for g in errors.groups())) if errors else 0.0}


# --- in-process measurements -------------------------------------------------------------------------


def gc_pause(snapshot_file: Path, settings: Settings, body: dict[str, Any]) -> dict[str, float]:
    """Full-collection pause with the cache warm: snapshot loaded, indexes built, one review answered."""
    started = time.perf_counter()
    snapshot = load_snapshot(snapshot_file)
    loaded = time.perf_counter() - started
    started = time.perf_counter()
    engine.prepare(snapshot, settings)
    prepared = time.perf_counter() - started
    outcome = pipeline.answer(pipeline.parse_review(body), snapshot=snapshot, settings=settings, operation="mutate")
    assert outcome.outcome == "patched", outcome.review
    pauses = []
    for _ in range(7):
        started = time.perf_counter()
        gc.collect()
        pauses.append(time.perf_counter() - started)
    tracked = len(gc.get_objects())
    settle_heap(float("-inf"))  # what the server does after every published snapshot
    frozen = []
    for _ in range(7):
        started = time.perf_counter()
        gc.collect()
        frozen.append(time.perf_counter() - started)
    gc.unfreeze()
    return {"load_s": loaded, "prepare_s": prepared, "gc_ms": statistics.median(pauses) * 1000,
            "gc_max_ms": max(pauses) * 1000, "gc_frozen_ms": statistics.median(frozen) * 1000,
            "tracked_objects": float(tracked)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved wrk rounds per server (best one counts)")
    parser.add_argument("--quick", action="store_true", help="one round of 3 s runs (smoke)")
    opts = parser.parse_args()
    duration = 3 if opts.quick else opts.duration
    if opts.quick:
        opts.rounds = 1
    if not shutil.which("wrk"):
        print("bench_http: wrk not found (apt-get install wrk); skipping the HTTP benchmark", file=sys.stderr)
        return 0

    with tempfile.TemporaryDirectory(prefix="topoguard-bench-") as tmp_name:
        tmp = Path(tmp_name)
        pair = generate_self_signed(["bench.local"])
        cert, key = tmp / "tls.crt", tmp / "tls.key"
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        ctx = ssl.create_default_context(cadata=pair.cert_pem.decode())
        config = tmp / "config.yaml"
        config.write_text("zoneIdentityLabel: zone\n")
        settings = Settings(zone_identity_label="zone")
        snapshots = {}
        for nodes in (5000, 60):
            snapshots[nodes] = tmp / f"cluster-{nodes}.json"
            snapshots[nodes].write_text(json.dumps(cluster(nodes, 1000)))
        body = review(name=f"llm-{SEQ}", seed=SEQ)
        body_file = tmp / "review.json"
        body_file.write_bytes(json.dumps(body, separators=(",", ":")).encode())
        script = lua(tmp / "post.lua", body_file)
        same_file = tmp / "review-same.json"
        same_file.write_bytes(json.dumps(review(), separators=(",", ":")).encode())
        same_script = lua(tmp / "post-same.lua", same_file)
        skip_file = tmp / "review-skip.json"
        skipped = review(OPTED_OUT, name=f"llm-{SEQ}", seed=SEQ)
        skip_file.write_bytes(json.dumps(skipped, separators=(",", ":")).encode())
        skip_script = lua(tmp / "post-skip.lua", skip_file)
        size_kib = body_file.stat().st_size / 1024
        print(f"review: 16-replica PyTorchJob, {size_kib:.1f} KiB; cluster: 5,000 or 60 nodes x 1,000 policies; "
              f"wrk -t1 -c{opts.connections} -d{duration}s keep-alive over TLS; server on CPU 0, wrk on CPU 1")

        warm = gc_pause(snapshots[5000], settings, body)
        py = sys.executable
        tg = [py, "-m", "app", "serve", "--tls-cert", str(cert), "--tls-key", str(key), "--host", "127.0.0.1",
              "--config", str(config)]
        runs: list[tuple[str, list[str]]] = [
            ("echo (raw ASGI + orjson)", [py, str(ROOT / "bench" / "echo_app.py"), "--tls-cert", str(cert),
                                          "--tls-key", str(key)]),
            ("topoguard 5,000 nodes", [*tg, "--cluster", str(snapshots[5000])]),
            ("topoguard 60 nodes", [*tg, "--cluster", str(snapshots[60])]),
        ]
        # Every server runs for the whole benchmark (idle ones cost nothing) and the wrk rounds are
        # interleaved, so load from other processes on a shared machine hits all of them alike; the
        # best round of each server is the one least disturbed and is the one compared.
        servers: list[Server] = []
        results: dict[str, dict[str, float]] = {}
        try:
            for name, argv in runs:
                port = free_port()
                servers.append(start(name, [*argv, "--port", str(port)], port, ctx, tmp / f"{len(servers)}.log"))
                response = post_once(port, same_file.read_bytes(), ctx)["response"]
                if "topoguard" in name and not (response.get("allowed") and response.get("patch")):
                    raise RuntimeError(f"{name}: expected a patched answer, got {json.dumps(response)[:300]}")
            print(f"{'server':<44} {'round':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
            # The same 5,000-node server once more with a review it skips (namespace not opted in):
            # everything but the decision, i.e. what the HTTP layer itself costs next to the echo app.
            targets = [(server.name, server, script) for server in servers]
            targets.insert(2, (SKIPPED, servers[1], skip_script))
            targets.insert(3, (REPEATED, servers[1], same_script))
            buckets: dict[str, float] = {}  # server-side durations of the 5,000-node runs (deltas)
            for round_number in range(1, opts.rounds + 1):
                for name, server, wrk_script in targets:
                    before = review_buckets(server.port, ctx) if name == BIG else {}
                    got = wrk(server.port, wrk_script, duration=duration, connections=opts.connections)
                    if name == BIG:
                        for le, count in review_buckets(server.port, ctx).items():
                            buckets[le] = buckets.get(le, 0.0) + count - before.get(le, 0.0)
                    print(f"{name:<44} {round_number:>5} {got['rps']:>9.0f} {got['p50_ms']:>8.2f} "
                          f"{got['p99_ms']:>8.2f} {got['non2xx'] + got['socket_errors']:>7.0f}")
                    if name not in results or got["rps"] > results[name]["rps"]:
                        results[name] = got
            # One connection, one review at a time: the latency a single job submission sees (the
            # apiserver's real load is a few reviews per second, not saturation).
            single = wrk(servers[1].port, script, duration=max(duration // 2, 3), connections=1)
            print(f"{BIG + ', 1 connection':<44} {'-':>5} {single['rps']:>9.0f} {single['p50_ms']:>8.2f} "
                  f"{single['p99_ms']:>8.2f} {single['non2xx'] + single['socket_errors']:>7.0f}")
            print(f"{'server':<32} {'ready s':>8} {'RSS MiB':>8} {'peak MiB':>9}")
            for server in servers:
                rss, peak = server.rss_mib()
                print(f"{server.name:<32} {server.ready_seconds:>8.2f} {rss:>8.0f} {peak:>9.0f}")
                results[server.name].update(ready_s=server.ready_seconds, rss_mib=rss, peak_mib=peak)
        finally:
            for server in servers:
                server.stop()

        echo, big, small = (results[n]["rps"] for n in ("echo (raw ASGI + orjson)", "topoguard 5,000 nodes",
                                                           "topoguard 60 nodes"))
        vs_echo, vs_small = big / echo, big / small
        print(f"ratio topoguard(5,000 nodes) / echo      = {vs_echo:.2f}  (target >= {TARGET_VS_ECHO}) "
              f"{'ok' if vs_echo >= TARGET_VS_ECHO else 'MISSED'}")
        print(f"ratio 5,000-node / 60-node throughput  = {vs_small:.2f}  (target >= {TARGET_5K_VS_60}) "
              f"{'ok' if vs_small >= TARGET_5K_VS_60 else 'MISSED'}")
        total = buckets.get("+Inf", 0.0) or 1.0
        shares = ", ".join(f"{buckets.get(le, 0.0) / total:.1%} <= {float(le) * 1000:g} ms"
                           for le in ("0.005", "0.025", "0.1"))
        print(f"server-side review duration under that load (topoguard_review_duration_seconds, {BIG}): {shares}")
        skipped = results[SKIPPED]["rps"]
        print(f"ratio HTTP layer alone (decision skipped) / echo = {skipped / echo:.2f}; the decision itself costs "
              f"{(1 / big - 1 / skipped) * 1000:.2f} ms of server time per review")
        repeated = results[REPEATED]["rps"]
        print(f"one review repeated byte for byte: {repeated:.0f} req/s ({repeated / big:.2f}x a new job per request)")
        again = repeated / echo
        print(f"ratio one review repeated / echo         = {again:.2f}  (target >= {TARGET_REPEATED_VS_ECHO}) "
              f"{'ok' if again >= TARGET_REPEATED_VS_ECHO else 'MISSED'}")
        p99, p99_ok = single["p99_ms"], single["p99_ms"] <= TARGET_ONE_CONNECTION_P99_MS
        print(f"one connection, a new job per request: p50 {single['p50_ms']:.2f} ms, p99 {p99:.2f} ms "
              f"(target p99 <= {TARGET_ONE_CONNECTION_P99_MS:g} ms) {'ok' if p99_ok else 'MISSED'}")
        print(f"cold start to /readyz 200 with 5,000 nodes: {results['topoguard 5,000 nodes']['ready_s']:.2f} s "
              f"(in process: snapshot load {warm['load_s']:.2f} s, index build {warm['prepare_s']:.2f} s)")
        print(f"full gc.collect() with the 5,000-node cache warm: median {warm['gc_ms']:.1f} ms, "
              f"max {warm['gc_max_ms']:.1f} ms, {warm['tracked_objects']:.0f} tracked objects; "
              f"as the server runs (heap frozen after each snapshot): {warm['gc_frozen_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
