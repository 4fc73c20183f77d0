"""CiliumNetworkPolicy / CiliumClusterwideNetworkPolicy → compiled `Rule`s (cilium-semantics.md §2-§5, §9).

Owns: reading `spec` + `specs[]`, the validation Cilium applies (an invalid object is not
enforced at all, §9.3), the namespace scoping of subjects and peers, entities, CIDR/node/FQDN
peers (never a pod), `toPorts` with L7 parts (conditional allows), `enableDefaultDeny`.
Must not: decide verdicts, or raise on any input — every problem becomes a stated reason.

Policies whose effect cannot be known become *uncertain* rules: invalid ones (Cilium rejects
them, but they were clearly meant to apply), `fromRequires`/`toRequires` (enforced up to 1.18,
rejected from 1.19), fields the schema does not know, an unknown apiVersion.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.models.cluster import CIDRGroup, PolicyObject
from app.models.labels import CILIUM_NAMESPACE_LABEL
from app.policy import cidrs as cidrs_mod
from app.policy.cidrs import CidrRule
from app.policy.ports import MAX_PORTS_PER_RULE, PortSpec, parse_cilium_port
from app.policy.rules import DIRECTIONS, ENTITY_MATCHES_POD, CompiledPolicy, Direction, Entry, Peers, Rule
from app.policy.selectors import InvalidPolicy, Requirement, Selector, parse_selector, scope_peer

API_VERSION = "cilium.io/v2"
CNP = "CiliumNetworkPolicy"
CCNP = "CiliumClusterwideNetworkPolicy"
RULE_FIELDS = frozenset({
    "endpointSelector", "nodeSelector", "ingress", "ingressDeny", "egress", "egressDeny",
    "enableDefaultDeny", "labels", "description", "log",
})
L3_FIELDS: Mapping[Direction, tuple[str, ...]] = {
    "ingress": ("fromEndpoints", "fromCIDR", "fromCIDRSet", "fromEntities", "fromGroups", "fromNodes"),
    "egress": ("toEndpoints", "toCIDR", "toCIDRSet", "toEntities", "toServices", "toFQDNs", "toGroups", "toNodes"),
}
REQUIRES: Mapping[Direction, str] = {"ingress": "fromRequires", "egress": "toRequires"}
PORT_RULE_FIELDS = frozenset({"ports", "rules", "terminatingTLS", "originatingTLS", "serverNames", "listener"})
NEVER_A_POD = {
    "CIDR": "a CIDR peer never matches a Cilium-managed pod (default policy-cidr-match-mode)",
    "CIDRSet": "a CIDR peer never matches a Cilium-managed pod (default policy-cidr-match-mode)",
    "Groups": "a cloud security-group peer is a CIDR peer and never matches a Cilium-managed pod",
    "Nodes": "a node peer selects node identities, never a regular pod",
    "FQDNs": "toFQDNs never matches a pod (IPs of cluster-managed endpoints are not applied)",
}


class UnsupportedPolicy(Exception):
    """The policy uses something whose effect cannot be evaluated."""


@dataclass
class _Context:
    policy: PolicyObject
    namespace: str | None  # CNP: the policy namespace (subject and peer scope); CCNP: None
    groups: Mapping[str, CIDRGroup] = field(default_factory=dict)  # CiliumCIDRGroups by name (cidrGroupRef)
    warnings: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)


def compile_cilium(policy: PolicyObject, groups: Mapping[str, CIDRGroup] | None = None) -> CompiledPolicy:
    """Compile one CNP/CCNP; never raises. `groups`: the snapshot's CiliumCIDRGroups, for `cidrGroupRef`."""
    ctx = _Context(policy, policy.namespace if policy.kind == CNP else None, groups or {})
    body: Mapping[str, Any] = policy.body
    try:
        raw_rules = _raw_rules(body)
        rules = [r for path, raw in raw_rules if (r := _compile_rule(raw, path, ctx)) is not None]
    except InvalidPolicy as e:
        why = f"invalid (Cilium rejects it and does not enforce it): {e}"
        return CompiledPolicy(policy.ref, policy.kind, _shadows(body, ctx, why), (why, *ctx.warnings))
    if policy.api_version != API_VERSION:
        ctx.unsupported.append(f"apiVersion {policy.api_version!r} is not {API_VERSION}")
    unknown_top = sorted(set(body) - {"apiVersion", "kind", "metadata", "spec", "specs", "status"})
    if unknown_top:
        ctx.unsupported.append(f"unknown field(s) {', '.join(unknown_top)}")
    if ctx.unsupported:
        why = "unsupported: " + "; ".join(ctx.unsupported)
        return CompiledPolicy(policy.ref, policy.kind, _shadows(body, ctx, why), (why, *ctx.warnings))
    return CompiledPolicy(policy.ref, policy.kind, tuple(rules), tuple(ctx.warnings))


def _raw_rules(body: Mapping[str, Any]) -> list[tuple[str, Any]]:
    spec, specs = body.get("spec"), body.get("specs")
    if spec is None and specs is None:
        raise InvalidPolicy("it has neither spec nor specs")
    out: list[tuple[str, Any]] = []
    if spec is not None:
        out.append(("spec", spec))
    if specs is not None:
        if not isinstance(specs, list):
            raise InvalidPolicy("specs must be a list of rules")
        out += [(f"specs[{i}]", raw) for i, raw in enumerate(specs)]
    return out


def _entry_path(rule_path: str, name: str) -> str:
    """Entries of `spec` are named without a prefix ("egress[0]"), of specs[i] with it."""
    return name if rule_path == "spec" else f"{rule_path}.{name}"


def _compile_rule(raw: Any, path: str, ctx: _Context) -> Rule | None:
    if not isinstance(raw, Mapping):
        raise InvalidPolicy(f"{path}: a rule must be a mapping")
    unknown = sorted(set(map(str, raw)) - RULE_FIELDS)
    if unknown:
        ctx.unsupported.append(f"{path}: unknown field(s) {', '.join(unknown)} (the apiserver would prune them)")
    endpoint_selector, node_selector = raw.get("endpointSelector"), raw.get("nodeSelector")
    if (endpoint_selector is None) == (node_selector is None):
        raise InvalidPolicy(f"{path}: needs exactly one of endpointSelector and nodeSelector")
    if node_selector is not None and ctx.policy.kind == CNP:
        raise InvalidPolicy(f"{path}: a CiliumNetworkPolicy cannot use nodeSelector")
    names = ("ingress", "ingressDeny", "egress", "egressDeny")
    sections = {name: _list(raw.get(name), f"{path}.{name}") for name in names}
    if not any(sections.values()):
        raise InvalidPolicy(f"{path}: has no ingress, ingressDeny, egress or egressDeny entries (rejected since 1.17)")
    default_deny = _enable_default_deny(raw.get("enableDefaultDeny"), path)
    entries: dict[Direction, list[Entry]] = {"ingress": [], "egress": []}
    for direction in DIRECTIONS:
        for deny in (False, True):
            name = direction + ("Deny" if deny else "")
            for i, item in enumerate(sections[name]):
                entries[direction] += _compile_entry(item, _entry_path(path, f"{name}[{i}]"), direction, deny, ctx)
    if node_selector is not None:
        parse_selector(node_selector, f"{path}.nodeSelector")
        ctx.warnings.append(f"warning: {path} is a host policy (nodeSelector): it applies to nodes, not pods")
        return None
    has = frozenset(d for d in DIRECTIONS if sections[d] or sections[d + "Deny"])
    return Rule(
        policy=ctx.policy.ref,
        kind=ctx.policy.kind,
        path=path,
        subject=_subject(endpoint_selector, path, ctx),
        namespace=ctx.namespace,
        ingress=tuple(entries["ingress"]),
        egress=tuple(entries["egress"]),
        enforces=frozenset(d for d in has if default_deny.get(d, True)),
        directions=has,
    )


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidPolicy(f"{where}: must be a list")
    return value


def _enable_default_deny(raw: Any, path: str) -> dict[str, bool]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or set(raw) - {"ingress", "egress"}:
        raise InvalidPolicy(f"{path}.enableDefaultDeny: must be a mapping with ingress/egress booleans")
    out: dict[str, bool] = {}
    for key, value in raw.items():
        if value is None:
            continue
        if not isinstance(value, bool):
            raise InvalidPolicy(f"{path}.enableDefaultDeny.{key}: must be true or false")
        out[str(key)] = value
    return out


def _subject(raw: Any, path: str, ctx: _Context) -> Selector:
    """endpointSelector; a CNP's is ANDed with its namespace, replacing a `k8s:` namespace key (§2.2)."""
    if ctx.namespace is None:
        return parse_selector(raw, f"{path}.endpointSelector")
    if isinstance(raw, Mapping) and isinstance(raw.get("matchLabels"), Mapping):
        labels = dict(raw["matchLabels"])
        if labels.pop(f"k8s:{CILIUM_NAMESPACE_LABEL}", None) is not None:
            ctx.warnings.append(f"warning: {path}.endpointSelector: the k8s: namespace key is replaced by the "
                                f"policy's namespace {ctx.namespace}")
        raw = {**raw, "matchLabels": labels}
    selector = parse_selector(raw, f"{path}.endpointSelector")
    if selector.mentions(CILIUM_NAMESPACE_LABEL):
        ctx.warnings.append(f"warning: {path}.endpointSelector names {CILIUM_NAMESPACE_LABEL}; a CNP only ever "
                            f"selects pods of its own namespace {ctx.namespace}")
    return selector.with_requirement(Requirement("k8s", CILIUM_NAMESPACE_LABEL, "In", frozenset({ctx.namespace})))


def _compile_entry(raw: Any, path: str, direction: Direction, deny: bool, ctx: _Context) -> list[Entry]:
    if not isinstance(raw, Mapping):
        raise InvalidPolicy(f"{path}: must be a mapping")
    l3_fields = tuple(f for f in L3_FIELDS[direction] if not (deny and f == "toFQDNs"))
    known = {*l3_fields, REQUIRES[direction], "toPorts", "icmps"} | (set() if deny else {"authentication"})
    unknown = sorted(set(map(str, raw)) - known)
    if unknown:
        ctx.unsupported.append(f"{path}: unknown field(s) {', '.join(unknown)}")
    present = [f for f in l3_fields if raw.get(f)]
    if len(present) > 1:
        raise InvalidPolicy(f"{path}: combines {' and '.join(present)}; one entry may use only one L3 peer field")
    if raw.get(REQUIRES[direction]):
        _list(raw[REQUIRES[direction]], f"{path}.{REQUIRES[direction]}")
        ctx.unsupported.append(f"{path}: {REQUIRES[direction]} is enforced up to Cilium 1.18 and rejected from 1.19 "
                               "(removed), so its effect depends on the Cilium version")
    to_ports = _list(raw.get("toPorts"), f"{path}.toPorts")
    icmps = _list(raw.get("icmps"), f"{path}.icmps")
    if to_ports and icmps:
        raise InvalidPolicy(f"{path}: icmps and toPorts cannot be combined in one entry")
    if all(raw.get(f) is None for f in l3_fields):
        peers = Peers(wildcard=bool(to_ports or icmps))  # nil L3 + L4 = every peer; `{}` = nothing
    elif present:
        peers = _peers(present[0], raw[present[0]], f"{path}.{present[0]}", ctx)
    else:
        peers = Peers(never="an empty peer list selects nothing")
    conditions = _authentication(raw.get("authentication"), path) if not deny else ()
    if icmps:
        return [Entry(path, deny, peers, (), conditions)]
    if not to_ports:
        return [Entry(path, deny, peers, None, conditions)]
    out = []
    for i, port_rule in enumerate(to_ports):
        specs, extra = _port_rule(port_rule, f"{path}.toPorts[{i}]", direction, deny, ctx)
        out.append(Entry(path, deny, peers, specs, conditions + extra))
    return out


def _peers(name: str, raw: Any, where: str, ctx: _Context) -> Peers:
    items = _list(raw, where)
    if name in ("fromEndpoints", "toEndpoints"):
        selectors = [parse_selector(s, f"{where}[{i}]") for i, s in enumerate(items)]
        for i, s in enumerate(selectors):
            if s.broken:
                ctx.warnings.append(f"warning: {where}[{i}] matches nothing: {s.broken}")
        return Peers(selectors=tuple(scope_peer(s, policy_namespace=ctx.namespace) for s in selectors))
    if name in ("fromEntities", "toEntities"):
        for entity in items:
            if not isinstance(entity, str) or entity not in ENTITY_MATCHES_POD:
                raise InvalidPolicy(f"{where}: unknown entity {entity!r}")
        return Peers(entities=tuple(items))
    if name == "toServices":
        return Peers(maybe="toServices: a Service with a selector stands for its pods, which the snapshot "
                     "does not resolve")
    suffix = name.removeprefix("from").removeprefix("to")
    if suffix == "CIDR":
        rules = tuple(CidrRule(_network(cidr, where)) for cidr in items)
        return Peers(never=f"{name}: {NEVER_A_POD[suffix]}", cidrs=rules)
    if suffix == "CIDRSet":
        found = [rule for i, item in enumerate(items) for rule in _cidr_rule(item, f"{where}[{i}]", ctx)]
        selected = ("a cidrGroupSelector peer (the labels of CiliumCIDRGroups are not in the snapshot), or a "
                    "CiliumCIDRGroup range that does not parse")
        return Peers(never=f"{name}: {NEVER_A_POD[suffix]}", cidrs=tuple(r for r in found if r is not None),
                     cidr_unresolved=selected if None in found else "")
    if suffix == "Groups":
        return Peers(never=f"{name}: {NEVER_A_POD[suffix]}",
                     cidr_unresolved=f"{name}: cloud security-group addresses are not known here")
    if suffix == "Nodes":
        nodes = tuple(parse_selector(s, f"{where}[{i}]") for i, s in enumerate(items))
        ctx.warnings.append(f"warning: {where} needs enable-node-selector-labels (else Cilium rejects the policy) "
                            "and never matches a pod")
        return Peers(never=f"{name}: {NEVER_A_POD[suffix]}", nodes=nodes)
    return Peers(never=f"{name}: {NEVER_A_POD[suffix]}")


def _network(value: Any, where: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(str(value), strict=False)
    except ValueError as e:
        raise InvalidPolicy(f"{where}: {value!r} is not a CIDR") from e


def _cidr_rule(raw: Any, where: str, ctx: _Context) -> list[CidrRule | None]:
    """A CIDRRule's CIDRs: one, a referenced CiliumCIDRGroup's (none when it does not exist: Cilium then
    selects nothing), or [None] for a group selector, which cannot be resolved here."""
    if not isinstance(raw, Mapping):
        raise InvalidPolicy(f"{where}: must be a mapping with cidr, cidrGroupRef or cidrGroupSelector")
    chosen = [k for k in ("cidr", "cidrGroupRef", "cidrGroupSelector") if raw.get(k) is not None]
    if len(chosen) != 1:
        raise InvalidPolicy(f"{where}: needs exactly one of cidr, cidrGroupRef, cidrGroupSelector")
    if chosen[0] == "cidrGroupSelector":
        return [None]
    if chosen[0] == "cidrGroupRef":
        group = ctx.groups.get(str(raw["cidrGroupRef"]))
        out: list[CidrRule | None] = []
        for cidr in group.cidrs if group is not None else ():
            try:
                out.append(cidrs_mod.parse_rule(cidr))
            except ValueError:
                out.append(None)  # a range the operator would refuse: not known
        return out
    network = _network(raw["cidr"], f"{where}.cidr")
    excepts = []
    for j, exc in enumerate(_list(raw.get("except"), f"{where}.except")):
        sub = _network(exc, f"{where}.except[{j}]")
        if sub.version != network.version or not sub.subnet_of(network):  # type: ignore[arg-type]
            raise InvalidPolicy(f"{where}.except[{j}]: {exc} is not inside {raw['cidr']}")
        excepts.append(sub)
    return [CidrRule(network, tuple(excepts))]


def _authentication(raw: Any, path: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    mode = raw.get("mode") if isinstance(raw, Mapping) else None
    if mode not in ("disabled", "required", "test-always-fail"):
        raise InvalidPolicy(f"{path}.authentication.mode: must be disabled, required or test-always-fail")
    if mode == "disabled":
        return ()
    return (f"authentication mode {mode}: allowed only after mutual authentication, which cannot be evaluated",)


def _port_rule(
    raw: Any, where: str, direction: Direction, deny: bool, ctx: _Context
) -> tuple[tuple[PortSpec, ...] | None, tuple[str, ...]]:
    if not isinstance(raw, Mapping):
        raise InvalidPolicy(f"{where}: must be a mapping")
    allowed = {"ports"} if deny else PORT_RULE_FIELDS
    unknown = sorted(set(map(str, raw)) - allowed)
    if unknown:
        ctx.unsupported.append(f"{where}: field(s) {', '.join(unknown)} not supported here")
    ports = _list(raw.get("ports"), f"{where}.ports")
    if len(ports) > MAX_PORTS_PER_RULE:
        raise InvalidPolicy(f"{where}.ports: {len(ports)} ports, at most {MAX_PORTS_PER_RULE} are allowed")
    specs = tuple(parse_cilium_port(p, f"{where}.ports[{i}]") for i, p in enumerate(ports))
    conditions = _l7_conditions(raw, where, direction, specs)
    # NB: a port rule without ports (`{}`, `ports: []`) covers no port, it is not "all ports":
    # Cilium adds an L4 filter per listed port only (pkg/policy/rule.go mergeL4Filter).
    return specs, conditions


def _l7_conditions(
    raw: Mapping[str, Any], where: str, direction: Direction, specs: tuple[PortSpec, ...]
) -> tuple[str, ...]:
    conditions: list[str] = []
    rules = raw.get("rules")
    if rules is not None:
        if not isinstance(rules, Mapping):
            raise InvalidPolicy(f"{where}.rules: must be a mapping")
        kinds = [k for k, v in rules.items() if v]
        if "dns" in kinds and direction == "ingress":
            raise InvalidPolicy(f"{where}.rules.dns: DNS rules are only allowed on egress")
        if kinds and any(not s.name and s.first == 0 for s in specs):
            raise InvalidPolicy(f"{where}: L7 rules cannot be used with port 0")
        if any(k != "dns" for k in kinds) and any(s.protocol not in ("TCP", "ANY") for s in specs):
            raise InvalidPolicy(f"{where}: L7 rules other than DNS need a TCP port")
        if not _allows_every_request(rules):
            conditions.append(f"L7 rules ({', '.join(kinds)}): traffic goes through the proxy and only requests "
                              "that match them pass")
    if raw.get("listener") is not None:
        if direction == "ingress" or rules:
            raise InvalidPolicy(f"{where}.listener: only on egress, and not together with L7 rules")
        conditions.append("a custom Envoy listener handles this traffic")
    if any(raw.get(k) for k in ("terminatingTLS", "originatingTLS", "serverNames")):
        conditions.append("TLS interception / SNI matching decides this traffic")
    return tuple(conditions)


def _allows_every_request(rules: Mapping[str, Any]) -> bool:
    """An `http: [{}]` rule or `dns: [{matchPattern: "*"}]` lets every request through."""
    kinds = {k: v for k, v in rules.items() if v}
    if set(kinds) - {"http", "dns"} or not all(isinstance(v, list) for v in kinds.values()):
        return False
    http_ok = "http" not in kinds or any(isinstance(r, Mapping) and not r for r in kinds["http"])
    dns_ok = "dns" not in kinds or any(isinstance(r, Mapping) and r.get("matchPattern") == "*" for r in kinds["dns"])
    return bool(kinds) and http_ok and dns_ok


def _shadows(body: Mapping[str, Any], ctx: _Context, why: str) -> tuple[Rule, ...]:
    """Best-effort subjects of a policy that cannot be evaluated, marked uncertain with `why`."""
    try:
        raw_rules = _raw_rules(body)
    except InvalidPolicy:
        raw_rules = [("spec", None)]
    out = []
    for path, raw in raw_rules:
        directions = frozenset(DIRECTIONS)
        subject: Selector | None = None
        if isinstance(raw, Mapping):
            if raw.get("nodeSelector") is not None and raw.get("endpointSelector") is None:
                continue  # a host policy: never selects a pod
            directions = frozenset(d for d in DIRECTIONS if raw.get(d) or raw.get(d + "Deny"))
            if not directions:
                continue  # no entries: it affects nothing on any Cilium version
            try:
                subject = _subject(raw.get("endpointSelector"), path, _Context(ctx.policy, ctx.namespace))
            except InvalidPolicy:
                subject = None
        out.append(Rule(ctx.policy.ref, ctx.policy.kind, path, subject, ctx.namespace,
                        directions=directions, uncertain=why))
    return tuple(out)
