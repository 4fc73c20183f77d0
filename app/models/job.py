"""A training job as topoguard reasons about it: its replica groups, coordinator and flows.

Job adapters (app/jobs/) turn a raw job object of any supported kind into a `JobGroup`; the
engine never looks at kind-specific fields. Owned by app/jobs; fields may be added, never renamed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from app.models.dra import PodClaimRef
from app.models.network import PortRange
from app.models.pods import ContainerPort

RawJob = Mapping[str, Any]


@dataclass(frozen=True)
class UserPlacement:
    """The scheduling constraints the user wrote in a pod template (kept as written)."""

    node_selector: Mapping[str, str]
    # requiredDuringScheduling nodeSelectorTerms (ORed); each term a raw dict as written.
    node_selector_terms: tuple[Mapping[str, Any], ...]
    tolerations: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class Replica:
    """One replica type (PyTorch Master/Worker, a JobSet replicatedJob, ...)."""

    key: str  # the key as written (e.g. "Worker", "worker", a replicatedJob name)
    role: str  # operator's lower-case replica type / replicatedJob name
    count: int  # pods of this replica type
    template_path: str  # RFC 6901 pointer to the PodTemplateSpec in the job (may not exist yet)
    template: Mapping[str, Any]  # the PodTemplateSpec as written ({} when absent, e.g. TrainJob)
    pod_labels: Mapping[str, str]  # labels every pod will carry (template + operator labels)
    index_label: str  # label key that differs per pod index ("" when none)
    gpus: Mapping[str, int]  # GPU resources per pod, e.g. {"nvidia.com/gpu": 2}
    ports: tuple[ContainerPort, ...]  # container ports of the pod
    service_account: str
    host_network: bool
    placement: UserPlacement
    is_coordinator: bool
    # Labels only the pod with index 0 carries on top of `pod_labels` (kubeflow v1 puts
    # `training.kubeflow.org/job-role=master` on the coordinator's index-0 pod only). When the
    # replica has one pod they are in `pod_labels` as well.
    leader_labels: Mapping[str, str] = field(default_factory=dict)
    # Pod spec fields a new override entry of the adapter's own starts from (TrainJob: the lists a
    # runtime patch replaces, as composed from the runtime and every patch, so none is lost).
    seed: Mapping[str, Any] = field(default_factory=dict)
    # Every resource each pod asks for as the scheduler sums it (cpu in millicores, else base units; GPUs
    # included), and the DRA claims its template names (spec.resourceClaims).
    requests: Mapping[str, int] = field(default_factory=dict)
    claims: tuple[PodClaimRef, ...] = ()

    @property
    def gpus_per_pod(self) -> int:
        return sum(self.gpus.values())


FlowPurpose = Literal["rendezvous", "all-to-all", "collective", "launcher"]


@dataclass(frozen=True)
class Flow:
    """A connection the framework must be able to open: from every pod of `src` to `dst`."""

    src: str  # replica key
    dst: str  # replica key
    ports: PortRange
    protocol: str  # TCP | UDP
    purpose: FlowPurpose
    port_name: str = ""  # e.g. "pytorchjob-port" when the port came from a named container port


@dataclass(frozen=True)
class JobGroup:
    api_version: str
    kind: str
    name: str
    namespace: str
    replicas: tuple[Replica, ...]
    coordinator: str  # replica key of the coordinator
    flows: tuple[Flow, ...]
    group_selector: Mapping[str, str]  # labels that select exactly this job's pods
    annotations: Mapping[str, str]  # the job's own metadata.annotations
    # Whether the kind's CRD keeps topologySpreadConstraints (TrainJob runtimePatches prune them).
    supports_spread: bool = True
    # Where the pod templates come from when the job holds none (TrainJob: `ClusterTrainingRuntime
    # torch-distributed@42 via runtimePatches`); "" when the job's own templates are used.
    composed_from: str = ""

    def replica(self, key: str) -> Replica:
        for r in self.replicas:
            if r.key == key:
                return r
        raise KeyError(key)


@dataclass(frozen=True, slots=True)
class RoleShape:
    """One replica type of a stored job as the audit reads its pods (a few strings, not the template)."""

    key: str  # the replica key as written ("Worker", a replicatedJob name)
    role: str  # the operator's lower-case replica type
    # The operator labels that tell this replica type's pods from the job's others
    # (`training.kubeflow.org/replica-type=worker`, MPI v2's `job-role=worker`, JobSet's
    # `replicatedjob-name=node`); () when the job has no other replica type to tell it from.
    selector: tuple[tuple[str, str], ...]
    count: int
    coordinator: bool = False

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.selector)


@dataclass(frozen=True, slots=True)
class JobShape:
    """What the audit needs of a stored job's `JobGroup`: its replica types and required flows.

    Kept with the stored job (`JobInfo.shape`) instead of the job itself; `problem` says why the
    flows could not be derived (the job's own error, word for word), and then roles and flows are empty.
    """

    roles: tuple[RoleShape, ...] = ()
    flows: tuple[Flow, ...] = ()
    problem: str = ""

    def role_of(self, labels: Mapping[str, str]) -> RoleShape | None:
        """The replica type a pod with these labels belongs to (the most specific selector wins)."""
        found: RoleShape | None = None
        for role in self.roles:
            if role.selects(labels) and (found is None or len(role.selector) > len(found.selector)):
                found = role
        return found

