"""Adapters for the kubeflow.org replica-map kinds: training-operator v1 and mpi-operator v2beta1.

Each kind keeps `spec.<map>.<ReplicaType>.{replicas, template}`; a table (`FRAMEWORKS`) says
per kind which replica types exist, which is the coordinator, the framework container and its
default port, and the shape of the traffic. Facts and their sources: research/kubeflow-formats.md
sections 2 and 5 (training-operator v1.9.4, mpi-operator caa3c47).

Replica keys match case-insensitively (the operators' `setTypeNameToCamelCase` uses EqualFold)
but are kept as written, so patches land under the user's own key.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, NamedTuple

from app.jobs import flows
from app.jobs.errors import FieldError, InvalidJobError, join_path
from app.jobs.groups import JobMeta, find_named_port, make_replica, read_job_meta
from app.jobs.pointers import build_pointer, escape_json_pointer
from app.jobs.records import build_record, build_tuple
from app.jobs.templates import EMPTY_FACTS, PodFacts, is_object, read_int, read_mapping, read_pod_template, read_str
from app.models import labels as L
from app.models.cluster import BoundedMemo, ContainerPort
from app.models.job import Flow, JobGroup, Replica
from app.models.labels import BATCH_JOB_NAME_LABEL, LEGACY_JOB_NAME_LABEL
from app.models.network import PortRange

Shape = Literal["rendezvous", "all-to-all", "mpi-exec", "mpi-ssh"]

# mpi-operator v2beta1 labels its pods with this operator name (research §2.4).
MPI_OPERATOR_NAME = "mpi-operator"
# batch/v1 Job controller labels on the mpi-operator launcher's pod.


@dataclass(frozen=True)
class Framework:
    """What one kubeflow.org kind looks like (research/kubeflow-formats.md §2)."""

    api_version: str
    kind: str
    map_key: str  # spec.<map_key> holds the replica specs
    replica_types: tuple[str, ...]  # canonical names
    coordinator_types: tuple[str, ...]  # preference order; the first one present coordinates
    shape: Shape
    container: str = ""  # the framework container the operator adds the default port to
    port_name: str = ""
    default_port: int = 0
    open_types: bool = False  # TFJob: the operator accepts any key (§5.2)
    coordinator_required: bool = False
    # Coordinator types whose index-0 pod gets job-role=master (`IsMasterRole`).
    job_role_types: tuple[str, ...] = ()
    default_replicas: Mapping[str, int] = field(default_factory=dict)

    # Derived once per framework, not per review (cached_property writes the instance __dict__,
    # which a frozen dataclass allows).
    @cached_property
    def operator_name(self) -> str:
        if self.api_version == "kubeflow.org/v2beta1":
            return MPI_OPERATOR_NAME
        return f"{self.kind.lower()}-controller"

    @cached_property
    def map_path(self) -> str:
        """`spec.<map_key>` as a field path."""
        return join_path("spec", self.map_key)

    @cached_property
    def map_pointer(self) -> str:
        """`/spec/<map_key>` as a JSON pointer."""
        return build_pointer(["spec", self.map_key])

    @cached_property
    def default_container_port(self) -> ContainerPort:
        """The port the operator adds to the default container when no port there has `port_name`."""
        return ContainerPort(port=self.default_port, protocol="TCP", name=self.port_name)

    @cached_property
    def types_by_folded_name(self) -> Mapping[str, str]:
        """Lower-cased replica type → canonical name (keys match case-insensitively)."""
        return {t.lower(): t for t in self.replica_types}


FRAMEWORKS: Mapping[tuple[str, str], Framework] = {
    (f.api_version, f.kind): f
    for f in (
        Framework(
            "kubeflow.org/v1",
            "PyTorchJob",
            "pytorchReplicaSpecs",
            ("Master", "Worker"),
            ("Master", "Worker"),
            "rendezvous",
            container="pytorch",
            port_name="pytorchjob-port",
            default_port=23456,
            job_role_types=("Master", "Worker"),
        ),
        Framework(
            "kubeflow.org/v1",
            "TFJob",
            "tfReplicaSpecs",
            ("Chief", "Master", "PS", "Worker", "Evaluator"),
            ("Chief", "Master", "Worker"),
            "all-to-all",
            container="tensorflow",
            port_name="tfjob-port",
            default_port=2222,
            open_types=True,
            job_role_types=("Chief", "Master", "Worker"),
        ),
        Framework(
            "kubeflow.org/v1",
            "XGBoostJob",
            "xgbReplicaSpecs",
            ("Master", "Worker"),
            ("Master",),
            "rendezvous",
            container="xgboost",
            port_name="xgboostjob-port",
            default_port=9999,
            coordinator_required=True,
            job_role_types=("Master",),
        ),
        # Collective mode (Worker only): worker-0 is the rendezvous host but gets no job-role (§2.6).
        Framework(
            "kubeflow.org/v1",
            "PaddleJob",
            "paddleReplicaSpecs",
            ("Master", "Worker"),
            ("Master", "Worker"),
            "rendezvous",
            container="paddle",
            port_name="master",
            default_port=36543,
            job_role_types=("Master",),
        ),
        Framework(
            "kubeflow.org/v1",
            "JAXJob",
            "jaxReplicaSpecs",
            ("Worker",),
            ("Worker",),
            "rendezvous",
            container="jax",
            port_name="jaxjob-port",
            default_port=6666,
            job_role_types=("Worker",),
        ),
        # training-operator MPIJob: launcher reaches workers with `kubectl exec` through the
        # apiserver, no pod-to-pod port; Worker replicas default to 0 (§2.3).
        Framework(
            "kubeflow.org/v1",
            "MPIJob",
            "mpiReplicaSpecs",
            ("Launcher", "Worker"),
            ("Launcher",),
            "mpi-exec",
            coordinator_required=True,
            job_role_types=("Launcher",),
            default_replicas={"Worker": 0},
        ),
        # mpi-operator: launcher ssh-es into workers (sshd on 22 unless the image says otherwise, §2.4).
        Framework(
            "kubeflow.org/v2beta1",
            "MPIJob",
            "mpiReplicaSpecs",
            ("Launcher", "Worker"),
            ("Launcher",),
            "mpi-ssh",
            coordinator_required=True,
        ),
    )
}


class _Spec(NamedTuple):
    """One replica spec as read: key as written, canonical type, pod count, template facts."""

    key: str
    canonical: str
    replicas: int
    template: Any
    facts: PodFacts


def parse(
    framework: Framework, raw: Mapping[str, Any], *, gpu_resources: Sequence[str], namespace: str,
    collective_ports: PortRange,
) -> JobGroup:
    """The group of a kubeflow.org replica-map job; raises InvalidJobError listing every bad field.

    One reader for every job, and cheap for the usual one (it runs on every admission review of
    these kinds): each field reader checks the exact JSON type first and formats a path only when it
    records an error; the pod templates are read by `read_pod_template`; the flows are built once
    per shape of job (`_flows`); and the frozen records are filled in by `build_record`.
    """
    errors: list[FieldError] = []
    meta = read_job_meta(raw, namespace, errors)
    spec = raw.get("spec")
    if type(spec) is not dict:
        spec = read_mapping(spec, "spec", errors)
    specs = _read_specs(spec, framework, errors, gpu_resources=gpu_resources)
    coordinator = _choose_coordinator(specs, framework, errors)
    rendezvous = _read_rendezvous(spec, framework, errors)
    if coordinator is None and not errors:  # every key was one the operator ignores (mpi-operator)
        required = framework.coordinator_types[0]
        errors.append(FieldError(framework.map_path, f"a {required} replica is required"))
    if errors or coordinator is None:
        raise InvalidJobError(errors)
    # mpi-operator: with runLauncherAsWorker the launcher is rank 0 and labelled replica-index=0.
    launcher_is_worker = spec.get("runLauncherAsWorker") is True
    group_selector = _operator_labels(framework, meta)
    replicas: list[Replica] = []
    members: list[_Member] = []
    for s in specs:
        key, _, count, _, facts = s
        pod_ports, port = framework_ports(facts, framework)
        replicas.append(_build_replica(s, framework, meta, group_selector, pod_ports, coordinator, launcher_is_worker))
        members.append((key, count if count < 2 else 2, bool(facts.gpus), port))
    return build_record(
        JobGroup,
        {
            "api_version": framework.api_version,
            "kind": framework.kind,
            "name": meta.name,
            "namespace": meta.namespace,
            "replicas": tuple(replicas),
            "coordinator": coordinator.key,
            "flows": _flows(tuple(members), coordinator.key, framework, rendezvous, replicas, collective_ports),
            "group_selector": group_selector,
            "annotations": meta.annotations,
            "supports_spread": True,
            "composed_from": "",
        },
    )


# What the flows of a replica depend on: (key, pods (2 for two or more), asks for GPUs, framework port).
_Member = tuple[str, int, bool, int]
# Flows by shape of job: the reviews of one job, and of most jobs alike, need the same flows (frozen, so
# groups share them, and engine/memo.py reuses their plain form by identity). Bounded: replica keys are
# user data.
FLOWS_MEMO_SIZE = 1024
_FLOWS: BoundedMemo[tuple[Hashable, ...], tuple[Flow, ...]] = BoundedMemo(FLOWS_MEMO_SIZE)


def _flows(
    members: tuple[_Member, ...], coordinator: str, framework: Framework, rendezvous: Rendezvous,
    replicas: Sequence[Replica], collective_ports: PortRange,
) -> tuple[Flow, ...]:
    """The group's flows (`build_flows`), built once per shape of job (`_FLOWS`).

    The shape (`members`) holds what the flows depend on: which replicas have no pod, one, or two
    and more (flows.py pairs a replica with itself only then), ask for GPUs, and their ports; with the
    framework's traffic shape and port name, the rendezvous and the collectives' range.
    """
    # The range by its ports: PortRange's own (dataclass) __hash__ is a Python call on every review.
    key = (framework.shape, framework.port_name, coordinator, rendezvous, members,
           collective_ports.first, collective_ports.last)
    found = _FLOWS.get(key)
    if found is None:
        ports = {m[0]: m[3] for m in members}
        found = tuple(build_flows(replicas, ports, coordinator, framework, rendezvous, collective_ports))
        _FLOWS.put(key, found)
    return found


def _read_specs(
    spec: Mapping[str, Any], framework: Framework, errors: list[FieldError], *, gpu_resources: Sequence[str]
) -> list[_Spec]:
    map_path = framework.map_path
    raw_map = spec.get(framework.map_key)
    replica_map = raw_map if type(raw_map) is dict else read_mapping(raw_map, map_path, errors)
    if not raw_map and (raw_map is None or is_object(raw_map)):
        errors.append(FieldError(map_path, "is required and must hold at least one replica type"))
    out: list[_Spec] = []
    seen: dict[str, str] = {}
    by_folded_name = framework.types_by_folded_name
    for key, value in replica_map.items():
        if not isinstance(key, str) or not key:
            errors.append(FieldError(join_path(map_path, str(key)), "replica type must be a non-empty string"))
            continue
        folded = key.lower()  # keys match case-insensitively; a canonical name folds to its key's folding
        canonical = by_folded_name.get(folded)
        if canonical is None:
            if framework.open_types:
                canonical = key
            elif framework.api_version == "kubeflow.org/v2beta1":
                continue  # mpi-operator ignores other keys (§2.4): they make no pods
            else:
                expected = ", ".join(framework.replica_types)
                errors.append(FieldError(join_path(map_path, key),
                                         f"unsupported replica type; expected one of {expected}"))
                continue
        if folded in seen:
            errors.append(
                FieldError(
                    join_path(map_path, key),
                    f"duplicates replica type {seen[folded]!r} (keys match case-insensitively)",
                )
            )
            continue
        seen[folded] = key
        out.append(_read_spec(key, canonical, value, framework, errors, gpu_resources=gpu_resources))
    return out


def _read_spec(
    key: str,
    canonical: str,
    value: Any,
    framework: Framework,
    errors: list[FieldError],
    *,
    gpu_resources: Sequence[str],
) -> _Spec:
    """The replica spec `spec.<map_key>.<key>`."""
    at = (framework.map_path, key)
    body = value if type(value) is dict else read_mapping(value, at, errors)
    count = body.get("replicas")
    if type(count) is not int or count < 0:
        count = read_int(count, (at, "replicas"), errors, default=framework.default_replicas.get(canonical, 1))
    template = body.get("template")
    if template is None:
        facts = EMPTY_FACTS
    else:
        facts = read_pod_template(template, (at, "template"), errors, gpu_resources=gpu_resources)
    return build_tuple(_Spec, (key, canonical, count, template, facts))


def _choose_coordinator(specs: list[_Spec], framework: Framework, errors: list[FieldError]) -> _Spec | None:
    """Master/Chief/Launcher, else Worker-0 (`IsMasterRole`), else the first replica (TFJob)."""
    for wanted in framework.coordinator_types:
        for s in specs:
            if s.canonical == wanted:
                return s
    if framework.coordinator_required and specs:
        errors.append(FieldError(framework.map_path, f"a {framework.coordinator_types[0]} replica is required"))
        return None
    if specs:
        return specs[0]
    return None


class Rendezvous(NamedTuple):
    """PyTorch elastic overrides (§2.1): `rdzvPort` replaces the Worker's port; a `rdzvHost`
    (e.g. an etcd service) moves the rendezvous out of the job, so no pod of it is dialled."""

    port: int | None = None
    external: bool = False


NO_RENDEZVOUS = Rendezvous()


def _read_rendezvous(spec: Mapping[str, Any], framework: Framework, errors: list[FieldError]) -> Rendezvous:
    if framework.kind != "PyTorchJob" or spec.get("elasticPolicy") is None:
        return NO_RENDEZVOUS
    policy = read_mapping(spec.get("elasticPolicy"), "spec.elasticPolicy", errors)
    port = None
    if policy.get("rdzvPort") is not None:
        port = read_int(policy.get("rdzvPort"), "spec.elasticPolicy.rdzvPort", errors, default=0, minimum=1) or None
    host = read_str(policy.get("rdzvHost"), "spec.elasticPolicy.rdzvHost", errors)
    return Rendezvous(port, bool(host))


def _operator_labels(framework: Framework, meta: JobMeta) -> dict[str, str]:
    """operator-name + job-name: the labels on every pod of this job and on no other pod."""
    out = {L.KF_OPERATOR_NAME: framework.operator_name}
    if meta.name:
        out[L.KF_JOB_NAME] = meta.name.replace("/", "-")
    return out


def _build_replica(
    s: _Spec,
    framework: Framework,
    meta: JobMeta,
    operator_labels: Mapping[str, str],
    ports: tuple[ContainerPort, ...],
    coordinator: _Spec,
    launcher_is_worker: bool,
) -> Replica:
    """`operator_labels` are the job's own (`_operator_labels`); `ports` those of `framework_ports`."""
    key, canonical, count, template, facts = s
    is_coordinator = key == coordinator.key
    labels, leader, index_label, service_account = replica_role(
        framework, key, canonical, meta.name, operator_labels, template=template,
        service_account=facts.service_account, is_coordinator=is_coordinator, launcher_is_worker=launcher_is_worker)
    if service_account != facts.service_account:
        facts = facts._replace(service_account=service_account)
    return make_replica(
        key=key,
        role=key.lower(),
        count=count,
        template_path=f"{framework.map_pointer}/{escape_json_pointer(key)}/template",
        template=template,
        facts=facts,
        operator_labels=labels,
        index_label=index_label,
        is_coordinator=is_coordinator,
        leader_labels=leader,
        ports=ports,
    )


class ReplicaRole(NamedTuple):
    """What the operator adds to the pods of one replica type (`replica_role`)."""

    labels: dict[str, str]  # on every pod: the job's own labels plus the role's
    leader: dict[str, str]  # on pod 0 only
    index_label: str  # the label that differs per pod index ("" when none)
    service_account: str  # the one the pods run as


def replica_role(
    framework: Framework,
    key: str,
    canonical: str,
    name: str,
    operator_labels: Mapping[str, str],
    *,
    template: Any,
    service_account: str,
    is_coordinator: bool,
    launcher_is_worker: bool,
) -> ReplicaRole:
    """The operator's labels, index label and service account for the replica `key` (of type `canonical`)
    of job `name`; `operator_labels` are the job's own (`_operator_labels`), `service_account` the
    template's."""
    labels = dict(operator_labels)
    leader: dict[str, str] = {}
    index_label = L.KF_REPLICA_INDEX
    if framework.api_version == "kubeflow.org/v2beta1":
        labels[L.KF_JOB_ROLE] = canonical.lower()  # launcher | worker, on every pod
        if canonical == "Launcher":
            index_label = ""
            labels.update(_launcher_labels(name))
            if launcher_is_worker:
                labels[L.KF_REPLICA_INDEX] = "0"
    else:
        labels[L.KF_REPLICA_TYPE] = key.lower()
        if is_coordinator and canonical in framework.job_role_types:
            leader[L.KF_JOB_ROLE] = "master"
        if canonical == "Launcher":
            index_label = ""  # the v1 launcher pod has no replica-index label (§2.3)
            service_account = _v1_launcher_account(template, name, service_account)
    return build_tuple(ReplicaRole, (labels, leader, index_label, service_account))


def _v1_launcher_account(template: Any, name: str, service_account: str) -> str:
    """training-operator runs the MPI launcher as ServiceAccount `<job>-launcher` (the one its
    Role lets `kubectl exec` into workers) unless the template names one (§2.3; mpijob_controller
    `newLauncher` sets it only when `serviceAccountName` is empty)."""
    spec = template.get("spec") if isinstance(template, Mapping) else None
    explicit = spec.get("serviceAccountName") if isinstance(spec, Mapping) else None
    if explicit or not name:
        return service_account
    return f"{name}-launcher"


def _launcher_labels(name: str) -> dict[str, str]:
    """The batch Job controller's labels on the v2beta1 launcher pod (Job `<job>-launcher`)."""
    if not name:
        return {}
    job = f"{name}-launcher"
    return {BATCH_JOB_NAME_LABEL: job, LEGACY_JOB_NAME_LABEL: job}


def framework_ports(facts: PodFacts, framework: Framework) -> tuple[tuple[ContainerPort, ...], int]:
    """(the container ports the pods will have, the framework port of the replica's pods).

    The framework port is the one named `port_name` in the default container (the one
    `setDefaultPort` picks: the framework-named one, else container 0), else the default port,
    which the operator then adds to that container. The operators read only the default container
    (`GetPortFromXJob`); a port of the same name on another container is not the one the framework
    listens on.
    """
    ports = tuple([p.port for p in facts.ports]) if facts.ports else ()
    names = facts.container_names
    if not names:
        return ports, framework.default_port
    container = framework.container if framework.container in names else names[0]
    named = find_named_port(facts.ports, container, framework.port_name) if facts.ports else None
    if named is not None:
        return ports, named.port
    if framework.default_port:
        ports = (*ports, framework.default_container_port)
    return ports, framework.default_port


def build_flows(
    replicas: Sequence[Replica],
    ports: Mapping[str, int],
    coordinator: str,
    framework: Framework,
    rendezvous: Rendezvous,
    collective_ports: PortRange,
) -> list[Flow]:
    members = [flows.Member(r.key, r.count, r.gpus_per_pod) for r in replicas]
    if not flows.has_peer(members):
        return []
    out: list[Flow] = []
    if framework.shape == "rendezvous":
        if not rendezvous.external:
            port = rendezvous.port or ports[coordinator]
            name = "" if rendezvous.port else framework.port_name
            out += flows.build_rendezvous(members, coordinator, port, port_name=name)
    elif framework.shape == "all-to-all":
        out += flows.build_all_to_all(members, {k: (p, framework.port_name) for k, p in ports.items()})
    elif framework.shape == "mpi-ssh":
        out += flows.build_launcher(coordinator, members, flows.SSH_PORT)
    # "mpi-exec" (training-operator MPIJob v1): the launcher starts `orted` on workers through the
    # apiserver (`kubectl exec`); the orted daemons then dial mpirun back on an ephemeral port
    # (`orte_hnp_uri tcp://<launcher-ip>:<port>`), which the collective flows below cover.
    out += flows.build_collective(members, coordinator, collective_ports,
                                  cpu_collectives=framework.shape != "all-to-all")
    return out
