"""Property tests: random and mutated AdmissionReviews thrown at the review endpoints, in process.

Whatever arrives, the answer is either an HTTP 4xx with `{"error": "<text>"}` or an HTTP 200 whose
body is a well-formed response AdmissionReview (echoing the uid when the request had a usable one).
Never a 5xx, never a crash, never an allow that skipped the checks without saying why.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.admission import pipeline
from app.cache.files import build_snapshot
from app.cache.store import StaticStore
from app.config import Settings
from app.http.app import TopoguardApp, create_app
from tests.integration.conftest import admission_review, check_review_envelope, load_scenario, scenario_objects

BODY_LIMIT_BYTES = 256 * 1024

json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


class Client:
    """POSTs straight into the ASGI app (httpx's ASGI transport), one short event loop per request."""

    def __init__(self, app: TopoguardApp) -> None:
        self.app = app

    def post(self, path: str, *, content: bytes, headers: dict[str, str]) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="https://testserver") as c:
                return await c.post(path, content=content, headers=headers)

        return asyncio.run(send())


SNAPSHOT = build_snapshot(scenario_objects(load_scenario("lab-pytorchjob-managed-zone-label")))
SETTINGS = Settings(zone_identity_label="zone", max_body_bytes=BODY_LIMIT_BYTES)


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    # Module scope: one app (and its decision thread pool) for every generated example.
    yield Client(create_app(SETTINGS, StaticStore(SNAPSHOT)))


def base_review() -> dict[str, Any]:
    job = load_scenario("lab-pytorchjob-managed-zone-label")["object"]
    return admission_review(job, uid="fuzz-uid")


BASE = base_review()


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a node of a JSON document (dict keys and list indexes)."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from paths(child, (*prefix, index))


ALL_PATHS = [p for p in paths(BASE) if p]


@st.composite
def mutated_reviews(draw: st.DrawFn) -> dict[str, Any]:
    """The lab's PyTorchJob review with 1-3 nodes replaced by random JSON or deleted."""
    review = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(ALL_PATHS))
        parent: Any = review
        try:
            for step in path[:-1]:
                parent = parent[step]
            key = path[-1]
            # An earlier mutation may have turned a list into a dict (or back): a list index must not
            # become a dict key (JSON has only string keys, orjson refuses others), nor a key an index.
            fits = (isinstance(parent, dict) and isinstance(key, str)) or (
                isinstance(parent, list) and isinstance(key, int) and key < len(parent))
            if not fits:
                continue
            if draw(st.booleans()):
                parent[key] = draw(json_values)
            else:
                parent.pop(key)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or retyped this path
    return review


def check_answer(status: int, body: bytes, sent: Any) -> None:
    answer = orjson.loads(body)
    if status == 200:
        request = sent.get("request") if isinstance(sent, dict) else None
        uid = request.get("uid") if isinstance(request, dict) else None
        check_review_envelope(answer, uid if isinstance(uid, str) else None)
    else:
        assert 400 <= status < 500, (status, answer)
        assert isinstance(answer, dict) and isinstance(answer.get("error"), str) and answer["error"]


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(review=mutated_reviews(), path=st.sampled_from(["/mutate", "/validate"]))
def test_mutated_reviews_get_a_review_or_a_4xx(client: Client, review: dict[str, Any], path: str) -> None:
    got = client.post(path, content=orjson.dumps(review), headers={"content-type": "application/json"})
    check_answer(got.status_code, got.content, review)
    if got.status_code == 200:  # one code path: the same answer as the in-process pipeline
        operation = "mutate" if path == "/mutate" else "validate"
        request = pipeline.parse_review(orjson.loads(orjson.dumps(review)))
        want = pipeline.answer(request, snapshot=SNAPSHOT, settings=SETTINGS, operation=operation).review
        assert orjson.loads(got.content) == want


@FUZZ
@given(value=json_values)
def test_random_json_gets_a_4xx(client: Client, value: Any) -> None:
    got = client.post("/mutate", content=orjson.dumps(value), headers={"content-type": "application/json"})
    check_answer(got.status_code, got.content, value)
    assert got.status_code == 400  # random JSON is never an AdmissionReview


@FUZZ
@given(body=st.binary(max_size=512))
def test_random_bytes_get_a_4xx(client: Client, body: bytes) -> None:
    got = client.post("/validate", content=body, headers={"content-type": "application/json"})
    assert got.status_code == 400
    check_answer(got.status_code, got.content, None)


@FUZZ
@given(content_type=st.text(max_size=40).filter(lambda t: t.split(";")[0].strip().lower() != "application/json"))
def test_other_content_types_get_415(client: Client, content_type: str) -> None:
    try:
        headers = {"content-type": content_type.encode("latin-1").decode("latin-1")}
        got = client.post("/mutate", content=orjson.dumps(BASE), headers=headers)
    except (UnicodeEncodeError, ValueError):
        return  # not expressible as an HTTP header value; nothing reaches the server
    assert got.status_code == 415
    check_answer(got.status_code, got.content, None)



@settings(max_examples=300, deadline=None)
@given(review=mutated_reviews())
def test_mutations_keep_json_string_keys(review: dict[str, Any]) -> None:
    """A list replaced by a dict, then mutated at a list index, must not give the dict an integer key."""
    orjson.dumps(review)  # raises JSONEncodeError on a key that is not a string
