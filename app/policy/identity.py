"""The labels a pod "has" for Cilium policy: its security identity (cilium-semantics.md §1).

Owns: turning an `Endpoint` (the pod's own labels, namespace labels, service account) into the
identity label set Cilium derives, and `endpoint_for_pod`.
Must not: match selectors or read policies.

All identity labels of a pod have the `k8s` source, so the identity is a plain key → value map.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

from app.models.cluster import PodInfo, Snapshot
from app.models.labels import (
    CILIUM_CLUSTER_LABEL,
    CILIUM_NAMESPACE_LABEL,
    CILIUM_NAMESPACE_LABELS_PREFIX,
    CILIUM_SERVICE_ACCOUNT_LABEL,
    NAMESPACE_NAME_LABEL,
)
from app.models.network import Endpoint

# The agent's `cluster-name` default; the single-cluster case topoguard models.
CLUSTER_NAME = "default"

# Cilium's default identity-relevant label filter (Documentation/operations/performance/
# scalability/identity-relevant-labels.rst; pkg/labelsfilter): pod label keys matching one of these
# (anchored at the start of the key) are not part of the identity, so no selector can match them.
# NB: `topology.kubernetes.io/zone` is NOT caught by `kubernetes.io` (the anchor is the key start).
EXCLUDED_LABEL_PATTERNS = tuple(
    re.compile(p)
    for p in (
        r"io\.kubernetes",
        r"kubernetes\.io",
        r"statefulset\.kubernetes\.io/pod-name",
        r"apps\.kubernetes\.io/pod-index",
        r"batch\.kubernetes\.io/job-completion-index",
        r"batch\.kubernetes\.io/controller-uid",
        r".*beta\.kubernetes\.io",
        r"k8s\.io",
        r"pod-template-generation",
        r"pod-template-hash",
        r"controller-revision-hash",
        r"controller-uid",
        r"annotation.*",
        r"etcd_node",
    )
)
# Keys Cilium itself owns; a pod label cannot fake them (SanitizePodLabels / filterPodLabels).
CILIUM_OWNED_PREFIX = "io.cilium.k8s"


@functools.lru_cache(maxsize=8192)
def is_identity_label(key: str) -> bool:
    """Whether a pod label with this key survives into the Cilium identity (default filter)."""
    if key.startswith(CILIUM_OWNED_PREFIX):
        return False
    return not any(p.match(key) for p in EXCLUDED_LABEL_PATTERNS)


def identity_labels(endpoint: Endpoint) -> dict[str, str]:
    """The identity label set of a Cilium-managed pod (§1.1), keys without the `k8s:` source."""
    labels = {k: v for k, v in endpoint.labels.items() if is_identity_label(k)}
    namespace_labels: Mapping[str, str] = endpoint.namespace_labels
    for key, value in namespace_labels.items():
        labels[CILIUM_NAMESPACE_LABELS_PREFIX + key] = value
    # The apiserver sets kubernetes.io/metadata.name on every Namespace (1.21+).
    labels.setdefault(CILIUM_NAMESPACE_LABELS_PREFIX + NAMESPACE_NAME_LABEL, endpoint.namespace)
    labels[CILIUM_NAMESPACE_LABEL] = endpoint.namespace
    labels[CILIUM_SERVICE_ACCOUNT_LABEL] = endpoint.service_account or "default"
    labels[CILIUM_CLUSTER_LABEL] = CLUSTER_NAME
    return labels


def endpoint_for_pod(snapshot: Snapshot, pod: PodInfo) -> Endpoint:
    """The policy view of an existing pod: its labels plus its Namespace's labels from `snapshot`."""
    return Endpoint(
        namespace=pod.namespace,
        labels=pod.labels,
        namespace_labels=snapshot.namespace_labels(pod.namespace),
        service_account=pod.service_account or "default",
        ports=pod.ports,
        host_network=pod.host_network,
        ips=pod.ips,
        name=pod.name,
    )


def describe(endpoint: Endpoint) -> str:
    """`ns/name` for an existing pod, `ns:{k=v,...}` for a simulated one."""
    if endpoint.name:
        return f"{endpoint.namespace}/{endpoint.name}"
    labels = ",".join(f"{k}={v}" for k, v in sorted(endpoint.labels.items()))
    return f"{endpoint.namespace}:{{{labels}}}"
