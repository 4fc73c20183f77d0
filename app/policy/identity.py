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
from dataclasses import dataclass, field

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

# Cilium's default identity-relevant label filter (pkg/labelsfilter/filter.go
# defaultLabelPrefixCfg; Documentation/operations/performance/scalability/
# identity-relevant-labels.rst), in its own syntax: `[source:][!]regexp`, the regexp anchored at
# the start of the key, `!` for an exclusion. Checked against the module sources of v1.16.0,
# v1.18.0, v1.19.0 and v1.20.2. NB: `topology.kubernetes.io/zone` is NOT caught by
# `!kubernetes\.io` (the anchor is the key start); it is dropped only by the exclusion that
# v1.19.0 added (TOPOLOGY_EXCLUSION).
DEFAULT_LABEL_PREFIXES = (
    r"reserved:.*",
    r"io\.kubernetes\.pod\.namespace",
    r"io\.cilium\.k8s\.namespace\.labels",
    r"app\.kubernetes\.io",
    r"io\.cilium\.k8s\.policy\.cluster",
    r"io\.cilium\.k8s\.policy\.serviceaccount",
    r"!io\.kubernetes",
    r"!kubernetes\.io",
    r"!statefulset\.kubernetes\.io/pod-name",
    r"!apps\.kubernetes\.io/pod-index",
    r"!batch\.kubernetes\.io/job-completion-index",
    r"!batch\.kubernetes\.io/controller-uid",
    r"!.*beta\.kubernetes\.io",
    r"!k8s\.io",
    r"!pod-template-generation",
    r"!pod-template-hash",
    r"!controller-revision-hash",
    r"!controller-uid",
    r"!annotation.*",
    r"!etcd_node",
)
TOPOLOGY_EXCLUSION = r"!topology\.kubernetes\.io"
# The first release whose default filter drops every topology.kubernetes.io/* pod label.
TOPOLOGY_EXCLUSION_SINCE = (1, 19)
# Keys Cilium itself owns; a pod label cannot fake them (SanitizePodLabels / RemoveCiliumLabels).
CILIUM_OWNED_PREFIX = "io.cilium.k8s"
# The source every identity label of a pod has.
K8S_SOURCE = "k8s"


@dataclass(frozen=True)
class LabelPrefix:
    """One entry of the filter: a regexp anchored at the key start, for one source or any."""

    pattern: re.Pattern[str]
    ignore: bool
    source: str = ""

    def match_length(self, key: str) -> int:
        """The length of the matched start of `key`, 0 when it does not match."""
        found = self.pattern.match(key)
        return found.end() if found else 0


def parse_label_prefix(text: str) -> LabelPrefix:
    """`k8s:!app`, `!io\\.kubernetes`, `team` → a LabelPrefix (the pkg/labelsfilter syntax).

    Raises:
        ValueError: an empty prefix or a regexp that does not compile.
    """
    source, sep, prefix = text.partition(":")
    if not sep:
        source, prefix = "", text
    ignore = prefix.startswith("!")
    prefix = prefix[1:] if ignore else prefix
    if not prefix:
        raise ValueError(f"label prefix {text!r} is empty")
    try:
        pattern = re.compile(prefix)
    except re.error as e:
        raise ValueError(f"label prefix {text!r} is not a regular expression: {e}") from e
    return LabelPrefix(pattern, ignore, source)


@dataclass(frozen=True)
class LabelFilter:
    """Which labels become part of an identity.

    A label is kept when no inclusive entry was configured beyond the defaults and no exclusion
    matches it, or when the longest inclusive match is longer than the shortest exclusion match
    (so `app.kubernetes.io` beats `!kubernetes.io`-style exclusions); user-given inclusive
    prefixes switch the filter to allow-list mode (pkg/labelsfilter filterLabels).
    """

    prefixes: tuple[LabelPrefix, ...]
    allow_list: bool = False
    _kept: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    def keeps(self, key: str, source: str = K8S_SOURCE) -> bool:
        try:
            return self._kept[key]
        except KeyError:
            pass
        included = ignored = 0
        for prefix in self.prefixes:
            if prefix.source and prefix.source != source:
                continue
            length = prefix.match_length(key)
            if not length:
                continue
            if prefix.ignore:
                ignored = length if not ignored else min(ignored, length)
            else:
                included = max(included, length)
        kept = (not self.allow_list and not ignored) or included > ignored
        self._kept[key] = kept
        return kept


@functools.lru_cache(maxsize=64)
def label_filter(*, drops_topology: bool, extra: tuple[str, ...] = ()) -> LabelFilter:
    """The default filter of a Cilium version (with or without TOPOLOGY_EXCLUSION) plus the
    agent's `labels` setting. Raises ValueError for an unusable extra prefix."""
    texts = DEFAULT_LABEL_PREFIXES + ((TOPOLOGY_EXCLUSION,) if drops_topology else ())
    extras = tuple(parse_label_prefix(t) for t in extra)
    return LabelFilter(tuple(parse_label_prefix(t) for t in texts) + extras,
                       allow_list=any(not p.ignore for p in extras))


# Before v1.19 (the seed lab's 1.15.6): topology.kubernetes.io/* labels are identity labels.
LEGACY_FILTER = label_filter(drops_topology=False)


def is_identity_label(key: str, label_filter: LabelFilter = LEGACY_FILTER) -> bool:
    """Whether a pod label with this key survives into the Cilium identity."""
    if key.startswith(CILIUM_OWNED_PREFIX):
        return False
    return label_filter.keeps(key)


def identity_labels(
    endpoint: Endpoint, label_filter: LabelFilter = LEGACY_FILTER, *, cluster_name: str = CLUSTER_NAME
) -> dict[str, str]:
    """The identity label set of a Cilium-managed pod (§1.1), keys without the `k8s:` source.

    As the agent does it (pkg/k8s/utils SanitizePodLabels, then labelsfilter.Filter): the pod's
    own labels minus Cilium-owned keys, plus the namespace, its labels, the service account and
    the cluster name; then the filter over all of them.
    """
    labels = {k: v for k, v in endpoint.labels.items() if not k.startswith(CILIUM_OWNED_PREFIX)}
    namespace_labels: Mapping[str, str] = endpoint.namespace_labels
    for key, value in namespace_labels.items():
        labels[CILIUM_NAMESPACE_LABELS_PREFIX + key] = value
    # The apiserver sets kubernetes.io/metadata.name on every Namespace (1.21+).
    labels.setdefault(CILIUM_NAMESPACE_LABELS_PREFIX + NAMESPACE_NAME_LABEL, endpoint.namespace)
    labels[CILIUM_NAMESPACE_LABEL] = endpoint.namespace
    labels[CILIUM_SERVICE_ACCOUNT_LABEL] = endpoint.service_account or "default"
    labels[CILIUM_CLUSTER_LABEL] = cluster_name
    return {k: v for k, v in labels.items() if label_filter.keeps(k)}


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
