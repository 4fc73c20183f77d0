"""Adapter for jobset.x-k8s.io/v1alpha2 JobSet (research/kubeflow-formats.md §4, JobSet v0.12.0).

A JobSet is a list of replicatedJobs, each `replicas` batch Jobs of `min(parallelism,
completions)` pods. There is no framework, so no rendezvous port it implies: the group needs the
collective traffic (the collectives' range, jobs/flows.py) between its concurrently running GPU
replicatedJobs and the coordinator (`spec.coordinator`, else the first replicatedJob that runs with
the others), and every pod reaches the coordinator on each TCP port the coordinator's pods declare
(`containerPort`: what they listen on, e.g. torchrun's MASTER_PORT).

A replicatedJob that another one `dependsOn` with status `Complete` (an initializer) has
finished before the others start, so it takes part in no flow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.jobs import flows
from app.jobs.errors import FieldError, InvalidJobError, join_path
from app.jobs.groups import JobMeta, make_replica, read_job_meta
from app.jobs.pointers import build_pointer
from app.jobs.templates import PodFacts, read_int, read_list, read_mapping, read_pod_template, read_str, type_name
from app.models.job import Flow, JobGroup, Replica
from app.models.labels import (
    BATCH_JOB_NAME_LABEL,
    COMPLETION_INDEX_LABEL,
    COORDINATOR_LABEL,
    GROUP_NAME_LABEL,
    JOB_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    LEGACY_JOB_NAME_LABEL,
    REPLICATED_JOB_NAME_LABEL,
    REPLICATED_JOB_REPLICAS_LABEL,
)
from app.models.network import PortRange

API_VERSION = "jobset.x-k8s.io/v1alpha2"
KIND = "JobSet"

# Labels JobSet and the batch Job controller put on every pod (research §4). Kept here until
# they move to app/models/labels.py (owned by another engineer).
DEFAULT_GROUP_NAME = "default"  # CRD default of replicatedJobs[].groupName


@dataclass(frozen=True)
class _RJob:
    index: int
    name: str
    replicas: int
    pods_per_job: int
    group_name: str
    template: Any
    facts: PodFacts


def parse(
    raw: Mapping[str, Any], *, gpu_resources: Sequence[str], namespace: str, collective_ports: PortRange
) -> JobGroup:
    """The group of a JobSet; raises InvalidJobError listing every bad field."""
    errors: list[FieldError] = []
    meta = read_job_meta(raw, namespace, errors)
    spec = read_mapping(raw.get("spec"), "spec", errors)
    rjobs = _read_rjobs(spec, errors, gpu_resources=gpu_resources)
    coordinator = _choose_coordinator(spec, rjobs, errors)
    coordinator_value = _coordinator_value(spec, meta, errors)
    if errors:
        raise InvalidJobError(errors)
    replicas = tuple(_build_replica(r, meta, coordinator, coordinator_value) for r in rjobs)
    finished_first = _finished_first(spec)
    members = [flows.Member(r.key, r.count, r.gpus_per_pod) for r in replicas if r.key not in finished_first]
    flow_list = _flows(members, replicas, coordinator, collective_ports) if flows.has_peer(members) else []
    return JobGroup(
        api_version=API_VERSION,
        kind=KIND,
        name=meta.name,
        namespace=meta.namespace,
        replicas=replicas,
        coordinator=coordinator,
        flows=tuple(flow_list),
        group_selector={JOBSET_NAME_LABEL: meta.name} if meta.name else {},
        annotations=meta.annotations,
    )


def _flows(
    members: Sequence[flows.Member], replicas: Sequence[Replica], coordinator: str, collective_ports: PortRange
) -> list[Flow]:
    """Rendezvous on each TCP port the coordinator's pods declare, and the collectives."""
    declared: dict[int, str] = {}
    for p in next((r.ports for r in replicas if r.key == coordinator), ()):
        if p.protocol == "TCP":
            declared.setdefault(p.port, p.name)
    out: list[Flow] = []
    for port, name in declared.items():
        out += flows.build_rendezvous(members, coordinator, port, port_name=name)
    return out + flows.build_collective(members, coordinator, collective_ports)


def _read_rjobs(spec: Mapping[str, Any], errors: list[FieldError], *, gpu_resources: Sequence[str]) -> list[_RJob]:
    raw = spec.get("replicatedJobs")
    items = read_list(raw, "spec.replicatedJobs", errors)
    if raw is None or (isinstance(raw, list) and not raw):
        errors.append(FieldError("spec.replicatedJobs", "is required and must hold at least one replicatedJob"))
    out: list[_RJob] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        path = join_path("spec.replicatedJobs", i)
        if not isinstance(item, Mapping):
            errors.append(FieldError(path, f"must be an object, got {type_name(item)}"))
            continue
        body = item
        name = read_str(body.get("name"), join_path(path, "name"), errors)
        if not name:
            errors.append(FieldError(join_path(path, "name"), "is required"))
            continue
        if name in seen:
            errors.append(FieldError(join_path(path, "name"), f"duplicate replicatedJob name {name!r}"))
            continue
        seen.add(name)
        out.append(_read_rjob(i, name, body, path, errors, gpu_resources=gpu_resources))
    return out


def _read_rjob(
    index: int, name: str, body: Mapping[str, Any], path: str, errors: list[FieldError], *, gpu_resources: Sequence[str]
) -> _RJob:
    replicas = read_int(body.get("replicas"), join_path(path, "replicas"), errors, default=1)
    group = read_str(body.get("groupName"), join_path(path, "groupName"), errors) or DEFAULT_GROUP_NAME
    job_path = join_path(path, "template")
    job_template = read_mapping(body.get("template"), job_path, errors)
    job_spec_path = join_path(job_path, "spec")
    job_spec = read_mapping(job_template.get("spec"), job_spec_path, errors)
    parallelism = read_int(job_spec.get("parallelism"), join_path(job_spec_path, "parallelism"), errors, default=1)
    completions_raw = job_spec.get("completions")
    pods = parallelism
    if completions_raw is not None:
        completions = read_int(completions_raw, join_path(job_spec_path, "completions"), errors, default=parallelism)
        pods = min(parallelism, completions)  # a Job runs min(parallelism, completions) pods at once
    template = job_spec.get("template")
    facts = read_pod_template(template, join_path(job_spec_path, "template"), errors, gpu_resources=gpu_resources)
    return _RJob(index, name, replicas, pods, group, template, facts)


def _choose_coordinator(spec: Mapping[str, Any], rjobs: list[_RJob], errors: list[FieldError]) -> str:
    """`spec.coordinator.replicatedJob`, else the first replicatedJob that is not an initializer."""
    raw = read_mapping(spec.get("coordinator"), "spec.coordinator", errors)
    wanted = read_str(raw.get("replicatedJob"), "spec.coordinator.replicatedJob", errors)
    names = [r.name for r in rjobs]
    if wanted:
        if wanted not in names and rjobs:
            errors.append(FieldError("spec.coordinator.replicatedJob", f"names no replicatedJob: {wanted!r}"))
        return wanted
    finished_first = _finished_first(spec)
    running = [n for n in names if n not in finished_first]
    return (running or names or [""])[0]


def _finished_first(spec: Mapping[str, Any]) -> frozenset[str]:
    """replicatedJobs some other one waits to `Complete` (dependsOn): they never run beside it."""
    out: set[str] = set()
    items = spec.get("replicatedJobs")
    for item in items if isinstance(items, list) else []:
        depends = item.get("dependsOn") if isinstance(item, Mapping) else None
        for dep in depends if isinstance(depends, list) else []:
            if isinstance(dep, Mapping) and dep.get("status") == "Complete" and isinstance(dep.get("name"), str):
                out.add(dep["name"])
    return frozenset(out)


def _coordinator_value(spec: Mapping[str, Any], meta: JobMeta, errors: list[FieldError]) -> str:
    """`<js>-<rjob>-<jobIndex>-<podIndex>.<subdomain>`, the coordinator label's value ("" when unset)."""
    coordinator = spec.get("coordinator")
    if not isinstance(coordinator, Mapping) or not isinstance(coordinator.get("replicatedJob"), str):
        return ""
    job_index = read_int(coordinator.get("jobIndex"), "spec.coordinator.jobIndex", errors, default=0)
    pod_index = read_int(coordinator.get("podIndex"), "spec.coordinator.podIndex", errors, default=0)
    network = read_mapping(spec.get("network"), "spec.network", errors)
    subdomain = read_str(network.get("subdomain"), "spec.network.subdomain", errors) or meta.name
    if not meta.name:
        return ""
    return f"{meta.name}-{coordinator['replicatedJob']}-{job_index}-{pod_index}.{subdomain}"


def pod_labels(
    jobset_name: str, rjob_name: str, replicas: int, group_name: str, coordinator: str = ""
) -> dict[str, str]:
    """The labels the JobSet controller puts on every pod of replicatedJob `rjob_name` (those the same
    for all its pods; `jobset_name` "" while the apiserver has yet to generate it)."""
    labels = {
        REPLICATED_JOB_NAME_LABEL: rjob_name,
        REPLICATED_JOB_REPLICAS_LABEL: str(replicas),
        GROUP_NAME_LABEL: group_name,
    }
    if jobset_name:
        labels[JOBSET_NAME_LABEL] = jobset_name
    if coordinator:
        labels[COORDINATOR_LABEL] = coordinator
    if replicas == 1:  # one child Job: its index and name are the same for every pod
        labels[JOB_INDEX_LABEL] = "0"
        if jobset_name:
            labels[BATCH_JOB_NAME_LABEL] = labels[LEGACY_JOB_NAME_LABEL] = f"{jobset_name}-{rjob_name}-0"
    return labels


def _build_replica(r: _RJob, meta: JobMeta, coordinator: str, coordinator_value: str) -> Replica:
    labels = pod_labels(meta.name, r.name, r.replicas, r.group_name, coordinator_value)
    return make_replica(
        key=r.name,
        role=r.name,
        count=r.replicas * r.pods_per_job,
        template_path=build_pointer(["spec", "replicatedJobs", r.index, "template", "spec", "template"]),
        template=r.template,
        facts=r.facts,
        operator_labels=labels,
        index_label=COMPLETION_INDEX_LABEL,
        is_coordinator=r.name == coordinator,
    )
