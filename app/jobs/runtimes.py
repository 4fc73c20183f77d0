"""A TrainJob's pod templates composed from its (Cluster)TrainingRuntime, as Kubeflow Trainer composes them.

PURE: the runtime comes in as a `TrainingRuntimeInfo` from the snapshot. Order of composition (the
order Trainer v2.3 builds the JobSet in; research/kubeflow-formats.md §3, ecosystem-2026-12.md §1, §8):

1. The runtime's JobSet template: every `replicatedJobs[]` entry, its pod template as written.
2. Its ML policy and the TrainJob's `trainer` overrides: the replicatedJob whose Job template carries
   `trainer.kubeflow.org/trainjob-ancestor-step: trainer` (and, for an MPI runtime with
   `runLauncherAsNode`, the job named `node` as well) is the trainer. Its pod count is
   `trainer.numNodes` (else `mlPolicy.numNodes`, else 1); in an MPI runtime the `launcher` runs one pod
   and `node` runs numNodes pods, one fewer with runLauncherAsNode (the launcher is a node then, at
   least one). In the trainer's containers named `node`, `image`, `command` and `args` are replaced
   and `resourcesPerNode` is laid over the container's own resources key by key. Torch, JAX and
   XGBoost upsert container port 29500 (`ContainerTrainerPort`, the rendezvous on node-0-0), Flux
   its broker port 8050.
3. The pod-template overrides, in the form the installed Trainer accepts, detected by which field
   the stored TrainJob carries (the CRD of an older or newer Trainer prunes the others):
   `runtimePatches` (v2.2+, each entry in list order, by replicatedJob name), `podTemplateOverrides`
   (v2.1, PodTemplateSpec per `targetJobs`) or `podSpecOverrides` (v2.0, PodSpec per `targetJobs`).
   Each is a strategic merge patch (`merge_strategic`): maps merge key by key, the lists Kubernetes
   gives a merge key (containers, volumes, env, ...) merge item by item, every other list
   (tolerations, nodeSelectorTerms, podAffinity terms) is replaced whole.

A replicatedJob that a patch names but the runtime lacks is an error (Trainer rejects such patches).
Without a runtime (`runtime=None`: the caller has no runtimes to read), the jobs are `node` plus those
a patch names, and an MPI runtime is recognised by a `launcher` among them: what the TrainJob alone says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.jobs.errors import FieldError, JobError, join_path
from app.jobs.pointers import copy_json
from app.jobs.templates import (
    read_int,
    read_list,
    read_mapping,
    read_pod_template,
    read_resources,
    read_str,
    type_name,
)
from app.models.cluster import RuntimeKey, TrainingRuntimeInfo

API_GROUP = "trainer.kubeflow.org"
CLUSTER_RUNTIME = "ClusterTrainingRuntime"
NAMESPACED_RUNTIME = "TrainingRuntime"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
NODE_JOB = "node"
LAUNCHER_JOB = "launcher"
TRAINER_CONTAINER = "node"  # the container Trainer's overrides apply to
# ML policy source → the port the trainer pods rendezvous on (Trainer pkg/constants, plugins/flux).
FRAMEWORK_PORTS = {"torch": 29500, "jax": 29500, "xgboost": 29500, "flux": 8050}
ML_POLICY_SOURCES = ("torch", "mpi", "jax", "xgboost", "flux")
# Patch merge keys of the list fields a pod template patch can reach (k8s.io/api core/v1 and
# JobSet's replicatedJobs); any other list is replaced (atomic).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "schedulingGates": "name",
    "resourceClaims": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "replicatedJobs": "name",
}
OVERRIDE_FIELDS = ("runtimePatches", "podTemplateOverrides", "podSpecOverrides")
_PATCH_JOBS = ("trainingRuntimeSpec", "template", "spec", "replicatedJobs")


class MissingRuntimeError(JobError):
    """The TrainJob names a runtime the cluster does not have: its pods cannot be known."""

    def __init__(self, ref: str) -> None:
        self.ref = ref
        super().__init__(f"{ref} does not exist in the cluster, so the pods of this TrainJob cannot be known")


@dataclass(frozen=True)
class ComposedJob:
    """One replicatedJob of the JobSet Trainer will create, its pod template fully composed."""

    name: str
    ancestor: str  # the Job template's trainjob-ancestor-step label ("" when none)
    replicas: int  # JobSet replicas (child Jobs)
    pods: int  # pods running at once over all its Jobs
    group_name: str  # JobSet groupName (default "default")
    template: Mapping[str, Any]  # the PodTemplateSpec the pods are made from


@dataclass(frozen=True)
class Composition:
    source: str  # `ClusterTrainingRuntime torch-distributed@42`, or "" when no runtime was read
    framework: str  # the ML policy source (torch, mpi, jax, xgboost, flux) or ""
    overrides: str  # which override field the TrainJob carries ("" when none)
    run_launcher_as_node: bool
    coscheduling: bool  # podGroupPolicy.coscheduling: pods carry the pod-group label
    jobs: tuple[ComposedJob, ...]

    def job(self, name: str) -> ComposedJob | None:
        return next((j for j in self.jobs if j.name == name), None)


def runtime_key(spec: Mapping[str, Any], namespace: str, errors: list[FieldError]) -> RuntimeKey:
    """The runtime `spec.runtimeRef` names, with the CRD's defaults (kind ClusterTrainingRuntime)."""
    ref = read_mapping(spec.get("runtimeRef"), "spec.runtimeRef", errors)
    name = read_str(ref.get("name"), "spec.runtimeRef.name", errors)
    if not name:
        errors.append(FieldError("spec.runtimeRef.name", "is required"))
    group = read_str(ref.get("apiGroup"), "spec.runtimeRef.apiGroup", errors, default=API_GROUP) or API_GROUP
    kind = read_str(ref.get("kind"), "spec.runtimeRef.kind", errors, default=CLUSTER_RUNTIME) or CLUSTER_RUNTIME
    if group != API_GROUP or kind not in (CLUSTER_RUNTIME, NAMESPACED_RUNTIME):
        errors.append(FieldError("spec.runtimeRef", f"names {kind} in {group}; only {API_GROUP} "
                                 f"{CLUSTER_RUNTIME} and {NAMESPACED_RUNTIME} are runtimes"))
    return (kind, "" if kind == CLUSTER_RUNTIME else namespace, name)


def describe_key(key: RuntimeKey) -> str:
    kind, namespace, name = key
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def merge_strategic(base: Any, patch: Any, key: str = "") -> Any:
    """`patch` applied to `base` as a strategic merge patch (a new value; neither input is changed).

    Maps merge; a null in the patch deletes the key; lists named in MERGE_KEYS merge by their key
    (items without it are appended); every other list, and every scalar, is replaced.

    NB: copy-on-write: what the patch does not touch is shared with `base`, never copied (the
    runtime's template in the snapshot is read by every review); what it sets is a copy.
    """
    if isinstance(patch, Mapping) and isinstance(base, Mapping):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = merge_strategic(out.get(k), v, k)
        return out
    if isinstance(patch, list) and isinstance(base, list) and key in MERGE_KEYS:
        return _merge_list(base, patch, MERGE_KEYS[key])
    return copy_json(patch)


def _merge_list(base: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    out = list(base)
    for item in patch:
        at = next((i for i, old in enumerate(out) if isinstance(item, Mapping) and isinstance(old, Mapping)
                   and merge_key in item and old.get(merge_key) == item[merge_key]), None)
        if at is None:
            out.append(copy_json(item))
        else:
            out[at] = merge_strategic(out[at], item)
    return out


@dataclass
class _Job:
    name: str
    ancestor: str
    replicas: int
    parallelism: int
    group_name: str
    template: Any


def compose(
    spec: Mapping[str, Any],
    runtime: TrainingRuntimeInfo | None,
    errors: list[FieldError],
    *,
    gpu_resources: Sequence[str],
) -> Composition:
    """The TrainJob's replicatedJobs as Trainer will create them (see the module docstring).

    Bad fields of the TrainJob, and of the runtime (their paths start with the runtime's name), are
    appended to `errors`; the composition is then incomplete and must not be used.
    """
    overrides = next((f for f in OVERRIDE_FIELDS if spec.get(f) is not None), "")
    entries = _override_entries(spec, overrides, errors)
    ml_policy: Mapping[str, Any] = runtime.ml_policy if runtime else {}
    pod_group: Mapping[str, Any] = runtime.pod_group_policy if runtime else {}
    jobs = _runtime_jobs(runtime, errors, gpu_resources) if runtime else _implied_jobs(entries)
    framework = next((s for s in ML_POLICY_SOURCES if ml_policy.get(s) is not None), "")
    if runtime is None:
        framework = "mpi" if any(j.name == LAUNCHER_JOB for j in jobs) else "torch"
    mpi = _mapping(ml_policy.get("mpi"))
    as_node = mpi.get("runLauncherAsNode") is True
    trainer = read_mapping(spec.get("trainer"), "spec.trainer", errors)
    nodes = read_int(trainer.get("numNodes"), "spec.trainer.numNodes", errors,
                     default=_int(ml_policy.get("numNodes"), 1), minimum=1)
    checked = len(errors)
    read_resources(trainer.get("resourcesPerNode"), "spec.trainer.resourcesPerNode", errors,
                        gpu_resources=gpu_resources)
    if len(errors) == checked:  # a bad quantity is reported once, where the user wrote it
        for job in jobs:
            if _is_trainer(job, framework, as_node):
                job.template = _apply_trainer(job.template, trainer, framework)
    source = f"{runtime.ref}@{runtime.resource_version}" if runtime and runtime.resource_version else (
        runtime.ref if runtime else "")
    _apply_overrides(jobs, entries, overrides, source or "the runtime", errors, strict=runtime is not None,
                     gpu_resources=gpu_resources)
    composed = tuple(
        ComposedJob(j.name, j.ancestor, j.replicas, _pods(j, framework, as_node, nodes), j.group_name, j.template)
        for j in jobs
    )
    return Composition(source, framework, overrides, as_node, pod_group.get("coscheduling") is not None, composed)


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _is_trainer(job: _Job, framework: str, as_node: bool) -> bool:
    return job.ancestor == ANCESTOR_TRAINER or (framework == "mpi" and as_node and job.name == NODE_JOB)


def _pods(job: _Job, framework: str, as_node: bool, nodes: int) -> int:
    if framework == "mpi" and job.name == LAUNCHER_JOB:
        return 1
    if framework == "mpi" and job.name == NODE_JOB:
        return max(nodes - 1, 1) if as_node else nodes
    if job.ancestor == ANCESTOR_TRAINER:
        return nodes
    return job.replicas * job.parallelism


def _runtime_jobs(runtime: TrainingRuntimeInfo, errors: list[FieldError], gpu_resources: Sequence[str]) -> list[_Job]:
    """The runtime's replicatedJobs, read and checked (paths name the runtime)."""
    at = f"{runtime.ref}: spec.template.spec"
    spec = read_mapping(runtime.template.get("spec"), at, errors)
    out: list[_Job] = []
    for i, rjob in enumerate(read_list(spec.get("replicatedJobs"), join_path(at, "replicatedJobs"), errors)):
        rjob_at = join_path(at, "replicatedJobs", i)
        rjob = read_mapping(rjob, rjob_at, errors)
        name = read_str(rjob.get("name"), join_path(rjob_at, "name"), errors)
        job_template = read_mapping(rjob.get("template"), join_path(rjob_at, "template"), errors)
        job_meta = read_mapping(job_template.get("metadata"), join_path(rjob_at, "template", "metadata"), errors)
        job_labels = _mapping(job_meta.get("labels"))
        job_spec = read_mapping(job_template.get("spec"), join_path(rjob_at, "template", "spec"), errors)
        pod_at = join_path(rjob_at, "template", "spec", "template")
        template = job_spec.get("template") or {}
        read_pod_template(template, pod_at, errors, gpu_resources=gpu_resources)
        parallelism = read_int(job_spec.get("parallelism"), join_path(rjob_at, "template", "spec", "parallelism"),
                               errors, default=1)
        completions = job_spec.get("completions")
        if isinstance(completions, int) and not isinstance(completions, bool) and 0 <= completions < parallelism:
            parallelism = completions
        replicas = read_int(rjob.get("replicas"), join_path(rjob_at, "replicas"), errors, default=1)
        group = read_str(rjob.get("groupName"), join_path(rjob_at, "groupName"), errors, default="default")
        # NB: shared with the snapshot, never written to: every later step copies what it changes.
        out.append(_Job(name, str(job_labels.get(ANCESTOR_LABEL) or ""), replicas, parallelism, group or "default",
                        template))
    if not any(j.name for j in out):
        errors.append(FieldError(join_path(at, "replicatedJobs"), "has no replicatedJob"))
    return out


def _implied_jobs(entries: list[tuple[str, str, Any]]) -> list[_Job]:
    """Without the runtime: `node` (the trainer) and every other job a patch names."""
    names = [NODE_JOB, *dict.fromkeys(name for _, name, _ in entries if name != NODE_JOB)]
    return [_Job(n, ANCESTOR_TRAINER if n == NODE_JOB else "", 1, 1, "default", {}) for n in names]


def _apply_trainer(template: Any, trainer: Mapping[str, Any], framework: str) -> Any:
    """The trainer overrides and the framework's port on the containers named `node`."""
    template = dict(template) if isinstance(template, Mapping) else {}
    spec = dict(_mapping(template.get("spec")))
    containers = spec.get("containers")
    if not isinstance(containers, list) or not any(_mapping(c).get("name") == TRAINER_CONTAINER for c in containers):
        containers = [*(containers if isinstance(containers, list) else []), {"name": TRAINER_CONTAINER}]
    resources = _mapping(trainer.get("resourcesPerNode"))
    port = FRAMEWORK_PORTS.get(framework)
    out = []
    for container in containers:
        if not isinstance(container, Mapping) or container.get("name") != TRAINER_CONTAINER:
            out.append(container)
            continue
        container = dict(container)
        for field in ("image", "command", "args"):
            if trainer.get(field) is not None:
                container[field] = copy_json(trainer[field])
        if resources:
            container["resources"] = merge_strategic(_mapping(container.get("resources")), resources)
        if port is not None:
            ports = [p for p in container.get("ports") or [] if isinstance(p, Mapping)]
            if not any(p.get("containerPort") == port for p in ports):
                container["ports"] = [*ports, {"containerPort": port, "protocol": "TCP"}]
        out.append(container)
    spec["containers"] = out
    template["spec"] = spec
    return template


def _override_entries(spec: Mapping[str, Any], field: str, errors: list[FieldError]) -> list[tuple[str, str, Any]]:
    """(path of the pod template patch, replicatedJob name, the patch as a PodTemplateSpec) in order."""
    if not field:
        return []
    out: list[tuple[str, str, Any]] = []
    for i, item in enumerate(read_list(spec.get(field), f"spec.{field}", errors)):
        at = join_path(f"spec.{field}", i)
        if not isinstance(item, Mapping):
            errors.append(FieldError(at, f"must be an object, got {type_name(item)}"))
            continue
        if field == "runtimePatches":
            out += _runtime_patch_entries(item, at, errors)
            continue
        targets = [read_mapping(t, join_path(at, "targetJobs", j), errors)
                   for j, t in enumerate(read_list(item.get("targetJobs"), join_path(at, "targetJobs"), errors))]
        if field == "podTemplateOverrides":
            patch: Any = {k: item[k] for k in ("metadata", "spec") if item.get(k) is not None}
        else:  # podSpecOverrides: the entry is a PodSpec patch beside its targetJobs
            patch = {"spec": {k: v for k, v in item.items() if k != "targetJobs"}}
        for j, target in enumerate(targets):
            name = read_str(target.get("name"), join_path(at, "targetJobs", j, "name"), errors)
            if name:
                out.append((at, name, patch))
    return out


def _runtime_patch_entries(item: Mapping[str, Any], at: str, errors: list[FieldError]) -> list[tuple[str, str, Any]]:
    read_str(item.get("manager"), join_path(at, "manager"), errors)
    node: Any = item
    path = at
    for part in _PATCH_JOBS[:-1]:
        path = join_path(path, part)
        node = read_mapping(node.get(part), path, errors)
    out = []
    for j, rjob in enumerate(read_list(node.get("replicatedJobs"), join_path(path, "replicatedJobs"), errors)):
        rjob_at = join_path(path, "replicatedJobs", j)
        if not isinstance(rjob, Mapping):
            errors.append(FieldError(rjob_at, f"must be an object, got {type_name(rjob)}"))
            continue
        name = read_str(rjob.get("name"), join_path(rjob_at, "name"), errors)
        if not name:
            errors.append(FieldError(join_path(rjob_at, "name"), "is required"))
            continue
        job_template = read_mapping(rjob.get("template"), join_path(rjob_at, "template"), errors)
        job_spec = read_mapping(job_template.get("spec"), join_path(rjob_at, "template", "spec"), errors)
        out.append((join_path(rjob_at, "template", "spec", "template"), name, job_spec.get("template") or {}))
    return out


def _apply_overrides(
    jobs: list[_Job],
    entries: list[tuple[str, str, Any]],
    field: str,
    source: str,
    errors: list[FieldError],
    *,
    strict: bool,
    gpu_resources: Sequence[str],
) -> None:
    by_name = {j.name: j for j in jobs}
    for at, name, patch in entries:
        job = by_name.get(name)
        if job is None:
            if strict:
                errors.append(FieldError(at, f"names replicatedJob {name!r}, which {source} does not have"))
            continue
        scratch: list[FieldError] = []
        read_pod_template(patch, at if field == "runtimePatches" else f"{at} (replicatedJob {name})", scratch,
                          gpu_resources=gpu_resources)
        errors.extend(e for e in scratch if e not in errors)
        if not scratch:
            job.template = merge_strategic(job.template, patch)
