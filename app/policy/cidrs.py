"""CIDR peers against pods under `policy-cidr-match-mode: pods` (cilium-semantics.md §4.6).

Owns: `CidrRule` (one CIDR with its `except` prefixes, parsed once) and `match_ranges`, which says
whether a pod whose address lies somewhere in `ranges` is inside a CIDR peer.
Must not: know selectors, rules or verdicts.

At admission a pod's address is not known, only where it will come from: the pod CIDRs of the
nodes of the zone it is placed in (Node `spec.podCIDRs`), or the address of a pod that exists. So
every range inside one CIDR (and outside its excepts) → the peer matches; every range outside all
of them → it does not; anything else → `maybe` (the verdict is then `unknown`). No range at all
(nodes without podCIDRs, e.g. cloud IPAM) → `maybe`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from app.policy.selectors import Match

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class CidrRule:
    network: Network
    excepts: tuple[Network, ...] = ()

    def holds(self, net: Network) -> bool:
        """Every address of `net` is in the rule."""
        return (net.version == self.network.version and net.subnet_of(self.network)  # type: ignore[arg-type]
                and not any(net.overlaps(e) for e in self.excepts))

    def misses(self, net: Network) -> bool:
        """No address of `net` is in the rule."""
        return (net.version != self.network.version or not net.overlaps(self.network)
                or any(net.subnet_of(e) for e in self.excepts if e.version == net.version))  # type: ignore[arg-type]

    def __str__(self) -> str:
        excepts = f" except {', '.join(map(str, self.excepts))}" if self.excepts else ""
        return f"{self.network}{excepts}"


def parse_rule(cidr: str, excepts: Sequence[str] = ()) -> CidrRule:
    """Raises ValueError for a CIDR that does not parse."""
    return CidrRule(ipaddress.ip_network(cidr, strict=False),
                    tuple(ipaddress.ip_network(e, strict=False) for e in excepts))


def match_ranges(ranges: Sequence[str], rules: Sequence[CidrRule]) -> Match:
    """Whether a pod with an address in one of `ranges` (CIDRs or addresses) is in one of `rules`."""
    nets: list[Network] = []
    for text in ranges:
        try:
            nets.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            return "maybe"
    if not nets or not rules:
        return "maybe" if rules else "no"
    if all(any(rule.holds(net) for rule in rules) for net in nets):
        return "yes"
    if all(rule.misses(net) for net in nets for rule in rules):
        return "no"
    return "maybe"
