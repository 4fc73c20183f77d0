"""Compiled policy rules: what every CNP/CCNP/KNP becomes before any flow is judged.

Owns: the frozen types the compilers (`cilium`, `knp`) produce and the verdict reads — `Rule`
(one subject selector with its entries), `Entry` (one allow or deny entry: peers by ports),
`Peers`, `CompiledPolicy` — and how an entry's peers match a pod.
Must not: parse raw objects (see cilium.py / knp.py) or decide verdicts (see verdicts.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from app.models.cilium import Version
from app.policy import cidrs
from app.policy.cidrs import CidrRule
from app.policy.ports import PortSpec
from app.policy.selectors import Match, PeerSelector, Selector

Direction = Literal["ingress", "egress"]
DIRECTIONS: tuple[Direction, Direction] = ("ingress", "egress")
# Policy tiers in the order Cilium evaluates them (pkg/policy/types Tier: Admin 100 < Normal 200 <
# Baseline 250): ClusterNetworkPolicy's Admin tier, then CNP/CCNP/NetworkPolicy, then its Baseline tier.
Tier = Literal["Admin", "Normal", "Baseline"]

# Entities and whether they match a regular (non-hostNetwork) pod (cilium-semantics.md §4.5;
# pkg/policy/api/entity.go). `cluster` holds every pod of the local cluster; `cluster-mesh` is new
# in 1.20, where it holds every endpoint carrying a cluster label (so every local pod); it is
# `maybe` when the version is not known.
ENTITY_MATCHES_POD: Mapping[str, Match] = {
    "all": "yes",
    "cluster": "yes",
    "cluster-mesh": "maybe",
    "world": "no",
    "world-ipv4": "no",
    "world-ipv6": "no",
    "host": "no",
    "remote-node": "no",
    "kube-apiserver": "no",
    "ingress": "no",
    "health": "no",
    "init": "no",
    "unmanaged": "no",
    "none": "no",
}


CLUSTER_MESH_ENTITY_SINCE = (1, 20)


def entity_matches_node(entity: str, node: str) -> Match:
    """Whether entity `entity` holds the `node` identity (host | remote-node) a hostNetwork pod's
    traffic carries (§1.4, §4.5): `all` and `cluster` hold both; `kube-apiserver` is also on a node
    that runs the apiserver, which the snapshot does not tell; `cluster-mesh` is not pinned down."""
    if entity in ("all", "cluster", node):
        return "yes"
    return "maybe" if entity in ("kube-apiserver", "cluster-mesh") else "no"


@dataclass(frozen=True)
class Peers:
    """Whom an entry applies to. Exactly one L3 field is set per entry (Cilium validation)."""

    wildcard: bool = False  # every identity (no L3 field + L4 part; KNP missing `from`/`to`)
    selectors: tuple[PeerSelector, ...] = ()
    entities: tuple[str, ...] = ()
    never: str = ""  # a field that never selects a pod (CIDR, nodes, FQDN), for messages
    maybe: str = ""  # a field whose pod match cannot be evaluated (toServices)
    nodes: tuple[Selector, ...] = ()  # fromNodes/toNodes selectors (they match remote nodes only)
    nodes_with_host: bool = False  # the node selectors also hold the local host (ClusterNetworkPolicy `nodes`)
    # CIDR peers (toCIDR/CIDRSet, ipBlock, networks): they match a pod only under policy-cidr-match-mode pods.
    cidrs: tuple[CidrRule, ...] = ()
    cidr_unresolved: str = ""  # a CIDR peer whose ranges are not known here (cidrGroupRef, toGroups)

    def match(self, identity: Mapping[str, str], namespace: str, *,
              version: Version | None = None, ranges: Sequence[str] | None = None) -> tuple[Match, str]:
        """Whether a pod with `identity` in `namespace` is a peer, and which part decided it.
        `version` (the agent's, None when unknown) settles what differs between releases; `ranges` are
        where the pod's address lies when the agent matches CIDR peers against pods (None: it does not)."""
        if self.wildcard:
            return "yes", "any peer (no L3 selector)"
        found: tuple[Match, str] = ("no", self.never or "no peer selector matches")
        for selector in self.selectors:
            got = selector.match(identity, namespace, version=version)
            if got == "yes":
                crossing = selector.scope_uncertain and selector.namespace not in (None, namespace)
                note = " (it names namespace labels, so Cilium >= 1.16 leaves it unscoped)" if crossing else ""
                return "yes", f"peer selector {selector}{note}"
            if got == "maybe":
                found = ("maybe", f"peer selector {selector} names namespace labels: Cilium before 1.16 also "
                         "scopes it to the policy's namespace, 1.16 and later do not, and the version is not known")
        for entity in self.entities:
            got = ENTITY_MATCHES_POD.get(entity, "no")
            if entity == "cluster-mesh" and version is not None and version[:2] >= CLUSTER_MESH_ENTITY_SINCE:
                got = "yes"
            if got == "yes":
                return "yes", f"entity {entity}"
            if got == "maybe":
                found = ("maybe", f"entity {entity}: membership is not defined precisely enough to evaluate")
        if ranges is not None and (self.cidrs or self.cidr_unresolved):
            got, why = self._match_cidrs(ranges)
            if got == "yes":
                return got, why
            if got == "maybe":
                found = (got, why)
        if self.maybe:
            found = ("maybe", self.maybe)
        return found

    def _match_cidrs(self, ranges: Sequence[str]) -> tuple[Match, str]:
        """policy-cidr-match-mode pods: the CIDR peers against where the pod's address lies."""
        shown = ", ".join(str(c) for c in self.cidrs)
        where = ", ".join(ranges) if ranges else "not known (no pod CIDRs on the zone's nodes)"
        got = cidrs.match_ranges(ranges, self.cidrs) if self.cidrs else "no"
        if got == "yes":
            return "yes", (f"CIDR peer {shown} holds every address the pod can get ({where}; "
                           "policy-cidr-match-mode pods)")
        if self.cidr_unresolved:
            return "maybe", f"{self.cidr_unresolved}: under policy-cidr-match-mode pods it may hold the pod"
        if got == "maybe":
            return "maybe", (f"CIDR peer {shown} holds only part of (or cannot be compared with) the addresses the pod "
                             f"can get: {where} (policy-cidr-match-mode pods)")
        return "no", f"CIDR peer {shown} holds none of the pod's addresses ({where})"

    def match_node(self, node: str, *, pod_selectors: bool = True, cidr_nodes: bool = False) -> tuple[Match, str]:
        """Whether a hostNetwork pod's traffic, carrying the `node` identity (host | remote-node),
        is a peer. `pod_selectors=False` for a NetworkPolicy: its podSelector / namespaceSelector
        peers select pods, never node traffic (§8); its missing `from`/`to` is the true wildcard.
        `cidr_nodes`: policy-cidr-match-mode nodes, where CIDR peers match node addresses, which the
        snapshot does not hold."""
        if self.wildcard:
            return "yes", "any peer (no L3 selector)"
        found: tuple[Match, str] = ("no", f"no peer of this entry selects entity {node}")
        for selector in self.selectors:
            if not pod_selectors:
                continue
            got, why = selector.match_node(node)
            if got == "yes":
                return "yes", why
            if got == "maybe":
                found = ("maybe", why)
        for entity in self.entities:
            got = entity_matches_node(entity, node)
            if got == "yes":
                return "yes", f"entity {entity}"
            if got == "maybe":
                found = ("maybe", f"entity {entity}: whether it holds entity {node} of this node is not known "
                          "(a node running kube-apiserver; cluster-mesh membership)")
        # fromNodes/toNodes select remote nodes by their labels; current Cilium ANDs reserved:remote-node,
        # so the local host is never one of them (§4.7).
        usable = [s for s in self.nodes if not s.broken]
        if (node == "remote-node" or self.nodes_with_host) and usable:
            if any(not s.requirements for s in usable):
                return "yes", "node selector {} (every remote node)"
            found = ("maybe", f"node selector {usable[0]}: the nodes the pods run on are not known")
        if cidr_nodes and (self.cidrs or self.cidr_unresolved):
            found = ("maybe", f"CIDR peer {self}: under policy-cidr-match-mode nodes it may hold the address of "
                              f"the node behind entity {node}, which the snapshot does not tell")
        if self.maybe:
            found = ("maybe", self.maybe)
        return found

    def __str__(self) -> str:
        if self.wildcard:
            return "any peer"
        parts = [str(s) for s in self.selectors] + [f"entity {e}" for e in self.entities]
        if self.never:
            parts.append(self.never)
        if self.maybe:
            parts.append(self.maybe)
        return " or ".join(parts) if parts else "nothing"


@dataclass(frozen=True)
class Entry:
    """One allow or deny entry: it decides a flow iff the peer matches and the port is covered."""

    path: str  # e.g. "specs[1].egress[0]", "ingressDeny[0]", "ingress[2]" (KNP)
    deny: bool
    peers: Peers
    ports: tuple[PortSpec, ...] | None  # None: every port of every protocol; (): none (ICMP only)
    conditions: tuple[str, ...] = ()  # L7 / authentication / listener: the allow is conditional
    # ClusterNetworkPolicy only: its tier, the entry's precedence inside it (spec.priority + rule
    # index / 100, lower first, as pkg/k8s ParseClusterNetworkPolicy computes it) and a Pass action
    # (skip the rest of the tier). CNP/CCNP/KNP entries are all Normal, priority 0.
    tier: Tier = "Normal"
    priority: float = 0.0
    passes: bool = False
    label: str = ""  # how reasons name it: `tier Admin, priority 10, rule "deny-b"`

    def describe_ports(self) -> str:
        if self.ports is None:
            return "all ports"
        return ", ".join(str(p) for p in self.ports) if self.ports else "ICMP only"


@dataclass(frozen=True)
class Rule:
    """One subject selector with its entries: an entry of `spec`/`specs[]`, or a whole KNP.

    `uncertain` is non-empty when the rule's effect cannot be known (its policy is invalid, uses
    a version-dependent or unsupported feature); such a rule only makes the sides it may
    affect (`directions`) `unknown`.
    """

    policy: str  # "ns/name" or "name"
    kind: str
    path: str  # "spec", "specs[1]"
    subject: Selector | None  # None: unknown (unparsable) — may select any pod in scope
    namespace: str | None  # pods must be in this namespace to be selected (CNP, KNP); None: any
    ingress: tuple[Entry, ...] = ()
    egress: tuple[Entry, ...] = ()
    enforces: frozenset[Direction] = frozenset()  # directions it switches into default-deny
    directions: frozenset[Direction] = frozenset()  # directions it has entries (or enforcement) in
    uncertain: str = ""

    def entries(self, direction: Direction) -> tuple[Entry, ...]:
        return self.ingress if direction == "ingress" else self.egress

    def selects(self, identity: Mapping[str, str], namespace: str) -> bool:
        if self.namespace is not None and self.namespace != namespace:
            return False
        return self.subject is None or self.subject.matches(identity)


@dataclass(frozen=True)
class CompiledPolicy:
    ref: str
    kind: str
    rules: tuple[Rule, ...]
    problems: tuple[str, ...] = ()  # "invalid: ...", "unsupported: ...", "warning: ..."
