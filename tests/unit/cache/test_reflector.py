"""Pure parts of the reflector: backoff, stream splitting, event application, status text."""

from __future__ import annotations

import gc
import random
import threading
import time
from typing import Any

import pytest

from app.cache import projections, resources
from app.cache.errors import ApiError, StreamError
from app.cache.reflector import (
    KindCache,
    Reflector,
    WatchTuning,
    backoff_delay,
    describe,
    object_key,
    parse_json,
    split_lines,
)
from app.config import Settings

RESOURCES = {r.kind: r for r in resources.build_resources(Settings())}


@pytest.mark.parametrize(
    "attempt, low, high",
    [
        pytest.param(1, 0.25, 0.5, id="first retry waits about the initial delay"),
        pytest.param(2, 0.5, 1.0, id="second retry doubles"),
        pytest.param(6, 8.0, 16.0, id="sixth retry is 16 s at most"),
        pytest.param(7, 15.0, 30.0, id="seventh retry reaches the 30 s cap"),
        pytest.param(1000, 15.0, 30.0, id="any later retry stays within the cap"),
        pytest.param(0, 0.25, 0.5, id="attempt 0 is treated as the first"),
    ],
)
def test_backoff_is_capped_exponential_with_jitter(attempt: int, low: float, high: float) -> None:
    delays = [backoff_delay(attempt, initial=0.5, maximum=30.0, rng=random.Random(seed)) for seed in range(200)]

    assert low <= min(delays) and max(delays) <= high
    assert len(set(delays)) > 100  # jittered: replicas do not retry in lockstep


@pytest.mark.parametrize(
    "chunks, want",
    [
        pytest.param([b'{"a":1}\n{"b":2}\n'], [b'{"a":1}', b'{"b":2}'], id="two records in one chunk"),
        pytest.param([b'{"a"', b":1}\n{", b'"b":2}\n'], [b'{"a":1}', b'{"b":2}'], id="records cut across chunks"),
        pytest.param([b"\n\n", b'{"a":1}\n', b"\n"], [b'{"a":1}'], id="blank lines are skipped"),
        pytest.param([b'{"a":1}\n{"b":2}'], [b'{"a":1}', b'{"b":2}'], id="a last record without newline is kept"),
        pytest.param([], [], id="an empty stream has no records"),
    ],
)
def test_split_lines(chunks: list[bytes], want: list[bytes]) -> None:
    assert list(split_lines(chunks)) == want


@pytest.mark.parametrize(
    "data, message",
    [
        pytest.param(b"{not json", "Node list: not JSON", id="garbage is a StreamError"),
        pytest.param(b"[1, 2]", "expected a JSON object, got list", id="a JSON list is a StreamError"),
    ],
)
def test_parse_json_rejects_what_the_api_never_sends(data: bytes, message: str) -> None:
    with pytest.raises(StreamError, match=message):
        parse_json(data, "Node list")


@pytest.mark.parametrize("page", [False, True])
def test_parse_json_rejects_what_the_api_never_sends_whether_or_not_a_page(page: bool) -> None:
    with pytest.raises(StreamError, match="Pod list: not JSON"):
        parse_json(b'{"items": [{"a": ', "Pod list", page=page)
    assert gc.isenabled()  # a page that fails to parse leaves the collector on


def test_a_list_page_is_taken_out_of_the_collectors_generations_and_still_freed() -> None:
    page = b'{"items": [' + b",".join(b'{"metadata": {"name": "p%d", "labels": {}}, "spec": {"c": [{}]}}' % i
                                       for i in range(1_000)) + b"]}"
    frozen = gc.get_freeze_count()
    try:
        value = parse_json(page, "Pod list", page=True)
        assert gc.isenabled()
        held = gc.get_freeze_count()
        assert held >= frozen + 3 * 1_000  # the page's dicts and lists are not scanned
        del value
        assert gc.get_freeze_count() <= held - 3 * 1_000  # reference counting still frees them
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        parse_json(page, "Pod list", page=True)
        assert not gc.isenabled()  # a collector turned off by the caller stays off
    finally:
        gc.enable()


def node(name: str, *, rv: str = "1", zone: str = "a", kind: bool = True) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "resourceVersion": rv, "labels": {"topology.kubernetes.io/zone": zone}},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }
    return {"apiVersion": "v1", "kind": "Node", **obj} if kind else obj


def pod(name: str, *, phase: str = "Running", gpus: int = 1, node_name: str = "n1") -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {"cpu": "1"}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "train", "resourceVersion": "7"},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": phase},
    }


def filled(kind: str, *objs: dict[str, Any]) -> KindCache:
    cache = KindCache(RESOURCES[kind])
    for obj in objs:
        cache.apply("ADDED", obj)
    return cache


@pytest.mark.parametrize(
    "cache, event, obj, changed, keys, rv",
    [
        pytest.param(filled("Node"), "ADDED", node("n1", rv="5"), True, ["n1"], "5", id="added is kept"),
        pytest.param(filled("Node", node("n1")), "MODIFIED", node("n1", rv="6", zone="b"), True, ["n1"], "6",
                     id="modified replaces"),
        pytest.param(filled("Node", node("n1")), "MODIFIED", node("n1", rv="6"), False, ["n1"], "6",
                     id="modified with an equal projection is no change but moves the rv"),
        pytest.param(filled("Node", node("n1")), "DELETED", node("n1", rv="9"), True, [], "9",
                     id="deleted is dropped"),
        pytest.param(filled("Node"), "DELETED", node("ghost", rv="9"), False, [], "9",
                     id="deleting an unknown object is no change"),
        pytest.param(filled("Pod", pod("w0")), "MODIFIED", pod("w0", phase="Succeeded"), True, [], "7",
                     id="a pod turning terminal is dropped"),
        pytest.param(filled("Pod"), "ADDED", pod("w0", gpus=0), False, [], "7",
                     id="a pod without GPUs is never kept"),
        pytest.param(filled("Pod"), "ADDED", pod("w0", node_name=""), False, [], "7",
                     id="an unbound pod is never kept"),
    ],
)
def test_kind_cache_applies_events(
    cache: KindCache, event: str, obj: dict[str, Any], changed: bool, keys: list[str], rv: str
) -> None:
    got = cache.apply(event, obj)

    assert (got, sorted(cache.items), cache.resource_version) == (changed, keys, rv)


def test_list_items_without_kind_are_projected_as_the_watched_kind() -> None:
    cache = KindCache(RESOURCES["NetworkPolicy"])
    item = {"metadata": {"name": "deny", "namespace": "train"}, "spec": {"podSelector": {}}}

    cache.apply("ADDED", item)

    typed = {**item, "kind": "NetworkPolicy", "apiVersion": "networking.k8s.io/v1"}
    assert cache.items == {"train/deny": projections.project_policy(typed)}


@pytest.mark.parametrize(
    "obj, want",
    [
        pytest.param({"metadata": {"name": "n1"}}, "n1", id="cluster-scoped"),
        pytest.param({"metadata": {"name": "p", "namespace": "ns"}}, "ns/p", id="namespaced"),
        pytest.param({"metadata": "garbage"}, "", id="bad metadata"),
    ],
)
def test_object_key(obj: dict[str, Any], want: str) -> None:
    assert object_key(obj) == want


def make_reflector(kind: str = "Node") -> Reflector:
    return Reflector(
        RESOURCES[kind], apis=resources.Apis(core=None, custom=None), tuning=WatchTuning(),
        lock=threading.Lock(), on_change=lambda: None,
    )


FAILED_AT = 1_780_000_000.0  # 2026-05-28T20:26:40Z


@pytest.mark.parametrize(
    "state, want_detail, want_failing",
    [
        pytest.param({}, "listing", 0.0, id="before the first list: listing"),
        pytest.param({"listed": True}, "synced", 0.0, id="after the first list: synced"),
        pytest.param({"listed": True, "absent": True}, resources.CRD_ABSENT, 0.0, id="absent CRD"),
        pytest.param(
            {"listed": True, "failing_since": FAILED_AT, "failing_since_monotonic": 95.0, "last_error": "HTTP 500 X"},
            "failing since 2026-05-28T20:26:40Z: HTTP 500 X", 5.0, id="failing shows since when and why",
        ),
        pytest.param(
            {"listed": True, "failing_since": FAILED_AT, "failing_since_monotonic": 95.0, "connected": True},
            "synced", 0.0, id="a reconnected watch is not failing",
        ),
    ],
)
def test_reflector_status(state: dict[str, Any], want_detail: str, want_failing: float) -> None:
    reflector = make_reflector()
    for name, value in state.items():
        setattr(reflector, name, value)

    assert (reflector.detail(100.0), reflector.failing_for(100.0)) == (want_detail, want_failing)


def test_interrupt_without_an_open_request_is_a_no_op() -> None:
    reflector = make_reflector()

    reflector.interrupt()

    assert reflector.detail(time.monotonic()) == "listing"


@pytest.mark.parametrize(
    "error, want",
    [
        pytest.param(ApiError(403, "Forbidden", "nodes is forbidden"), "HTTP 403 Forbidden: nodes is forbidden",
                     id="API errors read as the apiserver wrote them"),
        pytest.param(ConnectionError("refused"), "ConnectionError: refused", id="others name their type"),
        pytest.param(ValueError("x" * 1000), "ValueError: " + "x" * 285 + "...", id="long text is cut at 300"),
    ],
)
def test_describe(error: Exception, want: str) -> None:
    assert describe(error) == want
