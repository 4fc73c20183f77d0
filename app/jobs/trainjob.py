"""Adapter for trainer.kubeflow.org/v1alpha1 TrainJob (Kubeflow Trainer v2; research §3).

A TrainJob holds no pod template: the pods come from the referenced (Cluster)TrainingRuntime,
which the job adapter does not read (it is pure; the runtime is another object). What the
TrainJob itself says is used:

- `trainer.numNodes` (default 1) pods of replicatedJob `node`, each with
  `trainer.resourcesPerNode` (the GPUs);
- `spec.runtimePatches[]` entries, applied in list order as a strategic merge patch: pod labels
  and nodeSelector maps merge, tolerations and nodeSelectorTerms are replaced;
- replicatedJob names: `node` always exists; any other name (`launcher` for MPI runtimes,
  initializers) is used only when some runtimePatches entry already names it, because the
  Trainer's validator rejects a patch that names a replicatedJob the runtime lacks. A
  `launcher` so found marks an MPI runtime (launcher → node over ssh) instead of torch's
  rendezvous on 29500.

topoguard patches through its own runtimePatches entry (manager `topoguard.io/webhook`),
appended on the first review and reused afterwards. The CRD prunes topologySpreadConstraints
there, so `supports_spread` is False.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.jobs import flows
from app.jobs.errors import FieldError, InvalidJobError, join_path
from app.jobs.groups import make_replica, read_job_meta
from app.jobs.pointers import build_pointer, ensure_object
from app.jobs.templates import (
    DEFAULT_SERVICE_ACCOUNT,
    PodFacts,
    read_int,
    read_list,
    read_mapping,
    read_placement,
    read_resources_gpus,
    read_str,
    read_string_map,
    type_name,
)
from app.models.cluster import ContainerPort
from app.models.job import Flow, JobGroup, Replica, UserPlacement
from app.models.labels import COMPLETION_INDEX_LABEL, JOBSET_NAME_LABEL, MANAGER_NAME, REPLICATED_JOB_NAME_LABEL

API_VERSION = "trainer.kubeflow.org/v1alpha1"
KIND = "TrainJob"

NODE_JOB = "node"
LAUNCHER_JOB = "launcher"
INITIALIZER_JOBS = frozenset({"dataset-initializer", "model-initializer"})
# Torch/JAX/XGBoost runtimes: rendezvous on <tj>-node-0-0:29500 (research §3).
TRAINER_RENDEZVOUS_PORT = 29500
MAX_RUNTIME_PATCHES = 16  # CRD maxItems of spec.runtimePatches

# JobSet labels on the pods the Trainer's JobSet creates (research §4).

_RJOBS_PATH = ("trainingRuntimeSpec", "template", "spec", "replicatedJobs")


@dataclass
class _PatchedPod:
    """The pod template of one replicatedJob after every runtimePatches entry, in order."""

    labels: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    terms: tuple[Mapping[str, Any], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    service_account: str = ""
    ours: Any = None  # this replicatedJob's pod template in topoguard's own entry
    ours_index: int = -1  # its index in our entry's replicatedJobs


def parse(raw: Mapping[str, Any], *, gpu_resources: Sequence[str], namespace: str) -> JobGroup:
    """The group of a TrainJob; raises InvalidJobError listing every bad field."""
    errors: list[FieldError] = []
    meta = read_job_meta(raw, namespace, errors)
    spec = read_mapping(raw.get("spec"), "spec", errors)
    trainer = read_mapping(spec.get("trainer"), "spec.trainer", errors)
    nodes = read_int(trainer.get("numNodes"), "spec.trainer.numNodes", errors, default=1)
    gpus = read_resources_gpus(
        trainer.get("resourcesPerNode"), "spec.trainer.resourcesPerNode", errors, gpu_resources=gpu_resources
    )
    ours_at, pods = _read_patches(spec, errors)
    existing = spec.get("runtimePatches")
    entry = ours_at if ours_at >= 0 else len(existing) if isinstance(existing, list) else 0
    if errors:
        raise InvalidJobError(errors)
    names = [NODE_JOB, *(n for n in pods if n != NODE_JOB)]
    is_mpi = LAUNCHER_JOB in names
    new_slots = itertools.count(_our_rjob_count(spec, ours_at))
    replicas = []
    for name in names:
        pod = pods.get(name) or _PatchedPod()
        slot = pod.ours_index if pod.ours_index >= 0 else next(new_slots)
        count = nodes if name == NODE_JOB else 1
        node_gpus = gpus if name == NODE_JOB else {}
        replicas.append(_build_replica(name, count, (entry, slot), pod, meta.name, node_gpus, is_mpi))
    members = [flows.Member(r.key, r.count, r.gpus_per_pod) for r in replicas if r.key not in INITIALIZER_JOBS]
    return JobGroup(
        api_version=API_VERSION,
        kind=KIND,
        name=meta.name,
        namespace=meta.namespace,
        replicas=tuple(replicas),
        coordinator=LAUNCHER_JOB if is_mpi else NODE_JOB,
        flows=tuple(_build_flows(members, is_mpi)),
        group_selector={JOBSET_NAME_LABEL: meta.name} if meta.name else {},
        annotations=meta.annotations,
        supports_spread=False,
    )


def prepare(doc: dict[str, Any], group: JobGroup) -> None:
    """Append (or reuse) topoguard's runtimePatches entry and one replicatedJob per replica.

    A new replicatedJob entry starts from the tolerations and required node affinity the earlier
    entries set: strategic merge replaces those lists, so whatever the engine writes must keep
    them (NB: the runtime's own template values are not visible here; see module docstring).
    """
    spec = ensure_object(doc, "/spec")
    patches = spec.get("runtimePatches")
    if patches is None:
        patches = spec["runtimePatches"] = []
    if not isinstance(patches, list):
        raise InvalidJobError([FieldError("spec.runtimePatches", "must be a list")])
    ours = next((p for p in patches if isinstance(p, dict) and p.get("manager") == MANAGER_NAME), None)
    if ours is None:
        if len(patches) >= MAX_RUNTIME_PATCHES:
            raise InvalidJobError(
                [
                    FieldError(
                        "spec.runtimePatches",
                        f"holds {len(patches)} entries, the most the CRD allows; no room for {MANAGER_NAME}",
                    )
                ]
            )
        ours = {"manager": MANAGER_NAME}
        patches.append(ours)
    rjobs = _ensure_list(ours, _RJOBS_PATH)
    for replica in group.replicas:
        if not any(isinstance(r, dict) and r.get("name") == replica.key for r in rjobs):
            rjobs.append({"name": replica.key, "template": {"spec": {"template": {"spec": _seed(replica.placement)}}}})
        template = ensure_object(doc, replica.template_path)
        for part in ("metadata", "spec"):
            if template.get(part) is None:
                template[part] = {}


def _read_patches(spec: Mapping[str, Any], errors: list[FieldError]) -> tuple[int, dict[str, _PatchedPod]]:
    """(index of our entry or -1, replicatedJob name → its patched pod), validating as it goes."""
    items = read_list(spec.get("runtimePatches"), "spec.runtimePatches", errors)
    ours_at = -1
    pods: dict[str, _PatchedPod] = {}
    for i, item in enumerate(items):
        path = join_path("spec.runtimePatches", i)
        if not isinstance(item, Mapping):
            errors.append(FieldError(path, f"must be an object, got {type_name(item)}"))
            continue
        manager = read_str(item.get("manager"), join_path(path, "manager"), errors)
        if manager == MANAGER_NAME and ours_at < 0:  # list-map keys are unique; the first one counts
            ours_at = i
        node: Any = item
        node_path = path
        for part in _RJOBS_PATH[:-1]:
            node_path = join_path(node_path, part)
            node = read_mapping(node.get(part), node_path, errors)
        rjobs_path = join_path(node_path, "replicatedJobs")
        for j, rjob in enumerate(read_list(node.get("replicatedJobs"), rjobs_path, errors)):
            _apply_rjob_patch(rjob, join_path(rjobs_path, j), j, pods, errors, ours=i == ours_at)
    return ours_at, pods


def _apply_rjob_patch(
    rjob: Any, path: str, index: int, pods: dict[str, _PatchedPod], errors: list[FieldError], *, ours: bool
) -> None:
    if not isinstance(rjob, Mapping):
        errors.append(FieldError(path, f"must be an object, got {type_name(rjob)}"))
        return
    name = read_str(rjob.get("name"), join_path(path, "name"), errors)
    if not name:
        errors.append(FieldError(join_path(path, "name"), "is required"))
        return
    job_template = read_mapping(rjob.get("template"), join_path(path, "template"), errors)
    job_spec = read_mapping(job_template.get("spec"), join_path(path, "template", "spec"), errors)
    pod_path = join_path(path, "template", "spec", "template")
    template = job_spec.get("template")
    pod_template = read_mapping(template, pod_path, errors)
    metadata = read_mapping(pod_template.get("metadata"), join_path(pod_path, "metadata"), errors)
    pod_spec = read_mapping(pod_template.get("spec"), join_path(pod_path, "spec"), errors)
    pod = pods.setdefault(name, _PatchedPod())
    pod.labels.update(read_string_map(metadata.get("labels"), join_path(pod_path, "metadata", "labels"), errors))
    placement = read_placement(pod_spec, join_path(pod_path, "spec"), errors)
    pod.node_selector.update(placement.node_selector)
    if _has_required_terms(pod_spec):
        pod.terms = placement.node_selector_terms
    if pod_spec.get("tolerations") is not None:
        pod.tolerations = placement.tolerations
    account = read_str(pod_spec.get("serviceAccountName"), join_path(pod_path, "spec", "serviceAccountName"), errors)
    pod.service_account = account or pod.service_account
    if ours and pod.ours_index < 0:
        pod.ours = template
        pod.ours_index = index


def _has_required_terms(pod_spec: Mapping[str, Any]) -> bool:
    affinity = pod_spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(node_affinity, Mapping)
        else None
    )
    return isinstance(required, Mapping) and required.get("nodeSelectorTerms") is not None


def _our_rjob_count(spec: Mapping[str, Any], ours_at: int) -> int:
    """How many replicatedJobs our entry already lists (new ones are appended after them)."""
    if ours_at < 0:
        return 0
    node: Any = spec["runtimePatches"][ours_at]
    for part in _RJOBS_PATH:
        node = node.get(part) if isinstance(node, Mapping) else None
    return len(node) if isinstance(node, list) else 0


def _build_replica(
    name: str,
    count: int,
    where: tuple[int, int],
    pod: _PatchedPod,
    job_name: str,
    gpus: Mapping[str, int],
    mpi: bool,
) -> Replica:
    """`where` = (index of our runtimePatches entry, index of this job in its replicatedJobs)."""
    entry, slot = where
    path = build_pointer(["spec", "runtimePatches", entry, *_RJOBS_PATH, slot, "template", "spec", "template"])
    labels = {REPLICATED_JOB_NAME_LABEL: name}
    if job_name:
        labels[JOBSET_NAME_LABEL] = job_name
    ports = () if mpi or name != NODE_JOB else (ContainerPort(TRAINER_RENDEZVOUS_PORT),)
    facts = PodFacts(
        labels=pod.labels,
        gpus=dict(gpus),
        ports=(),
        container_names=(),
        service_account=pod.service_account or DEFAULT_SERVICE_ACCOUNT,
        host_network=False,
        placement=UserPlacement(pod.node_selector, pod.terms, pod.tolerations),
    )
    return make_replica(
        key=name,
        role=name,
        count=count,
        template_path=path,
        template=pod.ours if isinstance(pod.ours, Mapping) else {},
        facts=facts,
        operator_labels=labels,
        index_label=COMPLETION_INDEX_LABEL,
        is_coordinator=name == (LAUNCHER_JOB if mpi else NODE_JOB),
        ports=ports,
    )


def _build_flows(members: list[flows.Member], mpi: bool) -> list[Flow]:
    if not flows.has_peer(members):
        return []
    if mpi:
        out = flows.build_launcher(LAUNCHER_JOB, members, flows.SSH_PORT)
        return out + flows.build_collective(members, LAUNCHER_JOB)
    out = flows.build_rendezvous(members, NODE_JOB, TRAINER_RENDEZVOUS_PORT)
    return out + flows.build_collective(members, NODE_JOB)


def _seed(placement: UserPlacement) -> dict[str, Any]:
    """Pod spec for a new entry: the lists earlier entries set, which ours would otherwise replace."""
    spec: dict[str, Any] = {}
    if placement.tolerations:
        spec["tolerations"] = [copy.deepcopy(dict(t)) for t in placement.tolerations]
    if placement.node_selector_terms:
        terms = [copy.deepcopy(dict(t)) for t in placement.node_selector_terms]
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    return spec


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
