"""Raw Kubernetes objects → the compact, immutable projections in app.models.cluster.

Used by both the file loader and the watch cache, so a snapshot means the same whichever fed it.
Projections never raise on odd shapes: missing or mistyped fields fall back to safe defaults
(an unparsable GPU count counts as 0 for capacity, a node without Ready=True is not Ready).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.models.cluster import (
    CIDRGroup,
    ContainerPort,
    NamespaceInfo,
    NodeInfo,
    PodInfo,
    PolicyObject,
    Taint,
    TrainingRuntimeInfo,
    freeze,
)
from app.models.labels import NAMESPACE_NAME_LABEL

POLICY_KINDS = ("CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy", "NetworkPolicy")
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
KNOWN_KINDS = ("Node", "Namespace", "Pod", *POLICY_KINDS, "CiliumCIDRGroup", *RUNTIME_KINDS)
STANDARD_RESOURCES = frozenset({"cpu", "memory", "pods", "ephemeral-storage", "storage"})


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


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
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    text = str(value).strip()
    multipliers = {"k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, factor in sorted(multipliers.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(suffix):
            text, mult = text[: -len(suffix)], factor
            break
    else:
        mult = 1
    try:
        return max(int(float(text) * mult), 0)
    except ValueError:
        return 0


def _extended(resources: Mapping[str, Any]) -> dict[str, int]:
    return {str(k): parse_count(v) for k, v in resources.items() if k not in STANDARD_RESOURCES}


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
    )


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
    )


def project_policy(obj: Mapping[str, Any]) -> PolicyObject:
    meta = _dict(obj.get("metadata"))
    kind = str(obj.get("kind", ""))
    body = {k: v for k, v in obj.items() if k != "status"}
    body["metadata"] = {k: v for k, v in meta.items() if k in ("name", "namespace", "labels", "annotations")}
    namespace = "" if kind == "CiliumClusterwideNetworkPolicy" else str(meta.get("namespace", "") or "default")
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
