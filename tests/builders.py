"""Shared test builders: small, explicit constructors for cluster objects, policies and jobs.

Cluster objects are built as the raw Kubernetes objects and projected with app.cache.projections,
so tests see exactly what the snapshot loader would produce. Jobs are raw dicts (as the
apiserver sends them); `make_group`/`make_replica` build a `JobGroup` directly for engine tests
that must not depend on a job adapter.

Keep these stable: other test packages import them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from app.cache import projections
from app.engine import ledger
from app.models.cluster import JobInfo, NamespaceInfo, NodeInfo, PodInfo, PolicyObject, Snapshot, freeze
from app.models.job import Flow, JobGroup, Replica, UserPlacement
from app.models.labels import DEFAULT_ZONE_LABEL, HOSTNAME_LABEL, KF_JOB_NAME, KF_REPLICA_INDEX, KF_REPLICA_TYPE
from app.models.network import EPHEMERAL_PORTS, PortRange

GPU = "nvidia.com/gpu"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def make_node(
    name: str,
    *,
    zone: str | None = "zone-a",
    gpus: int = 0,
    gpu_resource: str = GPU,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    ready: bool = True,
    unschedulable: bool = False,
    zone_label: str = DEFAULT_ZONE_LABEL,
) -> NodeInfo:
    """A node in `zone` (None: no zone label) with `gpus` allocatable GPUs."""
    all_labels = {HOSTNAME_LABEL: name, **({zone_label: zone} if zone else {}), **(labels or {})}
    allocatable: dict[str, str] = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    if gpus:
        allocatable[gpu_resource] = str(gpus)
    return projections.project_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": all_labels},
            "spec": {"taints": [dict(t) for t in taints], "unschedulable": unschedulable},
            "status": {
                "allocatable": allocatable,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
    )


def make_pod(
    name: str,
    *,
    namespace: str = "default",
    node: str = "",
    gpus: int = 0,
    phase: str = "Running",
    labels: Mapping[str, str] | None = None,
    service_account: str = "default",
    ports: Sequence[int] = (),
    host_network: bool = False,
    ip: str = "",
) -> PodInfo:
    """A pod bound to `node` ("" = pending) that holds `gpus` GPUs."""
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if gpus:
        container["resources"] = {"limits": {GPU: str(gpus)}}
    if ports:
        container["ports"] = [{"containerPort": p} for p in ports]
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status["podIP"] = ip
    return projections.project_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
            "spec": {
                "nodeName": node,
                "serviceAccountName": service_account,
                "hostNetwork": host_network,
                "containers": [container],
            },
            "status": status,
        }
    )


def make_namespace(name: str, labels: Mapping[str, str] | None = None) -> NamespaceInfo:
    return projections.project_namespace(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}
    )


def make_cnp(name: str, spec: Mapping[str, Any], *, namespace: str = "default") -> PolicyObject:
    """A CiliumNetworkPolicy with one `spec`."""
    return projections.project_policy(
        {
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNetworkPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": dict(spec),
        }
    )


def make_intra_zone_cnp(zone: str, *, namespace: str, name: str = "") -> PolicyObject:
    """The seed lab's zone-scoped CNP: pods labelled `zone=<zone>` talk only to pods with the same label."""
    return make_cnp(
        name or f"allow-intra-{zone}",
        {
            "endpointSelector": {"matchLabels": {"zone": zone}},
            "ingress": [{"fromEndpoints": [{"matchLabels": {"zone": zone}}]}],
            "egress": [{"toEndpoints": [{"matchLabels": {"zone": zone}}]}],
        },
        namespace=namespace,
    )


def make_ccnp(name: str, spec: Mapping[str, Any]) -> PolicyObject:
    """A CiliumClusterwideNetworkPolicy with one `spec`."""
    return projections.project_policy(
        {
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumClusterwideNetworkPolicy",
            "metadata": {"name": name},
            "spec": dict(spec),
        }
    )


def make_knp(name: str, spec: Mapping[str, Any], *, namespace: str = "default") -> PolicyObject:
    """A Kubernetes NetworkPolicy."""
    return projections.project_policy(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": dict(spec),
        }
    )


def make_snapshot(
    nodes: Iterable[NodeInfo] = (),
    *,
    pods: Iterable[PodInfo] = (),
    namespaces: Iterable[NamespaceInfo] = (),
    policies: Iterable[PolicyObject] = (),
    revision: str = "test",
    jobs: Iterable[JobInfo] = (),
) -> Snapshot:
    return Snapshot(
        nodes=tuple(nodes),
        pods=tuple(pods),
        namespaces=MappingProxyType({ns.name: ns for ns in namespaces}),
        policies=tuple(policies),
        revision=revision,
        jobs=tuple(jobs),
    )


# --- jobs as the user writes them ----------------------------------------------------------


def make_template(
    *,
    labels: Mapping[str, str] | None = None,
    gpus: int = 0,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, str]] = (),
    affinity: Mapping[str, Any] | None = None,
    container: str = "pytorch",
    ports: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A PodTemplateSpec with one container."""
    c: dict[str, Any] = {"name": container, "image": "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"}
    if gpus:
        c["resources"] = {"limits": {GPU: gpus}}
    if ports:
        c["ports"] = [dict(p) for p in ports]
    spec: dict[str, Any] = {"containers": [c]}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if affinity:
        spec["affinity"] = dict(affinity)
    template: dict[str, Any] = {"spec": spec}
    if labels:
        template["metadata"] = {"labels": dict(labels)}
    return template


def make_pytorchjob(
    name: str = "train",
    *,
    namespace: str = "default",
    workers: int = 2,
    worker_gpus: int = 1,
    master: Mapping[str, Any] | None = None,
    worker: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A kubeflow.org/v1 PyTorchJob: one Master (CPU unless `master` says otherwise) and GPU Workers."""
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": dict(master) if master is not None else make_template(),
                },
                "Worker": {
                    "replicas": workers,
                    "restartPolicy": "OnFailure",
                    "template": dict(worker)
                    if worker is not None
                    else make_template(
                        gpus=worker_gpus, tolerations=[{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
                    ),
                },
            }
        },
    }


def make_tfjob(
    name: str = "tf", *, namespace: str = "default", specs: Mapping[str, tuple[int, Mapping[str, Any]]]
) -> dict[str, Any]:
    """A kubeflow.org/v1 TFJob; `specs` maps replica type → (replicas, template)."""
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"tfReplicaSpecs": {k: {"replicas": n, "template": dict(t)} for k, (n, t) in specs.items()}},
    }


# --- job groups built directly (engine tests) -----------------------------------------------


def make_placement(
    node_selector: Mapping[str, str] | None = None,
    terms: Sequence[Mapping[str, Any]] = (),
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> UserPlacement:
    return UserPlacement(
        node_selector=MappingProxyType(dict(node_selector or {})),
        node_selector_terms=tuple(terms),
        tolerations=tuple(tolerations),
    )


def make_replica(
    key: str,
    *,
    count: int = 1,
    gpus: int = 0,
    labels: Mapping[str, str] | None = None,
    placement: UserPlacement | None = None,
    coordinator: bool = False,
    job: str = "train",
    service_account: str = "default",
    host_network: bool = False,
    template: Mapping[str, Any] | None = None,
) -> Replica:
    """A PyTorchJob-style replica type with the operator's labels."""
    role = key.lower()
    pod_labels = {KF_JOB_NAME: job, KF_REPLICA_TYPE: role, **(labels or {})}
    return Replica(
        key=key,
        role=role,
        count=count,
        template_path=f"/spec/pytorchReplicaSpecs/{key}/template",
        template=dict(template or {}),
        pod_labels=MappingProxyType(pod_labels),
        index_label=KF_REPLICA_INDEX,
        gpus=MappingProxyType({GPU: gpus} if gpus else {}),
        ports=(),
        service_account=service_account,
        host_network=host_network,
        placement=placement or make_placement(),
        is_coordinator=coordinator,
    )


def rendezvous(src: str, dst: str, port: int = 23456) -> Flow:
    return Flow(src=src, dst=dst, ports=PortRange.single(port), protocol="TCP", purpose="rendezvous")


def collective(src: str, dst: str) -> Flow:
    return Flow(src=src, dst=dst, ports=EPHEMERAL_PORTS, protocol="TCP", purpose="collective")


def make_group(
    *replicas: Replica,
    name: str = "train",
    namespace: str = "default",
    flows: Sequence[Flow] | None = None,
) -> JobGroup:
    """A group; by default every non-coordinator → coordinator on 23456 and collective all-to-all."""
    coordinator = next((r.key for r in replicas if r.is_coordinator), replicas[0].key)
    if flows is None:
        keys = [r.key for r in replicas]
        flows = [rendezvous(k, coordinator) for k in keys if k != coordinator]
        flows += [collective(a, b) for a in keys for b in keys]
    return JobGroup(
        api_version="kubeflow.org/v1",
        kind="PyTorchJob",
        name=name,
        namespace=namespace,
        replicas=tuple(replicas),
        coordinator=coordinator,
        flows=tuple(flows),
        group_selector=MappingProxyType({KF_JOB_NAME: name}),
        annotations=MappingProxyType({}),
    )


def gpu_taint(key: str = GPU, value: str = "present", effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": key, "value": value, "effect": effect}


def tolerate(key: str = GPU, effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": key, "operator": "Exists", "effect": effect}


def in_flight_totals(
    holds: Iterable[ledger.Hold], *, job: ledger.JobKey, stored: frozenset[ledger.JobKey] = frozenset()
) -> ledger.ZoneTotals:
    """Per zone, the GPUs `holds` keep for jobs other than `job` that are not stored yet, counted from
    scratch: what engine.pending's `in_flight` means, and the reference InFlight.totals (which keeps the
    same totals incrementally) is tested against."""
    totals: dict[str, dict[str, int]] = {}
    for hold in holds:
        if hold.key == job or hold.key in stored:
            continue
        per = totals.setdefault(hold.zone, {})
        for resource, count in hold.gpus.items():
            per[resource] = per.get(resource, 0) + count
    return freeze({z: freeze(per) for z, per in totals.items()})


def match_expression(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A nodeSelectorRequirement against node labels, written from the Kubernetes API docs (the reference the
    placement tests hold topoguard's patches to; Gt/Lt are not used by them)."""
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op} not handled by the test")


def mark_everything(value: Any) -> None:
    """Add a marker to every object and list in `value` (in place): what shares a container with it shows it."""
    if isinstance(value, dict):
        for item in list(value.values()):
            mark_everything(item)
        value["mutated"] = True
    elif isinstance(value, list):
        for item in list(value):
            mark_everything(item)
        value.append("mutated")
