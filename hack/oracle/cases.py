"""The cases the oracle comparison runs: the test suite's reach tables and a seeded generator.

A case is a plain dict in the oracle's wire shape (hack/oracle/main.go `Case`): `name`,
`policies` (stored objects), `src` / `dst` (namespace, labels, namespaceLabels,
serviceAccountName, containerPorts), `ports` (the destination ports to probe), `protocol`,
`settings` (policyEnforcement, clusterName, labels), plus `first` / `last` (the port range
topoguard is asked about) and `features` (tags the known-differences file may name).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
NS, OTHER = "ml-demo", "other"


# --- the test suite's tables ------------------------------------------------------------------


def table_cases() -> list[dict[str, Any]]:
    """Every reach table case of the test suite that a Cilium endpoint pair can express."""
    cases = [*_documented_cases(), *_verdict_table_cases()]
    for case in cases:
        case["features"] = sorted(set(case["features"]) | policy_features(case["policies"]))
    return cases


def _documented_cases() -> list[dict[str, Any]]:
    path = ROOT / "tests" / "unit" / "policy" / "data" / "cilium-cases.yaml"
    out = []
    for case in yaml.safe_load(path.read_text()):
        config = case.get("config") or {}
        port = int(case["port"])
        out.append({
            "name": f"table cilium-cases {case['name']}",
            "policies": case.get("policies") or [],
            "src": _pod(case["src"]),
            "dst": _pod(case["dst"]),
            "first": port, "last": port, "ports": [port],
            "protocol": case.get("protocol", "TCP"),
            "settings": {"policyEnforcement": config.get("policyEnforcementMode", "default")},
            "ciliumVersion": str(config.get("cilium_version", "")),
            "features": ["table"],
        })
    return out


def _pod(side: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "namespace": side["namespace"],
        "labels": dict(side.get("labels") or {}),
        "namespaceLabels": {"kubernetes.io/metadata.name": side["namespace"], **(side.get("namespaceLabels") or {})},
        "serviceAccountName": side.get("serviceAccountName", "default"),
        "containerPorts": [
            {"name": p.get("name", ""), "containerPort": int(p["containerPort"]), "protocol": p.get("protocol", "TCP")}
            for p in side.get("containerPorts") or []
        ],
    }


def _verdict_table_cases() -> list[dict[str, Any]]:
    from tests.unit.policy import test_policy_kcnp, test_policy_verdicts

    out = []
    tables = [(test_policy_verdicts, t) for t in
              ("ENFORCEMENT", "SELECTORS", "SCOPING", "ENTITIES", "PORTS", "DENIES", "KNPS", "UNKNOWNS")]
    for module, table in [*tables, (test_policy_kcnp, "KCNPS")]:
        for param in getattr(module, table):
            case = param.values[0]
            if case.src.host_network or case.dst.host_network:
                continue  # the oracle models Cilium endpoints; host traffic has its own tests
            probes = probe_ports(case.ports.first, case.ports.last, case.policies,
                                 [p.port for p in case.dst.ports])
            out.append({
                "name": f"table {table} {param.id}",
                "policies": list(case.policies),
                "src": _endpoint(case.src, with_ports=False),
                "dst": _endpoint(case.dst, with_ports=True),
                "first": case.ports.first, "last": case.ports.last, "ports": probes,
                "protocol": case.protocol,
                "settings": {"policyEnforcement": case.enforcement},
                "features": ["table", table.lower()],
            })
    return out


def _endpoint(endpoint: Any, *, with_ports: bool) -> dict[str, Any]:
    return {
        "namespace": endpoint.namespace,
        "labels": dict(endpoint.labels),
        "namespaceLabels": dict(endpoint.namespace_labels),
        "serviceAccountName": endpoint.service_account,
        "containerPorts": [
            {"name": p.name, "containerPort": p.port, "protocol": p.protocol} for p in endpoint.ports
        ] if with_ports else [],
    }


def probe_ports(first: int, last: int, policies: Sequence[Mapping[str, Any]],
                named: Sequence[int] = ()) -> list[int]:
    """The ports to ask Cilium about for `first`..`last`: both ends and every port (and its
    neighbours) a policy names inside the range, or that a destination port name stands for
    (`named`: its container ports); a verdict can only change at those points."""
    probes = {first, last}
    for number in [*_numbers_in(policies), *named]:
        for p in (number - 1, number, number + 1):
            if first <= p <= last and p > 0:
                probes.add(p)
    return sorted(p for p in probes if p > 0)


def _numbers_in(value: Any) -> Iterator[int]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key in ("port", "endPort", "number", "start", "end") and str(item).isdigit():
                yield int(item)
            else:
                yield from _numbers_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _numbers_in(item)


# --- features the known-differences file can name ---------------------------------------------

API_VERSIONS = {
    "CiliumNetworkPolicy": "cilium.io/v2", "CiliumClusterwideNetworkPolicy": "cilium.io/v2",
    "NetworkPolicy": "networking.k8s.io/v1", "ClusterNetworkPolicy": "policy.networking.k8s.io/v1alpha2",
}


def policy_features(policies: Sequence[Mapping[str, Any]]) -> set[str]:
    """Tags for what a case's policies use that the snapshot alone cannot settle."""
    found: set[str] = set()
    for policy in policies:
        if API_VERSIONS.get(str(policy.get("kind"))) != policy.get("apiVersion"):
            found.add("unknown-apiVersion")
        _walk(policy.get("spec"), found)
        for spec in policy.get("specs") or []:
            _walk(spec, found)
    return found


def _walk(value: Any, found: set[str]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key == "rules" and item:
                found.add("l7")
            elif key == "authentication" and isinstance(item, Mapping) and item.get("mode") not in (None, "disabled"):
                found.add("authentication")
            elif key == "toServices":
                found.add("toServices")
            elif key in ("fromRequires", "toRequires"):
                found.add("requires")
            _walk(item, found)
    elif isinstance(value, list):
        for item in value:
            _walk(item, found)


# --- the generator ----------------------------------------------------------------------------

ROLES = ("worker", "coord", "launcher")
ZONES = ("zone-a", "zone-b")
PORTS = (80, 443, 2222, 23456, 29500, 9999)
NAMED = (("rdzv", 23456), ("http", 80), ("nccl", 2222))
ENTITIES = ("all", "cluster", "world", "host", "remote-node")


class Generator:
    """Seeded random cases over CNP, CCNP, KNP and ClusterNetworkPolicy sections, selectors,
    entities, ports, ranges, named ports and deny rules. Only objects the CRDs accept are built."""

    def __init__(self, seed: int, *, kinds: Sequence[str]) -> None:
        self.rng = random.Random(seed)
        self.kinds = tuple(kinds)

    def cases(self, count: int) -> list[dict[str, Any]]:
        return [self.case(i) for i in range(count)]

    def case(self, i: int) -> dict[str, Any]:
        r = self.rng
        src, dst = self.pod(with_ports=False), self.pod(with_ports=True)
        self.features: set[str] = set()
        policies = [self.policy(f"p{n}", src, dst) for n in range(r.choice((1, 1, 2, 2, 3)))]
        if r.random() < 0.2:
            first = r.choice((1, 1024, 2000))
            last = r.choice((2300, 30000, 65535))
            self.features.add("range")
        else:
            first = last = r.choice(PORTS)
        protocol = r.choices(("TCP", "UDP", "ANY"), (8, 1, 1))[0]
        enforcement = r.choices(("default", "always"), (9, 1))[0]
        return {
            "name": f"generated {i}",
            "policies": policies,
            "src": src, "dst": dst,
            "first": first, "last": last,
            "ports": probe_ports(first, last, policies, [p["containerPort"] for p in dst["containerPorts"]]),
            "protocol": protocol,
            "settings": {"policyEnforcement": enforcement},
            "features": sorted(self.features | {"generated"}),
        }

    def pod(self, *, with_ports: bool) -> dict[str, Any]:
        r = self.rng
        namespace = r.choices((NS, OTHER), (4, 1))[0]
        labels = {"role": r.choice(ROLES)}
        zone = r.choice(ZONES)
        if r.random() < 0.7:
            labels["zone"] = zone
        if r.random() < 0.5:
            labels["topology.kubernetes.io/zone"] = zone
        if r.random() < 0.3:
            labels["app.kubernetes.io/name"] = "train"
        ns_labels = {"kubernetes.io/metadata.name": namespace}
        if r.random() < 0.4:
            ns_labels["team"] = r.choice(("ml", "infra"))
        ports = []
        if with_ports:
            ports = [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in NAMED if r.random() < 0.5]
        return {"namespace": namespace, "labels": labels, "namespaceLabels": ns_labels,
                "serviceAccountName": r.choice(("default", "default", "trainer")), "containerPorts": ports}

    def policy(self, name: str, src: Mapping[str, Any], dst: Mapping[str, Any]) -> dict[str, Any]:
        kind = self.rng.choice(self.kinds)
        self.features.add(kind)
        if kind == "NetworkPolicy":
            return self.knp(name, self.rng.choice((src, dst))["namespace"])
        if kind == "ClusterNetworkPolicy":
            return self.kcnp(name)
        spec = self.cilium_rule()
        if kind == "CiliumClusterwideNetworkPolicy":
            return {"apiVersion": "cilium.io/v2", "kind": kind, "metadata": {"name": name}, "spec": spec}
        namespace = self.rng.choice((src, dst))["namespace"]
        return {"apiVersion": "cilium.io/v2", "kind": kind, "metadata": {"name": name, "namespace": namespace},
                "spec": spec}

    # -- Cilium rules --

    def cilium_rule(self) -> dict[str, Any]:
        r = self.rng
        rule: dict[str, Any] = {"endpointSelector": self.selector(subject=True)}
        sections = r.sample(("ingress", "egress", "ingressDeny", "egressDeny"), r.choice((1, 1, 2)))
        for section in sections:
            rule[section] = [self.cilium_entry(section) for _ in range(r.choice((0, 1, 1, 2)))]
        if not any(rule.get(s) for s in sections):
            rule[sections[0]] = [self.cilium_entry(sections[0])]
        if r.random() < 0.15:
            rule["enableDefaultDeny"] = {d: r.random() < 0.5 for d in ("ingress", "egress") if r.random() < 0.7}
            self.features.add("enableDefaultDeny")
        return rule

    def cilium_entry(self, section: str) -> dict[str, Any]:
        r = self.rng
        prefix = "from" if section.startswith("ingress") else "to"
        entry: dict[str, Any] = {}
        peer = r.choices(("endpoints", "entities", "cidr", "none"), (6, 2, 1, 2))[0]
        if peer == "endpoints":
            entry[f"{prefix}Endpoints"] = [self.selector(subject=False) for _ in range(r.choice((1, 1, 2)))]
        elif peer == "entities":
            entry[f"{prefix}Entities"] = r.sample(ENTITIES, r.choice((1, 2)))
            self.features.add("entities")
        elif peer == "cidr":
            entry[f"{prefix}CIDR"] = [r.choice(("10.0.0.0/8", "0.0.0.0/0"))]
            self.features.add("cidr")
        if r.random() < 0.6 or (peer == "none" and r.random() < 0.7):
            entry["toPorts"] = [self.port_rule(deny=section.endswith("Deny"))]
        return entry

    def port_rule(self, *, deny: bool) -> dict[str, Any]:
        r = self.rng
        shape = r.choices(("ports", "empty-rule", "empty-ports"), (10, 1, 1))[0]
        if shape == "empty-rule":
            self.features.add("no-port")
            return {}
        if shape == "empty-ports":
            self.features.add("no-port")
            return {"ports": []}
        return {"ports": [self.port_protocol(deny=deny) for _ in range(r.choice((1, 1, 2)))]}

    def port_protocol(self, *, deny: bool) -> dict[str, Any]:
        r = self.rng
        shape = r.choices(("number", "range", "named", "zero"), (6, 2, 0 if deny else 2, 1))[0]
        out: dict[str, Any]
        if shape == "number":
            out = {"port": str(r.choice(PORTS))}
        elif shape == "range":
            start = r.choice((1, 80, 2000, 23000))
            out = {"port": str(start), "endPort": start + r.choice((10, 500, 30000))}
            self.features.add("port-range")
        elif shape == "named":
            out = {"port": r.choice(NAMED)[0]}
            self.features.add("named-port")
        else:
            out = {"port": "0"}
        protocol = r.choices(("TCP", "UDP", "ANY", None), (6, 1, 1, 2))[0]
        if protocol:
            out["protocol"] = protocol
        return out

    def selector(self, *, subject: bool) -> dict[str, Any]:
        r = self.rng
        shapes = ("empty", "role", "zone", "topology", "expr", "namespace")
        shape = r.choices(shapes, (2, 5, 2, 2, 2, 0 if subject else 2))[0]
        if shape == "empty":
            return {}
        if shape == "role":
            return {"matchLabels": {"role": r.choice(ROLES)}}
        if shape == "zone":
            return {"matchLabels": {"zone": r.choice(ZONES)}}
        if shape == "topology":
            self.features.add("topology-label")
            return {"matchLabels": {"topology.kubernetes.io/zone": r.choice(ZONES)}}
        if shape == "namespace":
            key = r.choice(("k8s:io.kubernetes.pod.namespace", "io.kubernetes.pod.namespace"))
            return {"matchLabels": {key: r.choice((NS, OTHER))}}
        key = r.choice(("role", "zone", "topology.kubernetes.io/zone"))
        operator = r.choice(("In", "NotIn", "Exists", "DoesNotExist"))
        requirement: dict[str, Any] = {"key": key, "operator": operator}
        if operator in ("In", "NotIn"):
            requirement["values"] = r.sample(ROLES if key == "role" else ZONES, 1)
        if key.startswith("topology"):
            self.features.add("topology-label")
        return {"matchExpressions": [requirement]}

    # -- Kubernetes NetworkPolicy --

    def knp(self, name: str, namespace: str) -> dict[str, Any]:
        r = self.rng
        spec: dict[str, Any] = {"podSelector": self.selector(subject=True)}
        types = []
        for direction, peer_key in (("ingress", "from"), ("egress", "to")):
            if r.random() < 0.6:
                rules = []
                for _ in range(r.choice((0, 1, 1, 2))):
                    rule: dict[str, Any] = {}
                    if r.random() < 0.7:
                        rule[peer_key] = [self.knp_peer()]
                    if r.random() < 0.5:
                        rule["ports"] = [self.knp_port()]
                    rules.append(rule)
                spec[direction] = rules
                types.append(direction.capitalize())
        if not types or r.random() < 0.5:
            spec["policyTypes"] = types or ["Ingress"]
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": namespace}, "spec": spec}

    def knp_peer(self) -> dict[str, Any]:
        r = self.rng
        shape = r.choice(("pod", "namespace", "both"))
        peer: dict[str, Any] = {}
        if shape in ("pod", "both"):
            peer["podSelector"] = self.selector(subject=True)
        if shape in ("namespace", "both"):
            peer["namespaceSelector"] = r.choice(({}, {"matchLabels": {"team": "ml"}},
                                                  {"matchLabels": {"kubernetes.io/metadata.name": OTHER}}))
        return peer

    def knp_port(self) -> dict[str, Any]:
        r = self.rng
        shape = r.choice(("number", "range", "named", "protocol-only"))
        out: dict[str, Any] = {}
        if shape == "number":
            out["port"] = r.choice(PORTS)
        elif shape == "range":
            start = r.choice((80, 2000, 23000))
            out.update(port=start, endPort=start + r.choice((10, 1000)))
            self.features.add("port-range")
        elif shape == "named":
            out["port"] = r.choice(NAMED)[0]
            self.features.add("named-port")
        if r.random() < 0.7:
            out["protocol"] = r.choice(("TCP", "TCP", "UDP"))
        return out

    # -- Kubernetes ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2) --

    def kcnp(self, name: str) -> dict[str, Any]:
        r = self.rng
        tier = r.choice(("Admin", "Baseline"))
        spec: dict[str, Any] = {"tier": tier, "priority": r.choice((0, 5, 10, 50, 100)), "subject": self.kcnp_subject()}
        for direction, peer_key in (("ingress", "from"), ("egress", "to")):
            if r.random() < 0.6 or (direction == "egress" and "ingress" not in spec):
                rules = []
                for n in range(r.choice((1, 1, 2))):
                    rule: dict[str, Any] = {"name": f"r{n}", "action": r.choice(("Accept", "Deny", "Pass"))}
                    # The CRD requires at least one peer (`from` / `to`).
                    rule[peer_key] = [self.kcnp_peer(egress=direction == "egress") for _ in range(r.choice((1, 1, 2)))]
                    if r.random() < 0.5:
                        # The CRD refuses a named port beside a networks peer (no named ports there).
                        cidr = any("networks" in peer for peer in rule.get(peer_key, ()))
                        rule["protocols"] = [self.kcnp_protocol(named=not cidr)]
                    rules.append(rule)
                spec[direction] = rules
        return {"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
                "metadata": {"name": name}, "spec": spec}

    def kcnp_subject(self) -> dict[str, Any]:
        r = self.rng
        if r.random() < 0.4:
            return {"namespaces": r.choice(({}, {"matchLabels": {"kubernetes.io/metadata.name": NS}}))}
        return {"pods": {"namespaceSelector": r.choice(({}, {"matchLabels": {"team": "ml"}})),
                         "podSelector": self.selector(subject=True)}}

    def kcnp_peer(self, *, egress: bool = False) -> dict[str, Any]:
        r = self.rng
        if egress and r.random() < 0.15:
            self.features.add("cidr")
            return {"networks": [r.choice(("10.0.0.0/8", "0.0.0.0/0"))]}
        if r.random() < 0.4:
            return {"namespaces": r.choice(({}, {"matchLabels": {"kubernetes.io/metadata.name": OTHER}}))}
        return {"pods": {"namespaceSelector": {}, "podSelector": self.selector(subject=True)}}

    def kcnp_protocol(self, *, named: bool = True) -> dict[str, Any]:
        r = self.rng
        if r.random() < 0.1:
            return {r.choice(("tcp", "udp")): {}}  # every port of the protocol
        if named and r.random() < 0.2:
            self.features.add("named-port")
            return {"destinationNamedPort": r.choice(NAMED)[0]}
        protocol = r.choices(("tcp", "udp"), (4, 1))[0]
        if r.random() < 0.3:
            start = r.choice((80, 2000, 23000))
            return {protocol: {"destinationPort": {"range": {"start": start, "end": start + 1000}}}}
        return {protocol: {"destinationPort": {"number": r.choice(PORTS)}}}
