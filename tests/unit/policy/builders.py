"""Builders for policy tests: policy objects, endpoints and snapshots without hand-written dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.cache.files import build_snapshot
from app.models.cluster import ContainerPort, Snapshot
from app.models.network import Endpoint

NS = "ml-demo"


def cnp(name: str = "p", namespace: str = NS, *, spec: Any = None, specs: Any = None, **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
    }
    if spec is not None:
        obj["spec"] = spec
    if specs is not None:
        obj["specs"] = specs
    obj.update(extra)
    return obj


def ccnp(name: str = "cw", *, spec: Any = None, specs: Any = None) -> dict[str, Any]:
    obj = cnp(name, spec=spec, specs=specs)
    obj["kind"] = "CiliumClusterwideNetworkPolicy"
    del obj["metadata"]["namespace"]
    return obj


def knp(name: str = "k", namespace: str = NS, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def sel(**labels: str) -> dict[str, Any]:
    return {"matchLabels": dict(labels)}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


def port(number: int | str, protocol: str | None = "TCP", end: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"port": str(number)}
    if protocol:
        out["protocol"] = protocol
    if end is not None:
        out["endPort"] = end
    return out


def rule(subject: Mapping[str, Any] | None = None, **sections: Any) -> dict[str, Any]:
    """A CNP rule: `rule(sel(role="x"), ingress=[...])`."""
    return {"endpointSelector": dict(subject) if subject is not None else {}, **sections}


def endpoint(
    namespace: str = NS,
    *,
    name: str = "",
    sa: str = "default",
    ns_labels: Mapping[str, str] | None = None,
    ports: Sequence[ContainerPort] = (),
    host_network: bool = False,
    **labels: str,
) -> Endpoint:
    return Endpoint(
        namespace=namespace,
        labels=dict(labels),
        namespace_labels={"kubernetes.io/metadata.name": namespace, **(ns_labels or {})},
        service_account=sa,
        ports=tuple(ports),
        host_network=host_network,
        name=name,
    )


def snapshot(*policies: Mapping[str, Any]) -> Snapshot:
    return build_snapshot(list(policies))


def kcnp(name: str = "cnp", *, tier: str = "Admin", priority: int = 10, subject: Any = None,
         ingress: Sequence[Any] | None = None, egress: Sequence[Any] | None = None) -> dict[str, Any]:
    """A Kubernetes ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2); subject defaults to every pod
    of the test namespace."""
    spec: dict[str, Any] = {
        "tier": tier,
        "priority": priority,
        "subject": subject if subject is not None else {"namespaces": sel(**{"kubernetes.io/metadata.name": NS})},
    }
    if ingress is not None:
        spec["ingress"] = list(ingress)
    if egress is not None:
        spec["egress"] = list(egress)
    return {"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
            "metadata": {"name": name}, "spec": spec}


def kcnp_rule(action: str, name: str = "", *, pods: Any = None, namespaces: Any = None, direction: str = "ingress",
              protocols: Sequence[Any] | None = None, peers: Sequence[Any] | None = None) -> dict[str, Any]:
    """One ClusterNetworkPolicy rule: `kcnp_rule("Deny", pods=sel(role="worker"))` (pods in any namespace)."""
    if peers is None:
        if pods is not None:
            peers = [{"pods": {"namespaceSelector": {}, "podSelector": pods}}]
        else:
            peers = [{"namespaces": namespaces if namespaces is not None else {}}]
    out: dict[str, Any] = {"action": action, "from" if direction == "ingress" else "to": list(peers)}
    if name:
        out["name"] = name
    if protocols is not None:
        out["protocols"] = list(protocols)
    return out


def tcp(number: int | None = None, end: int | None = None) -> dict[str, Any]:
    """A ClusterNetworkPolicy protocol: tcp port `number`, `number`-`end`, or every TCP port."""
    if number is None:
        return {"tcp": {}}
    if end is None:
        return {"tcp": {"destinationPort": {"number": number}}}
    return {"tcp": {"destinationPort": {"range": {"start": number, "end": end}}}}
