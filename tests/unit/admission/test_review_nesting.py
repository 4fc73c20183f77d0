"""parse_review's nesting bound: the orjson indentation screen answers exactly what the walk answers.

`_nested_deeper_than` first rules deep nesting out from orjson's indented output and walks the
dicts and lists only when it cannot (issue 4: the walk alone cost 25-30 µs per review). Property: on
random JSON-like values, including the values that could fool a text-based screen (strings holding
newlines, spaces and brackets, empty containers, tuples and dict subclasses orjson encodes but the walk
does not descend, keys and integers orjson refuses), the answer equals the walk's for every limit.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.admission import pipeline

LAB_REVIEW = Path(__file__).resolve().parents[2] / "data" / "reviews" / "lab-pytorchjob-create.json"

tricky_text = st.text(alphabet=st.sampled_from(["\n", " ", "{", "[", "]", "}", '"', "\\", "a"]), max_size=12)
plain_leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), tricky_text)


def _plain_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.lists(children, max_size=4), st.dictionaries(tricky_text, children, max_size=4))


def _unusual_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        _plain_containers(children),
        st.lists(children, max_size=3).map(tuple),  # orjson writes an array; the walk sees a leaf
        st.dictionaries(tricky_text, children, max_size=3).map(collections.OrderedDict),  # the same for a subclass
        st.dictionaries(st.integers(0, 3), children, min_size=1, max_size=2),  # orjson refuses: the walk decides
    )


# As orjson decodes: the screen decides most of these alone.
plain_json = _plain_containers(st.recursive(plain_leaves, _plain_containers, max_leaves=40))
# Values orjson encodes differently from the walk or refuses (a key not a string, an integer past 64 bits).
unusual = _unusual_containers(st.recursive(st.one_of(plain_leaves, st.just(2**70)), _unusual_containers,
                                           max_leaves=30))


@settings(max_examples=300, deadline=None)
@given(node=plain_json, limit=st.integers(min_value=0, max_value=7))
def test_the_screen_answers_what_the_walk_answers(node: Any, limit: int) -> None:
    assert pipeline._nested_deeper_than(node, limit) is pipeline._walked_deeper_than(node, limit)


@settings(max_examples=300, deadline=None)
@given(node=unusual, limit=st.integers(min_value=0, max_value=7))
def test_values_orjson_sees_otherwise_get_the_walks_answer(node: Any, limit: int) -> None:
    assert pipeline._nested_deeper_than(node, limit) is pipeline._walked_deeper_than(node, limit)


def _chain(levels: int, innermost: Any, *, arrays: bool = False) -> Any:
    """`innermost` wrapped in containers until the whole value has `levels` levels of its own."""
    node = innermost
    for _ in range(levels):
        node = [node] if arrays else {"x": node, "pad": "\n" + " " * 300}
    return node


@pytest.mark.parametrize(
    "node, limit, deeper",
    [
        pytest.param(_chain(4, "leaf"), 4, False, id="four levels are within four"),
        pytest.param(_chain(5, "leaf"), 4, True, id="five levels are not"),
        pytest.param(_chain(4, {}), 4, True, id="an empty object one level too deep counts"),
        pytest.param(_chain(4, [], arrays=True), 4, True, id="an empty array one level too deep counts"),
        pytest.param(_chain(3, []), 4, False, id="an empty container at the limit does not"),
        pytest.param({}, 0, True, id="limit 0: the value itself is a level"),
        pytest.param(_chain(300, "leaf", arrays=True), 100, True, id="past orjson's own limit the walk answers"),
        pytest.param(_chain(99, {1: "non-string key"}), 100, False, id="a key orjson refuses, within the limit"),
        pytest.param(_chain(100, {1: {}}), 100, True, id="a key orjson refuses, past the limit"),
        pytest.param({"s": "\n" + " " * 400 + "{[{["}, 100, False, id="newlines and spaces inside strings never count"),
    ],
)
def test_nesting_examples(node: Any, limit: int, deeper: bool) -> None:
    assert pipeline._nested_deeper_than(node, limit) is deeper
    assert pipeline._walked_deeper_than(node, limit) is deeper


def test_the_lab_review_is_cleared_by_the_screen_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_walk(node: Any, limit: int) -> bool:
        raise AssertionError("the walk ran for a review the screen clears")

    monkeypatch.setattr(pipeline, "_walked_deeper_than", no_walk)
    assert pipeline._nested_deeper_than(json.loads(LAB_REVIEW.read_text()), pipeline.MAX_NESTING_DEPTH) is False


def _review_with(extension: Any) -> dict[str, Any]:
    body = json.loads(LAB_REVIEW.read_text())
    body["request"]["extension"] = extension
    return body


@pytest.mark.parametrize(
    "extension",
    [
        pytest.param(_chain(99, "leaf"), id="nested objects"),
        pytest.param(_chain(99, "leaf", arrays=True), id="nested arrays"),
        pytest.param(_chain(99, {1: "x"}), id="with a key orjson refuses"),
        pytest.param(_chain(400, "leaf"), id="past orjson's own limit"),
    ],
)
def test_too_deep_reviews_are_refused_with_the_same_message(extension: Any) -> None:
    with pytest.raises(pipeline.BadReview) as refused:
        pipeline.parse_review(_review_with(extension))
    assert str(refused.value) == ("the review nests objects and arrays more than 100 levels deep; "
                                  "no Kubernetes object needs that many")


def test_a_value_orjson_refuses_within_the_limit_is_accepted() -> None:
    body = _review_with({"big": 2**70, 1: "non-string key"})
    request = pipeline.parse_review(body)
    assert request.uid == body["request"]["uid"] and request.obj == body["request"]["object"]
