"""What the policy evaluator is asked and what it answers: endpoints, flows, verdicts, reasons."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from app.models.pods import ContainerPort

_PORT_RANGE = re.compile(r"([0-9]{1,5}) *(?:- *([0-9]{1,5}))?")

VerdictKind = Literal["allow", "deny", "unknown"]
Protocol = Literal["TCP", "UDP", "SCTP", "ANY"]
PolicyEnforcement = Literal["default", "always", "never"]


@dataclass(frozen=True)
class Endpoint:
    """A pod as policy sees it: existing, or simulated before it exists (labels as they will be)."""

    namespace: str
    labels: Mapping[str, str]
    namespace_labels: Mapping[str, str]
    service_account: str = "default"
    ports: tuple[ContainerPort, ...] = ()
    host_network: bool = False
    ips: tuple[str, ...] = ()
    name: str = ""  # for messages only
    # Where the pod's address will lie when it does not exist yet: the pod CIDRs of its zone's nodes
    # (read only under policy-cidr-match-mode pods); an existing pod's `ips` say it exactly.
    ranges: tuple[str, ...] = ()


@dataclass(frozen=True)
class PortRange:
    """Ports `first`..`last` inclusive. A single port has first == last.

    A flow over a range is allowed only when every port in it is allowed (collective traffic
    such as NCCL/Gloo picks ephemeral ports, so a partial allow is a deny for some port).
    """

    first: int
    last: int

    @classmethod
    def single(cls, port: int) -> PortRange:
        return cls(port, port)

    @classmethod
    def parse(cls, text: str) -> PortRange:
        """`40000-40100` or `40000` (ports 1-65535, the first not above the last); ValueError saying why not."""
        match = _PORT_RANGE.fullmatch(str(text).strip())
        if match is None:
            raise ValueError(f"{text!r} is not a port or a port range FIRST-LAST (like 32768-60999)")
        ports = cls(int(match[1]), int(match[2] or match[1]))
        if not 1 <= ports.first <= ports.last <= 65535:
            raise ValueError(f"{text!r}: ports must be 1-65535 and the range ascending")
        return ports

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


ALL_PORTS = PortRange(1, 65535)
# The ports NCCL, Gloo and most MPI transports (MPICH, Intel MPI, Open MPI's out-of-band channel) listen
# on for their peer connections unless a job pins them: they bind port 0, so the kernel picks one from
# `net.ipv4.ip_local_port_range`, "32768 and 60999" by default (Linux Documentation/networking/
# ip-sysctl.rst, ip_local_port_range; net/ipv4/af_inet.c `inet_init_net` sets it per network namespace,
# so a pod starts with the default, not its node's value, unless its securityContext sets the namespaced
# sysctl). Settings `collectivePorts` changes it.
EPHEMERAL_PORTS = PortRange(32768, 60999)


@dataclass(frozen=True)
class Reason:
    """Why a side decided as it did. `policy` is "namespace/name" (or "name" when cluster-wide)."""

    side: Literal["egress", "ingress"]
    effect: Literal["allow", "deny", "default-deny", "unknown", "not-enforced"]
    message: str
    policy: str = ""
    kind: str = ""  # CiliumNetworkPolicy | CiliumClusterwideNetworkPolicy | NetworkPolicy
    rule: str = ""  # e.g. "egress[1]" or "specs[0].ingressDeny[0]"
    # default-deny only: the flow's ports that some rule of this side does allow the peer (`23456/TCP`),
    # "" when none; what a message names instead of the whole closed range.
    open_ports: str = ""


@dataclass(frozen=True)
class SideVerdict:
    verdict: VerdictKind
    reasons: tuple[Reason, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """A flow's verdict: allow only when the source's egress AND the destination's ingress allow."""

    verdict: VerdictKind
    egress: SideVerdict
    ingress: SideVerdict
    reasons: tuple[Reason, ...] = field(default=())
