"""WatchStore under faults: 410 Gone, bookmarks, dropped streams, absent CRDs, failures, stop()."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.cache import resources
from app.cache.errors import ClientConfigError
from app.cache.resources import CRD_ABSENT
from app.cache.watchers import WatchStore
from app.config import Settings
from tests.integration.fakeapi import (
    FAST_TUNING,
    FakeApiServer,
    make_cidr_group,
    make_cnp,
    make_namespace,
    make_node,
    running_store,
    wait_until,
)

WATCHED = len(resources.build_resources(Settings()))  # one watch (and thread) per kind
CILIUM_KINDS = ("CiliumNetworkPolicy", "CiliumClusterwideNetworkPolicy", "CiliumCIDRGroup")


@pytest.fixture
def api() -> Any:
    with FakeApiServer() as server:
        yield server


def node_names(store: WatchStore) -> list[str]:
    return [n.name for n in store.snapshot().nodes]


def node_lists(api: FakeApiServer) -> int:
    return len(api.requests_for("Node", watch=False))


def test_bookmark_advances_the_resource_version_so_a_reconnect_needs_no_relist(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.apply(make_node("gpu-a-1"))
    with running_store(api, tmp_path) as store:
        wait_until(lambda: api.open_watches("Node") == 1, what="the node watch")
        for i in range(5):  # other kinds move the cluster's resourceVersion past the last node event
            api.apply(make_namespace(f"ns-{i}"))
        bookmark_rv = api.resource_version
        api.bookmark("Node")
        wait_until(lambda: api.bookmarks_sent == 1, what="the bookmark to be sent")
        api.compact()  # without the bookmark, the node watch's resourceVersion is now too old
        api.drop_watches("Node")
        wait_until(lambda: len(api.requests_for("Node", watch=True)) == 2, what="the node watch to reconnect")
        api.apply(make_node("gpu-a-2"))
        wait_until(lambda: node_names(store) == ["gpu-a-1", "gpu-a-2"], what="the new node")

    assert api.requests_for("Node", watch=True)[-1].query["resourceVersion"] == str(bookmark_rv)
    assert node_lists(api) == 1


def test_expired_resource_version_relists_and_recovers_changes_the_watch_missed(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.apply(make_node("gpu-a-1"))
    api.apply(make_node("gpu-a-2"))
    with running_store(api, tmp_path) as store:
        api.fail("Node", status=503, watch=True)  # keep the node watch away while history is lost
        api.drop_watches("Node")
        api.delete("Node", "gpu-a-1")
        api.apply(make_node("gpu-a-3"))
        api.compact()
        api.clear_failures()
        wait_until(lambda: node_names(store) == ["gpu-a-2", "gpu-a-3"], what="the relisted nodes")
        detail = store.status().detail["Node"]

    assert node_lists(api) == 2
    assert detail == "synced"


@pytest.mark.parametrize(
    "watch",
    [pytest.param(False, id="HTTP 410 on the list relists from scratch"),
     pytest.param(True, id="HTTP 410 on the watch request relists")],
)
def test_http_410_relists(api: FakeApiServer, tmp_path: Path, watch: bool) -> None:
    api.apply(make_node("gpu-a-1"))
    api.fail("Node", status=410, watch=watch, times=1)
    with running_store(api, tmp_path) as store:
        wait_until(lambda: len(api.requests_for("Node", watch=True)) >= 1 + watch, what="the node watch")
        api.apply(make_node("gpu-a-2"))
        wait_until(lambda: node_names(store) == ["gpu-a-1", "gpu-a-2"], what="the new node")
        detail = store.status().detail["Node"]

    assert node_lists(api) == 2
    assert detail == "synced"


@pytest.mark.parametrize(
    "code, lists",
    [
        pytest.param(500, 1, id="an ERROR event with 500 resumes the watch without a relist"),
        pytest.param(410, 2, id="an ERROR event with 410 relists"),
    ],
)
def test_watch_error_events(api: FakeApiServer, tmp_path: Path, code: int, lists: int) -> None:
    api.apply(make_node("gpu-a-1"))
    with running_store(api, tmp_path) as store:
        wait_until(lambda: api.open_watches("Node") == 1, what="the node watch")
        assert api.watch_error("Node", code=code) == 1
        wait_until(lambda: len(api.requests_for("Node", watch=True)) == 2, what="the node watch to reopen")
        api.apply(make_node("gpu-a-2"))
        wait_until(lambda: node_names(store) == ["gpu-a-1", "gpu-a-2"], what="the new node")

    assert node_lists(api) == lists


def test_a_watch_that_times_out_is_reopened_from_where_it_ended(api: FakeApiServer, tmp_path: Path) -> None:
    api.apply(make_node("gpu-a-1"))
    tuning = dataclasses.replace(FAST_TUNING, watch_timeout_seconds=1)  # the server ends each stream after 1 s
    with running_store(api, tmp_path, tuning=tuning) as store:
        last = api.apply(make_node("gpu-a-2"))
        wait_until(lambda: len(api.requests_for("Node", watch=True)) >= 2, what="a second node watch")
        api.apply(make_node("gpu-a-3"))
        wait_until(lambda: len(node_names(store)) == 3, what="the third node")
        detail = store.status().detail["Node"]

    second = api.requests_for("Node", watch=True)[1].query
    assert (second["resourceVersion"], second["timeoutSeconds"]) == (last["metadata"]["resourceVersion"], "1")
    assert (node_lists(api), detail) == (1, "synced")


def test_dropped_connection_resumes_from_the_last_resource_version(api: FakeApiServer, tmp_path: Path) -> None:
    api.apply(make_node("gpu-a-1"))
    with running_store(api, tmp_path) as store:
        last = api.apply(make_node("gpu-a-2"))
        wait_until(lambda: node_names(store) == ["gpu-a-1", "gpu-a-2"], what="the second node")
        wait_until(lambda: api.open_watches() == WATCHED, what="every watch open")
        assert api.drop_watches() == WATCHED
        api.apply(make_node("gpu-a-3"))
        wait_until(lambda: node_names(store) == ["gpu-a-1", "gpu-a-2", "gpu-a-3"], what="the node added while cut")
        status = store.status()

    node_watches = api.requests_for("Node", watch=True)
    assert [r.query["resourceVersion"] for r in node_watches][-1] == last["metadata"]["resourceVersion"]
    assert node_lists(api) == 1
    assert (status.synced, status.stale) == (True, False)


def test_absent_cilium_crds_count_as_synced_and_are_picked_up_when_installed(tmp_path: Path) -> None:
    with FakeApiServer(cilium=False) as api, running_store(api, tmp_path) as store:
        absent = store.status().detail
        missing = store.snapshot().missing_kinds
        api.install_cilium()
        api.apply(make_cnp("late"))
        wait_until(lambda: [p.name for p in store.snapshot().policies] == ["late"], what="the late policy")
        wait_until(lambda: store.snapshot().missing_kinds == (), what="every cilium kind found")
        installed = store.status().detail

    assert {k: absent[k] for k in CILIUM_KINDS} == dict.fromkeys(CILIUM_KINDS, CRD_ABSENT)
    assert missing == CILIUM_KINDS
    assert {k: installed[k] for k in CILIUM_KINDS} == dict.fromkeys(CILIUM_KINDS, "synced")
    assert store.snapshot().missing_kinds == ()


def test_cilium_uninstalled_later_is_marked_absent_and_its_objects_dropped(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.apply(make_cnp("zone-a"))
    with running_store(api, tmp_path) as store:
        api.uninstall_cilium()
        wait_until(lambda: store.snapshot().missing_kinds == CILIUM_KINDS, what="cilium kinds marked absent")
        snapshot, detail = store.snapshot(), store.status().detail

    assert snapshot.policies == ()
    assert {k: detail[k] for k in CILIUM_KINDS} == dict.fromkeys(CILIUM_KINDS, CRD_ABSENT)


def test_cidr_groups_are_read_from_v2alpha1_when_v2_is_not_served(tmp_path: Path) -> None:
    with FakeApiServer(cidr_group_versions=("v2alpha1",)) as api:
        api.apply(make_cidr_group("corp", "10.0.0.0/8", api_version="cilium.io/v2alpha1"))
        with running_store(api, tmp_path) as store:
            groups = dict(store.snapshot().cidr_groups)
            detail = store.status().detail["CiliumCIDRGroup"]

    assert {name: g.cidrs for name, g in groups.items()} == {"corp": ("10.0.0.0/8",)}
    assert detail == "synced"
    assert api.requests_for("CiliumCIDRGroup", watch=True)[-1].path == "/apis/cilium.io/v2alpha1/ciliumcidrgroups"


def _answer_500(api: FakeApiServer) -> None:
    api.fail(status=500)
    api.drop_watches()


def _unreachable(api: FakeApiServer) -> None:
    api.stop()


@pytest.mark.parametrize(
    "outage, error",
    [
        pytest.param(_answer_500, "HTTP 500 InternalError", id="apiserver answering 500 turns stale"),
        pytest.param(_unreachable, "MaxRetryError", id="unreachable apiserver turns stale"),
    ],
)
def test_failing_watches_turn_stale_after_the_bound(
    api: FakeApiServer, tmp_path: Path, outage: Callable[[FakeApiServer], None], error: str
) -> None:
    api.apply(make_node("gpu-a-1"))
    settings = Settings(cache_stale_seconds=0.3)
    with running_store(api, tmp_path, settings=settings) as store:
        fresh, fresh_healthy = store.status(), store.healthy_snapshot()
        outage(api)
        wait_until(lambda: store.status().stale, what="the cache to turn stale")
        # A watch cut by the outage fails first with its own error (ProtocolError), then its retries with `error`.
        wait_until(lambda: all(v.startswith("failing since ") and error in v for v in store.status().detail.values()),
                   what=f"every kind failing with {error}")
        stale, stale_healthy = store.status(), store.healthy_snapshot()
        served = node_names(store)

    assert (fresh.synced, fresh.stale) == (True, False)
    assert fresh_healthy is not None and stale_healthy is None  # a review asks only this
    assert stale.synced is True  # it was synced once; the snapshot is old, not partial
    assert all(v.startswith("failing since ") and error in v for v in stale.detail.values()), stale.detail
    assert served == ["gpu-a-1"]  # the last good snapshot is still served; callers decide from `stale`


def test_stale_clears_when_the_apiserver_recovers(api: FakeApiServer, tmp_path: Path) -> None:
    settings = Settings(cache_stale_seconds=0.2)
    with running_store(api, tmp_path, settings=settings) as store:
        _answer_500(api)
        wait_until(lambda: store.status().stale, what="the cache to turn stale")
        api.clear_failures()
        wait_until(lambda: not store.status().stale, what="the cache to recover")
        api.apply(make_node("gpu-a-1"))
        wait_until(lambda: node_names(store) == ["gpu-a-1"], what="events after recovery")
        detail, healthy = store.status().detail, store.healthy_snapshot()

    assert set(detail.values()) == {"synced"}
    assert healthy is not None


def test_wrong_token_is_reported_per_kind(api: FakeApiServer, tmp_path: Path) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", token="wrong")
    store = WatchStore(Settings(), kubeconfig=str(kubeconfig), tuning=FAST_TUNING)
    asyncio.run(store.start())
    try:
        wait_until(lambda: all("Unauthorized" in v for v in store.status().detail.values()), what="401 details")
        status, healthy = store.status(), store.healthy_snapshot()
    finally:
        asyncio.run(store.stop())

    assert status.synced is False and healthy is None
    assert all(v.startswith("failing since ") and "HTTP 401 Unauthorized" in v for v in status.detail.values())


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("topoguard-")}


@pytest.mark.parametrize(
    "tuning, prepare",
    [
        pytest.param(FAST_TUNING, lambda api: None, id="stop ends threads blocked reading open watches"),
        pytest.param(
            dataclasses.replace(FAST_TUNING, backoff_initial_seconds=60, backoff_max_seconds=60),
            lambda api: (api.fail(status=500), api.drop_watches()),
            id="stop ends threads waiting out a backoff",
        ),
    ],
)
def test_stop_ends_every_thread(
    api: FakeApiServer, tmp_path: Path, tuning: Any, prepare: Callable[[FakeApiServer], Any]
) -> None:
    before = _threads()
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    store = WatchStore(Settings(), kubeconfig=str(kubeconfig), tuning=tuning)
    asyncio.run(store.start())
    wait_until(lambda: store.status().synced and api.open_watches() == WATCHED, what="every watch open")
    prepare(api)
    wait_until(lambda: len(_threads() - before) == WATCHED + 1, what="the threads running")

    asyncio.run(store.stop())  # watch timeouts are 300 s: only cutting the sockets ends these threads

    assert _threads() - before == set()


@pytest.mark.parametrize(
    "content, match",
    [
        pytest.param(None, "no such file|No such file|Invalid kube-config", id="a missing kubeconfig"),
        pytest.param("apiVersion: v1\nkind: Config\nclusters: []\n", "kubeconfig", id="a kubeconfig without a cluster"),
        pytest.param("{not: [yaml", "kubeconfig", id="a kubeconfig that is not YAML"),
    ],
)
def test_unusable_kubeconfig_is_a_clear_error(tmp_path: Path, content: str | None, match: str) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)

    with pytest.raises(ClientConfigError, match=match):
        WatchStore(Settings(), kubeconfig=str(path))
