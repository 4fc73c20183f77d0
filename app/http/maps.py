"""The zone map: `GET /map` (zones, GPU capacity, a namespace's policies and open paths) and `POST /map`
(one job's per-zone table).

Kept apart from the review endpoints (routes.py): the map is a debugging surface for people, not the
apiserver's hot path.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from app import engine, jobs, policy
from app.config import Settings
from app.engine import capacity
from app.http.deadlines import BodyDeadlineExceeded
from app.http.deps import AppState, StateDep
from app.http.routes import _enforcement, _HTTPProblem, _json, _read_body
from app.models.cluster import Snapshot
from app.models.network import ALL_PORTS, Endpoint, Reason


def zone_capacity(snapshot: Snapshot, *, zone_label: str, gpu_resources: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """Per zone: nodes, GPU nodes, allocatable-minus-held GPUs (Ready, schedulable nodes only)."""
    index = capacity.zone_index(snapshot, zone_label=zone_label, gpu_resources=gpu_resources)
    out: dict[str, dict[str, int]] = {}
    for zone in index.zones:
        classes = index.classes_in(zone)
        out[zone] = {
            "nodes": sum(len(c.nodes) for c in classes),
            "gpuNodes": sum(len(c.nodes) for c in classes if c.gpu_resources),
            "gpusFree": sum(c.gpus_free(gpu_resources) for c in classes),
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


router = APIRouter()


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
