"""The Cilium agent's settings as policy semantics need them: `agent_settings(snapshot, ...)`.

Owns: reading the cilium-config ConfigMap data and the agent image the snapshot carries into a
`CiliumAgent`, with topoguard's explicit settings winning, and the label filter of that agent.
Must not: do I/O (app.cache reads the ConfigMap and the DaemonSet).

The ConfigMap keys are the agent's flags (pkg/option/config.go): `enable-policy`,
`policy-audit-mode`, `policy-cidr-match-mode`, `cluster-name` (pkg/clustermesh/types),
`enable-non-default-deny-policies`, `labels`. String-slice values are split on whitespace and
commas, as the agent's config reader does.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from app.models.cilium import CiliumAgent, Version, parse_version
from app.models.cluster import Snapshot
from app.policy import identity

ENFORCEMENT_KEY = "enable-policy"
AUDIT_KEY = "policy-audit-mode"
CIDR_MATCH_KEY = "policy-cidr-match-mode"
CLUSTER_NAME_KEY = "cluster-name"
NON_DEFAULT_DENY_KEY = "enable-non-default-deny-policies"
LABELS_KEY = "labels"
# The agent's switches per policy kind (pkg/option/config.go; pkg/defaults: all on but ClusterNetworkPolicy,
# which v1.20 added behind enable-k8s-cluster-network-policy, off by default).
KCNP_KEY = "enable-k8s-cluster-network-policy"
KCNP_SINCE = (1, 20)
KIND_FLAGS: Mapping[str, tuple[str, bool]] = MappingProxyType({
    "NetworkPolicy": ("enable-k8s-networkpolicy", True),
    "CiliumNetworkPolicy": ("enable-cilium-network-policy", True),
    "CiliumClusterwideNetworkPolicy": ("enable-cilium-clusterwide-network-policy", True),
    "ClusterNetworkPolicy": (KCNP_KEY, False),
})
# A version label some installers put on the ConfigMap; else the agent DaemonSet's image tag.
VERSION_LABEL = "app.kubernetes.io/version"

ENFORCEMENT_MODES = ("default", "always", "never")
CIDR_MATCH_MODES = ("nodes", "pods")


class AgentConfigError(ValueError):
    """A cilium-config value the agent itself would refuse."""


def agent_settings(
    snapshot: Snapshot, *, version: str = "", policy_enforcement: str = ""
) -> CiliumAgent:
    """The agent the snapshot's cluster runs, explicit topoguard settings winning.

    Args:
        snapshot: carries the cilium-config data (`cilium_config`, None when not read or absent)
            and the agent image (`cilium_image`).
        version: topoguard's `ciliumVersion` ("" when not set).
        policy_enforcement: topoguard's `policyEnforcement` when set explicitly ("" otherwise).

    Raises:
        AgentConfigError: an explicit version that is not a version, or a cilium-config value
            the agent would not start with.
    """
    data: Mapping[str, str] = snapshot.cilium_config or {}
    sources: dict[str, str] = {}
    found_version = _version(snapshot, version, sources)
    enforcement = _choice(data, ENFORCEMENT_KEY, ENFORCEMENT_MODES, "default", sources, "policyEnforcement")
    if policy_enforcement:
        enforcement, sources["policyEnforcement"] = policy_enforcement, "config"
    modes = _words(data.get(CIDR_MATCH_KEY, ""))
    bad = [m for m in modes if m not in CIDR_MATCH_MODES]
    if bad:
        raise AgentConfigError(f"cilium-config {CIDR_MATCH_KEY}: {' '.join(bad)} is not one of nodes, pods")
    sources["cidrMatchMode"] = "cilium-config" if CIDR_MATCH_KEY in data else "default"
    labels = tuple(_words(data.get(LABELS_KEY, "")))
    try:
        identity.label_filter(drops_topology=True, extra=labels)
    except ValueError as e:
        raise AgentConfigError(f"cilium-config {LABELS_KEY}: {e}") from e
    sources["labels"] = "cilium-config" if LABELS_KEY in data else "default"
    kinds_off, kinds_unknown = _kinds(snapshot, found_version, sources)
    cluster = data.get(CLUSTER_NAME_KEY, "").strip() or identity.CLUSTER_NAME
    sources["clusterName"] = "cilium-config" if data.get(CLUSTER_NAME_KEY, "").strip() else "default"
    return CiliumAgent(
        version=found_version,
        policy_enforcement=enforcement,
        audit_mode=_flag(data, AUDIT_KEY, False, sources, "auditMode"),
        cidr_match_mode=tuple(modes),
        cluster_name=cluster,
        non_default_deny=_flag(data, NON_DEFAULT_DENY_KEY, True, sources, "nonDefaultDeny"),
        labels=labels,
        kinds_off=kinds_off,
        kinds_unknown=kinds_unknown,
        sources=MappingProxyType(sources),
    )


def kind_enforced(agent: CiliumAgent, kind: str) -> bool | None:
    """Whether the agent enforces policies of `kind`; None when that is not known."""
    if kind in agent.kinds_off:
        return False
    return None if kind in agent.kinds_unknown else True


def _kinds(snapshot: Snapshot, version: Version | None, sources: dict[str, str]) -> tuple[tuple[str, ...], ...]:
    """(kinds off, kinds not known) from the enable-* flags of cilium-config and the version."""
    data = snapshot.cilium_config
    off: list[str] = []
    unknown: list[str] = []
    for kind, (key, default) in KIND_FLAGS.items():
        name = f"enforces[{kind}]"
        if kind == "ClusterNetworkPolicy" and version is not None and version[:2] < KCNP_SINCE:
            off.append(kind)
            sources[name] = "ciliumVersion"
        elif data is None:
            if not default:
                unknown.append(kind)
            sources[name] = "unknown" if not default else "default"
        elif not _flag(data, key, default, sources, name):
            off.append(kind)
    return tuple(off), tuple(unknown)


def identity_filter(agent: CiliumAgent) -> identity.LabelFilter | None:
    """The identity label filter of `agent`; None when it depends on a version that is unknown."""
    newer = agent.at_least(*identity.TOPOLOGY_EXCLUSION_SINCE)
    if newer is None:
        return None
    return identity.label_filter(drops_topology=newer, extra=agent.labels)


def version_filters(agent: CiliumAgent) -> tuple[identity.LabelFilter, identity.LabelFilter]:
    """The filters before and from TOPOLOGY_EXCLUSION_SINCE, for an agent of unknown version."""
    return (identity.label_filter(drops_topology=False, extra=agent.labels),
            identity.label_filter(drops_topology=True, extra=agent.labels))


def describe_sources(agent: CiliumAgent) -> list[str]:
    """`ciliumVersion=1.20.2 (daemonset)` lines for explain / reach."""
    return [f"{key}={item['value']} ({item['source']})" for key, item in sources_json(agent).items()]


def sources_json(agent: CiliumAgent) -> dict[str, dict[str, str]]:
    """Each setting the verdicts use: `{"ciliumVersion": {"value": "1.20.2", "source": "daemonset"}, ...}`.

    Sources: `config` (topoguard's settings), `cilium-config` (the agent's ConfigMap), `daemonset` (the
    agent image), `ciliumVersion` (decided by the version), `default` (the agent's default), `unknown`.
    """
    shown = {
        "ciliumVersion": ".".join(map(str, agent.version)) if agent.version else "unknown",
        "policyEnforcement": agent.policy_enforcement,
        "auditMode": str(agent.audit_mode).lower(),
        "cidrMatchMode": " ".join(agent.cidr_match_mode) or '""',
        "clusterName": agent.cluster_name,
        "nonDefaultDeny": str(agent.non_default_deny).lower(),
        "labels": " ".join(agent.labels) or "(default filter)",
        **{f"enforces[{kind}]": {True: "true", False: "false", None: "unknown"}[kind_enforced(agent, kind)]
           for kind in KIND_FLAGS},
    }
    return {key: {"value": value, "source": agent.sources.get(key, "default")} for key, value in shown.items()}


def _version(snapshot: Snapshot, explicit: str, sources: dict[str, str]) -> Version | None:
    if explicit:
        parsed = parse_version(explicit)
        if parsed is None:
            raise AgentConfigError(f"ciliumVersion {explicit!r} is not a version such as 1.20.2")
        sources["ciliumVersion"] = "config"
        return parsed
    labels: Mapping[str, str] = snapshot.cilium_config_labels
    for text, source in ((labels.get(VERSION_LABEL, ""), "cilium-config"),
                         (snapshot.cilium_image, "daemonset")):
        parsed = parse_version(text) if text else None
        if parsed is not None:
            sources["ciliumVersion"] = source
            return parsed
    sources["ciliumVersion"] = "unknown"
    return None


def _words(value: str) -> list[str]:
    return [w for w in value.replace(",", " ").split() if w]


def _choice(data: Mapping[str, str], key: str, allowed: tuple[str, ...], default: str,
            sources: dict[str, str], name: str) -> str:
    value = data.get(key, "").strip()
    if not value:
        sources[name] = "default"
        return default
    if value not in allowed:
        raise AgentConfigError(f"cilium-config {key}: {value!r} is not one of {', '.join(allowed)}")
    sources[name] = "cilium-config"
    return value


def _flag(data: Mapping[str, str], key: str, default: bool, sources: dict[str, str], name: str) -> bool:
    value = data.get(key, "").strip().lower()
    if not value:
        sources[name] = "default"
        return default
    if value not in ("true", "false"):
        raise AgentConfigError(f"cilium-config {key}: {value!r} is not true or false")
    sources[name] = "cilium-config"
    return value == "true"
