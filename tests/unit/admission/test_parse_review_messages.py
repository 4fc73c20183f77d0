"""parse_review's refusals word for word: what the webhook answers with HTTP 400 and `topoguard review` prints.

Pinned so that a cheaper parse (issue 4) cannot change a message unnoticed: the field path in the
wire's camelCase, pydantic's wording, every problem of one request joined with "; ".
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from app.admission import pipeline

LAB_REVIEW = json.loads((Path(__file__).resolve().parents[2] / "data" / "reviews" / "lab-pytorchjob-create.json")
                        .read_text())


def _with(**fields: Any) -> dict[str, Any]:
    body = copy.deepcopy(LAB_REVIEW)
    body["request"].update(fields)
    return body


def _without(key: str) -> dict[str, Any]:
    body = copy.deepcopy(LAB_REVIEW)
    del body["request"][key]
    return body


OPERATIONS = "'CREATE', 'UPDATE', 'DELETE' or 'CONNECT'"


@pytest.mark.parametrize(
    "body, message",
    [
        pytest.param(_with(uid=7), "request.uid: Input should be a valid string", id="a numeric uid"),
        pytest.param(_without("uid"), "request.uid: Field required", id="no uid"),
        pytest.param(_with(uid=""), "request.uid must not be empty", id="an empty uid"),
        pytest.param(_with(operation="PATCH"), f"request.operation: Input should be {OPERATIONS}",
                     id="an unknown operation"),
        pytest.param(_with(kind="PyTorchJob"),
                     "request.kind: Input should be a valid dictionary or instance of GroupVersionKind",
                     id="a kind that is a string"),
        pytest.param(_with(kind={"group": 1, "version": "v1", "kind": "PyTorchJob"}),
                     "request.kind.group: Input should be a valid string", id="a numeric group in kind"),
        pytest.param(_with(object=[]), "request.object: Input should be a valid dictionary", id="an array object"),
        pytest.param(_with(userInfo="alice"), "request.userInfo: Input should be a valid dictionary",
                     id="a string userInfo"),
        pytest.param(_without("object"), "request.object is required for CREATE", id="CREATE without an object"),
        pytest.param(_with(uid=None, name=1, kind=3, operation=None),
                     "request.uid: Input should be a valid string; "
                     "request.kind: Input should be a valid dictionary or instance of GroupVersionKind; "
                     "request.name: Input should be a valid string; "
                     f"request.operation: Input should be {OPERATIONS}",
                     id="every problem, in field order"),
    ],
)
def test_bad_reviews_are_refused_with_these_words(body: dict[str, Any], message: str) -> None:
    with pytest.raises(pipeline.BadReview) as refused:
        pipeline.parse_review(body)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "fields, dry_run",
    [
        pytest.param({"dryRun": "true"}, True, id="a dryRun string pydantic reads as a boolean"),
        pytest.param({"requestKind": None}, False, id="a null requestKind"),
    ],
)
def test_lax_values_pydantic_accepts_stay_accepted(fields: dict[str, Any], dry_run: bool) -> None:
    assert pipeline.parse_review(_with(**fields)).dry_run is dry_run
