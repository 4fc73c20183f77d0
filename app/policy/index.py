"""The per-snapshot policy index: every policy compiled once, rules bucketed for fast subject lookup.

Owns: `PolicyIndex` (built once per snapshot through `Snapshot.memo("policy-index", ...)`),
`rules_for` (the rules whose subject selects an endpoint), `policy_problems`,
`label_keys_mentioned` and `label_values_mentioned`.
Must not: decide verdicts.

Lookup cost: rules are bucketed by namespace (CNP/KNP) or cluster-wide (CCNP), and inside a
bucket by one positive requirement of their subject selector — a `(key, value)` pair for
`key=value` / `In`, a key for `Exists` — so one lookup touches the rules that could select the
endpoint's labels, not every policy. Selectors without a positive requirement are scanned.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.models.cluster import CIDRGroup, IdentityMemo, PolicyObject, Snapshot, pod_index
from app.policy.cilium import CCNP, CNP, compile_cilium
from app.policy.kcnp import KIND as KCNP
from app.policy.kcnp import compile_kcnp
from app.policy.knp import KIND as KNP
from app.policy.knp import compile_knp
from app.policy.rules import DIRECTIONS, CompiledPolicy, Rule
from app.policy.selectors import POD_SOURCES

MEMO_KEY = "policy-index"
CLUSTER_WIDE = ""  # bucket key of CCNP rules


@dataclass
class _Bucket:
    by_value: dict[tuple[str, str], list[Rule]] = field(default_factory=lambda: defaultdict(list))
    by_key: dict[str, list[Rule]] = field(default_factory=lambda: defaultdict(list))
    scan: list[Rule] = field(default_factory=list)

    def add(self, rule: Rule) -> None:
        requirements = rule.subject.requirements if rule.subject is not None else ()
        positive = [r for r in requirements if r.source in POD_SOURCES and r.operator == "In"]
        # Prefer a user-written label over the namespace term every CNP/KNP subject carries.
        positive.sort(key=lambda r: (r.key.startswith("io."), len(r.values)))
        if positive:
            for value in positive[0].values:
                self.by_value[(positive[0].key, value)].append(rule)
            return
        exists = [r for r in requirements if r.source in POD_SOURCES and r.operator == "Exists"]
        if exists:
            self.by_key[exists[0].key].append(rule)
        else:
            self.scan.append(rule)

    def candidates(self, identity: Mapping[str, str]) -> Iterator[Rule]:
        yield from self.scan
        for key, value in identity.items():
            yield from self.by_value.get((key, value), ())
            yield from self.by_key.get(key, ())


@dataclass(frozen=True)
class PolicyIndex:
    policies: tuple[CompiledPolicy, ...]
    buckets: Mapping[str, _Bucket]
    label_keys: frozenset[str]
    # Container port name → the numbers pods of the snapshot give it (egress named-port ambiguity).
    port_names: Mapping[str, frozenset[int]] = field(default_factory=dict)
    # Direction → (policy, rule path) of every CCNP rule with a nodeSelector (a host policy) that has
    # entries in that direction, valid or not: they govern hostNetwork pods' traffic (§1.4).
    host_rules: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    # Every identity key a compiled selector (subject, peer or node) can read, plus the raw keys:
    # labels outside this set never change a verdict (see `verdicts.check_flow`'s memo).
    keys_read: frozenset[str] = frozenset()
    kinds: frozenset[str] = frozenset()  # the policy kinds the snapshot holds

    def rules_for(self, identity: Mapping[str, str], namespace: str) -> list[Rule]:
        """Every rule (certain or not) whose subject selects a pod with `identity` in `namespace`."""
        out: list[Rule] = []
        seen: set[int] = set()
        for bucket_key in (namespace, CLUSTER_WIDE):
            bucket = self.buckets.get(bucket_key)
            if bucket is None:
                continue
            for rule in bucket.candidates(identity):
                if id(rule) not in seen and rule.selects(identity, namespace):
                    seen.add(id(rule))
                    out.append(rule)
        return out

    def has_kind(self, kind: str) -> bool:
        """Whether the snapshot holds a policy of `kind` (valid or not)."""
        return kind in self.kinds

    def problems(self) -> list[tuple[str, str]]:
        return sorted((p.ref, problem) for p in self.policies for problem in p.problems)


def compile_policy(policy: PolicyObject, groups: Mapping[str, CIDRGroup] | None = None) -> CompiledPolicy:
    """Compile one policy object of any supported kind; never raises. `groups`: the snapshot's
    CiliumCIDRGroups (a CNP's `cidrGroupRef`)."""
    try:
        if policy.kind in (CNP, CCNP):
            return compile_cilium(policy, groups)
        if policy.kind == KNP:
            return compile_knp(policy)
        if policy.kind == KCNP:
            return compile_kcnp(policy)
    except Exception as e:  # NB: a shape the compilers missed must not take the webhook down
        why = f"unsupported: the policy could not be read ({type(e).__name__}: {e})"
        namespace = None if policy.kind in (CCNP, KCNP) else policy.namespace
        rule = Rule(policy.ref, policy.kind, "spec", None, namespace, directions=frozenset(DIRECTIONS), uncertain=why)
        return CompiledPolicy(policy.ref, policy.kind, (rule,), (why,))
    return CompiledPolicy(policy.ref, policy.kind, (), (f"unsupported: kind {policy.kind} is not evaluated",))


def _selector_keys(node: Any, out: set[str]) -> None:
    """Every key under any `matchLabels` / `matchExpressions` in a raw body, however malformed."""
    if isinstance(node, Mapping):
        labels = node.get("matchLabels")
        if isinstance(labels, Mapping):
            out.update(str(k) for k in labels)
        expressions = node.get("matchExpressions")
        if isinstance(expressions, list):
            out.update(str(e["key"]) for e in expressions if isinstance(e, Mapping) and "key" in e)
        for value in node.values():
            _selector_keys(value, out)
    elif isinstance(node, list):
        for item in node:
            _selector_keys(item, out)


def _strip_source(key: str) -> str:
    for prefix in ("k8s:", "any:"):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def build_index(snapshot: Snapshot) -> PolicyIndex:
    """The snapshot's compiled policies and subject index, built once per snapshot."""
    return snapshot.memo(MEMO_KEY, _build, network=True)


# Per policy object and CIDR groups (by identity): its compiled form, the keys its raw selectors name and the
# keys its compiled selectors read. Kept from one snapshot's index to the next, so an index whose policies
# are mostly the previous one's (the watch cache reuses an unchanged object; a what-if changes a few)
# compiles only the policies that are new.
_COMPILED: IdentityMemo[tuple[CompiledPolicy, frozenset[str], frozenset[str]]] = IdentityMemo(4096)


_Compiled = tuple[CompiledPolicy, frozenset[str], frozenset[str]]


def _compiled(policy: PolicyObject, groups: Mapping[str, CIDRGroup]) -> _Compiled:
    def build() -> _Compiled:
        compiled = compile_policy(policy, groups)
        keys: set[str] = set()
        _selector_keys(policy.body, keys)
        return compiled, frozenset(_strip_source(k) for k in keys), _keys_read((compiled,))
    return _COMPILED.get((policy, groups), build)


def compiled_policy(policy: PolicyObject, groups: Mapping[str, CIDRGroup]) -> CompiledPolicy:
    """`compile_policy`, kept per policy object and CIDR groups (as every index built since compiled it)."""
    return _compiled(policy, groups)[0]


def _build(snapshot: Snapshot) -> PolicyIndex:
    _COMPILED.fit(len(snapshot.policies))
    parts = [_compiled(p, snapshot.cidr_groups) for p in snapshot.policies]
    buckets: dict[str, _Bucket] = defaultdict(_Bucket)
    for policy, _, _ in parts:
        for rule in policy.rules:
            buckets[rule.namespace if rule.namespace is not None else CLUSTER_WIDE].add(rule)
    return _index(snapshot, parts, dict(buckets), _host_rules(snapshot))


def _index(snapshot: Snapshot, parts: list[tuple[CompiledPolicy, frozenset[str], frozenset[str]]],
           buckets: dict[str, _Bucket], host_rules: Mapping[str, tuple[tuple[str, str], ...]]) -> PolicyIndex:
    keys: frozenset[str] = frozenset().union(*(k for _, k, _ in parts))
    return PolicyIndex(
        tuple(c for c, _, _ in parts),
        buckets,
        keys,
        dict(pod_index(snapshot).named_ports),
        host_rules,
        frozenset().union(*(r for _, _, r in parts)) | keys,
        frozenset(p.kind for p in snapshot.policies),
    )


def build_index_after(previous: Snapshot, snapshot: Snapshot, changed: Collection[PolicyObject]) -> PolicyIndex:
    """`build_index(snapshot)` for a snapshot whose policies are `previous`'s but for `changed` (the objects
    added, replaced or deleted, old and new versions): the subject buckets of the namespaces no changed
    policy touches are `previous`'s own, only the others are filled again (a what-if of one namespaced
    policy costs that namespace's rules, not the cluster's). The same index `build_index` builds, but
    for the order of rules inside a bucket, which no verdict reads."""
    def build(after: Snapshot) -> PolicyIndex:
        if after.cidr_groups is not previous.cidr_groups:
            return _build(after)  # every policy may read a CIDR group: compiled again
        old = build_index(previous)
        _COMPILED.fit(len(after.policies))
        parts = [_compiled(p, after.cidr_groups) for p in after.policies]
        touched = {
            rule.namespace if rule.namespace is not None else CLUSTER_WIDE
            for p in changed for rule in _compiled(p, after.cidr_groups)[0].rules
        }
        buckets = {k: b for k, b in old.buckets.items() if k not in touched}
        for policy, _, _ in parts:
            for rule in policy.rules:
                key = rule.namespace if rule.namespace is not None else CLUSTER_WIDE
                if key in touched:
                    buckets.setdefault(key, _Bucket()).add(rule)
        host_rules = _host_rules(after) if any(p.kind == CCNP for p in changed) else old.host_rules
        return _index(after, parts, buckets, host_rules)
    return snapshot.memo(MEMO_KEY, build, network=True)


def _keys_read(compiled: tuple[CompiledPolicy, ...]) -> frozenset[str]:
    """The key of every requirement of every compiled selector, whatever its source or operator.

    `Requirement.matches` reads `identity[key]` and nothing else; rules, peers and entities read
    no other label (`Rule.selects`, `Peers.match`), and the subject buckets are keyed by these keys.
    """
    out: set[str] = set()
    for policy in compiled:
        for rule in policy.rules:
            selectors = [rule.subject] if rule.subject is not None else []
            for entry in (*rule.ingress, *rule.egress):
                selectors += [p.selector for p in entry.peers.selectors]
                selectors += entry.peers.nodes
            out.update(r.key for s in selectors for r in s.requirements)
    return frozenset(out)


def _host_rules(snapshot: Snapshot) -> dict[str, tuple[tuple[str, str], ...]]:
    """Host policy rules by direction, read from the raw bodies (however malformed the rest is)."""
    out: dict[str, list[tuple[str, str]]] = {d: [] for d in DIRECTIONS}
    for obj in snapshot.policies:
        if obj.kind != CCNP:
            continue
        specs = obj.body.get("specs")
        raw_rules = [("spec", obj.body.get("spec"))]
        if isinstance(specs, list):
            raw_rules += [(f"specs[{i}]", raw) for i, raw in enumerate(specs)]
        for path, raw in raw_rules:
            if not isinstance(raw, Mapping) or raw.get("nodeSelector") is None:
                continue
            for direction in DIRECTIONS:
                if raw.get(direction) is not None or raw.get(direction + "Deny") is not None:
                    out[direction].append((obj.ref, path))
    return {d: tuple(refs) for d, refs in out.items()}


def label_keys_mentioned(snapshot: Snapshot) -> frozenset[str]:
    """Every label key any selector of any policy (subject or peer) names, `k8s:`/`any:` stripped."""
    return build_index(snapshot).label_keys


def label_values_mentioned(snapshot: Snapshot, key: str) -> frozenset[str] | None:
    """The values any selector of any policy compares label `key` against (`matchLabels`, `In`,
    `NotIn`), read from the raw bodies so invalid and unsupported policies count too.

    Pods whose `key` values are both outside this set (or both in it and equal) look the same to
    every policy. `Exists`/`DoesNotExist` only tell present from absent, so they add no value.
    Returns None when some selector uses `key` in a way that is not value-enumerable (an
    operator outside the four, or `values` that is not a list): then nothing can be concluded.
    """
    return snapshot.memo(f"{MEMO_KEY}:values:{key}", lambda s: _values_of(s, key), network=True)


def _values_of(snapshot: Snapshot, key: str) -> frozenset[str] | None:
    values: set[str] = set()
    for obj in snapshot.policies:
        if not _selector_values(obj.body, key, values):
            return None
    return frozenset(values)


def _selector_values(node: Any, key: str, out: set[str]) -> bool:
    """Add to `out` every value compared with `key` under `node`; False when one is not enumerable."""
    if isinstance(node, Mapping):
        labels = node.get("matchLabels")
        if isinstance(labels, Mapping):
            # NB: a non-string value makes the policy invalid; counting its text is harmless.
            out.update(str(v) for k, v in labels.items() if _strip_source(str(k)) == key)
        expressions = node.get("matchExpressions")
        if isinstance(expressions, list):
            for e in expressions:
                if not isinstance(e, Mapping) or _strip_source(str(e.get("key"))) != key:
                    continue
                operator, raw_values = e.get("operator"), e.get("values")
                if operator in ("Exists", "DoesNotExist"):
                    continue
                if operator not in ("In", "NotIn") or not isinstance(raw_values, (list, type(None))):
                    return False
                out.update(str(v) for v in raw_values or ())
        return all(_selector_values(value, key, out) for value in node.values())
    if isinstance(node, list):
        return all(_selector_values(item, key, out) for item in node)
    return True


def policy_problems(snapshot: Snapshot) -> list[tuple[str, str]]:
    """(policy ref, problem) for invalid, unsupported and questionable policies, sorted."""
    return build_index(snapshot).problems()
