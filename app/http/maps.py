"""The zone map: `GET /map` (zones, GPU capacity, the running training jobs' audit, a namespace's policies
and open paths) and `POST /map` (one job's per-zone table).

Kept apart from the review endpoints (routes.py): the map is a debugging surface for people, not the
apiserver's hot path. It shows namespace labels, policy names and selector values, so it is served
only as `mapAccess` says (`off`: 404; `loopback`: only on the 127.0.0.1 listener; `authorized`: a
bearer token the cluster authenticates and authorizes for the non-resource URL /map with the
request's verb, get or post, as app.cache.access documents). Refusals: 401 no or bad token, 403 not
allowed, 404 not served here, 503 the check itself failed (never served on an error).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import orjson
from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from app import engine, jobs, policy
from app.admission import pipeline
from app.config import Settings
from app.engine import audit, capacity, ledger
from app.engine.gpus import DEFAULT_GPU_DEVICE_CLASSES, gpu_kinds
from app.http.deadlines import BodyDeadlineExceeded
from app.http.deps import AppState, StateDep
from app.http.routes import LOGGED_TEXT_CHARS, _enforcement, _Held, _HTTPProblem, _json, _read_body, decode
from app.http.workers import Shed
from app.models.cluster import Snapshot
from app.models.network import Endpoint, PolicyEnforcement, Reason

if TYPE_CHECKING:  # the kubernetes client loads only where it is used
    from app.cache.access import Access

log = logging.getLogger(__name__)


def zone_capacity(snapshot: Snapshot, *, zone_label: str, gpu_resources: tuple[str, ...],
                  gpu_device_classes: tuple[str, ...] = DEFAULT_GPU_DEVICE_CLASSES) -> dict[str, dict[str, int]]:
    """Per zone: nodes, GPU nodes, allocatable-minus-held GPUs (Ready, schedulable nodes only), and the
    GPUs admitted jobs reserve there (engine/ledger.py; this replica's in-flight holds not included)."""
    index = capacity.zone_index(snapshot, zone_label=zone_label, gpu_resources=gpu_resources,
                                gpu_device_classes=gpu_device_classes)
    gpu_resources = gpu_kinds(snapshot, gpu_resources, gpu_device_classes)
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
    in that zone can open collective traffic to each other (TCP, the collectives' range `collectivePorts`)."""
    ns_labels = snapshot.namespace_labels(namespace)
    policies = [
        {"kind": p.kind, "policy": p.ref}
        for p in snapshot.policies
        if p.namespace == namespace or not p.namespace  # namespaced ones apply in their namespace only
    ]
    zones = capacity.zone_index(snapshot, zone_label=settings.zone_label, gpu_resources=settings.gpu_resources,
                        gpu_device_classes=settings.gpu_device_classes).zones
    flows = []
    for zone in zones:
        labels = {settings.zone_identity_label: zone} if settings.zone_identity_label else {}
        # The policy messages name an endpoint as `namespace/name`, so the name is the pod alone.
        pod = Endpoint(namespace=namespace, labels=labels, namespace_labels=ns_labels, name=f"<pod in {zone}>")
        agent = policy.snapshot_agent(snapshot, settings.cilium_version, settings.explicit_policy_enforcement())
        verdict = policy.check_flow(snapshot, pod, pod, settings.collective_ports, "TCP",
                                    enforcement=cast(PolicyEnforcement, agent.policy_enforcement), agent=agent)
        flows.append({"zone": zone, "flow": f"pod → pod TCP/{settings.collective_ports}", "verdict": verdict.verdict,
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
        group = jobs.parse_job(raw, gpu_resources=settings.gpu_resources, namespace=namespace, limits=settings.limits,
                               runtimes=snapshot.training_runtimes, collective_ports=settings.collective_ports)
    except jobs.JobLimitError as e:
        raise _HTTPProblem(422, f"the job is larger than topoguard checks: {e}") from None
    except jobs.JobError as e:
        raise _HTTPProblem(400, f"not a usable job: {e}") from None
    try:
        decision = engine.decide(group, snapshot, settings)
    except engine.IndexValuesLimitError as e:
        raise _HTTPProblem(422, f"the job is larger than topoguard checks: {e}") from None
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


def build_map(
    state: AppState, *, namespace: str | None = None, job: Any = None, with_jobs: bool = True
) -> dict[str, Any]:
    snapshot, problem = state.snapshot()
    settings = state.settings
    zones = zone_capacity(snapshot, zone_label=settings.zone_label, gpu_resources=settings.gpu_resources,
                        gpu_device_classes=settings.gpu_device_classes)
    out: dict[str, Any] = {
        "revision": snapshot.revision,
        "zoneLabel": settings.zone_label,
        "zones": [{"zone": zone, **info} for zone, info in zones.items()],
    }
    if with_jobs and settings.audit.enabled:
        # The running training jobs in audit.scope (app/engine/audit.py), computed once per snapshot: a
        # pass over every job, so ?jobs=false leaves it out for callers that poll the zones.
        out["jobs"] = [a.to_json() for a in audit.audit_memoized(snapshot, settings)]
    if problem:
        out["cacheProblem"] = problem
    if snapshot.missing_kinds:
        out["missingKinds"] = list(snapshot.missing_kinds)
    if namespace:
        out["namespace"] = namespace_map(snapshot, settings, namespace)
    if job is not None:
        out["job"] = job_map(snapshot, settings, job)
    return out


# --- who may read the map (settings.map_access) -----------------------------------------------

MAP_PATH = "/map"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1"})
# A service-account token is about 1 KB; anything far longer is not a token (401, not sent on).
MAX_TOKEN_CHARS = 16 * 1024


def _bearer_token(header: str | None) -> str | None:
    scheme, _, token = (header or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_CHARS:
        return None
    return token


def access_refusal(access: Access | None, *, mode: str, map_port: int, method: str) -> tuple[int, str] | None:
    """(HTTP status, message) refusing a /map caller, or None to serve them.

    `access` is the reviewer's answer for an `authorized` caller (None: no token, or no reviewer), or
    for the other modes None. Pure, so the decision is tested without a server.
    """
    if mode == "off":
        return 404, "/map is not served (mapAccess: off)"
    if mode == "loopback":
        return 404, (f"/map is served only on 127.0.0.1:{map_port} (mapAccess: loopback); "
                     "reach it with kubectl port-forward")
    if access is None:
        return 401, "/map needs a bearer token (Authorization: Bearer <token>) the cluster authorizes"
    if access.verdict == "allowed":
        return None
    if access.verdict == "unauthenticated":
        return 401, f"the bearer token was not accepted: {access.reason}"
    if access.verdict == "denied":
        return 403, (f"{access.user or 'the caller'} may not {method.lower()} the non-resource URL /map: "
                     f"{access.reason}")
    return 503, f"cannot check access to /map right now: {access.reason}; retry shortly"


def _on_map_listener(request: Request, map_port: int) -> bool:
    host, port = request.scope.get("server") or ("", 0)
    return port == map_port and host in LOOPBACK_HOSTS


async def authorize(request: Request, state: AppState) -> Response | None:
    """The refusal for this /map request, or None when it may be served. The TokenReview and
    SubjectAccessReview calls block, so they run on a worker thread, never on the loop."""
    settings = state.settings
    mode = settings.map_access
    access: Access | None = None
    if mode == "loopback" and _on_map_listener(request, settings.map_port):
        return None
    if mode == "authorized":
        token = _bearer_token(request.headers.get("authorization"))
        reviewer = state.map_reviewer
        if token is not None and reviewer is None:
            return _json({"error": "/map access cannot be checked: no access reviewer (mapAccess: authorized "
                                   "needs the Kubernetes API)"}, 503)
        if token is not None and reviewer is not None:
            access = await asyncio.to_thread(reviewer.review, token, verb=request.method.lower(), path=MAP_PATH)
    refusal = access_refusal(access, mode=mode, map_port=settings.map_port, method=request.method)
    if refusal is None:
        return None
    status, message = refusal
    log.info("refused a /map request", extra={"status": status, "user": access.user if access else "",
                                               "error": message[:LOGGED_TEXT_CHARS]})
    headers = {"www-authenticate": 'Bearer realm="topoguard"'} if status == 401 else None
    return Response(orjson.dumps({"error": message}), status_code=status, media_type="application/json",
                    headers=headers)


# --- the routes ----------------------------------------------------------------------------------

router = APIRouter()


@router.get(MAP_PATH)
async def zone_map(request: Request, state: StateDep, namespace: str | None = None, jobs: bool = True) -> Response:
    """The zone map: zones with nodes, GPU nodes and free GPUs, and the running jobs' audit (unless
    ?jobs=false, or audit.enabled is false); with ?namespace=, the policies that apply there and, per
    zone, whether the namespace's pods can reach each other.

    Built on a worker thread (policy evaluation never blocks the loop).
    """
    refusal = await authorize(request, state)
    if refusal is not None:
        return refusal
    return _json(await run_in_threadpool(functools.partial(build_map, state, namespace=namespace, with_jobs=jobs)))


# The map's decisions share the decision workers under this one key, so together they hold at most a share.
MAP_SHARE = "(POST /map)"


def _job_map_bytes(state: AppState, body: bytes, held: _Held, deadline: float) -> bytes:
    """POST /map's answer, encoded, on a decision worker under the review deadline. Bad input raises
    _HTTPProblem (4xx), never a 500: the review path's memory estimate (413) and nesting screen
    (pipeline.check_nesting), the job adapters' errors and the job limits (job_map), and numbers JSON
    cannot carry."""
    raw = decode(state, body, held)
    try:
        pipeline.check_nesting(raw, "the job")
    except pipeline.BadReview as e:
        raise _HTTPProblem(400, str(e)) from None
    with engine.within(engine.Deadline(deadline, time.perf_counter)):
        try:
            return orjson.dumps(build_map(state, job=raw))
        except orjson.JSONEncodeError as e:
            raise _HTTPProblem(422, f"the job's map cannot be written as JSON: {e}") from None


async def decide_job_map(state: AppState, body: bytes) -> bytes:
    """POST /map's decision: on the decision workers (its share: MAP_SHARE), under the same deadline,
    memory budget and job limits as a review."""
    seconds = state.settings.request_deadline_seconds
    held = _Held(state.memory)
    try:
        held.take(len(body))
        work = functools.partial(_job_map_bytes, state, body, held, time.perf_counter() + seconds)
        if state.workers is None:
            return work()
        try:
            return await asyncio.wait_for(state.workers.decide(MAP_SHARE, work), timeout=seconds)
        except (TimeoutError, engine.DeadlineExceeded):
            raise _HTTPProblem(504, f"no map within the {seconds:g}s deadline") from None
        except Shed as shed:
            raise _HTTPProblem(503, f"the webhook is busy: {shed}; retry shortly") from None
    finally:
        held.release()


@router.post(MAP_PATH)
async def job_zone_map(request: Request, state: StateDep) -> Response:
    """The zone map for one job (JSON body): per zone GPUs free/needed and every flow's verdict."""
    refusal = await authorize(request, state)
    if refusal is not None:
        return refusal
    try:
        if (request.headers.get("content-type") or "").split(";")[0].strip().lower() != "application/json":
            raise _HTTPProblem(415, "Content-Type must be application/json")
        try:
            body = await state.body_deadlines.read(_read_body(request.receive, state.settings.max_body_bytes))
        except BodyDeadlineExceeded:
            raise _HTTPProblem(408, "the request body did not arrive within the deadline") from None
        return Response(await decide_job_map(state, body), media_type="application/json")
    except _HTTPProblem as problem:
        return _json({"error": str(problem)}, problem.status)
