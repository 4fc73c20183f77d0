"""Adapter for trainer.kubeflow.org/v1alpha1 TrainJob (Kubeflow Trainer v2; research §3).

A TrainJob holds no pod template: its pods are its (Cluster)TrainingRuntime's JobSet template with
the TrainJob's overrides applied the way Trainer applies them (`runtimes.compose`). The group has one
replica per replicatedJob of that JobSet, the initializers included (they share the job's volumes and
zone, but take part in no flow: they finish before the trainer starts). Pods carry the labels the
JobSet controller sets (`jobset.pod_labels`) and, under coscheduling, `scheduling.x-k8s.io/pod-group`.

Flows: torch, JAX and XGBoost rendezvous on `<tj>-node-0-0:29500`, Flux's brokers on 8050; an MPI
runtime's launcher reaches every node over ssh (the node container's port named `ssh`, else the port
its readiness or liveness probe checks, else 22); plus the collective traffic between the nodes.

When the caller passes the cluster's runtimes, the runtime named by `spec.runtimeRef` must be among
them (`MissingRuntimeError` otherwise); without them (`runtimes=None`) only what the TrainJob says is
used (see runtimes.py).

topoguard patches through its own `spec.runtimePatches` entry (manager `topoguard.io/webhook`),
appended on the first review and reused afterwards. A runtime patch replaces the lists it sets, so a
new replicatedJob entry of ours starts from the composed pod's tolerations, required node-affinity
terms and required podAffinity terms (`Replica.seed`): Trainer's merge then yields the runtime's
entries, every patch's and topoguard's. A TrainJob written for Trainer v2.0/v2.1
(`podSpecOverrides` / `podTemplateOverrides`) is composed and judged, but not patched (`prepare`
refuses: that Trainer's CRD would prune a runtimePatches entry). The CRD prunes
topologySpreadConstraints in a runtime patch, so `supports_spread` is False.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from app.jobs import flows, jobset, runtimes
from app.jobs.errors import FieldError, InvalidJobError
from app.jobs.groups import make_replica, read_job_meta
from app.jobs.pointers import build_pointer, copy_json, ensure_object
from app.jobs.runtimes import LAUNCHER_JOB, NODE_JOB, ComposedJob, Composition, MissingRuntimeError
from app.jobs.templates import read_mapping, read_pod_template
from app.models.cluster import RuntimeKey, TrainingRuntimeInfo
from app.models.job import Flow, JobGroup, Replica
from app.models.labels import COMPLETION_INDEX_LABEL, JOBSET_NAME_LABEL, MANAGER_NAME
from app.models.network import PortRange

__all__ = ["API_VERSION", "KIND", "MissingRuntimeError", "parse", "prepare", "unsuspends"]

API_VERSION = "trainer.kubeflow.org/v1alpha1"
KIND = "TrainJob"

INITIALIZER_JOBS = frozenset({"dataset-initializer", "model-initializer"})
TRAINER_RENDEZVOUS_PORT = runtimes.FRAMEWORK_PORTS["torch"]
MAX_RUNTIME_PATCHES = 16  # CRD maxItems of spec.runtimePatches
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"  # coscheduling plugin's label, = the TrainJob name
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"

_RJOBS_PATH = ("trainingRuntimeSpec", "template", "spec", "replicatedJobs")


def parse(
    raw: Mapping[str, Any],
    *,
    gpu_resources: Sequence[str],
    namespace: str,
    runtimes_by_key: Mapping[RuntimeKey, TrainingRuntimeInfo] | None = None,
    collective_ports: PortRange,
) -> JobGroup:
    """The group of a TrainJob; raises InvalidJobError listing every bad field, MissingRuntimeError."""
    errors: list[FieldError] = []
    meta = read_job_meta(raw, namespace, errors)
    spec = read_mapping(raw.get("spec"), "spec", errors)
    runtime = None
    if runtimes_by_key is not None:
        key = runtimes.runtime_key(spec, meta.namespace, errors)
        runtime = runtimes_by_key.get(key)
        if runtime is None and key[2]:
            raise MissingRuntimeError(runtimes.describe_key(key))
    composition = runtimes.compose(spec, runtime, errors, gpu_resources=gpu_resources)
    ours_at, slots = _our_entry(spec)
    existing = spec.get("runtimePatches")
    entry = ours_at if ours_at >= 0 else len(existing) if isinstance(existing, list) else 0
    if errors:
        raise InvalidJobError(errors)
    # Every part was checked where it was written; what is left is how the parts combine.
    facts = {j.name: read_pod_template(j.template, f"replicatedJob {j.name} (composed)", errors,
                                       gpu_resources=gpu_resources) for j in composition.jobs if j.name}
    if errors:
        raise InvalidJobError(errors)
    new_slots = itertools.count(len(slots))
    coordinator = LAUNCHER_JOB if composition.framework == "mpi" and composition.job(LAUNCHER_JOB) else NODE_JOB
    replicas = []
    for job in composition.jobs:
        slot, ours = slots.get(job.name, (next(new_slots), None))
        path = build_pointer(["spec", "runtimePatches", entry, *_RJOBS_PATH, slot, "template", "spec", "template"])
        replicas.append(_build_replica(job, composition, facts[job.name], path, ours, meta.name, coordinator))
    members = [flows.Member(r.key, r.count, r.gpus_per_pod) for r in replicas if r.key not in INITIALIZER_JOBS]
    return JobGroup(
        api_version=API_VERSION,
        kind=KIND,
        name=meta.name,
        namespace=meta.namespace,
        replicas=tuple(replicas),
        coordinator=coordinator,
        flows=tuple(_build_flows(members, composition, coordinator, collective_ports)),
        group_selector={JOBSET_NAME_LABEL: meta.name} if meta.name else {},
        annotations=meta.annotations,
        supports_spread=False,
        composed_from=_describe(composition),
    )


def prepare(doc: dict[str, Any], group: JobGroup) -> None:
    """Append (or reuse) topoguard's runtimePatches entry and one replicatedJob per replica.

    A new replicatedJob entry starts from the replica's `seed` (the composed lists a runtime patch
    replaces), so Trainer's merge keeps the runtime's and the other patches' entries.

    Raises:
        InvalidJobError: the TrainJob uses Trainer v2.0/v2.1 overrides, or runtimePatches is full.
    """
    spec = ensure_object(doc, "/spec")
    for old in ("podTemplateOverrides", "podSpecOverrides"):
        if spec.get(old) is not None:
            raise InvalidJobError([FieldError(f"spec.{old}", "is the override API of Kubeflow Trainer v2.0/v2.1; "
                                              "topoguard writes its placement as a runtimePatches entry (Trainer "
                                              "v2.2+), which that Trainer's CRD would drop")])
    patches = spec.get("runtimePatches")
    if patches is None:
        patches = spec["runtimePatches"] = []
    if not isinstance(patches, list):
        raise InvalidJobError([FieldError("spec.runtimePatches", "must be a list")])
    ours = next((p for p in patches if isinstance(p, dict) and p.get("manager") == MANAGER_NAME), None)
    if ours is None:
        if len(patches) >= MAX_RUNTIME_PATCHES:
            message = f"holds {len(patches)} entries, the most the CRD allows; no room for {MANAGER_NAME}"
            raise InvalidJobError([FieldError("spec.runtimePatches", message)])
        ours = {"manager": MANAGER_NAME}
        patches.append(ours)
    rjobs = _ensure_list(ours, _RJOBS_PATH)
    for replica in group.replicas:
        if not any(isinstance(r, dict) and r.get("name") == replica.key for r in rjobs):
            pod_spec = copy_json(dict(replica.seed))
            rjobs.append({"name": replica.key, "template": {"spec": {"template": {"spec": pod_spec}}}})
        template = ensure_object(doc, replica.template_path)
        for part in ("metadata", "spec"):
            if template.get(part) is None:
                template[part] = {}


def unsuspends(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether an UPDATE flips a TrainJob's `spec.suspend` from true to false (a queue manager admitting
    it): the pods are about to be created, so the job is judged again whatever else changed."""
    if old is None or (new.get("apiVersion"), new.get("kind")) != (API_VERSION, KIND):
        return False
    old_spec, new_spec = old.get("spec"), new.get("spec")
    was = isinstance(old_spec, Mapping) and old_spec.get("suspend") is True
    return was and not (isinstance(new_spec, Mapping) and new_spec.get("suspend") is True)


def _our_entry(spec: Mapping[str, Any]) -> tuple[int, dict[str, tuple[int, Any]]]:
    """(index of our runtimePatches entry or -1, replicatedJob name → (its index there, its pod template))."""
    items = spec.get("runtimePatches")
    if not isinstance(items, list):
        return -1, {}
    for i, item in enumerate(items):
        if isinstance(item, Mapping) and item.get("manager") == MANAGER_NAME:  # list-map keys are unique
            node: Any = item
            for part in _RJOBS_PATH:
                node = node.get(part) if isinstance(node, Mapping) else None
            slots: dict[str, tuple[int, Any]] = {}
            for j, rjob in enumerate(node if isinstance(node, list) else []):
                name = rjob.get("name") if isinstance(rjob, Mapping) else None
                if isinstance(name, str) and name not in slots:
                    job_spec = _get(rjob, "template", "spec")
                    slots[name] = (j, job_spec.get("template") if isinstance(job_spec, Mapping) else None)
            return i, slots
    return -1, {}


def _get(node: Any, *parts: str) -> Any:
    for part in parts:
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _build_replica(
    job: ComposedJob, composition: Composition, facts: Any, path: str, ours: Any, job_name: str, coordinator: str
) -> Replica:
    labels = jobset.pod_labels(job_name, job.name, job.replicas, job.group_name)
    if composition.coscheduling and job_name:
        labels[POD_GROUP_LABEL] = job_name
    replica = make_replica(
        key=job.name,
        role=job.name,
        count=job.pods,
        template_path=path,
        template=ours if isinstance(ours, Mapping) else {},
        facts=facts,
        operator_labels=labels,
        index_label=COMPLETION_INDEX_LABEL,
        is_coordinator=job.name == coordinator,
    )
    return dataclasses.replace(replica, seed=_seed(job.template))


def _seed(template: Mapping[str, Any]) -> dict[str, Any]:
    """The composed pod's lists a runtime patch would replace, for a new entry of ours to start from."""
    spec: dict[str, Any] = {}
    tolerations = _get(template, "spec", "tolerations")
    if isinstance(tolerations, list) and tolerations:
        spec["tolerations"] = copy_json(tolerations)
    terms = _get(template, "spec", "affinity", "nodeAffinity", REQUIRED, "nodeSelectorTerms")
    if isinstance(terms, list) and terms:
        spec["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": copy_json(terms)}}}
    pod_terms = _get(template, "spec", "affinity", "podAffinity", REQUIRED)
    if isinstance(pod_terms, list) and pod_terms:
        spec.setdefault("affinity", {})["podAffinity"] = {REQUIRED: copy_json(pod_terms)}
    return spec


def _ssh_port(composition: Composition) -> int:
    """The port a node's sshd listens on: a container port named ssh, else the one its probes check, else 22."""
    node = composition.job(NODE_JOB)
    containers = _get(node.template, "spec", "containers") if node else None
    for container in containers if isinstance(containers, list) else []:
        if not isinstance(container, Mapping):
            continue
        for port in container.get("ports") or []:
            if isinstance(port, Mapping) and port.get("name") == "ssh" and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
        for probe in ("readinessProbe", "livenessProbe"):
            number = _get(container, probe, "tcpSocket", "port")
            if isinstance(number, int) and not isinstance(number, bool):
                return number
    return flows.SSH_PORT


def _build_flows(
    members: list[flows.Member], composition: Composition, coordinator: str, collective_ports: PortRange
) -> list[Flow]:
    if not flows.has_peer(members):
        return []
    if composition.framework == "mpi" and coordinator == LAUNCHER_JOB:
        out = flows.build_launcher(LAUNCHER_JOB, members, _ssh_port(composition))
        return out + flows.build_collective(members, LAUNCHER_JOB, collective_ports)
    port = runtimes.FRAMEWORK_PORTS.get(composition.framework)
    out = flows.build_rendezvous(members, NODE_JOB, port) if port else []
    return out + flows.build_collective(members, NODE_JOB, collective_ports)


def _describe(composition: Composition) -> str:
    """For the decision: which runtime was read and which override API the TrainJob uses."""
    source = composition.source or "the TrainJob alone (runtime not read)"
    return f"{source} via {composition.overrides or 'runtimePatches'}"


def _ensure_list(node: dict[str, Any], parts: Sequence[str]) -> list[Any]:
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    items = node.get(parts[-1])
    if not isinstance(items, list):
        items = node[parts[-1]] = []
    return items
