"""One user's job must not take admission down for everyone (issue 18), on the real server (uvicorn + TLS).

Every adversarial case (tests/adversarial/generators.py, seeded) gets its clear answer promptly — a refusal
naming the field and the limit, a 4xx, or the right decision — never a 500, a crash or an answer at the
deadline; its decoded memory stays inside the per-review budget; and normal reviews sent meanwhile keep
being answered fast. `make bench` (bench/bench_adversarial.py) reports the worst case's time and memory.
"""

from __future__ import annotations

import base64
import json
import random
import shutil
import statistics
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from app.cache.files import load_snapshot
from app.cache.store import StaticStore
from app.config import Settings
from app.http import routes
from app.http.app import create_app
from app.http.workers import estimated_memory
from app.models.cluster import Snapshot
from app.tls import KeyPair
from tests.adversarial import generators
from tests.adversarial.generators import Case
from tests.integration.conftest import MAP_TOKEN, RunningServer, https_client, map_reader

LAB_CLUSTER = Path(__file__).resolve().parents[1] / "data" / "clusters" / "lab.yaml"
SEEDS = (1, 2, 3)
MAX_BODY = 2 * 1024 * 1024
# Far above what each case takes (tens of ms; bench/bench_adversarial.py measures), far below the 8 s deadline a
# runaway decision would reach: the test says "answered at once", not how fast this machine is.
PROMPT_SECONDS = 2.0


def snapshot_with(tmp: Path, objects: tuple[dict[str, Any], ...]) -> Snapshot:
    shutil.copy(LAB_CLUSTER, tmp / "lab.yaml")
    if objects:
        (tmp / "extra.yaml").write_text(yaml.safe_dump_all(list(objects)))
    return load_snapshot(tmp)


def read(state: Any, body: bytes) -> tuple[Any, Any]:
    """routes._read as a reader thread runs it, holding (and then giving back) the body's memory."""
    held = routes._Held(state.memory)
    try:
        return routes._read(state, "mutate", body, held)
    finally:
        held.release()


def all_cases() -> Iterator[Case]:
    for seed in SEEDS:
        yield from generators.cases(seed, max_body=MAX_BODY)


CASES = list(all_cases())


def check_answer(case: Case, status: int, body: bytes) -> None:
    assert status == case.status, (case.name, status, body[:300])
    answer = orjson.loads(body)
    if status != 200:
        assert all(word in answer["error"] for word in case.mentions), (case.name, answer["error"])
        return
    if case.path == "/map":
        assert "job" in answer, case.name
        return
    response = answer["response"]
    assert response["allowed"] is case.allowed, (case.name, response)
    if case.code is not None:
        assert response["status"]["code"] == case.code, (case.name, response["status"])
    text = response.get("status", {}).get("message", "") + " ".join(response.get("warnings", []))
    assert all(word in text for word in case.mentions), (case.name, text)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.name}" for c in CASES])
def test_each_adversarial_review_gets_its_clear_answer_at_once(
    case: Case, serve: Callable[..., RunningServer], server_pair: KeyPair, tmp_path: Path
) -> None:
    # POST /map as an authorized reader would send it (mapAccess: authorized, a reviewer that lets the token in).
    settings = Settings(max_body_bytes=MAX_BODY, map_access="authorized")
    server = serve(create_app(settings, StaticStore(snapshot_with(tmp_path, case.objects)), map_reviewer=map_reader()))
    with https_client(server, server_pair) as client:
        started = time.perf_counter()
        got = client.post(case.path, content=case.body, headers=_headers(case))
        elapsed = time.perf_counter() - started
    check_answer(case, got.status_code, got.content)
    assert elapsed < PROMPT_SECONDS, f"{case.name} took {elapsed:.2f}s"


def _headers(case: Case) -> dict[str, str]:
    return {"content-type": "application/json", "authorization": f"Bearer {MAP_TOKEN}"}


def test_the_warn_namespace_gets_a_warning_and_no_patch_for_a_job_past_the_limits(tmp_path: Path) -> None:
    snapshot = snapshot_with(tmp_path, ())
    case = generators.pod_blowup(random.Random(7))
    review = orjson.loads(case.body)
    settings = Settings(enforcement="warn")
    _request, answered = read(create_app(settings, StaticStore(snapshot)).state, orjson.dumps(review))
    response = orjson.loads(answered.body)["response"]
    assert response["allowed"] is True and "patch" not in response
    assert "enforcement=warn" in response["warnings"][0]
    assert any("limits.podsPerReplicaType" in w for w in response["warnings"][1:])


# --- memory ------------------------------------------------------------------------------------


def _largest_allowed_job(limits_pods: int, types: int) -> dict[str, Any]:
    """A TFJob at the limits: `types` replica types sharing `limits_pods` GPU pods, each with its own port."""
    per_type = limits_pods // types
    specs = {
        f"Worker{i}": {"replicas": per_type, "template": {"metadata": {"labels": {"app": "big", "slot": str(i)}},
                       "spec": {"containers": [{"name": "tensorflow", "image": "tf:2",
                                                "ports": [{"name": "tfjob-port", "containerPort": 2222}],
                                                "resources": {"limits": {"nvidia.com/gpu": 8}}}]}}}
        for i in range(types)
    }
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "big", "namespace": "ml-demo"},
            "spec": {"tfReplicaSpecs": specs}}


def _peak_of(work: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_largest_allowed_job_and_every_adversarial_review_stay_inside_the_memory_budget(tmp_path: Path) -> None:
    settings = Settings(max_body_bytes=MAX_BODY)
    budget = settings.review_memory_bytes
    snapshot = snapshot_with(tmp_path, tuple(o for c in CASES for o in c.objects))
    state = create_app(settings, StaticStore(snapshot), offload_decisions=False).state
    largest = generators.review_of(_largest_allowed_job(settings.limits.pods_per_job,
                                                        settings.limits.replica_types_per_job))
    bodies = [orjson.dumps(largest), *(c.body for c in CASES if c.path == "/mutate" and c.status == 200)]
    for body in bodies:
        assert estimated_memory(body) <= budget

        def review(body: bytes = body) -> None:
            _, step = read(state, body)
            if not isinstance(step, routes._Answered):
                routes._decide(step.prepared, float("inf"))

        assert _peak_of(review) < budget


@pytest.mark.parametrize("shape", [
    pytest.param(lambda n: b"[" + b",".join([b"{}"] * n) + b"]", id="empty objects"),
    pytest.param(lambda n: b"[" + b",".join([b"[]"] * n) + b"]", id="empty arrays"),
    pytest.param(lambda n: b"[" + b",".join([b'"a"'] * n) + b"]", id="short strings"),
    pytest.param(lambda n: b"[" + b",".join([b'{"k":1}'] * n) + b"]", id="one-key objects"),
    pytest.param(lambda n: b"{" + b",".join(b'"k%d":0.5' % i for i in range(n)) + b"}", id="one many-key object"),
    pytest.param(lambda n: b"[" + b",".join([b"123456789012345678"] * n) + b"]", id="big integers"),
])
def test_the_estimate_bounds_what_a_body_costs_decoded(shape: Callable[[int], bytes]) -> None:
    body = shape(50_000)
    assert _peak_of(lambda: orjson.loads(body)) <= estimated_memory(body)


def test_reviews_past_the_memory_budget_in_flight_are_refused_at_once(tmp_path: Path) -> None:
    settings = Settings(review_memory_bytes=1024 * 1024, decision_workers=1)
    state = create_app(settings, StaticStore(snapshot_with(tmp_path, ()))).state
    assert state.memory.take(state.memory.total)  # other reviews hold the whole budget
    with pytest.raises(routes._HTTPProblem) as refused:
        routes._Held(state.memory).take(10_000)
    assert refused.value.status == 503 and refused.value.shed


# --- normal reviews while adversarial ones are in flight -----------------------------------------


def test_normal_reviews_stay_fast_while_adversarial_reviews_are_in_flight(
    serve: Callable[..., RunningServer], server_pair: KeyPair, tmp_path: Path
) -> None:
    objects = tuple(o for c in CASES for o in c.objects)
    # The lab's policies key on the pods' `zone` label (tests/data/clusters/lab-config.yaml).
    settings = Settings(max_body_bytes=MAX_BODY, zone_identity_label="zone")
    server = serve(create_app(settings, StaticStore(snapshot_with(tmp_path, objects))))
    attacks = [c for c in CASES if c.path == "/mutate"]
    stop = threading.Event()
    answered: list[int] = []

    def attack(seed: int) -> None:
        rng = random.Random(seed)
        with https_client(server, server_pair) as client:
            while not stop.is_set() and len(answered) < 2_000:
                case = rng.choice(attacks)
                try:
                    got = client.post("/mutate", content=case.body, headers={"content-type": "application/json"})
                except httpx.TransportError:
                    # An oversized body is refused (413) before it is read, and the connection closed; a
                    # client still sending may see the close before the answer. Not a failure of the server.
                    assert case.status == 413, case.name
                    continue
                answered.append(got.status_code)

    threads = [threading.Thread(target=attack, args=(seed,), daemon=True) for seed in range(4)]
    for t in threads:
        t.start()
    rng = random.Random(11)
    times: list[float] = []
    try:
        with https_client(server, server_pair) as client:
            client.get("/healthz")
            for _ in range(150):
                review = generators.normal_review(rng)
                started = time.perf_counter()
                got = client.post("/mutate", json=review)
                times.append(time.perf_counter() - started)
                response = got.json()["response"]
                assert response["allowed"] is True and response["uid"] == review["request"]["uid"]
                assert base64.b64decode(response["patch"])  # a real decision, not a shed or a deadline answer
            health = [_timed(lambda: client.get("/healthz").status_code) for _ in range(20)]
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert answered and 500 not in answered
    assert all(status == 200 for status, _ in health)
    p99 = statistics.quantiles(times, n=100)[98]
    # The target is 50 ms (bench/bench_adversarial.py reports the figure); the bound here leaves room
    # for a loaded CI machine while still failing a server that makes normal reviews wait behind attacks.
    assert p99 < 0.5, f"normal review p99 {p99 * 1000:.0f} ms while adversarial reviews were in flight"
    assert max(t for _, t in health) < 0.5


def _timed(call: Callable[[], int]) -> tuple[int, float]:
    started = time.perf_counter()
    status = call()
    return status, time.perf_counter() - started


def test_an_adversarial_review_never_echoes_the_object(tmp_path: Path) -> None:
    """The refusal names the field and the limit; it does not carry the user's (huge) object back."""
    case = generators.many_replica_types(random.Random(3))
    state = create_app(Settings(), StaticStore(snapshot_with(tmp_path, ()))).state
    _, answered = read(state, case.body)
    assert len(answered.body) < 2_000
    assert json.loads(answered.body)["response"]["status"]["code"] == 422
