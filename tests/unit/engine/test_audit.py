"""The audit of running training jobs (app/engine/audit.py): one test per finding type, the seed lab's
before/after states, deduplication, scope, and what the cache's new pending pods must not change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.cache import files, projections
from app.config import AuditSettings, Settings, load_settings
from app.engine import audit as audit_engine
from app.engine import capacity, ledger
from app.engine.audit import AUDIT_FINDING_TYPES, AuditFinding, JobAudit, audit, audit_memoized
from app.models.cluster import JobInfo, PodInfo, PolicyObject, Snapshot
from tests.builders import GPU, make_cnp, make_namespace, make_node, make_pod, make_snapshot, make_template, tolerate

NS = "ml"
DATA = Path(__file__).resolve().parents[2] / "data" / "clusters"
SETTINGS = Settings()
KF = "training.kubeflow.org"


def stored_pytorchjob(
    name: str = "train",
    *,
    workers: int = 2,
    worker_gpus: int = 1,
    zone: str = "",
    namespace: str = NS,
    finished: bool = False,
) -> JobInfo:
    """A stored PyTorchJob (CPU Master, GPU Workers), projected as the cache projects it."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if zone:
        meta["annotations"] = {"topoguard.io/zone": zone}
    worker = make_template(gpus=worker_gpus, tolerations=[tolerate()])
    raw = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": meta,
        "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": make_template()},
            "Worker": {"replicas": workers, "template": worker},
        }},
        "status": {"conditions": [{"type": "Succeeded", "status": "True"}] if finished else []},
    }
    job = projections.project_job(raw)
    assert job is not None and job.shape is not None and not job.shape.problem
    return job


def pod(
    role: str,
    index: int,
    *,
    node: str = "",
    job: str = "train",
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    namespace: str = NS,
) -> PodInfo:
    """A pod of a PyTorchJob as the training operator labels it (`node` "" = pending)."""
    all_labels = {
        f"{KF}/operator-name": "pytorchjob-controller",
        f"{KF}/job-name": job,
        f"{KF}/replica-type": role,
        f"{KF}/replica-index": str(index),
        **({f"{KF}/job-role": "master"} if role == "master" else {}),
        **(labels or {}),
    }
    return make_pod(f"{job}-{role}-{index}", namespace=namespace, node=node, gpus=gpus, labels=all_labels,
                    ports=(23456,), phase="Running" if node else "Pending")


def nodes() -> list[Any]:
    return [
        make_node("gpu-a-1", zone="zone-a", gpus=4),
        make_node("gpu-a-2", zone="zone-a", gpus=4),
        make_node("gpu-b-1", zone="zone-b", gpus=4),
    ]


def deny_rendezvous() -> PolicyObject:
    """The Master admits ingress only from pods labelled `trusted`: Worker -> Master on 23456 is dropped."""
    return make_cnp(
        "master-ingress",
        {
            "endpointSelector": {"matchLabels": {f"{KF}/replica-type": "master"}},
            "ingress": [{"fromEndpoints": [{"matchLabels": {"trusted": "yes"}}]}],
        },
        namespace=NS,
    )


def snapshot(pods: list[PodInfo], *, jobs: list[JobInfo] | None = None, policies: list[PolicyObject] | None = None,
             opted_in: bool = True, node_list: list[Any] | None = None) -> Snapshot:
    return make_snapshot(
        nodes() if node_list is None else node_list,
        pods=pods,
        jobs=[stored_pytorchjob()] if jobs is None else jobs,
        policies=policies or [],
        namespaces=[make_namespace(NS, {"topoguard.io/enabled": "true"} if opted_in else {})],
    )


def only(audits: tuple[JobAudit, ...]) -> JobAudit:
    (one,) = audits
    return one


def types(job: JobAudit) -> list[str]:
    return [f.type for f in job.findings]


# --- the contract ---------------------------------------------------------------------------


def test_reasons_and_json_shape_follow_the_contract() -> None:
    reasons = {t: AuditFinding(t, "m").reason for t in AUDIT_FINDING_TYPES}
    assert reasons == {"split": "TopoguardSplit", "blocked": "TopoguardBlocked", "unknown": "TopoguardUnknown",
                       "zone-closed": "TopoguardZoneClosed"}
    got = only(audit(snapshot([pod("master", 0, node="gpu-a-1"), pod("worker", 0, node="gpu-b-1", gpus=1)]),
                     SETTINGS)).to_json()
    assert set(got) == {"kind", "namespace", "name", "zones", "pending", "findings"}
    assert {k for f in got["findings"] for k in f} == {"type", "message", "flows"}
    json.dumps(got)  # JSON-ready


def test_a_healthy_job_has_no_findings_and_counts_its_pods() -> None:
    pods = [pod("master", 0, node="gpu-a-1"), pod("worker", 0, node="gpu-a-1", gpus=1), pod("worker", 1)]
    got = only(audit(snapshot(pods), SETTINGS))
    assert (got.kind, got.namespace, got.name, got.uid) == ("PyTorchJob", NS, "train", "uid-train")
    assert (dict(got.zones), got.pending, got.findings) == ({"zone-a": 2}, 1, ())


# --- split ------------------------------------------------------------------------------------


def test_split_names_the_zones_and_where_each_replica_type_runs() -> None:
    pods = [pod("master", 0, node="gpu-b-1"), pod("worker", 0, node="gpu-a-1", gpus=1),
            pod("worker", 1, node="gpu-a-2", gpus=1)]
    got = only(audit(snapshot(pods), SETTINGS))
    assert dict(got.zones) == {"zone-a": 2, "zone-b": 1}
    assert types(got) == ["split"]  # no policy: every flow is open, the job is only split
    assert got.findings[0].message == (
        "Job split across zones zone-a and zone-b: 1 Master pod in zone-b, 2 Worker pods in zone-a"
    )
    assert got.findings[0].reason == "TopoguardSplit"


# --- blocked ----------------------------------------------------------------------------------


def test_blocked_names_the_flow_the_zones_and_the_policy() -> None:
    pods = [pod("master", 0, node="gpu-a-1"), pod("worker", 0, node="gpu-a-1", gpus=1),
            pod("worker", 1, node="gpu-a-2", gpus=1)]
    got = only(audit(snapshot(pods, policies=[deny_rendezvous()]), SETTINGS))
    (blocked,) = got.findings
    assert blocked.type == "blocked"
    assert blocked.message == (
        "Worker pods in zone-a cannot reach Master in zone-a on TCP 23456 and TCP 32768-60999 (collective traffic): "
        "CiliumNetworkPolicy ml/master-ingress"
    )
    assert blocked.policies == ("CiliumNetworkPolicy ml/master-ingress",)
    assert [(f["src"], f["dst"], f["port"], f["verdict"]) for f in blocked.flows] == [
        ("Worker", "Master", "TCP/23456", "deny"), ("Worker", "Master", "TCP/32768-60999", "deny")]
    assert blocked.flows[0]["srcZones"] == ["zone-a"] and blocked.flows[0]["dstZones"] == ["zone-a"]
    assert blocked.flows[0]["example"] == {"src": "ml/train-worker-0", "dst": "ml/train-master-0"}


def test_one_finding_per_role_pair_however_many_pods() -> None:
    workers = [pod("worker", i, node=f"gpu-a-{1 + i % 2}", gpus=1) for i in range(16)]
    job = stored_pytorchjob(workers=16)
    got = only(audit(snapshot([pod("master", 0, node="gpu-a-1"), *workers], jobs=[job],
                              policies=[deny_rendezvous()]), SETTINGS))
    assert types(got) == ["blocked"]
    assert len(got.findings[0].flows) == 2  # one entry per required flow, not per pod pair


def test_pods_that_policies_tell_apart_are_judged_apart() -> None:
    """Worker 1 carries the label the Master admits; only Worker 0 is blocked, and the finding says so."""
    pods = [pod("master", 0, node="gpu-a-1"), pod("worker", 0, node="gpu-b-1", gpus=1),
            pod("worker", 1, node="gpu-a-1", gpus=1, labels={"trusted": "yes"})]
    got = only(audit(snapshot(pods, policies=[deny_rendezvous()]), SETTINGS))
    blocked = next(f for f in got.findings if f.type == "blocked")
    assert blocked.message.startswith("Worker pods in zone-b cannot reach Master in zone-a on TCP 23456")


# --- unknown ----------------------------------------------------------------------------------


def test_a_flow_that_cannot_be_evaluated_is_unknown_never_allowed() -> None:
    l7 = make_cnp(
        "master-l7",
        {
            "endpointSelector": {"matchLabels": {f"{KF}/replica-type": "master"}},
            "ingress": [{"fromEndpoints": [{}], "toPorts": [{"ports": [{"port": "23456", "protocol": "TCP"}],
                                                            "rules": {"http": [{"method": "GET"}]}}]}],
        },
        namespace=NS,
    )
    pods = [pod("master", 0, node="gpu-a-1"), pod("worker", 0, node="gpu-a-1", gpus=1)]
    got = only(audit(snapshot(pods, policies=[l7]), SETTINGS))
    unknown = [f for f in got.findings if f.type == "unknown"]
    assert unknown and unknown[0].message.startswith(
        "Cannot tell whether Worker pods in zone-a can reach Master in zone-a on TCP 23456"
    )
    assert "L7 rules" in unknown[0].message and unknown[0].policies == ("CiliumNetworkPolicy ml/master-l7",)


def test_a_pod_on_a_node_without_a_zone_is_unknown() -> None:
    pods = [pod("master", 0, node="cpu-x"), pod("worker", 0, node="gpu-a-1", gpus=1)]
    node_list = [*nodes(), make_node("cpu-x", zone=None)]
    got = only(audit(snapshot(pods, node_list=node_list), SETTINGS))
    assert dict(got.zones) == {"zone-a": 1}
    assert [f.message for f in got.findings] == [
        "Cannot tell which zone 1 pod of this job run in: cpu-x has no topology.kubernetes.io/zone label"
    ]


def test_a_job_whose_flows_cannot_be_derived_is_unknown() -> None:
    raw = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "bad", "namespace": NS},
           "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": "many", "template": make_template()}}}}
    job = projections.project_job(raw)
    assert job is not None
    got = only(audit(snapshot([], jobs=[job]), SETTINGS))
    assert types(got) == ["unknown"]
    assert got.findings[0].message.startswith("Cannot check the connections this job needs: invalid job:")


# --- zone-closed ------------------------------------------------------------------------------


def test_pending_pods_pinned_to_a_zone_whose_paths_are_closed() -> None:
    job = stored_pytorchjob(zone="zone-a")
    pods = [pod("master", 0, node="gpu-a-1"), pod("worker", 0, gpus=1), pod("worker", 1, gpus=1)]
    got = only(audit(snapshot(pods, jobs=[job], policies=[deny_rendezvous()]), SETTINGS))
    assert (dict(got.zones), got.pending) == ({"zone-a": 1}, 2)
    (closed,) = got.findings
    assert closed.type == "zone-closed" and closed.reason == "TopoguardZoneClosed"
    assert closed.message == (
        "Pending Worker pods pinned to zone-a cannot reach Master in zone-a on TCP 23456 and TCP 32768-60999 "
        "(collective traffic): CiliumNetworkPolicy ml/master-ingress"
    )
    assert closed.flows[0]["srcPending"] is True and closed.flows[0]["srcZones"] == []


def test_pending_pods_of_a_job_not_pinned_are_blocked_not_zone_closed() -> None:
    pods = [pod("master", 0, node="gpu-a-1"), pod("worker", 0, gpus=1)]
    got = only(audit(snapshot(pods, policies=[deny_rendezvous()]), SETTINGS))
    assert types(got) == ["blocked"]
    assert got.findings[0].message.startswith("Pending Worker pods cannot reach Master in zone-a")


def test_pending_pods_pinned_to_a_zone_whose_gpus_are_gone() -> None:
    job = stored_pytorchjob(zone="zone-b", workers=2, worker_gpus=4)
    pods = [pod("master", 0, node="gpu-b-1"), pod("worker", 0, node="gpu-b-1", gpus=4), pod("worker", 1, gpus=4)]
    got = only(audit(snapshot(pods, jobs=[job]), SETTINGS))
    assert types(got) == ["zone-closed"]
    assert got.findings[0].message == (
        "Pending 1 pod (Worker) pinned to zone-b cannot start: they need 4 nvidia.com/gpu, the zone has 4 "
        "allocatable on its ready nodes, 4 of them held by this job's running pods"
    )


def test_pending_pods_pinned_to_a_zone_with_no_node_left() -> None:
    job = stored_pytorchjob(zone="zone-c")
    pods = [pod("master", 0), pod("worker", 0, gpus=1)]
    got = only(audit(snapshot(pods, jobs=[job]), SETTINGS))
    assert [f.message for f in got.findings] == [
        "Pending 2 pods (Master, Worker) pinned to zone-c cannot start: no ready, schedulable node is left in zone-c"
    ]


def test_a_busy_zone_is_not_closed() -> None:
    """The zone's GPUs are all held by another job: the pending pods wait, as they would without topoguard."""
    job = stored_pytorchjob(zone="zone-a", workers=2, worker_gpus=4)
    other = make_pod("other", namespace=NS, node="gpu-a-1", gpus=4)
    other2 = make_pod("other2", namespace=NS, node="gpu-a-2", gpus=4)
    pods = [pod("master", 0), pod("worker", 0, gpus=4), pod("worker", 1, gpus=4), other, other2]
    got = only(audit(snapshot(pods, jobs=[job]), SETTINGS))
    assert (got.pending, got.findings) == (3, ())


def test_pending_gpu_pods_do_not_count_as_bound_capacity() -> None:
    """The cache now keeps pending pods of training jobs: capacity and the ledger read only bound ones."""
    job = stored_pytorchjob(zone="zone-a", workers=2, worker_gpus=4)
    pending = [pod("worker", 0, gpus=4), pod("worker", 1, gpus=4)]
    with_pending, without = snapshot(pending, jobs=[job]), snapshot([], jobs=[job])
    zone_free = [
        sum(c.gpus_free([GPU]) for c in capacity.zone_index(s, zone_label=SETTINGS.zone_label,
                                                              gpu_resources=(GPU,)).classes_in("zone-a"))
        for s in (with_pending, without)
    ]
    assert zone_free == [8, 8]
    reserved = [dict(ledger.ledger_of(s, gpu_resources=(GPU,)).by_zone["zone-a"]) for s in (with_pending, without)]
    assert reserved == [{GPU: 8}, {GPU: 8}]


# --- scope and order ----------------------------------------------------------------------------


def test_scope_opted_in_skips_namespaces_not_opted_in_and_all_takes_them() -> None:
    s = snapshot([pod("master", 0, node="gpu-a-1")], opted_in=False)
    assert audit(s, SETTINGS) == ()
    everywhere = SETTINGS.model_copy(update={"audit": AuditSettings(scope="all")})
    assert [a.name for a in audit(s, everywhere)] == ["train"]


def test_finished_jobs_are_not_audited_and_the_rest_are_sorted() -> None:
    jobs = [stored_pytorchjob("b"), stored_pytorchjob("done", finished=True), stored_pytorchjob("a"),
            stored_pytorchjob("c", namespace="aaa")]
    s = make_snapshot(nodes(), jobs=jobs, namespaces=[make_namespace(n, {"topoguard.io/enabled": "true"})
                                                      for n in (NS, "aaa")])
    assert [(a.namespace, a.name) for a in audit(s, SETTINGS)] == [("aaa", "c"), (NS, "a"), (NS, "b")]


def test_the_memoized_audit_is_computed_once_per_snapshot_and_settings() -> None:
    s = snapshot([pod("master", 0, node="gpu-b-1"), pod("worker", 0, node="gpu-a-1", gpus=1)])
    first = audit_memoized(s, SETTINGS)
    assert audit_memoized(s, SETTINGS) is first and first == audit(s, SETTINGS)
    everywhere = SETTINGS.model_copy(update={"audit": AuditSettings(scope="all")})
    assert audit_memoized(s, everywhere) is not first


# --- other kinds ------------------------------------------------------------------------------


def test_jobset_pods_are_matched_by_their_labels_and_replicated_job() -> None:
    raw = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "js", "namespace": NS, "uid": "u"},
        "spec": {"replicatedJobs": [
            {"name": "workers", "replicas": 1, "template": {"spec": {"parallelism": 2, "completions": 2,
                                                                      "template": make_template(gpus=1)}}},
        ]},
    }
    job = projections.project_job(raw)
    assert job is not None

    def js_pod(i: int, node: str) -> PodInfo:
        labels = {"jobset.sigs.k8s.io/jobset-name": "js", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                  "batch.kubernetes.io/job-completion-index": str(i)}
        return make_pod(f"js-workers-0-{i}", namespace=NS, node=node, gpus=1, labels=labels)

    got = only(audit(snapshot([js_pod(0, "gpu-a-1"), js_pod(1, "gpu-b-1")], jobs=[job]), SETTINGS))
    assert (got.kind, dict(got.zones)) == ("JobSet", {"zone-a": 1, "zone-b": 1})
    assert types(got) == ["split"]


# --- the seed lab -----------------------------------------------------------------------------


def lab(state: str) -> tuple[Snapshot, Settings]:
    settings = load_settings(DATA / "lab-config.yaml")
    return files.load_snapshot(DATA / f"lab-audit-{state}.yaml", gpu_resources=settings.gpu_resources), settings


def test_the_lab_before_topoguard_is_split_and_blocked_by_its_own_policies() -> None:
    got = only(audit(*lab("before")))
    assert (got.kind, got.namespace, got.name, dict(got.zones), got.pending) == (
        "PyTorchJob", "ml-demo", "ml-training", {"zone-a": 4, "zone-b": 1}, 0)
    assert types(got) == ["split", "blocked", "blocked"]
    to_master, to_workers = got.findings[1:]
    assert to_master.message.startswith("Worker pods in zone-a cannot reach Master in zone-b on TCP 23456")
    assert "CiliumNetworkPolicy ml-demo/allow-intra-zone-b" in to_master.policies
    assert "CiliumNetworkPolicy ml-demo/allow-intra-zone-a" in to_master.policies
    assert to_workers.message.startswith("Master pods in zone-b cannot reach Worker in zone-a")
    assert set(to_workers.policies) == {"CiliumNetworkPolicy ml-demo/allow-intra-zone-b",
                                        "CiliumNetworkPolicy ml-demo/allow-intra-zone-a"}


def test_the_lab_as_topoguard_admits_it_has_nothing_to_report() -> None:
    got = only(audit(*lab("after")))
    assert (dict(got.zones), got.pending, got.findings) == ({"zone-a": 5}, 0, ())


@pytest.mark.parametrize("state", ["before", "after"])
def test_the_lab_fixtures_hold_the_job_and_its_five_pods(state: str) -> None:
    snap, settings = lab(state)
    (job,) = snap.jobs
    assert len(ledger.job_pods(snap)[(job.kind, job.namespace, job.name)]) == 5
    assert audit_engine.audit(snap, settings)[0].uid == job.uid != ""


def trainjob_snapshot(*, with_runtime: bool) -> Snapshot:
    import yaml

    fixtures = Path(__file__).resolve().parents[1] / "jobs" / "fixtures"
    objects = [o for o in yaml.safe_load_all((fixtures / "trainjob-multi-node.yaml").read_text()) if o]
    if with_runtime:
        objects += [o for o in yaml.safe_load_all((fixtures / "trainer" / "torch_distributed.yaml").read_text()) if o]
    (trainjob,) = [o for o in objects if o["kind"] == "TrainJob"]
    name = trainjob["metadata"]["name"]
    pods = [
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": f"{name}-node-0-{i}", "namespace": "default",
                      "labels": {"jobset.sigs.k8s.io/jobset-name": name,
                                 "jobset.sigs.k8s.io/replicatedjob-name": "node"}},
         "spec": {"nodeName": node, "containers": [{"name": "node"}]}, "status": {"phase": "Running"}}
        for i, node in enumerate(["gpu-a-1", "gpu-b-1", "gpu-a-1"])
    ]
    nodes = [{"kind": "Node", "metadata": {"name": n, "labels": {"topology.kubernetes.io/zone": z}},
              "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
             for n, z in (("gpu-a-1", "zone-a"), ("gpu-b-1", "zone-b"))]
    return files.build_snapshot([*objects, *pods, *nodes])


def test_a_trainjob_is_composed_from_its_runtime_at_audit_time() -> None:
    everywhere = SETTINGS.model_copy(update={"audit": AuditSettings(scope="all")})
    got = only(audit(trainjob_snapshot(with_runtime=True), everywhere))
    assert (got.kind, dict(got.zones), types(got)) == ("TrainJob", {"zone-a": 2, "zone-b": 1}, ["split"])
    missing = only(audit(trainjob_snapshot(with_runtime=False), everywhere))
    assert types(missing) == ["unknown", "split"]
    assert "ClusterTrainingRuntime torch-distributed does not exist" in missing.findings[0].message
