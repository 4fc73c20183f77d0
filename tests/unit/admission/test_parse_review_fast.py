"""parse_review's plain path reads a request exactly as the AdmissionRequest schema does.

`pipeline._plain_request` skips the schema for requests written the way the apiserver writes them;
everything else goes to the schema (`_validated_request`), which also words the refusals. Random
requests, from well-formed to subtly mistyped, must get the same ReviewRequest or the same refusal
either way, and the plain path must really be the one a usual review takes.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.admission import pipeline
from app.models.admission import ReviewRequest

LAB_REVIEW = json.loads((Path(__file__).resolve().parents[2] / "data" / "reviews" / "lab-pytorchjob-create.json")
                        .read_text())

_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=4,
)
# Values near the types the schema wants: right, null, the wrong JSON type, or what lax mode converts.
_STRING = st.one_of(st.text(max_size=5), st.none(), st.integers(0, 2), st.booleans(), st.just(["x"]))
_GVK = st.one_of(
    st.fixed_dictionaries({}, optional={"group": _STRING, "version": _STRING, "kind": _STRING,
                                        "resource": _STRING, "extra": _ANY_JSON}),
    st.none(), st.just("PyTorchJob"), st.just([]), st.just({1: "non-string key"}),
)
_OBJECT = st.one_of(st.dictionaries(st.text(max_size=3), _ANY_JSON, max_size=3), st.none(), st.just([]),
                    st.just("job"), st.just({2: "non-string key"}))
_FIELDS = {
    "uid": st.one_of(st.text(max_size=5), st.none(), st.integers(0, 9)),
    "operation": st.one_of(st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT", "PATCH", "create", ""]),
                           st.none(), st.integers(0, 1)),
    "kind": _GVK, "resource": _GVK, "requestKind": _GVK, "requestResource": _GVK,
    "name": _STRING, "namespace": _STRING, "subResource": _STRING, "requestSubResource": _STRING,
    "object": _OBJECT, "oldObject": _OBJECT, "userInfo": _OBJECT, "options": _OBJECT,
    "dryRun": st.one_of(st.booleans(), st.none(), st.sampled_from(["true", "false", "yes", "maybe"]),
                        st.integers(0, 2)),
    # The schema's Python names, which it accepts as well (populate_by_name), and a field it does not know.
    "obj": _OBJECT, "dry_run": st.booleans(), "sub_resource": _STRING, "futureField": _ANY_JSON,
}


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    base = copy.deepcopy(LAB_REVIEW["request"])
    for key in draw(st.lists(st.sampled_from(sorted(_FIELDS)), max_size=4, unique=True)):
        if draw(st.booleans()):
            base[key] = draw(_FIELDS[key])
        else:
            base.pop(key, None)
    return base


def _outcome(read: Any, raw: dict[str, Any]) -> ReviewRequest | str:
    try:
        result: ReviewRequest = read(raw)
        return result
    except pipeline.BadReview as e:
        return f"refused: {e}"


@settings(max_examples=3000, deadline=None)
@given(raw=requests())
def test_the_plain_path_reads_what_the_schema_reads(raw: dict[str, Any]) -> None:
    plain = pipeline._plain_request(raw)
    reference = _outcome(pipeline._validated_request, raw)
    if plain is not None:
        assert plain == reference
    body = {**LAB_REVIEW, "request": raw}
    assert _outcome(pipeline.parse_review, body) == _outcome(
        lambda b: _reference_parse(b), body)


def _reference_parse(body: dict[str, Any]) -> ReviewRequest:
    """parse_review with the schema alone (the plain path switched off)."""
    original = pipeline._plain_request
    pipeline._plain_request = lambda raw: None
    try:
        return pipeline.parse_review(body)
    finally:
        pipeline._plain_request = original


@pytest.mark.parametrize("review", ["lab-pytorchjob-create.json"])
def test_a_review_as_the_apiserver_sends_it_takes_the_plain_path(review: str) -> None:
    raw = json.loads((Path(__file__).resolve().parents[2] / "data" / "reviews" / review).read_text())["request"]
    plain = pipeline._plain_request(raw)
    assert plain is not None
    assert plain == pipeline._validated_request(raw)
    assert (plain.uid, plain.operation, plain.kind.kind) == (raw["uid"], "CREATE", raw["kind"]["kind"])
