"""Kubernetes ClusterNetworkPolicy (`policy.networking.k8s.io/v1alpha2`) → compiled `Rule`s, as Cilium
v1.20 translates it (pkg/k8s/cluster_network_policy.go ParseClusterNetworkPolicy).

Owns: the subject (`namespaces` or `pods`), peers (`namespaces`, `pods`; egress also `nodes`,
`networks`, `domainNames`), `protocols`, the tier (`Admin` | `Baseline`), each rule's precedence
and its action (Accept | Deny | Pass), and the CRD's validation (an object the apiserver would refuse
cannot exist, so it is `unknown`, never absent).
Must not: decide verdicts (verdicts.py walks the tiers), or raise on any input.

What Cilium's translation does, and so what this does (sigs.k8s.io/network-policy-api v0.2.0 for the
field meanings):

- Every entry of rule `i` of a direction has precedence `spec.priority + i/100` in its tier: lower
  first, so the first rule written wins inside one policy, and a lower `priority` wins across them.
- No ClusterNetworkPolicy entry turns default-deny on (`DefaultDeny = false`): a pod selected only
  by these policies keeps every flow no rule decides.
- A `pods` peer selects pods by their labels AND their namespace's labels; a `namespaces` peer every
  pod of the selected namespaces; an empty selector selects every namespace. Cilium adds
  `io.cilium.k8s.policy.cluster = <local cluster>` to a `pods` peer, which every local pod carries,
  so it is left out here (one cluster is modelled).
- A missing or empty `from`/`to` matches every peer (the CRD requires at least one; Cilium's code
  reads it so). A protocol without `destinationPort` covers every port of that protocol; a
  `destinationNamedPort` any protocol of the destination's port of that name.
- `networks` are CIDR peers: unlike the API text ("cluster-internal traffic will be checked against
  the rule as well"), Cilium's CIDR selectors never match a Cilium-managed pod under the default
  `policy-cidr-match-mode`. `domainNames` (Accept only) never match a pod, but add an allow of DNS to
  `k8s-app=kube-dns` on its `dns` / `dns-tcp` ports through the DNS proxy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.models.cluster import PolicyObject
from app.models.labels import CILIUM_NAMESPACE_LABEL, CILIUM_NAMESPACE_LABELS_PREFIX
from app.policy import cidrs
from app.policy.ports import MAX_PORT, PortSpec, parse_port_name
from app.policy.rules import DIRECTIONS, CompiledPolicy, Direction, Entry, Peers, Rule, Tier
from app.policy.selectors import InvalidPolicy, PeerSelector, Requirement, Selector, parse_selector

API_VERSION = "policy.networking.k8s.io/v1alpha2"
KIND = "ClusterNetworkPolicy"
TIERS: Mapping[str, Tier] = {"Admin": "Admin", "Baseline": "Baseline"}
ACTIONS = ("Accept", "Deny", "Pass")
MAX_PRIORITY = 1000
MAX_RULES = 25  # per direction, peers per rule, protocols per rule (CRD MaxItems)
PEER_FIELD: Mapping[Direction, str] = {"ingress": "from", "egress": "to"}
PEER_KINDS: Mapping[Direction, tuple[str, ...]] = {
    "ingress": ("namespaces", "pods"),
    "egress": ("namespaces", "pods", "nodes", "networks", "domainNames"),
}
PROTOCOLS = {"tcp": "TCP", "udp": "UDP", "sctp": "SCTP"}
NEVER_A_POD = {
    "networks": "networks: a CIDR peer never matches a Cilium-managed pod (default policy-cidr-match-mode)",
    "domainNames": "domainNames: an FQDN peer never matches a pod",
    "nodes": "nodes: a node peer selects node identities, never a regular pod",
}
# The DNS allow Cilium adds beside a domainNames peer (pkg/k8s kcnpParseFQDNSelectors' caller).
DNS_SELECTOR = Selector((Requirement("any", "k8s-app", "In", frozenset({"kube-dns"})),))
DNS_PORTS = (PortSpec("ANY", name="dns"), PortSpec("ANY", name="dns-tcp"))


def compile_kcnp(policy: PolicyObject) -> CompiledPolicy:
    """Compile one ClusterNetworkPolicy; never raises."""
    body: Mapping[str, Any] = policy.body
    warnings: list[str] = []
    unsupported: list[str] = []
    if policy.api_version != API_VERSION:
        unsupported.append(f"apiVersion {policy.api_version!r} is not {API_VERSION}, the version Cilium 1.20 reads")
    unknown_top = sorted(set(map(str, body)) - {"apiVersion", "kind", "metadata", "spec", "status"})
    if unknown_top:
        unsupported.append(f"unknown field(s) {', '.join(unknown_top)}")
    spec = body.get("spec")
    try:
        rule = _compile(policy, spec, warnings, unsupported)
    except InvalidPolicy as e:
        why = f"invalid (the apiserver rejects it): {e}"
        return CompiledPolicy(policy.ref, KIND, (_shadow(policy, spec, why),), (why, *warnings))
    if unsupported:
        why = "unsupported: " + "; ".join(unsupported)
        return CompiledPolicy(policy.ref, KIND, (_shadow(policy, spec, why),), (why, *warnings))
    return CompiledPolicy(policy.ref, KIND, (rule,) if rule.directions else (), tuple(warnings))


def _compile(policy: PolicyObject, spec: Any, warnings: list[str], unsupported: list[str]) -> Rule:
    if not isinstance(spec, Mapping):
        raise InvalidPolicy("spec must be a mapping")
    unknown = sorted(set(map(str, spec)) - {"tier", "priority", "subject", "ingress", "egress"})
    if unknown:
        unsupported.append(f"unknown spec field(s) {', '.join(unknown)} (the apiserver would prune them)")
    raw_tier = spec.get("tier")
    tier = TIERS.get(raw_tier) if isinstance(raw_tier, str) else None
    if tier is None:
        raise InvalidPolicy(f"spec.tier: {spec.get('tier')!r} is not Admin or Baseline")
    priority = spec.get("priority")
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= MAX_PRIORITY:
        raise InvalidPolicy(f"spec.priority: {priority!r} is not an integer 0-{MAX_PRIORITY}")
    subject = _subject(spec.get("subject"), unsupported)
    entries: dict[Direction, list[Entry]] = {"ingress": [], "egress": []}
    for direction in DIRECTIONS:
        raw_rules = _list(spec.get(direction), f"spec.{direction}")
        if len(raw_rules) > MAX_RULES:
            raise InvalidPolicy(f"spec.{direction}: {len(raw_rules)} rules, at most {MAX_RULES}")
        for i, raw in enumerate(raw_rules):
            where = f"{direction}[{i}]"
            entries[direction] += _rule(raw, where, direction, tier, priority + i / 100, warnings, unsupported)
    directions = frozenset(d for d in DIRECTIONS if spec.get(d))
    return Rule(policy.ref, KIND, "spec", subject, None, ingress=tuple(entries["ingress"]),
                egress=tuple(entries["egress"]), enforces=frozenset(), directions=directions)


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidPolicy(f"{where}: must be a list")
    return value


def _one_of(raw: Any, where: str, allowed: tuple[str, ...], unsupported: list[str]) -> tuple[str, Any]:
    """The one field set in a `MaxProperties=1, MinProperties=1` object (subject, peer, protocol)."""
    if not isinstance(raw, Mapping):
        raise InvalidPolicy(f"{where}: must be a mapping with one of {', '.join(allowed)}")
    unknown = sorted(set(map(str, raw)) - set(allowed))
    if unknown:
        unsupported.append(f"{where}: unknown field(s) {', '.join(unknown)} (a newer API version?)")
    present = [k for k in allowed if k in raw]
    if len(present) != 1 and not unknown:
        raise InvalidPolicy(f"{where}: needs exactly one of {', '.join(allowed)}")
    if not present:
        return "", None
    return present[0], raw[present[0]]


def _namespaces(raw: Any, where: str) -> Selector:
    """A namespace selector as pod identity requirements (namespace-label keys); `{}`: every namespace."""
    selector = parse_selector(raw if raw is not None else {}, where, default_source="k8s",
                              key_prefix=CILIUM_NAMESPACE_LABELS_PREFIX)
    if not selector.requirements:
        return selector.with_requirement(Requirement("k8s", CILIUM_NAMESPACE_LABEL, "Exists"))
    return selector


def _pods(raw: Any, where: str) -> Selector:
    if not isinstance(raw, Mapping):
        raise InvalidPolicy(f"{where}: must be a mapping with namespaceSelector and podSelector")
    unknown = sorted(set(map(str, raw)) - {"namespaceSelector", "podSelector"})
    if unknown:
        raise InvalidPolicy(f"{where}: unknown field(s) {', '.join(unknown)}")
    pods = parse_selector(raw.get("podSelector") or {}, f"{where}.podSelector", default_source="k8s")
    namespaces = _namespaces(raw.get("namespaceSelector"), f"{where}.namespaceSelector")
    return Selector(pods.requirements + namespaces.requirements, pods.broken or namespaces.broken)


def _subject(raw: Any, unsupported: list[str]) -> Selector:
    name, value = _one_of(raw, "spec.subject", ("namespaces", "pods"), unsupported)
    if name == "namespaces":
        return _namespaces(value, "spec.subject.namespaces")
    if name == "pods":
        return _pods(value, "spec.subject.pods")
    return Selector()


def _rule(raw: Any, where: str, direction: Direction, tier: Tier, priority: float,
          warnings: list[str], unsupported: list[str]) -> list[Entry]:
    if not isinstance(raw, Mapping):
        raise InvalidPolicy(f"{where}: must be a mapping")
    field = PEER_FIELD[direction]
    unknown = sorted(set(map(str, raw)) - {"name", "action", field, "protocols"})
    if unknown:
        unsupported.append(f"{where}: unknown field(s) {', '.join(unknown)}")
    action = raw.get("action")
    if not isinstance(action, str) or action not in ACTIONS:
        raise InvalidPolicy(f"{where}.action: {action!r} is not one of {', '.join(ACTIONS)}")
    name = raw.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > 100):
        raise InvalidPolicy(f"{where}.name: must be a string of at most 100 characters")
    label = f"tier {tier}, priority {priority:g}" + (f", rule {name!r}" if name else "") + f": {action}"
    ports = _protocols(raw.get("protocols"), f"{where}.protocols", unsupported)
    raw_peers = _list(raw.get(field), f"{where}.{field}")
    if len(raw_peers) > MAX_RULES:
        raise InvalidPolicy(f"{where}.{field}: {len(raw_peers)} peers, at most {MAX_RULES}")

    def entry(peers: Peers) -> Entry:
        return Entry(where, action == "Deny", peers, ports, (), tier, priority, action == "Pass", label)

    if not raw_peers:
        warnings.append(f"warning: {where}.{field} is empty: the CRD requires a peer; Cilium reads it as every peer")
        return [entry(Peers(wildcard=True))]
    out: list[Entry] = []
    for j, peer in enumerate(raw_peers):
        at = f"{where}.{field}[{j}]"
        kind, value = _one_of(peer, at, PEER_KINDS[direction], unsupported)
        if kind == "domainNames":
            if action != "Accept":
                raise InvalidPolicy(f"{at}: domainNames is only supported for action Accept (Cilium rejects it)")
            _domain_names(value, at)
            out.append(Entry(where, False, Peers(selectors=(PeerSelector(DNS_SELECTOR),)), DNS_PORTS,
                             ("L7 DNS rules: DNS requests go through the DNS proxy and only the listed names "
                              "are allowed",), tier, priority, False, label))
        out.append(entry(_peer(kind, value, at, warnings)))
    return out


def _peer(kind: str, value: Any, at: str, warnings: list[str]) -> Peers:
    if kind == "namespaces":
        return Peers(selectors=(PeerSelector(_namespaces(value, f"{at}.namespaces")),))
    if kind == "pods":
        return Peers(selectors=(PeerSelector(_pods(value, f"{at}.pods")),))
    if kind == "nodes":
        nodes = parse_selector(value if value is not None else {}, f"{at}.nodes", default_source="node")
        warnings.append(f"warning: {at}.nodes needs enable-node-selector-labels (else Cilium rejects the policy) "
                        "and never matches a pod")
        return Peers(never=NEVER_A_POD["nodes"], nodes=(nodes,), nodes_with_host=True)
    if kind == "networks":
        rules = []
        for i, cidr in enumerate(_list(value, f"{at}.networks")):
            try:
                rules.append(cidrs.parse_rule(str(cidr)))
            except ValueError as e:
                raise InvalidPolicy(f"{at}.networks[{i}]: {cidr!r} is not a CIDR") from e
        return Peers(never=NEVER_A_POD["networks"], cidrs=tuple(rules))
    if kind == "domainNames":
        return Peers(never=NEVER_A_POD["domainNames"])
    return Peers(never="a peer of a kind this version does not know")  # unsupported already recorded


def _domain_names(value: Any, at: str) -> None:
    names = _list(value, f"{at}.domainNames")
    if not names or not all(isinstance(n, str) and n for n in names):
        raise InvalidPolicy(f"{at}.domainNames: must be a non-empty list of domain names")


def _protocols(raw: Any, where: str, unsupported: list[str]) -> tuple[PortSpec, ...] | None:
    """`protocols`: None (every port of every protocol) when absent; one PortSpec per item."""
    items = _list(raw, where)
    if raw is not None and not items:
        raise InvalidPolicy(f"{where}: must hold at least one protocol when set")
    if len(items) > MAX_RULES:
        raise InvalidPolicy(f"{where}: {len(items)} protocols, at most {MAX_RULES}")
    if not items:
        return None
    specs = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        kind, value = _one_of(item, at, ("tcp", "udp", "sctp", "destinationNamedPort"), unsupported)
        if not kind:
            continue
        if kind == "destinationNamedPort":
            if not isinstance(value, str) or not value:
                raise InvalidPolicy(f"{at}.destinationNamedPort: must be a port name")
            specs.append(PortSpec("ANY", name=parse_port_name(value, f"{at}.destinationNamedPort")))
            continue
        specs.append(_destination_port(value, f"{at}.{kind}", PROTOCOLS[kind]))
    return tuple(specs)


def _destination_port(raw: Any, where: str, protocol: str) -> PortSpec:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping) or set(map(str, raw)) - {"destinationPort"}:
        raise InvalidPolicy(f"{where}: must be a mapping with an optional destinationPort")
    port = raw.get("destinationPort")
    if port is None:
        return PortSpec(protocol)  # every port of the protocol
    if not isinstance(port, Mapping) or len(port) != 1 or set(map(str, port)) - {"number", "range"}:
        raise InvalidPolicy(f"{where}.destinationPort: needs exactly one of number, range")
    if "number" in port:
        number = _port_number(port["number"], f"{where}.destinationPort.number")
        return PortSpec(protocol, number, number)
    span = port["range"]
    if not isinstance(span, Mapping) or set(map(str, span)) != {"start", "end"}:
        raise InvalidPolicy(f"{where}.destinationPort.range: needs start and end")
    start = _port_number(span["start"], f"{where}.destinationPort.range.start")
    end = _port_number(span["end"], f"{where}.destinationPort.range.end")
    if not start < end:
        raise InvalidPolicy(f"{where}.destinationPort.range: start {start} must be less than end {end}")
    return PortSpec(protocol, start, end)


def _port_number(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PORT:
        raise InvalidPolicy(f"{where}: {value!r} is not a port 1-{MAX_PORT}")
    return value


def _shadow(policy: PolicyObject, spec: Any, why: str) -> Rule:
    """A policy that cannot be evaluated: it may select any pod its subject may, in both directions."""
    subject: Selector | None = None
    if isinstance(spec, Mapping):
        try:
            subject = _subject(spec.get("subject"), [])
        except InvalidPolicy:
            subject = None
    return Rule(policy.ref, KIND, "spec", subject, None, directions=frozenset(DIRECTIONS), uncertain=why)
