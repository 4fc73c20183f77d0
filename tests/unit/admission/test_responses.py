"""responses: the exact wire shape of admitted and refused reviews, bounded warnings and messages."""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.admission import responses
from app.models.admission import AdmissionResponse, AdmissionReview, Status

OPS = [{"op": "add", "path": "/metadata/annotations/topoguard.io~1zone", "value": "zone-a"}]


@pytest.mark.parametrize(
    "got, want",
    [
        pytest.param(
            responses.allowed("u1"),
            {"uid": "u1", "allowed": True},
            id="an admission without a patch carries neither patch nor patchType",
        ),
        pytest.param(responses.allowed("u1", patch=[]), {"uid": "u1", "allowed": True}, id="an empty patch is omitted"),
        pytest.param(
            responses.allowed("u1", patch=OPS, warnings=["w"], audit={"zone": "zone-a"}),
            {
                "uid": "u1",
                "allowed": True,
                "patchType": "JSONPatch",
                "patch": base64.b64encode(json.dumps(OPS, separators=(",", ":")).encode()).decode(),
                "warnings": ["w"],
                "auditAnnotations": {"zone": "zone-a"},
            },
            id="a patch is base64 compact JSON with patchType JSONPatch",
        ),
        pytest.param(
            responses.refused("u1", code=403, message="no zone"),
            {"uid": "u1", "allowed": False, "status": {"code": 403, "message": "no zone", "reason": "Forbidden"}},
            id="a refusal puts the code and message inside the body",
        ),
        pytest.param(
            responses.refused("u1", code=504, message="late"),
            {"uid": "u1", "allowed": False, "status": {"code": 504, "message": "late", "reason": "Timeout"}},
            id="a missed deadline carries reason Timeout",
        ),
        pytest.param(
            responses.refused("u1", code=418, message="odd"),
            {"uid": "u1", "allowed": False, "status": {"code": 418, "message": "odd"}},
            id="a code without a known reason sends no reason",
        ),
    ],
)
def test_response_wire_shape(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": want}


@pytest.mark.parametrize(
    "warnings, want",
    [
        pytest.param(["a", "a", " ", "b\n  c"], ["a", "b c"], id="duplicates and blanks go and whitespace collapses"),
        pytest.param(["x" * 300], ["x" * 255 + "…"], id="a warning longer than 256 characters is cut with an ellipsis"),
        pytest.param(
            [f"w{i}" for i in range(14)],
            [*(f"w{i}" for i in range(11)), "... and 3 more (topoguard explain shows all)"],
            id="more than 12 warnings end with a count of the rest",
        ),
    ],
)
def test_bound_warnings(warnings: list[str], want: list[str]) -> None:
    assert responses.bound_warnings(warnings) == want


def test_a_long_refusal_message_is_bounded() -> None:
    review = responses.refused("u1", code=403, message="r" * 10_000)
    message = review["response"]["status"]["message"]
    assert len(message) == responses.MESSAGE_MAX_CHARS and message.endswith("…")


@settings(max_examples=200, deadline=None)
@given(
    uid=st.text(min_size=1, max_size=40),
    allowed=st.booleans(),
    code=st.sampled_from([400, 403, 418, 422, 500, 503, 504]),
    message=st.text(max_size=50),
    patch=st.lists(
        st.fixed_dictionaries({"op": st.just("add"), "path": st.text(max_size=10), "value": st.text()}), max_size=3
    ),
    warnings=st.lists(st.text(min_size=1, max_size=30), max_size=3),
    audit=st.none() | st.dictionaries(st.sampled_from(["zone", "outcome"]), st.text(max_size=10), max_size=2),
)
def test_the_wire_form_is_what_the_models_dump(
    uid: str,
    allowed: bool,
    code: int,
    message: str,
    patch: list[dict[str, Any]],
    warnings: list[str],
    audit: dict[str, str] | None,
) -> None:
    """responses.py builds the envelope directly; it must be exactly the models' `to_wire()` (keys and order)."""
    if allowed:
        got = responses.allowed(uid, patch=patch, warnings=warnings, audit=audit)
        want = AdmissionResponse(
            uid=uid,
            allowed=True,
            patch_type="JSONPatch" if patch else None,
            patch=responses.encode_patch(patch) if patch else None,
            warnings=responses.bound_warnings(warnings) or None,
            audit_annotations=audit or None,
        )
    else:
        got = responses.refused(uid, code=code, message=message, warnings=warnings, audit=audit)
        status = Status(
            code=code, message=responses.clip(message, responses.MESSAGE_MAX_CHARS), reason=responses.REASONS.get(code)
        )
        want = AdmissionResponse(
            uid=uid,
            allowed=False,
            status=status,
            warnings=responses.bound_warnings(warnings) or None,
            audit_annotations=audit or None,
        )
    wire = AdmissionReview(response=want).to_wire()
    assert got == wire
    assert orjson.dumps(got) == orjson.dumps(wire)


def test_a_long_warning_is_cut_in_the_explanation_never_in_the_policy_name() -> None:
    policy = "CiliumNetworkPolicy research/llm-rendezvous-only ingress[0]"
    text = "collective traffic between the Worker pods is blocked: " + "x " * 150 + f"because {policy} allows 23456/TCP"
    (got,) = responses.bound_warnings([text])
    assert len(got) <= responses.WARNING_MAX_CHARS
    assert got.startswith("collective traffic between the Worker pods is blocked: x x")
    assert got.endswith(f"… [{policy}]")


def test_the_policy_names_a_kept_head_already_shows_are_not_repeated() -> None:
    text = "blocked by CiliumNetworkPolicy ml/a egress[0], ml/b egress[1]: " + "detail " * 60
    (got,) = responses.bound_warnings([text])
    assert got.startswith("blocked by CiliumNetworkPolicy ml/a egress[0], ml/b egress[1]: detail")
    assert got.endswith("…") and len(got) <= responses.WARNING_MAX_CHARS


@pytest.mark.parametrize("ops", [OPS, tuple(OPS), OPS * 40], ids=["list", "tuple", "long (no line breaks)"])
def test_encode_patch_is_standard_base64_of_the_compact_json_in_one_line(ops: Any) -> None:
    encoded = responses.encode_patch(ops)
    assert encoded == base64.b64encode(json.dumps(list(ops), separators=(",", ":")).encode()).decode("ascii")
    assert "\n" not in encoded
    assert json.loads(base64.b64decode(encoded, validate=True)) == list(ops)
