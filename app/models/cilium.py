"""The Cilium agent settings a verdict depends on (types only).

`CiliumAgent` is what the policy evaluator is told about the agent: its version and the
cilium-config settings that change policy semantics. `app.policy.agent` builds one from the
snapshot (the cilium-config ConfigMap, the agent DaemonSet's image) and topoguard's own settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

Version = tuple[int, int, int]


@dataclass(frozen=True)
class CiliumAgent:
    """The agent as policy sees it. `None` / empty means "not known" where the default is not safe.

    `sources` says where each value came from (`config`, `cilium-config`, `daemonset`, `default`),
    for `explain` and `reach`.
    """

    version: Version | None = None  # None: unknown; version-dependent rules then answer `unknown`
    policy_enforcement: str = "default"  # default | always | never (policy-enforcement)
    audit_mode: bool = False  # policy-audit-mode: drops are only logged
    cidr_match_mode: tuple[str, ...] = ()  # policy-cidr-match-mode: () | ("nodes",) | ("pods",) | both
    cluster_name: str = "default"  # cluster-name
    non_default_deny: bool = True  # enable-non-default-deny-policies (enableDefaultDeny honoured)
    labels: tuple[str, ...] = ()  # `labels`: extra identity label prefixes (pkg/labelsfilter syntax)
    # Policy kinds the agent does not enforce (an enable-* flag off, or a version without the kind), and
    # kinds it may or may not enforce (the flag is not known: a verdict they change is `unknown`).
    kinds_off: tuple[str, ...] = ()
    kinds_unknown: tuple[str, ...] = ("ClusterNetworkPolicy",)
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), compare=False)

    def at_least(self, major: int, minor: int) -> bool | None:
        """Whether the version is >= major.minor; None when the version is unknown."""
        if self.version is None:
            return None
        return self.version[:2] >= (major, minor)


def parse_version(text: str) -> Version | None:
    """`v1.20.2`, `1.15.6`, `1.16`, `quay.io/cilium/cilium:v1.15.6@sha256:…` → (major, minor, patch)."""
    tag = text.strip()
    if "@" in tag:
        tag = tag.split("@", 1)[0]
    if "/" in tag or ":" in tag:
        tag = tag.rsplit(":", 1)[-1] if ":" in tag.rsplit("/", 1)[-1] else ""
    tag = tag.lstrip("v").split("-", 1)[0].split("+", 1)[0]
    parts = tag.split(".")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return numbers[0], numbers[1], numbers[2]
