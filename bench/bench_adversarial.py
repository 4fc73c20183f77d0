"""Adversarial reviews against a real `topoguard serve` (issue 18): worst-case answer time and memory.

    .venv/bin/python bench/bench_adversarial.py [--seconds 10] [--seeds 3]

The server is a real process on 127.0.0.1 (TLS, the seed lab's cluster and config, the defaults for every
limit), started with `topoguard serve --cluster`. The cases are the adversarial suite's own generators
(tests/adversarial/generators.py: pod-count blow-ups, thousands of replica types, a policy naming 1,000 pod
indices, deep nesting, a 1e30 GPU limit, decoded-size bombs, oversized bodies, POST /map with the same).

Reported, each against the issue's target:
- per case, the slowest of its answers (client side on loopback: server time plus TLS), and the worst overall
  (target: each answered within 100 ms with a clear refusal or the right decision);
- the peak memory one review takes in process (tracemalloc, decoding to answer) against `reviewMemoryBytes`,
  and the server's RSS before and at its peak (VmHWM);
- normal reviews (distinct jobs, never the same body twice) p50/p99 while four threads keep sending adversarial
  reviews (target: p99 < 50 ms), and the slowest /healthz meanwhile.
Traffic stays on loopback; every loop is bounded by --seconds and a request count.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import random
import shutil
import ssl
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_http import free_port, start  # noqa: E402  (this folder's script, run as a file)

from app.cache.files import load_snapshot  # noqa: E402
from app.cache.store import StaticStore  # noqa: E402
from app.config import load_settings  # noqa: E402
from app.http import routes  # noqa: E402
from app.http.app import create_app  # noqa: E402
from tests.adversarial import generators  # noqa: E402
from tests.adversarial.generators import Case  # noqa: E402

LAB = ROOT / "tests" / "data" / "clusters" / "lab.yaml"
LAB_CONFIG = ROOT / "tests" / "data" / "clusters" / "lab-config.yaml"
TARGET_CASE_MS = 100.0
TARGET_NORMAL_P99_MS = 50.0
ATTACKERS = 4
MAX_REQUESTS = 20_000


def post(port: int, ctx: ssl.SSLContext, path: str, body: bytes) -> tuple[int, bytes, float]:
    """One request on a new connection: (status, body, seconds); a connection the server closed while the
    client was still sending (an oversized body, refused before it is read) is status 0."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
    started = time.perf_counter()
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        return response.status, data, time.perf_counter() - started
    except (ConnectionError, http.client.HTTPException, ssl.SSLError):
        return 0, b"", time.perf_counter() - started
    finally:
        conn.close()


def attack(port: int, bodies: list[bytes], seed: int, stop: Any, sent: Any) -> None:
    """One attacker process: adversarial reviews on a keep-alive connection, as the apiserver sends reviews
    (a pooled connection per replica); a refusal that closes it (413) makes the next one reconnect."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    rng = random.Random(seed)
    conn: http.client.HTTPSConnection | None = None
    while not stop.is_set() and sent.value < MAX_REQUESTS:
        conn = conn or http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
        try:
            conn.request("POST", "/mutate", body=rng.choice(bodies), headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            if (response.getheader("connection") or "").lower() == "close":
                conn.close()
                conn = None
        except (ConnectionError, http.client.HTTPException, ssl.SSLError, TimeoutError):
            conn.close()
            conn = None
        with sent.get_lock():
            sent.value += 1
    if conn is not None:
        conn.close()


def peak_bytes(state: object, case: Case) -> int:
    """What one review of `case` takes at its peak in process, from its bytes to its encoded answer."""
    tracemalloc.start()
    try:
        try:
            held = routes._Held(state.memory)  # type: ignore[attr-defined]
            try:
                _, step = routes._read(state, "mutate", case.body, held)  # type: ignore[arg-type]
            finally:
                held.release()
            if not isinstance(step, routes._Answered):
                routes._decide(step.prepared, float("inf"))
        except routes._HTTPProblem:
            pass  # refused before decoding (413) or as a bad review: what it took is still measured
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the mixed-load phase")
    parser.add_argument("--seeds", type=int, default=3, help="how many seeded draws of every case")
    args = parser.parse_args()

    settings = load_settings(LAB_CONFIG, environ={})
    tmp = Path(tempfile.mkdtemp(prefix="topoguard-bench-adv-"))
    cases = [c for seed in range(1, args.seeds + 1) for c in generators.cases(seed, max_body=settings.max_body_bytes)]
    shutil.copy(LAB, tmp / "lab.yaml")
    objects = [o for c in cases for o in c.objects]
    (tmp / "extra.json").write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    state = create_app(settings, StaticStore(load_snapshot(tmp)), offload_decisions=False).state
    # Oversized bodies are refused from their Content-Length before they are read: nothing to measure in process.
    peaks = {c.name: peak_bytes(state, c) for c in cases if c.path == "/mutate" and c.name != "oversized"}

    port, map_port = free_port(), free_port()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    # The lab's settings, with /map served on its loopback listener (mapAccess: loopback) for the /map cases.
    config = Path(tempfile.mkstemp(prefix="topoguard-bench-adv-", suffix=".yaml")[1])  # not in the snapshot dir
    config.write_text(LAB_CONFIG.read_text() + f"\nmapAccess: loopback\nmapPort: {map_port}\n")
    argv = [str(ROOT / ".venv" / "bin" / "topoguard"), "serve", "--cluster", str(tmp), "--config", str(config),
            "--self-signed", "--host", "127.0.0.1", "--port", str(port), "--log-level", "error"]
    server = start("topoguard", argv, port, ctx, tmp / "server.log")
    try:
        rss_before = server.rss_mib()[0]
        worst: dict[str, float] = {}
        wrong: list[str] = []
        for case in cases:
            for _ in range(3):
                status, _, seconds = post(map_port if case.path == "/map" else port, ctx, case.path, case.body)
                worst[case.name] = max(worst.get(case.name, 0.0), seconds)
                if status not in (case.status, 0) or (status == 0 and case.status != 413):
                    wrong.append(f"{case.name}: HTTP {status}, want {case.status}")
        # Mixed load: attackers in processes of their own (so this client's GIL does not slow the normal reviews
        # it times), normal reviews and /healthz from this one.
        stop = multiprocessing.Event()
        sent = multiprocessing.Value("i", 0)
        attacks = [c.body for c in cases if c.path == "/mutate"]
        threads = [multiprocessing.Process(target=attack, args=(port, attacks, s, stop, sent), daemon=True)
                   for s in range(ATTACKERS)]
        for t in threads:
            t.start()
        rng = random.Random(7)
        normal: list[float] = []
        health: list[float] = []
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
        ends = time.perf_counter() + args.seconds
        while time.perf_counter() < ends and len(normal) < MAX_REQUESTS:
            body = orjson.dumps(generators.normal_review(rng))
            started = time.perf_counter()
            conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
            answer = orjson.loads(conn.getresponse().read())
            normal.append(time.perf_counter() - started)
            if not answer["response"]["allowed"]:
                wrong.append(f"normal review refused: {answer['response'].get('status')}")
            if len(normal) % 10 == 0:
                started = time.perf_counter()
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                health.append(time.perf_counter() - started)
        conn.close()
        stop.set()
        for t in threads:
            t.join(timeout=60)
            if t.is_alive():
                t.kill()
        rss_now, rss_peak = server.rss_mib()
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        config.unlink(missing_ok=True)

    print(f"   {len(cases)} adversarial reviews ({args.seeds} seeded draws of {len(cases) // args.seeds} cases), "
          "slowest of 3 answers each:")
    for name in sorted(worst, key=lambda n: -worst[n])[:12]:
        peak = f"{peaks[name] / 2**20:7.1f} MiB" if name in peaks else "      -    "
        print(f"     {name:<34} {worst[name] * 1000:7.1f} ms   peak {peak}")
    slowest = max(worst.values()) * 1000
    verdict = "ok" if slowest <= TARGET_CASE_MS else "MISSED"
    print(f"   worst-case answer: {slowest:.1f} ms (target <= {TARGET_CASE_MS:.0f} ms) {verdict}")
    budget = settings.review_memory_bytes / 2**20
    biggest = max(peaks.values()) / 2**20
    print(f"   worst-case review memory: {biggest:.1f} MiB (budget reviewMemoryBytes = {budget:.0f} MiB) "
          f"{'ok' if biggest <= budget else 'MISSED'}")
    print(f"   server RSS: {rss_before:.0f} MiB before, {rss_now:.0f} MiB after, peak {rss_peak:.0f} MiB")
    p50 = statistics.median(normal) * 1000
    p99 = statistics.quantiles(normal, n=100)[98] * 1000
    print(f"   normal reviews with {ATTACKERS} attacker processes ({sent.value} adversarial sent): "
          f"{len(normal)} answered, "
          f"p50 {p50:.1f} ms, p99 {p99:.1f} ms (target < {TARGET_NORMAL_P99_MS:.0f} ms) "
          f"{'ok' if p99 < TARGET_NORMAL_P99_MS else 'MISSED'}; slowest /healthz {max(health) * 1000:.1f} ms")
    for line in wrong[:10]:
        print(f"   WRONG: {line}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
