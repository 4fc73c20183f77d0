"""Job adapters: a raw training-job object of any supported kind → `JobGroup`.

The only kind-specific code in topoguard lives here. The engine sees `JobGroup` (replicas,
their pod labels, GPU demand, ports, the coordinator and the flows the framework needs) and
pointers to the pod templates it may patch. Pure: no I/O, no Kubernetes client.

Public API (the engine and HTTP layers use exactly these names):

- `SUPPORTED`: the (apiVersion, kind) pairs understood.
- `parse_job(raw, *, gpu_resources, namespace="", limits=Limits(), runtimes=None, collective_ports=EPHEMERAL_PORTS)`
  → `JobGroup`; raises
  `UnsupportedKindError`, `InvalidJobError` (every malformed field, with its path), `JobLimitError`
  (a job larger than `limits`, checked before its flows are built) or, for a TrainJob whose runtime is
  not among `runtimes`, `MissingRuntimeError`; never anything else.
- `job_shape(raw, *, gpu_resources, limits=Limits(), runtimes=None, collective_ports=EPHEMERAL_PORTS)` → `JobShape`
  (a stored job's replica types
  and required flows, for the audit); a job `parse_job` refuses gets a shape whose `problem` says why.
- `prepare_templates(doc, group)`: make every `Replica.template_path` exist in `doc` (the
  caller's working copy of the job, which it then edits and diffs into a JSON Patch). Idempotent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.config import Limits
from app.jobs import flows, jobset, kubeflow, trainjob
from app.jobs import limits as limits_
from app.jobs.errors import FieldError, InvalidJobError, JobError, UnsupportedKindError
from app.jobs.limits import JobLimitError
from app.jobs.pointers import ensure_object, escape_json_pointer
from app.jobs.runtimes import MissingRuntimeError
from app.jobs.shapes import shape_of
from app.jobs.templates import is_object, type_name
from app.jobs.trainjob import unsuspends
from app.models.cluster import RuntimeKey, TrainingRuntimeInfo
from app.models.job import JobGroup, JobShape
from app.models.network import EPHEMERAL_PORTS, PortRange

__all__ = [
    "SUPPORTED",
    "FieldError",
    "InvalidJobError",
    "JobError",
    "JobLimitError",
    "MissingRuntimeError",
    "UnsupportedKindError",
    "escape_json_pointer",
    "job_shape",
    "parse_job",
    "prepare_templates",
    "unsuspends",
]

# Each called as parser(raw, gpu_resources=..., namespace=..., collective_ports=...).
_Parser = Callable[..., JobGroup]

_PARSERS: Mapping[tuple[str, str], _Parser] = {
    # The framework bound by position: a partial without keywords keeps the vectorcall protocol (about 0.4 µs
    # a review cheaper than `framework=f`, which makes it merge keyword dicts on every call).
    **{gvk: functools.partial(kubeflow.parse, f) for gvk, f in kubeflow.FRAMEWORKS.items()},
    (jobset.API_VERSION, jobset.KIND): jobset.parse,
    (trainjob.API_VERSION, trainjob.KIND): trainjob.parse,
}

SUPPORTED: frozenset[tuple[str, str]] = frozenset(_PARSERS)

# The spec field listing each kind's replica types (checked against `limits` before parsing). A TrainJob's
# replicated jobs come from its runtime, which the cluster's administrators write.
_REPLICA_MAPS: Mapping[tuple[str, str], str] = {
    **{gvk: f.map_key for gvk, f in kubeflow.FRAMEWORKS.items()},
    (jobset.API_VERSION, jobset.KIND): "replicatedJobs",
}
DEFAULT_LIMITS = Limits()


def replica_types(raw: Any) -> int:
    """How many replica types `raw` writes: the size of its replica map (replicatedJobs for a JobSet); 1 for a
    TrainJob (its types come from a runtime the cluster's administrators write), 0 for what is no supported job.

    What reading a job costs grows with the square of this (flows are built per pair of replica types), not with
    its size in bytes: the server reads a job with few types where it was received, and others off its event loop.
    """
    if not isinstance(raw, Mapping):
        return 0
    api_version, kind = raw.get("apiVersion"), raw.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):  # e.g. a list: not even hashable
        return 0
    gvk = (api_version, kind)
    map_key = _REPLICA_MAPS.get(gvk)
    if map_key is None:
        return 1 if gvk in SUPPORTED else 0
    written = limits_.replica_map_size(raw, map_key)
    return written[1] if written else 0


def parse_job(
    raw: Mapping[str, Any],
    *,
    gpu_resources: Sequence[str],
    namespace: str = "",
    limits: Limits = DEFAULT_LIMITS,
    runtimes: Mapping[RuntimeKey, TrainingRuntimeInfo] | None = None,
    collective_ports: PortRange = EPHEMERAL_PORTS,
) -> JobGroup:
    """The `JobGroup` of a job object as the user submitted it.

    Args:
        raw: the job (AdmissionRequest.object), any supported kind.
        gpu_resources: extended resources that count as GPUs (settings `gpuResources`).
        namespace: the AdmissionRequest namespace, used when metadata.namespace is absent.
        limits: the largest job to consider (settings `limits`).
        runtimes: the cluster's Trainer runtimes (`Snapshot.training_runtimes`): a TrainJob's pods are
            composed from the one it names. None: not known, only what the TrainJob says is used.
        collective_ports: the TCP ports collectives use (settings `collectivePorts`), unless the job's
            annotation `topoguard.io/collective-ports` names its own (jobs/flows.py `collective_ports`).

    Raises:
        UnsupportedKindError: apiVersion/kind is not in `SUPPORTED`.
        InvalidJobError: the job is malformed; `.errors` lists every bad field with its path.
        JobLimitError: the job is larger than `limits`; `.errors` names each field and limit.
        MissingRuntimeError: a TrainJob names a runtime that is not among `runtimes` (`.ref` names it).
    """
    if type(raw) is not dict and not is_object(raw):
        raise InvalidJobError([FieldError("", f"job must be an object, got {type_name(raw)}")])
    api_version, kind = raw.get("apiVersion"), raw.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        raise UnsupportedKindError(str(api_version or ""), str(kind or ""))
    parser = _PARSERS.get((api_version, kind))
    if parser is None:
        raise UnsupportedKindError(api_version, kind)
    map_key = _REPLICA_MAPS.get((api_version, kind))
    limits_.check_replica_types(limits_.replica_map_size(raw, map_key) if map_key else None, limits)
    ports, bad_ports = flows.collective_ports(raw, collective_ports)
    try:
        if parser is trainjob.parse:
            group = trainjob.parse(raw, gpu_resources=tuple(gpu_resources), namespace=namespace,
                                   runtimes_by_key=runtimes, collective_ports=ports)
        else:
            group = parser(raw, gpu_resources=tuple(gpu_resources), namespace=namespace, collective_ports=ports)
    except InvalidJobError as e:
        raise InvalidJobError([*bad_ports, *e.errors]) from None
    if bad_ports:
        raise InvalidJobError(bad_ports)
    limits_.check_group(group, limits)
    return group


def job_shape(
    raw: Mapping[str, Any],
    *,
    gpu_resources: Sequence[str],
    limits: Limits = DEFAULT_LIMITS,
    runtimes: Mapping[RuntimeKey, TrainingRuntimeInfo] | None = None,
    collective_ports: PortRange = EPHEMERAL_PORTS,
) -> JobShape:
    """The replica types and required flows of a stored job (`parse_job`'s group, `shapes.shape_of`), for the
    audit; a job that cannot be parsed gets a shape that says why (`JobShape.problem`), never an exception."""
    try:
        group = parse_job(raw, gpu_resources=gpu_resources, limits=limits, runtimes=runtimes,
                          collective_ports=collective_ports)
    except JobError as e:
        return JobShape(problem=str(e))
    return shape_of(group)


def prepare_templates(doc: dict[str, Any], group: JobGroup) -> None:
    """Create every replica's pod template (with `metadata` and `spec`) in `doc`, in place.

    `doc` is the caller's working copy of the job `group` was parsed from: it writes only along the
    template paths (and creates new objects there), so the containers on those paths must be copies;
    everything else may be shared with the original (engine/patches.py). Kubeflow kinds and JobSet get
    the missing `template`/`metadata`/`spec` objects; a TrainJob gets topoguard's own
    `spec.runtimePatches` entry (manager `topoguard.io/webhook`) with one replicatedJob per
    replica. Running it again changes nothing.

    Raises:
        InvalidJobError: the template cannot be created (e.g. no room for a runtimePatches entry).
    """
    if (group.api_version, group.kind) == (trainjob.API_VERSION, trainjob.KIND):
        trainjob.prepare(doc, group)
        return
    for replica in group.replicas:
        template = ensure_object(doc, replica.template_path)
        for part in ("metadata", "spec"):
            if template.get(part) is None:
                template[part] = {}
