"""Layer-4 port sets: parsing `toPorts` / KNP `ports`, named ports, and port-interval arithmetic.

Owns: `PortSpec` (one port, range, `0` = all, or a name resolved against the destination's
container ports, cilium-semantics.md §4.2, §4.8) and the interval helpers the verdict uses so a
whole range such as 1-65535 is judged without iterating ports.
Must not: know about peers or policies.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.models.cluster import ContainerPort
from app.policy.selectors import InvalidPolicy

MAX_PORT = 65535
ALL = (0, MAX_PORT)
FLOW_PROTOCOLS = ("TCP", "UDP", "SCTP")
# Protocols a PortProtocol may name. The newest Cilium adds non-port protocols behind a flag; they
# never carry TCP/UDP/SCTP traffic, so they are accepted and cover nothing here.
CNP_PROTOCOLS = frozenset({"TCP", "UDP", "SCTP", "ANY", "VRRP", "IGMP", "GRE", "IPIP", "IPV6", "ESP", "AH"})
KNP_PROTOCOLS = frozenset({"TCP", "UDP", "SCTP"})
MAX_PORTS_PER_RULE = 40  # pkg/policy/api rule validation
# IANA service name (RFC 6335 §5.1), as Kubernetes validates container port names.
_PORT_NAME = re.compile(r"^(?=.{1,15}$)(?=.*[a-z])[a-z0-9]+(-[a-z0-9]+)*$")

Interval = tuple[int, int]


@dataclass(frozen=True)
class PortSpec:
    """One `{port, endPort, protocol}`: a numeric interval or a named port, for one protocol."""

    protocol: str  # TCP | UDP | SCTP | ANY | a non-port protocol
    first: int = 0
    last: int = MAX_PORT
    name: str = ""

    def covers_protocol(self, protocol: str) -> bool:
        return self.protocol == protocol or self.protocol == "ANY"

    def intervals(self, protocol: str, destination_ports: Sequence[ContainerPort]) -> list[Interval]:
        """The ports of `protocol` this spec covers, a name resolved against the destination pod."""
        if not self.covers_protocol(protocol):
            return []
        if not self.name:
            return [(self.first, self.last)]
        return [
            (p.port, p.port)
            for p in destination_ports
            if p.name.lower() == self.name and p.protocol.upper() == protocol
        ]

    def __str__(self) -> str:
        if self.name:
            where = self.name
        elif (self.first, self.last) == ALL:
            where = "all ports"
        else:
            where = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        return f"{where}/{self.protocol}"


def _number(value: Any, where: str) -> int | None:
    """An int from 80 or "80"; None when the value is a name."""
    if isinstance(value, bool):
        raise InvalidPolicy(f"{where}: {value!r} is not a port")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.isdigit():
        number = int(value)
    elif isinstance(value, str):
        return None
    else:
        raise InvalidPolicy(f"{where}: {value!r} is not a port")
    if not 0 <= number <= MAX_PORT:
        raise InvalidPolicy(f"{where}: port {number} is outside 0-{MAX_PORT}")
    return number


def parse_port_name(value: str, where: str) -> str:
    """A port name as Cilium compares it (lower-cased); InvalidPolicy when it is not an IANA service name."""
    name = value.lower()
    if not _PORT_NAME.match(name):
        raise InvalidPolicy(f"{where}: {value!r} is neither a port number nor a valid port name")
    return name


def _checked_protocol(
    raw: Any, where: str, *, default: str, accepted: frozenset[str], listed: str, shape: str
) -> str:
    """The shared checks of a port entry (CNP and KNP alike): a mapping, no unknown fields, and a
    protocol from `accepted` (`listed` is how the message names them), `default` when unset."""
    if not isinstance(raw, Mapping):
        raise InvalidPolicy(f"{where}: must be a mapping with {shape}")
    unknown = sorted(set(raw) - {"port", "endPort", "protocol"})
    if unknown:
        raise InvalidPolicy(f"{where}: unknown field(s) {', '.join(unknown)}")
    protocol = raw.get("protocol") or default
    if not isinstance(protocol, str) or protocol not in accepted:
        raise InvalidPolicy(f"{where}.protocol: {protocol!r} is not one of {listed}")
    return protocol


def parse_cilium_port(raw: Any, where: str) -> PortSpec:
    """A CNP `PortProtocol`: port "0" = all ports, `endPort` > port = a range, unset protocol = ANY."""
    protocol = _checked_protocol(raw, where, default="ANY", accepted=CNP_PROTOCOLS,
                                 listed="TCP, UDP, SCTP, ANY", shape="port/endPort/protocol")
    port = raw.get("port")
    if port is None or port == "":
        raise InvalidPolicy(f"{where}.port: missing")
    number = _number(port, f"{where}.port")
    if number is None:
        return PortSpec(str(protocol), name=parse_port_name(str(port), f"{where}.port"))
    end = _end_port(raw.get("endPort"), f"{where}.endPort")
    if number == 0:
        return PortSpec(str(protocol))
    return PortSpec(str(protocol), number, end if end is not None and end > number else number)


def parse_knp_port(raw: Any, where: str) -> PortSpec:
    """A NetworkPolicyPort: protocol defaults to TCP, no port = every port of that protocol."""
    protocol = _checked_protocol(raw, where, default="TCP", accepted=KNP_PROTOCOLS,
                                 listed="TCP, UDP, SCTP", shape="protocol/port/endPort")
    port = raw.get("port")
    end = _end_port(raw.get("endPort"), f"{where}.endPort")
    if port is None:
        if end is not None:
            raise InvalidPolicy(f"{where}.endPort: needs a numeric port")
        return PortSpec(str(protocol))
    number = _number(port, f"{where}.port")
    if number is None:
        if end is not None:
            raise InvalidPolicy(f"{where}.endPort: cannot be used with a named port")
        return PortSpec(str(protocol), name=parse_port_name(str(port), f"{where}.port"))
    if number == 0:
        raise InvalidPolicy(f"{where}.port: must be 1-{MAX_PORT}")
    if end is not None and end < number:
        raise InvalidPolicy(f"{where}.endPort: {end} is below port {number}")
    return PortSpec(str(protocol), number, end if end is not None else number)


def _end_port(value: Any, where: str) -> int | None:
    if value is None:
        return None
    number = _number(value, where)
    if number is None:
        raise InvalidPolicy(f"{where}: {value!r} is not a number")
    return number


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, non-overlapping, non-adjacent union."""
    out: list[Interval] = []
    for first, last in sorted(intervals):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def intersect(span: Interval, intervals: Iterable[Interval]) -> list[Interval]:
    """The parts of `span` inside the union of `intervals`."""
    return [
        (max(span[0], a), min(span[1], b)) for a, b in merge(intervals) if a <= span[1] and b >= span[0]
    ]


def subtract(span: Interval, intervals: Iterable[Interval]) -> list[Interval]:
    """The parts of `span` outside the union of `intervals`."""
    gaps: list[Interval] = []
    cursor = span[0]
    for a, b in merge(intervals):
        if b < cursor or a > span[1]:
            continue
        if a > cursor:
            gaps.append((cursor, a - 1))
        cursor = max(cursor, b + 1)
        if cursor > span[1]:
            break
    if cursor <= span[1]:
        gaps.append((cursor, span[1]))
    return gaps


def show(intervals: Sequence[Interval], protocol: str) -> str:
    """`80/TCP`, `80-90/TCP`, `80/TCP, 443/TCP` (at most three spans shown)."""
    parts = [f"{a}/{protocol}" if a == b else f"{a}-{b}/{protocol}" for a, b in intervals[:3]]
    more = f" and {len(intervals) - 3} more range(s)" if len(intervals) > 3 else ""
    return ", ".join(parts) + more
