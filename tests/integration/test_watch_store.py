"""WatchStore against the fake apiserver (real HTTP, the real kubernetes client): sync and events."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml

from app.cache import projections
from app.cache.errors import CacheNotReadyError
from app.cache.reflector import KindCache, WatchTuning
from app.cache.resources import POD_FIELD_SELECTOR
from app.cache.watchers import WatchStore
from app.config import Settings
from app.models.cluster import NodeInfo, PodInfo, PolicyObject, Snapshot
from tests.integration.fakeapi import (
    FAST_TUNING,
    TOKEN,
    FakeApiServer,
    make_ccnp,
    make_cidr_group,
    make_cnp,
    make_knp,
    make_namespace,
    make_node,
    make_pod,
    make_runtime,
    running_store,
    wait_until,
)

DATA = Path(__file__).parents[1] / "data"
DRA_KINDS = ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "ComputeDomain")
JOB_KINDS = ("PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "JobSet", "TrainJob")
KINDS = (
    "Node", "Namespace", "Pod", "NetworkPolicy", "CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy",
    "CiliumCIDRGroup", "TrainingRuntime", "ClusterTrainingRuntime", *JOB_KINDS, "ClusterNetworkPolicy",
    *DRA_KINDS, "ConfigMap", "DaemonSet",
)


@pytest.fixture
def api() -> Any:
    with FakeApiServer() as server:
        yield server


def seed(api: FakeApiServer) -> None:
    api.apply(make_node("gpu-a-1", zone="a"))
    api.apply(make_node("gpu-b-1", zone="b", gpus=4))
    api.apply(make_namespace("train", {"team": "ml"}))
    api.apply(make_pod("worker-0", node="gpu-a-1", gpus=2))
    api.apply(make_cnp("zone-a-only"))


def node_names(snapshot: Snapshot) -> list[str]:
    return [n.name for n in snapshot.nodes]


def test_not_ready_before_start(api: FakeApiServer, tmp_path: Path) -> None:
    store = WatchStore(Settings(), kubeconfig=str(api.write_kubeconfig(tmp_path / "kc")), tuning=FAST_TUNING)

    status = store.status()

    assert (status.synced, status.stale, status.detail) == (False, False, dict.fromkeys(KINDS, "listing"))
    with pytest.raises(CacheNotReadyError, match="not synced"):
        store.snapshot()


def test_synced_only_after_every_kind_listed(api: FakeApiServer, tmp_path: Path) -> None:
    seed(api)
    api.fail("CiliumNetworkPolicy", status=500)
    with running_store(api, tmp_path, wait_synced=False) as store:
        wait_until(lambda: store.status().detail["Node"] == "synced", what="nodes listed")
        wait_until(lambda: store.status().detail["CiliumNetworkPolicy"].startswith("failing since"),
                   what="CNP list failure reported")
        blocked = store.status()
        with pytest.raises(CacheNotReadyError, match="CiliumNetworkPolicy"):
            store.snapshot()

        api.clear_failures()
        wait_until(lambda: store.status().synced, what="sync after the failure clears")

        assert blocked.synced is False
        assert "HTTP 500 InternalError: injected failure 500" in blocked.detail["CiliumNetworkPolicy"]
        assert store.status().detail == dict.fromkeys(KINDS, "synced")
        assert [p.name for p in store.snapshot().policies] == ["zone-a-only"]


def test_initial_sync_keeps_projections_of_every_kind(api: FakeApiServer, tmp_path: Path) -> None:
    node = api.apply(make_node("gpu-a-1", zone="a"))
    namespace = api.apply(make_namespace("train", {"team": "ml"}))
    gpu_pod = api.apply(make_pod("worker-0", gpus=2))
    api.apply(make_pod("cpu-only", gpus=0))
    api.apply(make_pod("finished", gpus=2, phase="Succeeded"))
    api.apply(make_pod("failed", gpus=2, phase="Failed"))
    api.apply(make_pod("unbound", gpus=2, node="", phase="Pending"))
    knp, cnp, ccnp = api.apply(make_knp("deny-all")), api.apply(make_cnp("zone-a")), api.apply(make_ccnp("egress"))
    api.apply(make_cidr_group("corp", "10.0.0.0/8"))
    runtime, cluster_runtime = api.apply(make_runtime("torch", namespace="train")), api.apply(make_runtime("torch"))

    with running_store(api, tmp_path) as store:
        snapshot = store.snapshot()
        status, counts = store.status(), store.counts()

    assert snapshot.nodes == (projections.project_node(node),)
    assert dict(snapshot.namespaces) == {"train": projections.project_namespace(namespace)}
    assert snapshot.pods == (projections.project_pod(gpu_pod),)
    assert snapshot.policies == tuple(projections.project_policy(p) for p in (knp, cnp, ccnp))
    assert {name: g.cidrs for name, g in snapshot.cidr_groups.items()} == {"corp": ("10.0.0.0/8",)}
    assert dict(snapshot.training_runtimes) == {
        ("TrainingRuntime", "train", "torch"): projections.project_training_runtime(runtime),
        ("ClusterTrainingRuntime", "", "torch"): projections.project_training_runtime(cluster_runtime),
    }
    assert snapshot.missing_kinds == ()
    assert status.detail == dict.fromkeys(KINDS, "synced")
    assert counts == {"Node": 1, "Namespace": 1, "Pod": 1, "NetworkPolicy": 1, "CiliumNetworkPolicy": 1,
                      "CiliumClusterwideNetworkPolicy": 1, "CiliumCIDRGroup": 1, "TrainingRuntime": 1,
                      "ClusterTrainingRuntime": 1, **dict.fromkeys(JOB_KINDS, 0), "ClusterNetworkPolicy": 0,
                      **dict.fromkeys(DRA_KINDS, 0), "ConfigMap": 0, "DaemonSet": 0}


def test_cilium_config_and_agent_image_reach_the_snapshot(api: FakeApiServer, tmp_path: Path) -> None:
    def config_map(namespace: str, name: str, data: dict[str, str]) -> dict[str, Any]:
        meta = {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "cilium"}}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}

    def daemon_set(namespace: str, name: str, image: str) -> dict[str, Any]:
        containers = [{"name": "cilium-agent", "image": image}]
        return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": namespace},
                "spec": {"template": {"spec": {"containers": containers}}}}

    api.apply(config_map("kube-system", "cilium-config", {"enable-k8s-cluster-network-policy": "true"}))
    api.apply(config_map("kube-system", "other", {"enable-policy": "never"}))
    api.apply(config_map("default", "cilium-config", {"enable-policy": "always"}))
    api.apply(daemon_set("kube-system", "cilium", "quay.io/cilium/cilium:v1.20.2@sha256:0123"))
    api.apply(daemon_set("kube-system", "cilium-envoy", "quay.io/cilium/cilium-envoy:v1.35.0"))
    api.apply({**make_ccnp("x"), "apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy"})

    with running_store(api, tmp_path) as store:
        wait_until(lambda: store.snapshot().cilium_image != "", what="the agent image")
        snapshot = store.snapshot()
        requests = [r for r in api.requests if "configmaps" in r.path or "daemonsets" in r.path]

    assert dict(snapshot.cilium_config or {}) == {"enable-k8s-cluster-network-policy": "true"}
    assert dict(snapshot.cilium_config_labels) == {"app.kubernetes.io/part-of": "cilium"}
    assert snapshot.cilium_image == "quay.io/cilium/cilium:v1.20.2@sha256:0123"
    assert [p.kind for p in snapshot.policies] == ["ClusterNetworkPolicy"]
    # One object each, requested in its namespace by name (what a Role with resourceNames can grant).
    assert {(r.path, r.query.get("fieldSelector")) for r in requests} == {
        ("/api/v1/namespaces/kube-system/configmaps", "metadata.name=cilium-config"),
        ("/apis/apps/v1/namespaces/kube-system/daemonsets", "metadata.name=cilium"),
    }


def test_no_cilium_config_leaves_the_agent_unknown(api: FakeApiServer, tmp_path: Path) -> None:
    with running_store(api, tmp_path, settings=Settings(cilium_config="")) as store:
        snapshot = store.snapshot()
    assert (snapshot.cilium_config, snapshot.cilium_image) == (None, "")
    assert not [r for r in api.requests if "configmaps" in r.path or "daemonsets" in r.path]


def test_snapshot_holds_projections_only(api: FakeApiServer, tmp_path: Path) -> None:
    seed(api)
    with running_store(api, tmp_path) as store:
        snapshot = store.snapshot()

    assert all(type(n) is NodeInfo for n in snapshot.nodes)
    assert all(type(p) is PodInfo for p in snapshot.pods)
    (policy,) = snapshot.policies
    assert type(policy) is PolicyObject
    assert "status" not in policy.body
    assert set(policy.body["metadata"]) == {"name", "namespace"}  # no resourceVersion, uid, managedFields


def test_built_in_list_items_without_kind_are_projected_by_their_kind(api: FakeApiServer, tmp_path: Path) -> None:
    api.apply(make_knp("deny-all"))  # the fake, like the apiserver, strips kind/apiVersion from list items

    with running_store(api, tmp_path) as store:
        (policy,) = store.snapshot().policies

    assert (policy.kind, policy.api_version, policy.ref) == ("NetworkPolicy", "networking.k8s.io/v1", "train/deny-all")


def test_list_follows_continue_tokens(api: FakeApiServer, tmp_path: Path) -> None:
    for i in range(5):
        api.apply(make_node(f"gpu-a-{i}"))
    tuning = dataclasses.replace(FAST_TUNING, list_page_size=2)

    with running_store(api, tmp_path, tuning=tuning) as store:
        names = node_names(store.snapshot())

    assert names == [f"gpu-a-{i}" for i in range(5)]
    assert [r.query.get("limit") for r in api.requests_for("Node", watch=False)] == ["2", "2", "2"]


def _listed_in_pages_of_two(api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: int,
                            before_projecting: Callable[[Any], None]) -> list[str]:
    """The node names a store lists from `nodes` nodes in pages of two, `before_projecting(node)` called as each
    listed or watched Node is about to be projected."""
    for i in range(nodes):
        api.apply(make_node(f"gpu-a-{i}"))
    project = KindCache.project

    def hooked(cache: KindCache, obj: Any) -> Any:
        if cache.resource.kind == "Node":
            before_projecting(obj)
        return project(cache, obj)

    monkeypatch.setattr(KindCache, "project", hooked)
    with running_store(api, tmp_path, tuning=dataclasses.replace(FAST_TUNING, list_page_size=2)) as store:
        return node_names(store.snapshot())


def test_the_next_page_is_fetched_while_one_is_projected(
    api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[bool] = []

    def wait_for_page_two(obj: Any) -> None:
        if obj["metadata"]["name"] == "gpu-a-0" and not asked:
            try:  # NB: an error here would only fail this list, and the next one would pass
                wait_until(lambda: len(api.requests_for("Node", watch=False)) >= 2, timeout=5.0, what="page 2")
                asked.append(True)
            except AssertionError:
                asked.append(False)

    names = _listed_in_pages_of_two(api, tmp_path, monkeypatch, 4, wait_for_page_two)

    assert asked == [True]  # the second page was asked for while the first one's first node was projected
    assert names == [f"gpu-a-{i}" for i in range(4)]


def test_a_page_failing_mid_list_lists_again_from_the_start(
    api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed: list[Any] = []

    def fail_a_later_page(obj: Any) -> None:
        if not failed:
            failed.append(obj)
            api.fail("Node", watch=False, times=1)  # page 2 if not answered yet, else page 3

    names = _listed_in_pages_of_two(api, tmp_path, monkeypatch, 5, fail_a_later_page)

    first_pages = [r for r in api.requests_for("Node", watch=False) if not r.query.get("continue")]
    assert names == [f"gpu-a-{i}" for i in range(5)]
    assert len(first_pages) == 2  # a list is never stitched from two attempts


Step = Callable[[FakeApiServer], Any]


def _cpu_pod_then_gpu_pod(api: FakeApiServer) -> None:
    api.apply(make_pod("cpu-only", gpus=0))
    api.apply(make_pod("after", gpus=1))  # same stream, so seeing it means cpu-only was processed


@pytest.mark.parametrize(
    "change, check",
    [
        pytest.param(
            lambda api: api.apply(make_node("gpu-c-1", zone="c")),
            lambda s: node_names(s) == ["gpu-a-1", "gpu-b-1", "gpu-c-1"],
            id="an added node appears",
        ),
        pytest.param(
            lambda api: api.apply(make_node("gpu-a-1", zone="a", ready=False)),
            lambda s: [n.ready for n in s.nodes] == [False, True],
            id="a modified node is replaced",
        ),
        pytest.param(
            lambda api: api.delete("Node", "gpu-b-1"),
            lambda s: node_names(s) == ["gpu-a-1"],
            id="a deleted node disappears",
        ),
        pytest.param(
            lambda api: api.apply(make_pod("worker-0", node="gpu-a-1", gpus=2, phase="Succeeded")),
            lambda s: s.pods == (),
            id="a pod that finishes stops holding GPUs",
        ),
        pytest.param(
            lambda api: api.apply(make_pod("worker-1", node="gpu-b-1", gpus=4)),
            lambda s: [(p.name, p.requests["nvidia.com/gpu"]) for p in s.pods] == [("worker-0", 2), ("worker-1", 4)],
            id="a new GPU pod is counted",
        ),
        pytest.param(
            _cpu_pod_then_gpu_pod,
            lambda s: sorted(p.name for p in s.pods) == ["after", "worker-0"],
            id="a new pod without GPUs is not kept",
        ),
        pytest.param(
            lambda api: api.apply(make_namespace("train", {"team": "infra"})),
            lambda s: s.namespaces["train"].labels["team"] == "infra",
            id="a relabelled namespace is seen",
        ),
        pytest.param(
            lambda api: api.delete("CiliumNetworkPolicy", "zone-a-only", "train"),
            lambda s: s.policies == (),
            id="a deleted policy disappears",
        ),
        pytest.param(
            lambda api: api.apply(make_ccnp("cluster-egress")),
            lambda s: [p.ref for p in s.policies] == ["train/zone-a-only", "cluster-egress"],
            id="an added clusterwide policy appears",
        ),
    ],
)
def test_cache_follows_watch_events(
    api: FakeApiServer, tmp_path: Path, change: Step, check: Callable[[Snapshot], bool]
) -> None:
    seed(api)
    with running_store(api, tmp_path) as store:
        before = store.snapshot()
        change(api)
        wait_until(lambda: check(store.snapshot()), what="the change in the snapshot")

    assert not check(before)


def test_a_burst_of_events_is_coalesced_into_few_snapshots(api: FakeApiServer, tmp_path: Path) -> None:
    published: list[Snapshot] = []
    tuning = dataclasses.replace(FAST_TUNING, publish_interval_seconds=0.1)
    with running_store(api, tmp_path, tuning=tuning) as store:
        store.subscribe(published.append)
        for i in range(100):
            api.apply(make_node(f"gpu-a-{i:03}"))
        wait_until(lambda: len(store.snapshot().nodes) == 100, what="100 nodes")

    assert 1 <= len(published) < 100  # 1 for the initial snapshot, then a few per burst, never one per event
    assert len({s.revision for s in published}) == len(published)


def test_old_snapshots_never_change(api: FakeApiServer, tmp_path: Path) -> None:
    seed(api)
    with running_store(api, tmp_path) as store:
        before = store.snapshot()
        names_before = node_names(before)
        api.delete("Node", "gpu-a-1")
        wait_until(lambda: store.snapshot() is not before, what="a new snapshot")
        after = store.snapshot()

    assert (node_names(before), node_names(after)) == (names_before, ["gpu-b-1"])
    assert before.revision != after.revision
    assert after.pods is before.pods  # kinds that did not change are shared, not copied
    # and so are the fields made of several kinds (values kept by their identity carry over)
    assert (after.policies, after.namespaces, after.jobs) == (before.policies, before.namespaces, before.jobs)
    assert after.policies is before.policies and after.namespaces is before.namespaces and after.jobs is before.jobs
    assert isinstance(before.namespaces, MappingProxyType) and isinstance(before.nodes, tuple)
    with pytest.raises(TypeError):
        before.namespaces["x"] = before.namespaces["train"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.nodes = ()  # type: ignore[misc]


def test_subscribers_get_new_snapshots_even_when_one_fails(api: FakeApiServer, tmp_path: Path) -> None:
    seen: list[Snapshot] = []

    def broken(_: Snapshot) -> None:
        raise RuntimeError("subscriber bug")

    with running_store(api, tmp_path) as store:
        store.subscribe(broken)
        store.subscribe(seen.append)
        api.apply(make_node("gpu-a-1"))
        wait_until(lambda: bool(seen) and node_names(seen[-1]) == ["gpu-a-1"], what="the subscriber to see the node")
        latest = store.snapshot()

    assert seen[0].nodes == () and seen[-1] is latest


def test_before_publish_runs_on_each_snapshot_before_readers_can_get_it(api: FakeApiServer, tmp_path: Path) -> None:
    """What the app builds there (the engine's indexes) is ready when the first review reads the snapshot."""
    prepared: list[tuple[Snapshot, Snapshot | None]] = []  # (the new snapshot, what readers got meanwhile)
    with running_store(api, tmp_path) as store:
        store.before_publish(lambda snapshot: prepared.append((snapshot, store.snapshot())))
        assert prepared[0][0] is store.snapshot()  # the current one, at once
        published: list[Snapshot] = []
        store.subscribe(published.append)
        api.apply(make_node("gpu-a-1"))
        wait_until(lambda: node_names(store.snapshot()) == ["gpu-a-1"], what="the node")
        latest = store.snapshot()

    new, seen_meanwhile = prepared[-1]
    assert new is latest and seen_meanwhile is not latest  # readers still got the previous snapshot
    assert [s for s, _ in prepared[1:]] == published[1:]  # every published snapshot was prepared first


def test_requests_carry_token_bookmarks_selector_and_list_resource_version(
    api: FakeApiServer, tmp_path: Path
) -> None:
    seed(api)
    listed_at = str(api.resource_version)
    with running_store(api, tmp_path) as store:
        wait_until(lambda: api.open_watches() == len(KINDS), what="every kind watching")
        detail = store.status().detail

    watches = [r for r in api.requests if r.watch]
    pod_requests = api.requests_for("Pod")
    assert detail == dict.fromkeys(KINDS, "synced")
    assert {r.authorization for r in api.requests} == {f"Bearer {TOKEN}"}
    assert {(r.query["allowWatchBookmarks"], r.query["resourceVersion"]) for r in watches} == {("true", listed_at)}
    assert {r.query["fieldSelector"] for r in pod_requests} == {POD_FIELD_SELECTOR}
    assert all(300 <= int(r.query["timeoutSeconds"]) < 600 for r in watches)


def test_gpu_resources_setting_decides_which_pods_are_kept(api: FakeApiServer, tmp_path: Path) -> None:
    api.apply(make_pod("nvidia", gpus=1))
    amd = make_pod("amd", gpus=0)
    amd["spec"]["containers"][0]["resources"] = {"limits": {"amd.com/gpu": "2"}}
    api.apply(amd)

    with running_store(api, tmp_path, settings=Settings(gpu_resources=("amd.com/gpu",))) as store:
        names = [p.name for p in store.snapshot().pods]

    assert names == ["amd"]


def test_start_twice_is_refused(api: FakeApiServer, tmp_path: Path) -> None:
    with running_store(api, tmp_path) as store, pytest.raises(RuntimeError, match="already started"):
        asyncio.run(store.start())


def test_tuning_defaults_are_the_documented_bounds() -> None:
    tuning = WatchTuning()

    assert (tuning.backoff_initial_seconds, tuning.backoff_max_seconds, tuning.absent_retry_seconds) == (0.5, 30, 60)
    assert 0.1 <= tuning.publish_interval_seconds <= 0.2


def test_training_jobs_are_kept_as_ledger_projections(api: FakeApiServer, tmp_path: Path) -> None:
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "admitted", "namespace": "train", "uid": "u-1",
                     "annotations": {"topoguard.io/zone": "a"}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": {"spec": {"containers": [
            {"name": "pytorch", "resources": {"limits": {"nvidia.com/gpu": 4}}}]}}}}},
    }
    api.apply(job)
    with running_store(api, tmp_path) as store:
        (got,) = store.snapshot().jobs
        api.delete("PyTorchJob", "admitted", "train")
        wait_until(lambda: store.snapshot().jobs == (), what="the deleted job leaves the snapshot")

    assert (got.ref, got.zone, dict(got.demand), got.pods, got.suspended) == (
        "PyTorchJob train/admitted", "a", {"nvidia.com/gpu": 8}, 2, False,
    )


def _verdict(snapshot: Snapshot) -> str:
    from app import policy
    from app.models.network import Endpoint, PortRange

    src = Endpoint(namespace="train", labels={"zone": "b"}, namespace_labels=snapshot.namespace_labels("train"))
    dst = Endpoint(namespace="train", labels={"zone": "a"}, namespace_labels=snapshot.namespace_labels("train"))
    return policy.check_flow(snapshot, src, dst, PortRange(80, 80), "TCP").verdict


def _fresh(snapshot: Snapshot) -> Snapshot:
    """The same content with memos of its own (what a snapshot built from scratch would judge)."""
    return dataclasses.replace(snapshot, network_memo=type(snapshot.network_memo)(), _memo={})


def test_a_pod_change_keeps_the_network_memo_and_a_network_change_replaces_it(api: FakeApiServer,
                                                                              tmp_path: Path) -> None:
    # Verdicts, the policy index and the agent survive pod churn; a policy, a namespace's labels or a
    # newly named container port give a new memo, and every carried verdict is the fresh one.
    seed(api)
    with running_store(api, tmp_path) as store:
        first = store.snapshot()
        assert _verdict(first) == _verdict(_fresh(first))

        api.apply(make_pod("worker-1", node="gpu-a-1", gpus=1))
        wait_until(lambda: len(store.snapshot().pods) == 2, what="the new pod")
        second = store.snapshot()
        assert second.network_memo is first.network_memo
        assert _verdict(second) == _verdict(_fresh(second))

        named = make_pod("worker-2", node="gpu-a-1", gpus=1)
        named["spec"]["containers"][0]["ports"] = [{"name": "nccl", "containerPort": 29500}]
        api.apply(named)
        wait_until(lambda: len(store.snapshot().pods) == 3, what="the named-port pod")
        third = store.snapshot()
        assert third.network_memo is not second.network_memo
        assert third.network_memo.named_ports == {"nccl": frozenset({29500})}

        api.apply(make_namespace("train", {"team": "ml", "zone": "b"}))
        wait_until(lambda: store.snapshot().namespace_labels("train").get("zone") == "b", what="the label")
        fourth = store.snapshot()
        assert fourth.network_memo is not third.network_memo

        before = _verdict(fourth)
        api.apply(make_cnp("open-to-b", zone="a") | {"spec": {"endpointSelector": {"matchLabels": {"zone": "a"}},
                                                             "ingress": [{"fromEndpoints": [{}]}]}})
        wait_until(lambda: len(store.snapshot().policies) == 2, what="the second policy")
        fifth = store.snapshot()
        assert fifth.network_memo is not fourth.network_memo
        assert (before, _verdict(fifth)) == ("deny", "allow")
        assert _verdict(fifth) == _verdict(_fresh(fifth))


def test_dra_objects_reach_the_snapshot_projected(api: FakeApiServer, tmp_path: Path) -> None:
    objects = [api.apply(o) for o in yaml.safe_load_all((DATA / "dra" / "nvidia.yaml").read_text())]

    with running_store(api, tmp_path) as store:
        snapshot = store.snapshot()

    def of(kind: str) -> list[dict[str, Any]]:
        return [o for o in objects if o["kind"] == kind]
    assert dict(snapshot.device_classes) == {o["metadata"]["name"]: projections.project_device_class(o)
                                             for o in of("DeviceClass")}
    assert sorted(snapshot.resource_slices, key=lambda s: s.name) == sorted(
        (projections.project_resource_slice(o) for o in of("ResourceSlice")), key=lambda s: s.name)
    assert sorted(snapshot.resource_claims, key=lambda c: c.name) == sorted(
        (projections.project_resource_claim(o) for o in of("ResourceClaim")), key=lambda c: c.name)
    assert set(snapshot.claim_templates) == {("team-a", "llm-cd-channel"), ("team-a", "eight-gpus")}
    assert snapshot.compute_domains == tuple(projections.project_compute_domain(o) for o in of("ComputeDomain"))
    assert snapshot.missing_kinds == ()
