"""Raw Kubernetes objects → the compact, immutable projections in app.models.cluster.

Used by both the file loader and the watch cache, so a snapshot means the same whichever fed it.
Training jobs are kept as a `JobInfo` (their GPU demand, zone pin, suspended/finished), never whole.
Projections never raise on odd shapes: missing or mistyped fields fall back to safe defaults
(an unparsable GPU count counts as 0 for capacity, a node without Ready=True is not Ready).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from app.config import Settings
from app.jobs import job_shape, jobset, kubeflow, status, trainjob
from app.models.cluster import (
    CIDRGroup,
    ConfigMapInfo,
    ContainerPort,
    JobInfo,
    NamespaceInfo,
    NodeInfo,
    PodInfo,
    PolicyObject,
    Taint,
    TrainingRuntimeInfo,
    freeze,
)
from app.models.dra import (
    AllocatedDevice,
    ComputeDomainInfo,
    CounterUse,
    Device,
    DeviceClassInfo,
    DeviceRequest,
    DeviceTaint,
    ResourceClaimInfo,
    ResourceClaimTemplateInfo,
    ResourceSliceInfo,
    milli,
    parse_quantity,
)
from app.models.labels import JOBSET_NAME_LABEL, KF_JOB_NAME, NAMESPACE_NAME_LABEL, ZONE_ANNOTATION
from app.models.network import EPHEMERAL_PORTS, PortRange
from app.models.resources import node_resources

POLICY_KINDS = ("CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy", "NetworkPolicy", "ClusterNetworkPolicy")
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
# The training-job kinds the snapshot keeps (every kind topoguard places).
JOB_KINDS = tuple(sorted({kind for _, kind in (*kubeflow.FRAMEWORKS, (jobset.API_VERSION, jobset.KIND),
                                                (trainjob.API_VERSION, trainjob.KIND))}))
# Dynamic Resource Allocation (resource.k8s.io/v1) and NVIDIA ComputeDomains: all optional APIs.
DRA_KINDS = ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "ComputeDomain")
KNOWN_KINDS = ("Node", "Namespace", "Pod", *POLICY_KINDS, "CiliumCIDRGroup", *RUNTIME_KINDS, *JOB_KINDS, *DRA_KINDS)
# The GPU resources a job's shape is derived with when the caller names none (settings `gpuResources`).
DEFAULT_GPU_RESOURCES: tuple[str, ...] = Settings.model_fields["gpu_resources"].default
STANDARD_RESOURCES = frozenset({"cpu", "memory", "pods", "ephemeral-storage", "storage"})


_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _dict(value: Any) -> Mapping[str, Any]:
    # NB: parsed JSON is plain dicts: the exact-type test spares the ABC check (projecting a list page of
    # pods makes about 13 of these calls a pod).
    if type(value) is dict or isinstance(value, Mapping):
        return value
    return _EMPTY


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _flag(value: Any) -> bool:
    """A boolean field as written: True or the string "true" (YAML snapshots may quote it)."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def _text(value: Any) -> str:
    """A label value as the apiserver would store it; an unquoted YAML `true` reads as "true"."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _labels(meta: Mapping[str, Any]) -> Mapping[str, str]:
    return freeze({str(k): _text(v) for k, v in _dict(meta.get("labels")).items()})


def parse_count(value: Any) -> int:
    """An extended-resource quantity as whole units ("8", 8, "8.0"); 0 when unparsable.

    Extended resources (GPUs) must be integers in Kubernetes, so suffixes are not expected;
    "1k" style values are still read for robustness.
    """
    count = read_count(value)
    return 0 if count is None else count


# Quantity suffixes read by `read_count`, the two-letter ones first ("Mi" before "M").
_SUFFIXES = (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("k", 10**3), ("M", 10**6), ("G", 10**9))


def read_count(value: Any) -> int | None:
    """`parse_count`, but None when `value` is no quantity at all (`"eight"`, a list), so it can be reported."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return max(value, 0)
    if not isinstance(value, str | float):
        return None
    text = str(value).strip()
    if text.isdecimal() and text.isascii():
        return int(text)  # what nearly every quantity of an extended resource is ("8")
    for suffix, factor in _SUFFIXES:
        if text.endswith(suffix):
            text, mult = text[: -len(suffix)], factor
            break
    else:
        mult = 1
    try:
        return max(int(float(text) * mult), 0)
    except (ValueError, OverflowError):  # not a number, NaN or infinity
        return None


def _extended(resources: Mapping[str, Any]) -> dict[str, int]:
    return {str(k): parse_count(v) for k, v in resources.items() if k not in STANDARD_RESOURCES}


def _unparsable(resources: Mapping[str, Any]) -> dict[str, str]:
    """Extended resources whose quantity cannot be read (counted as 0, and reported: engine warnings)."""
    return {str(k): str(v) for k, v in resources.items() if k not in STANDARD_RESOURCES and read_count(v) is None}


def project_node(obj: Mapping[str, Any]) -> NodeInfo:
    meta, spec, status = _dict(obj.get("metadata")), _dict(obj.get("spec")), _dict(obj.get("status"))
    taints = tuple(
        Taint(str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", "")))
        for t in _list(spec.get("taints"))
        if isinstance(t, Mapping)
    )
    conditions = [c for c in _list(status.get("conditions")) if isinstance(c, Mapping)]
    ready = any(c.get("type") == "Ready" and str(c.get("status")) == "True" for c in conditions)
    resources = _dict(status.get("allocatable")) or _dict(status.get("capacity"))
    return NodeInfo(
        name=str(meta.get("name", "")),
        labels=_labels(meta),
        taints=taints,
        allocatable=freeze(_extended(resources)),
        ready=ready,
        unschedulable=_flag(spec.get("unschedulable")),
        pod_cidrs=_pod_cidrs(spec),
        unparsable=freeze(_unparsable(resources)),
        resources=freeze(node_resources(resources)),
    )


def _pod_cidrs(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """spec.podCIDRs (dual-stack), else the older single spec.podCIDR."""
    cidrs = [str(c) for c in _list(spec.get("podCIDRs")) if c]
    if not cidrs and spec.get("podCIDR"):
        cidrs = [str(spec["podCIDR"])]
    return tuple(cidrs)


# The Cilium agent's container in its DaemonSet (the cilium Helm chart's name for it).
AGENT_CONTAINER = "cilium-agent"


def project_config_map(obj: Mapping[str, Any]) -> ConfigMapInfo:
    """A ConfigMap's data (string values; binaryData is not read) and labels."""
    meta = _dict(obj.get("metadata"))
    data = {str(k): _text(v) for k, v in _dict(obj.get("data")).items()}
    return ConfigMapInfo(namespace=str(meta.get("namespace", "") or ""), name=str(meta.get("name", "")),
                         data=freeze(data), labels=_labels(meta))


def project_agent_image(obj: Mapping[str, Any]) -> str:
    """The image of the Cilium agent DaemonSet's agent container (`cilium-agent`, else the first container
    whose image is a cilium image); "" when there is none."""
    template = _dict(_dict(_dict(obj.get("spec")).get("template")).get("spec"))
    containers = [c for c in _list(template.get("containers")) if isinstance(c, Mapping)]
    named = [c for c in containers if c.get("name") == AGENT_CONTAINER]
    cilium = [c for c in containers if "cilium" in str(c.get("image", "")).rsplit("/", 1)[-1]]
    for container in named or cilium:
        return str(container.get("image", "") or "")
    return ""


def project_namespace(obj: Mapping[str, Any]) -> NamespaceInfo:
    meta = _dict(obj.get("metadata"))
    name = str(meta.get("name", ""))
    labels = dict(_labels(meta))
    labels.setdefault(NAMESPACE_NAME_LABEL, name)  # set by the apiserver since 1.21
    return NamespaceInfo(name=name, labels=freeze(labels))


def container_ports(containers: Iterable[Any]) -> tuple[ContainerPort, ...]:
    out: list[ContainerPort] = []
    for c in containers:
        for p in _list(_dict(c).get("ports")):
            p = _dict(p)
            number = p.get("containerPort")
            if isinstance(number, int) and not isinstance(number, bool):
                out.append(ContainerPort(number, str(p.get("protocol") or "TCP"), str(p.get("name") or "")))
    return tuple(out)


def pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """Extended resources a pod holds: max(any init container, sum of containers) per resource.

    Limits count where requests are absent (extended resources require requests == limits).
    """
    def of(container: Any) -> dict[str, int]:
        res = _dict(_dict(container).get("resources"))
        merged = {**_extended(_dict(res.get("limits"))), **_extended(_dict(res.get("requests")))}
        return merged

    total: dict[str, int] = {}
    for c in _list(spec.get("containers")):
        for k, v in of(c).items():
            total[k] = total.get(k, 0) + v
    for c in _list(spec.get("initContainers")):
        for k, v in of(c).items():
            total[k] = max(total.get(k, 0), v)
    return {k: v for k, v in total.items() if v}


def project_pod(obj: Mapping[str, Any]) -> PodInfo:
    meta, spec, status = _dict(obj.get("metadata")), _dict(obj.get("spec")), _dict(obj.get("status"))
    ips = tuple(str(_dict(i).get("ip")) for i in _list(status.get("podIPs")) if _dict(i).get("ip"))
    if not ips and status.get("podIP"):
        ips = (str(status["podIP"]),)
    return PodInfo(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "") or "default"),
        labels=_labels(meta),
        service_account=str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"),
        node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or ""),
        requests=freeze(pod_requests(spec)),
        ports=container_ports(_list(spec.get("containers"))),
        host_network=_flag(spec.get("hostNetwork")),
        ips=ips,
        owner=_controller(meta),
    )


def _controller(meta: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name) of the object's controller ownerReference (the Kubeflow operators own their pods)."""
    for ref in _list(meta.get("ownerReferences")):
        ref = _dict(ref)
        if ref.get("controller") is True:
            return (str(ref.get("kind", "")), str(ref.get("name", "")))
    return ("", "")


def project_policy(obj: Mapping[str, Any]) -> PolicyObject:
    meta = _dict(obj.get("metadata"))
    kind = str(obj.get("kind", ""))
    body = {k: v for k, v in obj.items() if k != "status"}
    body["metadata"] = {k: v for k, v in meta.items() if k in ("name", "namespace", "labels", "annotations")}
    cluster_scoped = kind in ("CiliumClusterwideNetworkPolicy", "ClusterNetworkPolicy")
    namespace = "" if cluster_scoped else str(meta.get("namespace", "") or "default")
    return PolicyObject(
        kind=kind,
        api_version=str(obj.get("apiVersion", "")),
        name=str(meta.get("name", "")),
        namespace=namespace,
        body=freeze(body),
    )


def project_cidr_group(obj: Mapping[str, Any]) -> CIDRGroup:
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    return CIDRGroup(name=str(meta.get("name", "")), cidrs=tuple(str(c) for c in _list(spec.get("externalCIDRs"))))


def project_training_runtime(obj: Mapping[str, Any]) -> TrainingRuntimeInfo:
    """A (Cluster)TrainingRuntime: its JobSet template, mlPolicy and podGroupPolicy, nothing else.

    The template keeps its JobSet metadata and spec as written (the pods are composed from it); the
    runtime's status and managedFields are dropped.
    """
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    kind = str(obj.get("kind", ""))
    template = _dict(spec.get("template"))
    return TrainingRuntimeInfo(
        kind=kind,
        name=str(meta.get("name", "")),
        namespace="" if kind == "ClusterTrainingRuntime" else str(meta.get("namespace", "") or "default"),
        resource_version=str(meta.get("resourceVersion", "") or ""),
        labels=_labels(meta),
        ml_policy=freeze(_dict(spec.get("mlPolicy"))),
        pod_group_policy=freeze(_dict(spec.get("podGroupPolicy"))),
        template=freeze({k: v for k, v in template.items() if k in ("metadata", "spec")}),
    )


# --- training jobs (the reservation ledger's input) --------------------------------------------

OPERATOR_NAMES = {"MPIJob": ("mpi-operator", "mpijob-controller")}  # both MPIJob operators' pod label values


def _count(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _add(total: dict[str, int], requests: Mapping[str, int], pods: int) -> None:
    for resource, n in requests.items():
        total[resource] = total.get(resource, 0) + n * pods


def _kubeflow_demand(spec: Mapping[str, Any], framework: kubeflow.Framework) -> tuple[dict[str, int], int]:
    total: dict[str, int] = {}
    pods = 0
    for key, body in _dict(spec.get(framework.map_key)).items():
        body = _dict(body)
        count = _count(body.get("replicas"), framework.default_replicas.get(str(key), 1))
        _add(total, pod_requests(_dict(_dict(body.get("template")).get("spec"))), count)
        pods += count
    return total, pods


def _jobset_demand(spec: Mapping[str, Any]) -> tuple[dict[str, int], int]:
    total: dict[str, int] = {}
    pods = 0
    for rjob in _list(spec.get("replicatedJobs")):
        job_spec = _dict(_dict(_dict(rjob).get("template")).get("spec"))
        count = _count(_dict(rjob).get("replicas"), 1) * _count(job_spec.get("parallelism"), 1)
        _add(total, pod_requests(_dict(_dict(job_spec.get("template")).get("spec"))), count)
        pods += count
    return total, pods


def _trainjob_demand(spec: Mapping[str, Any]) -> tuple[dict[str, int], int]:
    """The trainer nodes' demand as the TrainJob writes it; what only the runtime says is not counted."""
    trainer = _dict(spec.get("trainer"))
    count = _count(trainer.get("numNodes"), 1)
    total: dict[str, int] = {}
    _add(total, pod_requests({"containers": [{"resources": trainer.get("resourcesPerNode")}]}), count)
    return total, count


_SOURCE_METADATA = ("name", "namespace", "uid", "labels", "annotations")


def _owned_by_trainjob(meta: Mapping[str, Any]) -> bool:
    return any(_dict(o).get("kind") == trainjob.KIND for o in _list(meta.get("ownerReferences")))


def project_job(
    obj: Mapping[str, Any], *, gpu_resources: tuple[str, ...] = DEFAULT_GPU_RESOURCES,
    collective_ports: PortRange = EPHEMERAL_PORTS,
) -> JobInfo | None:
    """A stored training job's ledger and audit projection; None for a kind topoguard does not place, or a
    JobSet a TrainJob owns (the TrainJob holds its GPUs).

    The audit's `shape` (replica types, required flows) is parsed here, once per stored version, with
    `gpu_resources` (settings `gpuResources`: which replicas take part in GPU collectives) and `collective_ports`
    (settings `collectivePorts`: the collectives' range unless the job's annotation names one); a TrainJob's
    pods come from its runtime, so it keeps its metadata and spec as `source` instead, composed by the
    audit with the snapshot's runtimes."""
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    framework = kubeflow.FRAMEWORKS.get((api_version, kind))
    operators: tuple[str, ...]
    if framework is not None:
        demand, pods = _kubeflow_demand(spec, framework)
        pod_label, operators = KF_JOB_NAME, OPERATOR_NAMES.get(kind, (f"{kind.lower()}-controller",))
    elif (api_version, kind) == (jobset.API_VERSION, jobset.KIND) and not _owned_by_trainjob(meta):
        (demand, pods), pod_label, operators = _jobset_demand(spec), JOBSET_NAME_LABEL, ()
    elif (api_version, kind) == (trainjob.API_VERSION, trainjob.KIND):
        (demand, pods), pod_label, operators = _trainjob_demand(spec), JOBSET_NAME_LABEL, ()
    else:
        return None
    shape, source = None, None
    if kind == trainjob.KIND:
        source = freeze({"apiVersion": api_version, "kind": kind, "spec": spec,
                         "metadata": {k: v for k, v in meta.items() if k in _SOURCE_METADATA}})
    else:
        shape = job_shape(obj, gpu_resources=gpu_resources, collective_ports=collective_ports)
    return JobInfo(
        kind=kind,
        namespace=str(meta.get("namespace", "") or "default"),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "") or ""),
        zone=_text(_dict(meta.get("annotations")).get(ZONE_ANNOTATION)),
        demand=freeze({k: v for k, v in demand.items() if v}),
        pods=pods,
        suspended=status.is_suspended(obj),
        finished=status.is_finished(obj),
        created=_text(meta.get("creationTimestamp")),
        pod_label=pod_label,
        operators=operators,
        shape=shape,
        source=source,
    )


# --- Dynamic Resource Allocation (resource.k8s.io/v1) and NVIDIA ComputeDomains --------------------
# Field names and shapes: k8s.io/api resource/v1 types.go (research/gpus-2026.md section 3). Odd input
# never raises: what cannot be read is left out and named in the projection's `problem`.

def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _cel_selectors(selectors: Any, problems: list[str], where: str) -> tuple[str, ...]:
    """`selectors[].cel.expression` as written; a selector that is no CEL expression is a problem (the
    class or request then cannot be evaluated: the counter reports it, never skips it)."""
    out = []
    for i, selector in enumerate(_list(selectors)):
        expression = _dict(_dict(selector).get("cel")).get("expression")
        if isinstance(expression, str) and expression.strip():
            out.append(expression)
        else:
            problems.append(f"{where} selector {i} has no CEL expression")
            out.append("")  # evaluates as no expression at all: the counter names it unknown
    return tuple(out)


def project_device_class(obj: Mapping[str, Any]) -> DeviceClassInfo:
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    problems: list[str] = []
    selectors = _cel_selectors(spec.get("selectors"), problems, "spec")
    return DeviceClassInfo(name=_str(meta.get("name")), selectors=selectors,
                           extended_resource_name=_str(spec.get("extendedResourceName")),
                           problem="; ".join(problems), created=_text(meta.get("creationTimestamp")))


def _counters(value: Any, problems: list[str], where: str) -> Mapping[str, int]:
    """`{name: {value: quantity}}` as thousandths (models.dra.milli); an unreadable amount is a problem."""
    out = {}
    for name, counter in _dict(value).items():
        amount = parse_quantity(_dict(counter).get("value"))
        if amount is None:
            problems.append(f"{where} counter {name} has no quantity")
            continue
        out[str(name)] = milli(amount)
    return freeze(out)


_SHARED_VALUES: dict[Any, Any] = {}


def _shared(value: Any) -> Any:
    """One object for equal attribute values and names (a model name, "gpu", a driver version): thousands of
    devices write the same ones, so the projections hold each once (bounded: a full table is started again)."""
    return _SHARED_VALUES.setdefault(value, value) if type(value) is str and len(value) <= 64 else value


# A device attribute's value: exactly one of these keys, holding a value of exactly this type (JSON and YAML
# parse to exact types; a bool is no int here).
_ATTRIBUTE_VALUE_TYPES: Mapping[str, type] = {"string": str, "version": str, "int": int, "bool": bool}


def _device(raw: Any, problems: list[str]) -> Device | None:
    device = _dict(raw)
    name = _str(device.get("name"))
    if not name:
        problems.append("a device has no name")
        return None
    if len(_SHARED_VALUES) >= 65_536:
        _SHARED_VALUES.clear()
    attributes: dict[str, Any] = {}
    unreadable = []
    for key, value in _dict(device.get("attributes")).items():
        if isinstance(value, Mapping) and len(value) == 1:
            ((kind, raw_value),) = value.items()
            if type(raw_value) is _ATTRIBUTE_VALUE_TYPES.get(kind):
                attributes[_shared(str(key))] = _shared(raw_value)
                continue
        unreadable.append(str(key))
    if unreadable:
        problems.append(f"device {name}: attribute{'s' if len(unreadable) > 1 else ''} "
                        f"{', '.join(sorted(unreadable))} of no known type (string, int, bool, version)")
    capacity = {_shared(str(k)): _shared(_dict(v).get("value")) for k, v in _dict(device.get("capacity")).items()}
    taints = tuple(DeviceTaint(_str(_dict(t).get("key")), _text(_dict(t).get("value")), _str(_dict(t).get("effect")))
                   for t in _list(device.get("taints")))
    consumes = tuple(
        CounterUse(_str(_dict(c).get("counterSet")),
                   _counters(_dict(c).get("counters"), problems, f"device {name}"))
        for c in _list(device.get("consumesCounters")))
    return Device(
        name=name,
        attributes=freeze(attributes),
        capacity=freeze(capacity),
        taints=taints,
        consumes_counters=consumes,
        **_node_selection(device),
        allow_multiple_allocations=_flag(device.get("allowMultipleAllocations")),
        unreadable=tuple(sorted(unreadable)),
    )


def _node_selection(body: Mapping[str, Any]) -> dict[str, Any]:
    """nodeName, nodeSelector (a core/v1 NodeSelector as written) and allNodes of a slice or a device."""
    selector = body.get("nodeSelector")
    return {"node_name": _str(body.get("nodeName")), "all_nodes": _flag(body.get("allNodes")),
            "node_selector": freeze(selector) if isinstance(selector, Mapping) else None}


def project_resource_slice(obj: Mapping[str, Any]) -> ResourceSliceInfo:
    """A ResourceSlice. Without a pool name, or with an unreadable generation or slice count, it offers no
    device (`problem` says why): the scheduler cannot allocate from a pool it cannot tell complete."""
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    problems: list[str] = []
    pool = _dict(spec.get("pool"))
    generation, count = pool.get("generation", 0), pool.get("resourceSliceCount", 1)
    if not _str(pool.get("name")):
        problems.append("spec.pool has no name")
    if not (isinstance(generation, int) and not isinstance(generation, bool) and generation >= 0):
        problems.append(f"spec.pool.generation {generation!r} is no count")
        generation = -1
    if not (isinstance(count, int) and not isinstance(count, bool) and count > 0):
        problems.append(f"spec.pool.resourceSliceCount {count!r} is no positive count")
        count = 0
    devices = tuple(d for d in (_device(raw, problems) for raw in _list(spec.get("devices"))) if d is not None)
    shared = {}
    for counter_set in _list(spec.get("sharedCounters")):
        set_name = _str(_dict(counter_set).get("name"))
        shared[set_name] = _counters(_dict(counter_set).get("counters"), problems, f"counter set {set_name}")
    return ResourceSliceInfo(
        name=_str(meta.get("name")),
        driver=_str(spec.get("driver")),
        pool=_str(pool.get("name")),
        generation=generation,
        slice_count=count,
        **_node_selection(spec),
        per_device_node_selection=_flag(spec.get("perDeviceNodeSelection")),
        devices=devices,
        shared_counters=freeze(shared),
        problem="; ".join(problems),
    )


def _request_fields(name: str, body: Mapping[str, Any], problems: list[str]) -> DeviceRequest:
    """One `exactly` request or `firstAvailable` subrequest."""
    mode = _str(body.get("allocationMode")) or "ExactCount"
    count = body.get("count", 1)
    if mode not in ("ExactCount", "All"):
        problems.append(f"request {name}: allocationMode {mode!r} is neither ExactCount nor All")
    if not (isinstance(count, int) and not isinstance(count, bool) and count > 0):
        problems.append(f"request {name}: count {count!r} is no positive count")
        count = 1
    if not _str(body.get("deviceClassName")):
        problems.append(f"request {name} names no deviceClassName")
    return DeviceRequest(
        name=name,
        device_class=_str(body.get("deviceClassName")),
        selectors=_cel_selectors(body.get("selectors"), problems, f"request {name}"),
        allocation_mode=mode,
        count=count,
        admin_access=_flag(body.get("adminAccess")),
    )


def _requests(devices: Mapping[str, Any], problems: list[str]) -> tuple[DeviceRequest, ...]:
    out = []
    for raw in _list(devices.get("requests")):
        request = _dict(raw)
        name = _str(request.get("name"))
        if isinstance(request.get("exactly"), Mapping):
            out.append(_request_fields(name, request["exactly"], problems))
        elif _list(request.get("firstAvailable")):
            subs = tuple(_request_fields(f"{name}/{_str(_dict(s).get('name'))}", _dict(s), problems)
                         for s in _list(request.get("firstAvailable")))
            out.append(DeviceRequest(name=name, first_available=subs))
        else:
            problems.append(f"request {name or '(unnamed)'} has neither exactly nor firstAvailable")
    return tuple(out)


def project_resource_claim(obj: Mapping[str, Any]) -> ResourceClaimInfo:
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    allocation = _dict(_dict(obj.get("status")).get("allocation"))
    problems: list[str] = []
    results = []
    for raw in _list(_dict(allocation.get("devices")).get("results")):
        result = _dict(raw)
        results.append(AllocatedDevice(_str(result.get("request")), _str(result.get("driver")),
                                       _str(result.get("pool")), _str(result.get("device")),
                                       admin_access=_flag(result.get("adminAccess"))))
    selector = allocation.get("nodeSelector")
    return ResourceClaimInfo(
        namespace=_str(meta.get("namespace")) or "default",
        name=_str(meta.get("name")),
        labels=_labels(meta),
        annotations=freeze({str(k): _text(v) for k, v in _dict(meta.get("annotations")).items()}),
        requests=_requests(_dict(spec.get("devices")), problems),
        allocated=tuple(results),
        allocation_node_selector=freeze(selector) if isinstance(selector, Mapping) else None,
        reserved_for=tuple(_str(_dict(r).get("name")) for r in _list(_dict(obj.get("status")).get("reservedFor"))),
        problem="; ".join(problems),
    )


def project_claim_template(obj: Mapping[str, Any]) -> ResourceClaimTemplateInfo:
    meta = _dict(obj.get("metadata"))
    problems: list[str] = []
    requests = _requests(_dict(_dict(_dict(obj.get("spec")).get("spec")).get("devices")), problems)
    return ResourceClaimTemplateInfo(namespace=_str(meta.get("namespace")) or "default", name=_str(meta.get("name")),
                                     labels=_labels(meta), requests=requests, problem="; ".join(problems))


def project_compute_domain(obj: Mapping[str, Any]) -> ComputeDomainInfo:
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    template = _dict(_dict(spec.get("channel")).get("resourceClaimTemplate"))
    return ComputeDomainInfo(namespace=_str(meta.get("namespace")) or "default", name=_str(meta.get("name")),
                             uid=_str(meta.get("uid")), claim_template=_str(template.get("name")))
