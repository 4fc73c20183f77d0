"""The HTTP routes: POST /mutate and /validate (raw ASGI, the hot path), /healthz, /readyz, /metrics (/map: maps.py).

Thin: read and check the body, call `pipeline.parse_review` → `pipeline.answer` (the same code path
as `topoguard review`), record metrics and the log line, send the answer. Two reporting channels
(STYLE.md section 4): a malformed review is an HTTP 4xx with `{"error": ...}`; a job that cannot be
placed, an unexpected error or a missed deadline is HTTP 200 with an AdmissionReview whose response
says `allowed: false` (or `true` with warnings, per enforcement).

The review endpoints are plain ASGI rather than FastAPI routes: parsing, deciding and encoding with
orjson directly costs about half of what FastAPI's Request/Response machinery adds per request
(research/perf-rel-sec.md A.6: 165-200 µs vs 290-305 µs per review on one core).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import orjson
from fastapi import APIRouter, Response
from starlette.types import Receive, Scope, Send

from app import engine
from app.admission import pipeline, policy_changes, responses
from app.http import workers as workers_
from app.http.deadlines import BodyDeadlineExceeded
from app.http.deps import AppState, StateDep
from app.logs import log_review
from app.models.cluster import Snapshot
from app.models.decision import Decision
from app.models.labels import ENFORCEMENT_LABEL

log = logging.getLogger(__name__)

T = TypeVar("T")
Operation = Literal["mutate", "validate"]
REVIEW_PATHS: Mapping[str, Operation] = {"/mutate": "mutate", "/validate": "validate"}
JSON_CONTENT_TYPE = b"application/json"
# Where a review is read (decoded, its job parsed, its decision looked up): on the event loop when that costs no
# more than the GIL's switch interval (5 ms), which is how long a reader thread may keep the loop waiting anyway,
# else on a reader thread, so that the loop only moves the bytes. Decoding and reading a job cost with its size
# (up to ~250 µs per KiB for a dense one: thousands of container ports) and with the square of its replica types
# (flows per pair: a 16 KiB JobSet of 64 replicated jobs takes ~18 ms). So: a body up to INLINE_BODY_BYTES
# (~4 ms at worst) is decoded on the loop, and its job read there too when it writes at most INLINE_REPLICA_TYPES
# types. Real reviews are mostly 3-15 KiB and write 1-5 types.
INLINE_BODY_BYTES = 16 * 1024
INLINE_REPLICA_TYPES = 8
# Caller-controlled strings are clipped before they reach a log line.
LOGGED_TEXT_CHARS = 253
# Metric label values for `kind` are bounded: anything else a caller sends is counted as "other".
KNOWN_KINDS = frozenset({"PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "JobSet", "TrainJob"})


class _HTTPProblem(Exception):
    """A request the webhook refuses at the HTTP level (4xx with a JSON error body)."""

    def __init__(self, status: int, message: str, *, close: bool = False, shed: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.close = close
        self.shed = shed  # refused for the memory budget (counted in topoguard_reviews_shed_total)


# --- the review hot path -----------------------------------------------------------------------


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _check_headers(scope: Scope, limit: int) -> int:
    """Refuse what the headers already say is wrong; the declared Content-Length (0 when none)."""
    if scope["method"] != "POST":
        raise _HTTPProblem(405, f"{scope['path']} accepts POST only")
    content_type = (_header(scope, b"content-type") or b"").split(b";", 1)[0].strip().lower()
    if content_type != JSON_CONTENT_TYPE:
        shown = content_type.decode("latin-1")[:LOGGED_TEXT_CHARS] or "none"
        raise _HTTPProblem(415, f"Content-Type must be application/json, got {shown}")
    declared = _header(scope, b"content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise _HTTPProblem(400, "Content-Length is not a number", close=True) from None
        if length > limit:
            raise _HTTPProblem(413, f"body of {length} bytes exceeds the limit of {limit} bytes", close=True)
        return max(length, 0)
    return 0


async def _read_body(receive: Receive, limit: int) -> bytes:
    """Read the body chunk by chunk, refusing as soon as it passes `limit` (never buffering more)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _HTTPProblem(400, "client disconnected before sending the whole body", close=True)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _HTTPProblem(413, f"body exceeds the limit of {limit} bytes", close=True)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send(send: Send, status: int, body: bytes, *, close: bool = False) -> None:
    headers = [(b"content-type", JSON_CONTENT_TYPE), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _enforcement(snapshot: Snapshot | None, namespace: str, default: str) -> str:
    value = snapshot.namespace_labels(namespace).get(ENFORCEMENT_LABEL, "") if snapshot and namespace else ""
    return value if value in ("deny", "warn") else default


def _reason_counts(decision: Decision | None) -> dict[str, int]:
    """Low-cardinality reason classes (metrics.REASON_CLASSES) for topoguard_decision_reasons_total:
    one per zone that could not take the job, plus `split` once for a job refused as split."""
    counts: dict[str, int] = {}
    if decision is None:
        return counts
    if decision.split:
        counts["split"] = 1
    for report in decision.zones:
        if report.eligible:
            continue
        classes = []
        if not report.fits:
            classes.append("capacity")
        if report.network in ("deny", "unknown"):
            classes.append(f"network-{report.network}")
        for cls in classes or ["placement"]:
            counts[cls] = counts.get(cls, 0) + 1
    return counts


def _blocked_flows(decision: Decision | None) -> dict[str, int]:
    if decision is None:
        return {}
    return {r.zone: sum(1 for f in r.flows if f.verdict.verdict == "deny") for r in decision.zones}


def decision_metrics(state: AppState, decision: Decision) -> tuple[dict[str, int], dict[str, int]]:
    """(`_reason_counts`, `_blocked_flows`) of `decision`, worked out once per decision object.

    The engine memoizes decisions per snapshot, so most reviews carry a decision seen before. The
    entry holds the decision itself: its id cannot be reused by another object while it is kept.
    """
    kept = state.decision_metrics
    entry = kept.get(id(decision))
    if entry is not None and entry[0] is decision:
        return entry[1], entry[2]
    facts = _reason_counts(decision), _blocked_flows(decision)
    kept.put(id(decision), (decision, *facts))
    return facts


@dataclass(frozen=True)
class _Answered:
    """A review answered: the encoded response AdmissionReview and what the loop records."""

    body: bytes
    outcome: str
    decision: Decision | None
    skip: str = ""  # pipeline.Outcome.skip
    message: str = ""  # the refusal's message for the log line ("" when it allows)

    @classmethod
    def of(cls, review: dict[str, Any], outcome: str, decision: Decision | None, skip: str = "") -> _Answered:
        return cls(orjson.dumps(review), outcome, decision, skip, _denial_message(review))


@dataclass(frozen=True)
class _Undecided:
    """A review read on a worker whose decision is still to be computed."""

    request: pipeline.ReviewRequest
    snapshot: Snapshot
    prepared: pipeline.Prepared


def _encode(outcome: pipeline.Outcome) -> _Answered:
    return _Answered.of(outcome.review, outcome.outcome, outcome.decision, outcome.skip)


def _read(state: AppState, operation: Operation, body: bytes, held: _Held
          ) -> tuple[pipeline.ReviewRequest, _Answered | _Undecided]:
    """Step 1 for a big body, on a reader thread: `_parsed`, then `_prepared`."""
    request = _parsed(state, body, held)
    return request, _prepared(state, operation, request)


def _prepared(state: AppState, operation: Operation, request: pipeline.ReviewRequest) -> _Answered | _Undecided:
    """Take the snapshot (once), prepare the answer (`pipeline.prepare`) and finish it when that costs nothing
    more (a memo hit, a refusal, a skip, a decision of a shape already decided)."""
    try:
        snapshot, problem = state.snapshot()
        prepared = pipeline.prepare(request, snapshot=snapshot, settings=state.settings, operation=operation,
                                     cache_problem=problem, in_flight=state.in_flight)
        if prepared.cheap:
            return _encode(prepared.result())
    except Exception:
        log.exception("unexpected error answering a review", extra={"uid": request.uid, "operation": operation})
        refusal = responses.refused(request.uid, code=500,
                                    message=f"topoguard: internal error answering request {request.uid}")
        return _Answered.of(refusal, "error", None)
    return _Undecided(request, snapshot, prepared)


def _parsed(state: AppState, body: bytes, held: _Held) -> pipeline.ReviewRequest:
    """The review's request (`decode`, then `pipeline.parse_review`; 400 for what is not a usable review)."""
    raw = decode(state, body, held)
    try:
        return pipeline.parse_review(raw)
    except pipeline.BadReview as e:
        raise _HTTPProblem(400, str(e)) from None


def decode(state: AppState, body: bytes, held: _Held) -> Any:
    """`body` decoded, once `held` holds what decoding may cost (413 past `reviewMemoryBytes`, 503 when the
    budget is taken); 400 for what is not JSON. On a worker thread: the one place a request body is decoded."""
    held.hold_decoded(body, state.settings.review_memory_bytes)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise _HTTPProblem(400, f"body is not valid JSON: {e}") from None


def _decide(prepared: pipeline.Prepared, deadline: float) -> _Answered:
    """Step 2, on a decision worker: the decision, stopped by the engine itself past `deadline` (perf_counter)."""
    with engine.within(engine.Deadline(deadline, time.perf_counter)):
        return _encode(prepared.result())


def _unchecked(state: AppState, request: pipeline.ReviewRequest, snapshot: Snapshot | None, why: str,
               code: int) -> _Answered:
    """A review answered without a decision (deadline missed, no worker in time): refused with `code`, or
    admitted with a warning in a namespace whose enforcement is `warn`. Never a silent allow."""
    message = f"topoguard: {why}; the job's zone was not checked"
    if _enforcement(snapshot, request.namespace or "", state.settings.enforcement) == "warn":
        review = responses.allowed(request.uid, warnings=[message + "; admitted unchecked (enforcement=warn)"])
    else:
        review = responses.refused(request.uid, code=code, message=message + "; retry shortly")
    return _Answered.of(review, "timeout" if code == 504 else "shed", None)


async def _answer(state: AppState, operation: Operation, body: bytes, started: float, held: _Held
                  ) -> tuple[pipeline.ReviewRequest, _Answered]:
    """The review's answer, with as few hand-offs between threads as its cost allows.

    A small body (`INLINE_BODY_BYTES`) of a job with few replica types (`INLINE_REPLICA_TYPES`) is read on the
    event loop, and so is its answer when that costs nothing more (a memo hit, a refusal, a skip, a decision of a
    shape already decided on the snapshot, which only counts its reservations: `pipeline.Prepared.cheap`): no
    hand-off at all. Any other is read on a reader thread. A decision to compute runs on a decision worker, fair
    between namespaces, under the review's deadline. So a review crosses threads at most once, unless it is both
    costly to read and needs a decision (the guarded path: bounded work, deadline, fairness).
    """
    deadline = started + state.settings.request_deadline_seconds
    workers = state.workers
    step: _Answered | _Undecided
    if workers is None:
        request, step = _read(state, operation, body, held)
    elif len(body) > INLINE_BODY_BYTES:
        request, step = await _off_loop(workers, functools.partial(_read, state, operation, body, held), deadline)
    else:
        request = _parsed(state, body, held)
        if pipeline.replica_types(request) <= INLINE_REPLICA_TYPES:
            step = _prepared(state, operation, request)
        else:
            step = await _off_loop(workers, functools.partial(_prepared, state, operation, request), deadline)
    if isinstance(step, _Answered):
        return request, step
    if workers is None:
        return request, _decide(step.prepared, float("inf"))
    namespace = request.namespace or ""
    seconds = state.settings.request_deadline_seconds
    try:
        async with asyncio.timeout(max(deadline - time.perf_counter(), 0.0)):
            decided = await workers.decide(namespace, functools.partial(_decide, step.prepared, deadline))
    except (TimeoutError, engine.DeadlineExceeded):  # the latter: the engine saw the deadline just before the wait
        log.warning("decision deadline missed", extra={"uid": request.uid, "operation": operation})
        return request, _unchecked(state, request, step.snapshot,
                                   f"no placement decision within the {seconds:g}s deadline", 504)
    except workers_.Shed as shed:
        state.metrics.record_shed(shed.reason)
        log.warning("review shed: no decision worker in time",
                    extra={"uid": request.uid, "operation": operation, "namespace": namespace[:LOGGED_TEXT_CHARS],
                           "reason": shed.reason})
        return request, _unchecked(state, request, step.snapshot, str(shed),
                                   429 if shed.reason == "namespace-share" else 503)
    return request, decided


async def _off_loop(workers: workers_.Workers, work: Callable[[], T], deadline: float) -> T:
    """`work()` on a reader thread, before `deadline` (perf_counter), or 503."""
    try:
        async with asyncio.timeout(max(deadline - time.perf_counter(), 0.0)):
            return await workers.read(work)
    except TimeoutError:
        raise _HTTPProblem(503, "the review could not be read within the deadline: the webhook is overloaded",
                           close=True) from None


async def _review_body(state: AppState, scope: Scope, receive: Receive, held: _Held) -> bytes:
    """A review's body, within the body limit (counted against `held`) and the body deadline."""
    held.take(_check_headers(scope, state.settings.max_body_bytes))
    try:
        # A client that stops sending mid-body must not hold the request open forever.
        return await state.body_deadlines.read(_read_body(receive, state.settings.max_body_bytes))
    except BodyDeadlineExceeded:
        raise _HTTPProblem(408, "the request body did not arrive within the deadline", close=True) from None


async def handle_review(state: AppState, operation: Operation, scope: Scope, receive: Receive, send: Send) -> None:
    """POST /mutate | /validate: the loop reads the body and writes the answer; workers do the rest."""
    started = time.perf_counter()
    metrics = state.metrics
    held = _Held(state.memory)  # what this review holds of the in-flight memory budget
    try:
        try:
            body = await _review_body(state, scope, receive, held)
            request, answered = await _answer(state, operation, body, started, held)
        except _HTTPProblem as problem:
            metrics.record_review(operation=operation, kind="", outcome="bad-request",
                                  duration_seconds=time.perf_counter() - started)
            if problem.shed:
                metrics.record_shed("memory")
            log.info("refused review", extra={"status": problem.status, "error": str(problem)[:LOGGED_TEXT_CHARS],
                                              "operation": operation})
            await _send(send, problem.status, orjson.dumps({"error": str(problem)}),
                        close=problem.close or state.draining)
            return
        except Exception:
            log.exception("unexpected error answering a review", extra={"operation": operation})
            await _send(send, 500, orjson.dumps({"error": "internal error reading the review"}), close=True)
            return
    finally:
        held.release()

    if answered.outcome == "error":
        log.error("review failed inside the pipeline",
                  extra={"uid": request.uid, "operation": operation, "error": answered.message})
    duration = time.perf_counter() - started
    await _send(send, 200, answered.body, close=state.draining)
    kind = request.kind.kind if request.kind.kind in KNOWN_KINDS else "other"
    metrics.record_review(operation=operation, kind=kind, outcome=answered.outcome, duration_seconds=duration)
    if answered.skip:
        metrics.record_skip(answered.skip)
    decision = answered.decision
    if decision is not None:
        reasons, blocked = decision_metrics(state, decision)
        metrics.record_reasons(reasons)
        metrics.record_blocked_flows(blocked)
    log_review(
        uid=request.uid[:LOGGED_TEXT_CHARS], kind=request.kind.kind[:LOGGED_TEXT_CHARS],
        namespace=(request.namespace or "")[:LOGGED_TEXT_CHARS], name=(request.name or "")[:LOGGED_TEXT_CHARS],
        operation=operation, outcome=answered.outcome, zone=decision.zone if decision else None,
        duration_seconds=duration, message=answered.message if answered.outcome != "patched" else "",
    )


# --- POST /validate-policy: policy changes judged against the training jobs (admission/policy_changes.py) -------

POLICY_PATH = "/validate-policy"
POLICY_OPERATION = "validate-policy"


def _own_pods(snapshot: Snapshot) -> tuple[Any, ...]:
    """topoguard's own pods (POD_NAMESPACE / POD_NAME, the chart's downward API), found once per snapshot."""
    namespace, name = os.environ.get("POD_NAMESPACE", ""), os.environ.get("POD_NAME", "")
    return snapshot.memo(f"http.own-pods/{namespace}/{name}",
                         lambda s: policy_changes.own_pods(s, namespace, name))


def _judge_policy(state: AppState, request: pipeline.ReviewRequest, deadline: float) -> policy_changes.PolicyOutcome:
    """On a decision worker: take the snapshot once, judge the change before `deadline`."""
    try:
        snapshot, problem = state.snapshot()
        with engine.within(engine.Deadline(deadline, time.perf_counter)):
            outcome = policy_changes.answer(request, snapshot=snapshot, settings=state.settings,
                                           cache_problem=problem, own=_own_pods(snapshot) if problem is None else ())
    except engine.DeadlineExceeded:
        outcome = _policy_unjudged(request, f"no answer within the {state.settings.policy_changes.deadline_seconds:g}s "
                                            "deadline")
    except Exception:
        log.exception("unexpected error judging a policy change", extra={"uid": request.uid})
        outcome = _policy_unjudged(request, "internal error")
    return outcome


def _policy_unjudged(request: pipeline.ReviewRequest, why: str) -> policy_changes.PolicyOutcome:
    """Admitted with a warning: this webhook never blocks a change it did not judge."""
    text = f"topoguard: the change was not checked against the training jobs ({why}); it is admitted unchecked"
    return policy_changes.PolicyOutcome(responses.allowed(request.uid, warnings=[text]), "warned",
                                       dry_run=bool(request.dry_run))


async def handle_policy_review(state: AppState, scope: Scope, receive: Receive, send: Send) -> None:
    """POST /validate-policy: bounded like a review (body limit, memory budget, deadline, a decision worker)."""
    started = time.perf_counter()
    metrics = state.metrics
    held = _Held(state.memory)
    deadline = started + state.settings.policy_changes.deadline_seconds
    try:
        try:
            body = await _review_body(state, scope, receive, held)
            if state.workers is None:
                request = _parsed(state, body, held)
                outcome = _judge_policy(state, request, deadline)
            else:
                try:
                    request = await asyncio.wait_for(state.workers.read(functools.partial(_parsed, state, body, held)),
                                                     timeout=max(deadline - time.perf_counter(), 0))
                except TimeoutError:
                    raise _HTTPProblem(503, "the review could not be read within the deadline: the webhook is "
                                            "overloaded", close=True) from None
                try:
                    outcome = await asyncio.wait_for(
                        state.workers.decide(POLICY_OPERATION, functools.partial(_judge_policy, state, request,
                                                                                 deadline)),
                        timeout=max(deadline - time.perf_counter(), 0))
                except (TimeoutError, workers_.Shed):
                    seconds = state.settings.policy_changes.deadline_seconds
                    outcome = _policy_unjudged(request, f"no answer within the {seconds:g}s deadline")
        except _HTTPProblem as problem:
            metrics.record_review(operation=POLICY_OPERATION, kind="", outcome="bad-request",
                                  duration_seconds=time.perf_counter() - started)
            await _send(send, problem.status, orjson.dumps({"error": str(problem)}),
                        close=problem.close or state.draining)
            return
        except Exception:
            log.exception("unexpected error answering a policy review")
            await _send(send, 500, orjson.dumps({"error": "internal error reading the review"}), close=True)
            return
    finally:
        held.release()
    await _send(send, 200, orjson.dumps(outcome.review), close=state.draining)
    metrics.record_review(operation=POLICY_OPERATION, kind=request.kind.kind[:LOGGED_TEXT_CHARS],
                          outcome=outcome.outcome, duration_seconds=time.perf_counter() - started)
    result = outcome.result
    log.info("policy change judged", extra={
        "uid": request.uid[:LOGGED_TEXT_CHARS], "kind": request.kind.kind[:LOGGED_TEXT_CHARS],
        "namespace": (request.namespace or "")[:LOGGED_TEXT_CHARS],
        "policy": (request.name or "")[:LOGGED_TEXT_CHARS], "operation": request.operation,
        "outcome": outcome.outcome, "dry_run": outcome.dry_run,
        "what_if": result.outcome if result else "", "jobs_broken": len(result.broken) if result else 0,
        "duration_seconds": round(time.perf_counter() - started, 6)})
    jobs = outcome.events
    if jobs and result is not None and state.policy_events is not None:
        record = state.policy_events
        change = result.changes[0]
        asyncio.get_running_loop().run_in_executor(None, lambda: record(change, jobs))


class _Held:
    """What one request holds of the in-flight memory budget (taken on the loop and on its reader thread).

    `release` gives it all back once and closes it: a reader still running after its request gave up (a read
    past the deadline) can take nothing more, so nothing is ever left held.
    """

    def __init__(self, memory: workers_.MemoryBudget) -> None:
        self.memory = memory
        self.amount = 0
        self._closed = False
        self._lock = threading.Lock()

    def take(self, size: int) -> None:
        """Hold `size` more bytes, or refuse the request at once (503)."""
        with self._lock:
            if size <= 0:
                return
            if self._closed or not self.memory.take(size):
                raise _HTTPProblem(503, "too many large reviews in flight: the webhook's memory budget is taken; "
                                        "retry shortly", close=True, shed=True)
            self.amount += size

    def hold_decoded(self, body: bytes, limit: int) -> None:
        """Hold what decoding `body` may cost (`_decoded_size`) instead of its bytes alone."""
        self.take(_decoded_size(body, limit) - self.amount)

    def release(self) -> None:
        with self._lock:
            self._closed = True
            if self.amount:
                self.memory.give(self.amount)
            self.amount = 0


def _decoded_size(body: bytes, limit: int) -> int:
    """What `body` may cost decoded (workers.estimated_memory), refused with 413 past `limit` (reviewMemoryBytes)."""
    size = workers_.estimated_memory(body)
    if size > limit:
        raise _HTTPProblem(413, f"the review would take about {size:,} bytes of memory once decoded, more than the "
                                f"limit of {limit:,} (reviewMemoryBytes); no training job needs that many objects",
                           close=True)
    return size


def _denial_message(review: dict[str, Any]) -> str:
    response = review.get("response") or {}
    return "" if response.get("allowed") else str((response.get("status") or {}).get("message", ""))


# --- the FastAPI routes ------------------------------------------------------------------------

router = APIRouter()


def _json(body: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")


@router.get("/healthz")
async def healthz(state: StateDep) -> Response:
    """Liveness: 200 while the event loop answers (this handler runs on it) and no review task is wedged on a
    worker (running `STUCK_AFTER_DEADLINES` deadlines long: the engine checks its deadline every verdict, so
    only a loop it does not check gets there); 503 then, so Kubernetes restarts the replica."""
    stuck = state.workers.stuck() if state.workers is not None else 0
    state.metrics.workers_stuck.set(stuck)
    if stuck:
        return _json({"status": "stuck", "stuckWorkers": stuck}, 503)
    return _json({"status": "ok"})


@router.get("/readyz")
async def readyz(state: StateDep) -> Response:
    """200 once every watched kind has synced; 503 before that and while draining."""
    status, problem = state.cache_problem()
    stuck = state.workers.stuck() if state.workers is not None else 0
    ready = status.synced and not state.draining and not stuck
    body = {
        "ready": ready,
        "synced": status.synced,
        "stale": status.stale,
        "draining": state.draining,
        "ageSeconds": round(status.age_seconds, 3),
        "detail": dict(status.detail),
        **({"problem": problem} if problem else {}),
        **({"stuckWorkers": stuck} if stuck else {}),
    }
    return _json(body, 200 if ready else 503)


@router.get("/metrics")
async def metrics_endpoint(state: StateDep) -> Response:
    status = state.store.status()
    state.metrics.record_cache(synced=status.synced, age_seconds=status.age_seconds, objects=state.object_counts())
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)
