"""Where a review runs (routes._answer): as few hand-offs between threads as its cost allows.

A small review of a job with few replica types is read on the event loop, and answered there when the answer is
known (a memo hit, a skip, a refusal, a decision of a shape already decided): no hand-off. A decision to compute
goes to a decision worker (one hand-off, under the deadline and the namespace's share). A body over
INLINE_BODY_BYTES, or a job with more than INLINE_REPLICA_TYPES replica types, is read on a reader thread, so the
loop only moves its bytes. Counted on the real app, through HTTP, with the lab's cluster and review.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.cache.files import load_snapshot
from app.cache.store import StaticStore
from app.config import load_settings
from app.http import routes
from app.http.app import TopoguardApp, create_app
from app.http.workers import Workers

DATA = Path(__file__).resolve().parents[2] / "data"
LAB_REVIEW: dict[str, Any] = json.loads((DATA / "reviews" / "lab-pytorchjob-create.json").read_text())
SETTINGS = load_settings(DATA / "clusters" / "lab-config.yaml", environ={})


class Counted:
    """The app's worker pools, counting the tasks each one ran and on which threads the reads happened."""

    def __init__(self, workers: Workers) -> None:
        self.reads = 0
        self.decisions = 0
        self.read_threads: set[str] = set()
        read, decide = workers.read, workers.decide

        async def counted_read(work: Callable[[], Any]) -> Any:
            self.reads += 1
            return await read(work)

        async def counted_decide(namespace: str, work: Callable[[], Any]) -> Any:
            self.decisions += 1
            return await decide(namespace, work)

        workers.read = counted_read  # type: ignore[method-assign]
        workers.decide = counted_decide  # type: ignore[method-assign]

    def hand_offs(self) -> tuple[int, int]:
        return self.reads, self.decisions


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, Counted, list[str]]]:
    decoded_on: list[str] = []  # the thread that decoded each review body
    decode = routes.decode

    def watched(state: Any, body: bytes, held: Any) -> Any:
        decoded_on.append(threading.current_thread().name)
        return decode(state, body, held)

    monkeypatch.setattr(routes, "decode", watched)
    app: TopoguardApp = create_app(SETTINGS, StaticStore(load_snapshot(DATA / "clusters" / "lab.yaml")))
    with TestClient(app) as client:
        assert app.state.workers is not None
        yield client, Counted(app.state.workers), decoded_on


def review(*, name: str = "llm", uid: str = "u-1", pad: int = 0, dry_run: bool = False) -> dict[str, Any]:
    body = copy.deepcopy(LAB_REVIEW)
    request = body["request"]
    request["uid"], request["name"], request["dryRun"] = uid, name, dry_run
    job = request["object"]
    job["metadata"]["name"] = name
    if pad:  # an annotation as big as asked: a big body, the same job
        job["metadata"].setdefault("annotations", {})["example.com/notes"] = "x" * pad
    return body


def post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/mutate", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()["response"]
    return answer


def test_a_small_review_is_decided_with_one_hand_off_and_answered_from_the_memo_with_none(
    served: tuple[TestClient, Counted, list[str]],
) -> None:
    client, counted, decoded_on = served
    first = post(client, review(dry_run=True))  # a dry run holds no GPUs: the next one finds its decision
    assert first["allowed"] and first["patch"]
    assert counted.hand_offs() == (0, 1)

    again = post(client, review(uid="u-2", dry_run=True))
    assert again["patch"] == first["patch"]
    assert counted.hand_offs() == (0, 1)  # no new hand-off
    assert len(decoded_on) == 2 and not any(t.startswith(("read", "decide")) for t in decoded_on)  # the loop's


def test_a_new_job_of_a_shape_decided_before_is_decided_on_the_loop(
    served: tuple[TestClient, Counted, list[str]],
) -> None:
    client, counted, _ = served
    for i in range(3):  # each admitted job holds its GPUs, so each next decision is a new one
        answer = post(client, review(name=f"llm-{i}", uid=f"u-{i}"))
        assert answer["allowed"] and answer["patch"]
    assert counted.hand_offs() == (0, 1)  # only the first job of the shape went to a decision worker


def test_a_skipped_or_refused_small_review_never_leaves_the_loop(
    served: tuple[TestClient, Counted, list[str]],
) -> None:
    client, counted, _ = served
    status = review()
    status["request"].update(operation="UPDATE", subResource="status",
                             oldObject=copy.deepcopy(status["request"]["object"]))
    assert post(client, status) == {"uid": "u-1", "allowed": True}
    broken = review(name="broken")
    broken["request"]["object"]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "many"
    refused = post(client, broken)
    assert refused["allowed"] is False and refused["status"]["code"] == 422
    assert counted.hand_offs() == (0, 0)


def test_a_small_review_of_a_job_with_many_replica_types_is_read_off_the_loop(
    served: tuple[TestClient, Counted, list[str]],
) -> None:
    # Reading a job costs with the square of its replica types (flows per pair), not with its bytes.
    client, counted, decoded_on = served
    many = review(dry_run=True)
    specs = many["request"]["object"]["spec"]["pytorchReplicaSpecs"]
    for i in range(routes.INLINE_REPLICA_TYPES):  # Master + Worker + these: past the bound
        specs[f"Extra{i}"] = copy.deepcopy(specs["Worker"])
    assert len(json.dumps(many)) <= routes.INLINE_BODY_BYTES
    post(client, many)
    assert counted.reads == 1
    assert not decoded_on[-1].startswith("read")  # decoding the small body and reading the review stayed on the loop

    few = review(uid="u-2", dry_run=True)  # Master + Worker
    post(client, few)
    assert counted.reads == 1


def test_a_big_review_is_read_off_the_loop_and_decided_on_a_worker(
    served: tuple[TestClient, Counted, list[str]],
) -> None:
    client, counted, decoded_on = served
    big = review(pad=routes.INLINE_BODY_BYTES, dry_run=True)
    assert len(json.dumps(big)) > routes.INLINE_BODY_BYTES
    first = post(client, big)
    assert first["allowed"] and first["patch"]
    assert counted.hand_offs() == (1, 1)
    assert decoded_on[-1].startswith("read")

    # The same big job again: read on a reader thread, its decision found there (no second hand-off).
    post(client, review(pad=routes.INLINE_BODY_BYTES, uid="u-2", dry_run=True))
    assert counted.hand_offs() == (2, 1)
