"""app.cache.access / access_api: what the TokenReview and SubjectAccessReview answers mean, and the TTL cache."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from app.cache.access import Access, CachedAccess
from app.cache.access_api import ApiAccessReviewer

ALICE = {"username": "alice", "uid": "u-1", "groups": ["devs", "system:authenticated"]}


@dataclass
class Raw:
    """What the client returns with `_preload_content=False`: the body bytes in `.data`."""

    data: bytes


def answering(status: dict[str, Any] | Exception, sent: list[dict[str, Any]]) -> Callable[..., Raw]:
    def create(*, body: dict[str, Any], **_: Any) -> Raw:
        sent.append(body)
        if isinstance(status, Exception):
            raise status
        return Raw(json.dumps({"kind": body["kind"], "status": status}).encode())

    return create


def reviewer(authn: dict[str, Any] | Exception, authz: dict[str, Any] | Exception,
             sent: list[dict[str, Any]]) -> ApiAccessReviewer:
    api = ApiAccessReviewer(client.ApiClient(client.Configuration()))
    api._authn.create_token_review = answering(authn, sent)  # type: ignore[method-assign]
    api._authz.create_subject_access_review = answering(authz, sent)  # type: ignore[method-assign]
    return api


@pytest.mark.parametrize(
    "authn, authz, want",
    [
        pytest.param({"authenticated": True, "user": ALICE}, {"allowed": True}, Access("allowed", user="alice"),
                     id="an authenticated user RBAC allows is allowed"),
        pytest.param({"authenticated": True, "user": ALICE}, {"allowed": False, "reason": "no rule"},
                     Access("denied", user="alice", reason="no rule"),
                     id="an authenticated user RBAC does not allow is denied"),
        pytest.param({"authenticated": True, "user": ALICE}, {"allowed": True, "denied": True},
                     Access("denied", user="alice", reason="no RBAC rule allows it"),
                     id="an explicit deny wins over allowed"),
        pytest.param({"authenticated": False, "error": "token expired"}, {"allowed": True},
                     Access("unauthenticated", reason="token expired"),
                     id="a token the apiserver rejects is unauthenticated"),
        pytest.param({}, {"allowed": True}, Access("unauthenticated", reason="the token is not valid"),
                     id="an empty TokenReview status is not authentication"),
        pytest.param(ApiException(status=403, reason="Forbidden"), {"allowed": True},
                     Access("error", reason="TokenReview failed: HTTP 403 Forbidden"),
                     id="our account may not create tokenreviews: an error, not access"),
        pytest.param({"authenticated": True, "user": ALICE}, OSError("connection refused"),
                     Access("error", reason="SubjectAccessReview failed: OSError: connection refused"),
                     id="an unreachable apiserver is an error, not access"),
    ],
)
def test_api_reviewer_reads_the_reviews(authn: Any, authz: Any, want: Access) -> None:
    sent: list[dict[str, Any]] = []
    assert reviewer(authn, authz, sent).review("tok", verb="get", path="/map") == want


def test_api_reviewer_asks_for_the_non_resource_url_as_the_token_s_user() -> None:
    sent: list[dict[str, Any]] = []
    reviewer({"authenticated": True, "user": ALICE}, {"allowed": True}, sent).review("tok", verb="post", path="/map")
    assert sent == [
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "tok"}},
        {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
         "spec": {"user": "alice", "groups": ["devs", "system:authenticated"], "uid": "u-1",
                  "nonResourceAttributes": {"path": "/map", "verb": "post"}}},
    ]


@dataclass
class Scripted:
    """A reviewer answering from a list, one answer per call."""

    answers: list[Access]
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    gate: threading.Event | None = None

    def review(self, token: str, *, verb: str, path: str) -> Access:
        self.calls.append((token, verb, path))
        if self.gate is not None:
            self.gate.wait(10)
        return self.answers[len(self.calls) - 1]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_answers_are_kept_for_the_ttl_then_asked_again() -> None:
    inner = Scripted([Access("allowed", user="a"), Access("denied", user="a", reason="binding removed")])
    clock = Clock()
    cached = CachedAccess(inner, ttl_seconds=10, clock=clock)
    first = cached.review("t", verb="get", path="/map")
    clock.now += 9.9
    kept = cached.review("t", verb="get", path="/map")
    clock.now += 0.2
    later = cached.review("t", verb="get", path="/map")
    assert (first.verdict, kept.verdict, later.verdict) == ("allowed", "allowed", "denied")
    assert len(inner.calls) == 2


def test_each_token_and_verb_is_its_own_entry() -> None:
    inner = Scripted([Access("allowed"), Access("denied"), Access("unauthenticated")])
    cached = CachedAccess(inner, clock=Clock())
    got = [cached.review(t, verb=v, path="/map").verdict for t, v in [("a", "get"), ("a", "post"), ("b", "get")]]
    assert got == ["allowed", "denied", "unauthenticated"]
    assert [cached.review("b", verb="get", path="/map").verdict] == ["unauthenticated"]  # kept: a bad token too
    assert len(inner.calls) == 3


def test_errors_are_not_kept() -> None:
    inner = Scripted([Access("error", reason="apiserver down"), Access("allowed")])
    cached = CachedAccess(inner, clock=Clock())
    assert [cached.review("t", verb="get", path="/map").verdict for _ in range(2)] == ["error", "allowed"]


def test_calls_in_flight_are_bounded() -> None:
    gate = threading.Event()
    inner = Scripted([Access("allowed")] * 2, gate=gate)
    cached = CachedAccess(inner, in_flight=1, clock=Clock())
    worker = threading.Thread(target=cached.review, args=("slow",), kwargs={"verb": "get", "path": "/map"})
    worker.start()
    try:
        while not inner.calls:
            threading.Event().wait(0.001)
        busy = cached.review("other", verb="get", path="/map")
    finally:
        gate.set()
        worker.join()
    assert busy == Access("error", reason="more than 1 access reviews in flight")
    assert [c[0] for c in inner.calls] == ["slow"]


def test_the_kept_key_is_not_the_token() -> None:
    cached = CachedAccess(Scripted([Access("allowed")]), clock=Clock())
    cached.review("secret-token", verb="get", path="/map")
    assert "secret-token" not in repr(cached._kept._entries)
