"""The HTTP routes: POST /mutate and /validate (raw ASGI, the hot path), /healthz, /readyz, /metrics, /map.

Thin: read and check the body, call `admission.parse_review` → `admission.answer` (the same code path
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
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Request, Response
from starlette.types import Receive, Scope, Send

from app import engine, jobs, policy
from app.config import Settings
from app.engine import capacity, ledger
from app.http import admission, responses
from app.http.deadlines import BodyDeadlineExceeded
from app.http.deps import AppState, StateDep
from app.logs import log_review
from app.models.cluster import Snapshot
from app.models.decision import Decision
from app.models.labels import ENFORCEMENT_LABEL
from app.models.network import ALL_PORTS, Endpoint, Reason

log = logging.getLogger(__name__)

Operation = Literal["mutate", "validate"]
REVIEW_PATHS: Mapping[str, Operation] = {"/mutate": "mutate", "/validate": "validate"}
JSON_CONTENT_TYPE = b"application/json"
# Caller-controlled strings are clipped before they reach a log line.
LOGGED_TEXT_CHARS = 253
# Metric label values for `kind` are bounded: anything else a caller sends is counted as "other".
# Reviews up to this size are prepared on the event loop, and finished there when their decision is known.
INLINE_BODY_BYTES = 256 * 1024
KNOWN_KINDS = frozenset({"PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "JobSet", "TrainJob"})


class _HTTPProblem(Exception):
    """A request the webhook refuses at the HTTP level (4xx with a JSON error body)."""

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.close = close


# --- the review hot path -----------------------------------------------------------------------


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _check_headers(scope: Scope, limit: int) -> None:
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


def _deadline_review(
    state: AppState, request: admission.ReviewRequest, snapshot: Snapshot | None
) -> dict[str, Any]:
    seconds = state.settings.request_deadline_seconds
    message = f"topoguard: no placement decision within the {seconds:g}s deadline; the job's zone was not checked"
    if _enforcement(snapshot, request.namespace or "", state.settings.enforcement) == "warn":
        return responses.allowed(request.uid, warnings=[message + "; admitted unchecked (enforcement=warn)"])
    return responses.refused(request.uid, code=504, message=message + "; retry shortly")


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


def _prepare(
    state: AppState, request: admission.ReviewRequest, operation: Operation, taken: list[Snapshot]
) -> admission.Prepared:
    """Take the snapshot (once) and prepare the answer (`admission.prepare`)."""
    snapshot, problem = state.snapshot()
    taken.append(snapshot)  # for the deadline answer, which reads the namespace's enforcement label
    return admission.prepare(request, snapshot=snapshot, settings=state.settings, operation=operation,
                             cache_problem=problem, in_flight=state.in_flight)


def _answer(
    state: AppState, request: admission.ReviewRequest, operation: Operation, taken: list[Snapshot]
) -> admission.Outcome:
    """The whole answer (`admission.answer`). On the decision pool nothing here may block the loop."""
    return _prepare(state, request, operation, taken).result()


async def _decide(
    state: AppState, request: admission.ReviewRequest, operation: Operation, taken: list[Snapshot],
    started: float, body_bytes: int,
) -> admission.Outcome:
    """Answer on the loop what is cheap, on the decision pool (with the deadline) what may not be.

    A review up to INLINE_BODY_BYTES is prepared here (parsing a job is linear in its size); when
    its decision is already in the snapshot's memo, it is finished here too: a hop to a thread and
    back costs more than that (~0.2 ms on one core, measured with bench/bench_http.py). Decisions to
    compute, and bigger reviews whole, go to the pool.
    """
    if state.executor is None:
        return _answer(state, request, operation, taken)
    call: Callable[[], admission.Outcome]
    if body_bytes <= INLINE_BODY_BYTES:
        prepared = _prepare(state, request, operation, taken)
        if prepared.cheap:
            return prepared.result()
        call = prepared.result
    else:
        call = functools.partial(_answer, state, request, operation, taken)
    remaining = state.settings.request_deadline_seconds - (time.perf_counter() - started)
    future = asyncio.get_running_loop().run_in_executor(state.executor, call)
    # NB: on timeout the worker thread runs on to completion; its result is dropped. The pool is
    # small and bounded, so runaway decisions queue further requests into their own deadlines
    # instead of piling up threads.
    return await asyncio.wait_for(future, timeout=max(remaining, 0.0))


async def handle_review(state: AppState, operation: Operation, scope: Scope, receive: Receive, send: Send) -> None:
    """POST /mutate | /validate."""
    started = time.perf_counter()
    metrics = state.metrics
    try:
        _check_headers(scope, state.settings.max_body_bytes)
        try:
            # A client that stops sending mid-body must not hold the request open forever.
            body = await state.body_deadlines.read(_read_body(receive, state.settings.max_body_bytes))
        except BodyDeadlineExceeded:
            raise _HTTPProblem(408, "the request body did not arrive within the deadline", close=True) from None
        try:
            raw = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise _HTTPProblem(400, f"body is not valid JSON: {e}") from None
        try:
            request = admission.parse_review(raw)
        except admission.BadReview as e:
            raise _HTTPProblem(400, str(e)) from None
    except _HTTPProblem as problem:
        metrics.record_review(operation=operation, kind="", outcome="bad-request",
                              duration_seconds=time.perf_counter() - started)
        log.info("refused review",
                 extra={"status": problem.status, "error": str(problem)[:LOGGED_TEXT_CHARS], "operation": operation})
        await _send(send, problem.status, orjson.dumps({"error": str(problem)}), close=problem.close or state.draining)
        return

    kind = request.kind.kind if request.kind.kind in KNOWN_KINDS else "other"
    taken: list[Snapshot] = []
    decision: Decision | None = None
    outcome: str
    try:
        result = await _decide(state, request, operation, taken, started, len(body))
        review, outcome, decision = result.review, result.outcome, result.decision
        if outcome == "error":
            log.error("review failed inside the pipeline",
                      extra={"uid": request.uid, "operation": operation, "error": _denial_message(review)})
    except TimeoutError:
        review, outcome = _deadline_review(state, request, taken[0] if taken else None), "timeout"
        log.warning("decision deadline missed", extra={"uid": request.uid, "operation": operation})
    except Exception:
        log.exception("unexpected error answering a review", extra={"uid": request.uid, "operation": operation})
        review = responses.refused(request.uid, code=500,
                                   message=f"topoguard: internal error answering request {request.uid}")
        outcome = "error"
    duration = time.perf_counter() - started
    await _send(send, 200, orjson.dumps(review), close=state.draining)
    metrics.record_review(operation=operation, kind=kind, outcome=outcome, duration_seconds=duration)
    if decision is not None:
        reasons, blocked = decision_metrics(state, decision)
        metrics.record_reasons(reasons)
        metrics.record_blocked_flows(blocked)
    log_review(
        uid=request.uid[:LOGGED_TEXT_CHARS], kind=request.kind.kind[:LOGGED_TEXT_CHARS],
        namespace=(request.namespace or "")[:LOGGED_TEXT_CHARS], name=(request.name or "")[:LOGGED_TEXT_CHARS],
        operation=operation, outcome=outcome, zone=decision.zone if decision else None, duration_seconds=duration,
        message=_denial_message(review),
    )


def _denial_message(review: dict[str, Any]) -> str:
    response = review.get("response") or {}
    return "" if response.get("allowed") else str((response.get("status") or {}).get("message", ""))


# --- zone map ----------------------------------------------------------------------------------


def zone_capacity(snapshot: Snapshot, *, zone_label: str, gpu_resources: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """Per zone: nodes, GPU nodes, allocatable-minus-held GPUs (Ready, schedulable nodes only), and the
    GPUs admitted jobs reserve there (engine/ledger.py; this replica's in-flight holds not included)."""
    index = capacity.zone_index(snapshot, zone_label=zone_label, gpu_resources=gpu_resources)
    reserved = ledger.ledger_of(snapshot, gpu_resources=gpu_resources).by_zone  # the stored jobs' reservations
    out: dict[str, dict[str, int]] = {}
    for zone in index.zones:
        classes = index.classes_in(zone)
        out[zone] = {
            "nodes": sum(len(c.nodes) for c in classes),
            "gpuNodes": sum(len(c.nodes) for c in classes if c.gpu_resources),
            "gpusFree": sum(c.gpus_free(gpu_resources) for c in classes),
            "gpusReserved": sum(reserved.get(zone, {}).values()),
        }
    return out


def _reason(r: Reason) -> dict[str, str]:
    return {k: v for k, v in {"side": r.side, "effect": r.effect, "policy": r.policy, "kind": r.kind,
                               "rule": r.rule, "message": r.message}.items() if v}


def namespace_map(snapshot: Snapshot, settings: Settings, namespace: str) -> dict[str, Any]:
    """The policies that can apply to pods of `namespace`, and per zone whether two pods of it placed
    in that zone can open collective traffic to each other (TCP, every port)."""
    ns_labels = snapshot.namespace_labels(namespace)
    policies = [
        {"kind": p.kind, "policy": p.ref}
        for p in snapshot.policies
        if p.namespace == namespace or not p.namespace  # namespaced ones apply in their namespace only
    ]
    zones = capacity.zone_index(snapshot, zone_label=settings.zone_label, gpu_resources=settings.gpu_resources).zones
    flows = []
    for zone in zones:
        labels = {settings.zone_identity_label: zone} if settings.zone_identity_label else {}
        # The policy messages name an endpoint as `namespace/name`, so the name is the pod alone.
        pod = Endpoint(namespace=namespace, labels=labels, namespace_labels=ns_labels, name=f"<pod in {zone}>")
        verdict = policy.check_flow(snapshot, pod, pod, ALL_PORTS, "TCP", enforcement=settings.policy_enforcement)
        flows.append({"zone": zone, "flow": f"pod → pod TCP/{ALL_PORTS}", "verdict": verdict.verdict,
                      "reasons": [_reason(r) for r in verdict.reasons]})
    return {
        "name": namespace,
        "labels": dict(ns_labels),
        "enforcement": _enforcement(snapshot, namespace, settings.enforcement),
        "identityLabel": settings.zone_identity_label,
        "policies": policies,
        "flows": flows,
    }


def job_map(snapshot: Snapshot, settings: Settings, raw: Any) -> dict[str, Any]:
    """The per-zone table of one job (GPUs free/needed, every flow's verdict), as the engine sees it."""
    if not isinstance(raw, Mapping):
        raise _HTTPProblem(400, "body must be a job object")
    metadata = raw.get("metadata")
    namespace = str((metadata.get("namespace") if isinstance(metadata, Mapping) else None) or "default")
    try:
        group = jobs.parse_job(raw, gpu_resources=settings.gpu_resources, namespace=namespace)
    except jobs.JobError as e:
        raise _HTTPProblem(400, f"not a usable job: {e}") from None
    decision = engine.decide(group, snapshot, settings)
    table = {
        "job": f"{group.kind} {group.namespace}/{group.name}",
        "allowed": decision.allowed,
        "zone": decision.zone,
        "reasons": list(decision.reasons),
        "zones": [
            {
                "zone": z.zone, "gpuNodes": z.gpu_nodes, "gpusFree": z.gpus_free, "gpusNeeded": z.gpus_needed,
                "fits": z.fits, "network": z.network, "eligible": z.eligible, "problems": list(z.problems),
                "flows": [
                    {"from": f.flow.src, "to": f.flow.dst, "ports": f"{f.flow.protocol}/{f.flow.ports}",
                     "purpose": f.flow.purpose, "verdict": f.verdict.verdict,
                     "reasons": [_reason(r) for r in f.verdict.reasons]}
                    for f in z.flows
                ],
            }
            for z in decision.zones
        ],
    }
    rendered: dict[str, Any] = engine.render_json(table, group.name)
    return rendered


def build_map(state: AppState, *, namespace: str | None = None, job: Any = None) -> dict[str, Any]:
    snapshot, problem = state.snapshot()
    settings = state.settings
    zones = zone_capacity(snapshot, zone_label=settings.zone_label, gpu_resources=settings.gpu_resources)
    out: dict[str, Any] = {
        "revision": snapshot.revision,
        "zoneLabel": settings.zone_label,
        "zones": [{"zone": zone, **info} for zone, info in zones.items()],
    }
    if problem:
        out["cacheProblem"] = problem
    if snapshot.missing_kinds:
        out["missingKinds"] = list(snapshot.missing_kinds)
    if namespace:
        out["namespace"] = namespace_map(snapshot, settings, namespace)
    if job is not None:
        out["job"] = job_map(snapshot, settings, job)
    return out


# --- the FastAPI routes ------------------------------------------------------------------------

router = APIRouter()


def _json(body: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")


@router.get("/healthz")
async def healthz() -> Response:
    return _json({"status": "ok"})


@router.get("/readyz")
async def readyz(state: StateDep) -> Response:
    """200 once every watched kind has synced; 503 before that and while draining."""
    status, problem = state.cache_problem()
    ready = status.synced and not state.draining
    body = {
        "ready": ready,
        "synced": status.synced,
        "stale": status.stale,
        "draining": state.draining,
        "ageSeconds": round(status.age_seconds, 3),
        "detail": dict(status.detail),
        **({"problem": problem} if problem else {}),
    }
    return _json(body, 200 if ready else 503)


@router.get("/metrics")
async def metrics_endpoint(state: StateDep) -> Response:
    status = state.store.status()
    state.metrics.record_cache(synced=status.synced, age_seconds=status.age_seconds, objects=state.object_counts())
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)


@router.get("/map")
def zone_map(state: StateDep, namespace: str | None = None) -> Response:
    """The zone map: zones with nodes, GPU nodes and free GPUs; with ?namespace=, the policies that
    apply there and, per zone, whether the namespace's pods can reach each other.

    A plain `def`: FastAPI runs it on its thread pool, so policy evaluation never blocks the loop.
    """
    return _json(build_map(state, namespace=namespace))


@router.post("/map")
async def job_zone_map(request: Request, state: StateDep) -> Response:
    """The zone map for one job (JSON body): per zone GPUs free/needed and every flow's verdict."""
    try:
        if (request.headers.get("content-type") or "").split(";")[0].strip().lower() != "application/json":
            raise _HTTPProblem(415, "Content-Type must be application/json")
        try:
            body = await state.body_deadlines.read(_read_body(request.receive, state.settings.max_body_bytes))
        except BodyDeadlineExceeded:
            raise _HTTPProblem(408, "the request body did not arrive within the deadline") from None
        try:
            raw = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise _HTTPProblem(400, f"body is not valid JSON: {e}") from None
        loop = asyncio.get_running_loop()
        return _json(await loop.run_in_executor(state.executor, functools.partial(build_map, state, job=raw)))
    except _HTTPProblem as problem:
        return _json({"error": str(problem)}, problem.status)
