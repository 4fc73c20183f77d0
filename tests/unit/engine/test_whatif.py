"""The what-if engine (app/engine/whatif.py): a policy change judged against the jobs before it lands.

Table-driven: each case is a cluster (policies, agent settings), a change set and what the engine must say
of the jobs — which break, which become unknown, which it must not even judge (the inverse index).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pytest

from app.cache import projections
from app.config import Settings
from app.engine import whatif
from app.engine.audit import audit
from app.engine.whatif import Change, ChangeError, what_if
from app.models.cluster import PolicyObject, Snapshot
from tests.builders import make_namespace, make_node, make_snapshot
from tests.unit.engine.test_audit import KF, pod, stored_pytorchjob

NS, OTHER = "ml", "team-b"
MASTER = {f"{KF}/replica-type": "master"}
WORKER = {f"{KF}/replica-type": "worker"}
KCNP_ON = {"enable-k8s-cluster-network-policy": "true"}
SETTINGS = Settings(cilium_version="1.20.2")


def obj(kind: str, name: str, spec: dict[str, Any], namespace: str = NS) -> dict[str, Any]:
    api = {"NetworkPolicy": "networking.k8s.io/v1", "ClusterNetworkPolicy": "policy.networking.k8s.io/v1alpha2"}
    meta: dict[str, Any] = {"name": name}
    if kind in ("CiliumNetworkPolicy", "NetworkPolicy"):
        meta["namespace"] = namespace
    return {"apiVersion": api.get(kind, "cilium.io/v2"), "kind": kind, "metadata": meta, "spec": spec}


def cnp(name: str, spec: dict[str, Any], namespace: str = NS) -> PolicyObject:
    return projections.project_policy(obj("CiliumNetworkPolicy", name, spec, namespace))


def ccnp(name: str, spec: dict[str, Any]) -> PolicyObject:
    return projections.project_policy(obj("CiliumClusterwideNetworkPolicy", name, spec))


def kcnp(name: str, tier: str, action: str, *, priority: int = 10) -> PolicyObject:
    """A ClusterNetworkPolicy of `tier` whose one ingress rule does `action` to traffic from every namespace, for
    the job pods of every namespace."""
    spec = {"tier": tier, "priority": priority,
            "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {f"{KF}/operator-name":
                                                                                          "pytorchjob-controller"}}}},
            "ingress": [{"name": "rule-0", "action": action, "from": [{"namespaces": {}}]}]}
    return projections.project_policy(obj("ClusterNetworkPolicy", name, spec))


# An allow-list for the job's own pods: every pod of the job may reach every other (the lab's intra-job policy).
def allow_job(name: str = "allow-job", namespace: str = NS) -> PolicyObject:
    job = {"matchLabels": {f"{KF}/job-name": "train"}}
    return cnp(name, {"endpointSelector": job, "ingress": [{"fromEndpoints": [job]}],
                      "egress": [{"toEndpoints": [job]}]}, namespace)


# A policy that selects the Master and allows nothing the job needs (its ingress only from `trusted` pods).
def only_trusted(name: str = "only-trusted") -> PolicyObject:
    return cnp(name, {"endpointSelector": {"matchLabels": MASTER},
                      "ingress": [{"fromEndpoints": [{"matchLabels": {"trusted": "yes"}}]}]})


def lock_coordinator(name: str = "lock-coordinator", namespace: str = NS) -> PolicyObject:
    """Denies the Workers' ingress to the Master on the rendezvous port (a deny beats every allow)."""
    return cnp(name, {"endpointSelector": {"matchLabels": MASTER},
                      "ingressDeny": [{"fromEndpoints": [{"matchLabels": WORKER}],
                                       "toPorts": [{"ports": [{"port": "23456", "protocol": "TCP"}]}]}]}, namespace)


def cluster(policies: list[PolicyObject], *, cilium_config: dict[str, str] | None = None,
            namespaces: tuple[str, ...] = (NS,), pending: bool = False) -> Snapshot:
    nodes = [make_node("gpu-a-1", zone="zone-a", gpus=8), make_node("gpu-a-2", zone="zone-a", gpus=8)]
    pods, jobs = [], []
    for ns in namespaces:
        jobs.append(stored_pytorchjob(namespace=ns, zone="zone-a"))
        pods += [pod("master", 0, node="gpu-a-1", namespace=ns),
                 pod("worker", 0, node="gpu-a-1", gpus=1, namespace=ns),
                 pod("worker", 1, node="" if pending else "gpu-a-2", gpus=1, namespace=ns)]
    snap = make_snapshot(nodes, pods=pods, jobs=jobs, policies=policies,
                         namespaces=[make_namespace(ns, {"topoguard.io/enabled": "true"}) for ns in namespaces])
    if cilium_config is not None:
        snap = dataclasses.replace(snap, cilium_config=MappingProxyType(cilium_config))
    return snap


def apply(p: PolicyObject) -> Change:
    return Change.apply(p)


def delete(p: PolicyObject) -> Change:
    return Change.delete(p.kind, p.namespace, p.name)


@dataclass(frozen=True)
class Case:
    id: str
    before: list[PolicyObject]
    changes: list[Change]
    outcome: str  # clean | breaks | unknown
    broken: tuple[str, ...] = ()  # namespaces of the jobs that break
    judged: int | None = None  # jobs the inverse index could not rule out
    flows: tuple[tuple[str, str, str, str, str], ...] = ()  # (from, to, before, after, policy) that must be listed
    rule: str = ""  # the rule named for the first broken flow
    cilium_config: dict[str, str] | None = field(default=None)
    namespaces: tuple[str, ...] = (NS,)
    pending: bool = False


CASES = [
    Case("additive allow breaks nothing", [allow_job()], [apply(allow_job("allow-job-too"))], "clean", judged=1),
    Case("a first allow-list on unselected pods breaks what it does not allow", [],
         [apply(only_trusted())], "breaks", broken=(NS,), judged=1,
         flows=(("Worker", "Master", "allow", "deny", "CiliumNetworkPolicy ml/only-trusted"),)),
    Case("a deleted allow policy leaves the pods unselected: not enforced, nothing breaks",
         [allow_job()], [delete(allow_job())], "clean", judged=1),
    Case("a deleted allow policy under another that still selects the pods: default-deny",
         [allow_job(), only_trusted()], [delete(allow_job())], "breaks", broken=(NS,),
         flows=(("Worker", "Master", "allow", "deny", "CiliumNetworkPolicy ml/only-trusted"),)),
    Case("a deny beats the allow that opens the flow", [allow_job()], [apply(lock_coordinator())], "breaks",
         broken=(NS,), rule="ingressDeny[0]",
         flows=(("Worker", "Master", "allow", "deny", "CiliumNetworkPolicy ml/lock-coordinator"),)),
    Case("deleting the deny opens the flow again (informational, not a break)", [allow_job(), lock_coordinator()],
         [delete(lock_coordinator())], "clean",
         flows=(("Worker", "Master", "deny", "allow", "CiliumNetworkPolicy ml/allow-job"),)),
    Case("a namespaced change in another namespace judges no job here", [allow_job()],
         [apply(lock_coordinator(namespace=OTHER))], "clean", judged=0),
    Case("a clusterwide deny breaks the jobs of every namespace", [],
         [apply(ccnp("no-rendezvous", {"endpointSelector": {"matchLabels": MASTER},
                                       "ingressDeny": [{"fromEndpoints": [{}],
                                                        "toPorts": [{"ports": [{"port": "23456"}]}]}]}))],
         "breaks", broken=(NS, OTHER), judged=2, namespaces=(NS, OTHER), rule="ingressDeny[0]"),
    Case("a clusterwide policy selecting no job pod judges none", [],
         [apply(ccnp("web", {"endpointSelector": {"matchLabels": {"app": "web"}},
                             "ingress": [{"fromEntities": ["world"]}]}))], "clean", judged=0, namespaces=(NS, OTHER)),
    Case("Admin-tier Deny beats the namespace's allow", [allow_job()], [apply(kcnp("isolate", "Admin", "Deny"))],
         "breaks", broken=(NS,), cilium_config=KCNP_ON, rule="ingress[0]"),
    Case("Baseline-tier Deny loses to the namespace's allow", [allow_job()],
         [apply(kcnp("baseline-deny", "Baseline", "Deny"))], "clean", judged=1, cilium_config=KCNP_ON),
    Case("Baseline-tier Deny decides where no policy selects the pods", [],
         [apply(kcnp("baseline-deny", "Baseline", "Deny"))], "breaks", broken=(NS,), cilium_config=KCNP_ON),
    Case("Admin-tier Pass hands the flow to the namespace's allow-list", [only_trusted()],
         [apply(kcnp("pass", "Admin", "Pass"))], "clean", cilium_config=KCNP_ON),
    Case("ClusterNetworkPolicy with the agent's switch unknown: unknown, never a guess", [allow_job()],
         [apply(kcnp("isolate", "Admin", "Deny"))], "unknown", cilium_config=None),
    Case("ClusterNetworkPolicy with the agent's switch off: not enforced, nothing changes", [allow_job()],
         [apply(kcnp("isolate", "Admin", "Deny"))], "clean", judged=1,
         cilium_config={"enable-k8s-cluster-network-policy": "false"}),
    Case("pending pods are judged on their labels (the pinned zone's)", [allow_job()], [apply(lock_coordinator())],
         "breaks", broken=(NS,), pending=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_what_if(case: Case) -> None:
    snap = cluster(case.before, cilium_config=case.cilium_config, namespaces=case.namespaces, pending=case.pending)
    result = what_if(snap, SETTINGS, case.changes)
    assert result.outcome == case.outcome, result.to_json()
    assert tuple(sorted(j.namespace for j in result.broken)) == case.broken
    assert result.checked == len(case.namespaces)
    if case.judged is not None:
        assert result.judged == case.judged
    listed = {(f.flow.src, f.flow.dst, f.before, f.after, f.policy) for j in result.jobs for f in j.flows}
    for expected in case.flows:
        assert expected in listed, listed
    if case.rule:
        first = next(f for j in result.broken for f in j.flows if f.breaks)
        assert first.rule == case.rule, first
    if case.outcome == "unknown":
        assert all(f.after == "unknown" for j in result.jobs for f in j.flows)
        assert any("enable-k8s-cluster-network-policy" in r for j in result.jobs for f in j.flows for r in f.reasons)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_after_agrees_with_the_audit_of_the_changed_cluster(case: Case) -> None:
    """The what-if's new verdicts are the audit's on the cluster with the change made (one flow model)."""
    snap = cluster(case.before, cilium_config=case.cilium_config, namespaces=case.namespaces, pending=case.pending)
    after, _ = whatif.apply_changes(snap, case.changes)
    fresh = dataclasses.replace(snap, policies=after.policies, revision="fresh", _memo={},
                                network_memo=type(snap.network_memo)())
    blocked = {(a.namespace) for a in audit(fresh, SETTINGS)
               if any(f.type in ("blocked", "zone-closed") for f in a.findings)}
    was = {(a.namespace) for a in audit(snap, SETTINGS)
           if any(f.type in ("blocked", "zone-closed") for f in a.findings)}
    assert tuple(sorted(blocked - was)) == case.broken


def test_json_shape() -> None:
    snap = cluster([allow_job()])
    got = what_if(snap, SETTINGS, [apply(lock_coordinator())]).to_json()
    assert got["changes"] == [{"action": "apply", "kind": "CiliumNetworkPolicy", "namespace": NS,
                               "name": "lock-coordinator"}]
    (job,) = got["jobs"]
    assert (job["kind"], job["namespace"], job["name"]) == ("PyTorchJob", NS, "train")
    flow = job["flows"][0]
    assert {k: flow[k] for k in ("from", "to", "port", "purpose", "before", "after", "policy", "rule")} == {
        "from": "Worker", "to": "Master", "port": "TCP/23456", "purpose": "rendezvous", "before": "allow",
        "after": "deny", "policy": "CiliumNetworkPolicy ml/lock-coordinator", "rule": "ingressDeny[0]"}
    assert got["summary"]["jobsChecked"] == 1 and got["summary"]["jobsBroken"] == 1
    assert got["summary"]["jobsUnknown"] == 0


def test_delete_of_an_absent_object_is_an_error() -> None:
    with pytest.raises(ChangeError, match="CiliumNetworkPolicy ml/nope"):
        what_if(cluster([]), SETTINGS, [Change.delete("CiliumNetworkPolicy", NS, "nope")])


def test_namespaces_restrict_the_jobs_named() -> None:
    snap = cluster([], namespaces=(NS, OTHER))
    change = apply(ccnp("deny-all", {"endpointSelector": {}, "ingressDeny": [{"fromEntities": ["all"]}]}))
    assert {j.namespace for j in what_if(snap, SETTINGS, [change]).broken} == {NS, OTHER}
    assert {j.namespace for j in what_if(snap, SETTINGS, [change], namespaces={OTHER}).broken} == {OTHER}


def test_jobs_without_pods_are_counted_not_judged() -> None:
    snap = dataclasses.replace(cluster([allow_job()]), pods=(), pod_index=None)
    result = what_if(snap, SETTINGS, [apply(lock_coordinator())])
    assert (result.outcome, result.checked, result.without_pods) == ("clean", 0, 1)


def test_a_cidr_group_change_rejudges_the_policies_that_name_it() -> None:
    # The Master admits the rendezvous only from a CIDR group; under policy-cidr-match-mode pods the group's
    # ranges decide whether the Workers' addresses are in it.
    group = {"apiVersion": "cilium.io/v2alpha1", "kind": "CiliumCIDRGroup", "metadata": {"name": "trusted"},
             "spec": {"externalCIDRs": ["10.0.0.0/8"]}}
    spec = {"endpointSelector": {"matchLabels": MASTER}, "ingress": [{"fromCIDRSet": [{"cidrGroupRef": "trusted"}]}]}
    before = cnp("from-group", spec)
    snap = cluster([before])
    after, touched = whatif.apply_changes(snap, [Change.apply(projections.project_cidr_group(group))])
    assert before in touched and after.cidr_groups["trusted"].cidrs == ("10.0.0.0/8",)


def test_the_after_index_equals_a_fresh_one() -> None:
    """build_index_after reuses the untouched buckets: its lookups equal a from-scratch index's."""
    from app import policy
    snap = cluster([allow_job(), only_trusted(), lock_coordinator(namespace=OTHER)], namespaces=(NS, OTHER))
    after, _ = whatif.apply_changes(snap, [apply(lock_coordinator()), delete(only_trusted())])
    derived = policy.build_index(after)
    fresh = policy.build_index(dataclasses.replace(after, _memo={}, network_memo=type(snap.network_memo)()))
    assert derived is not fresh
    assert derived.keys_read == fresh.keys_read and derived.kinds == fresh.kinds
    for p in snap.pods:
        identity = {**p.labels, "io.kubernetes.pod.namespace": p.namespace}
        assert {(r.policy, r.path) for r in derived.rules_for(identity, p.namespace)} == {
            (r.policy, r.path) for r in fresh.rules_for(identity, p.namespace)}
