"""PURE: outcomes → the response AdmissionReview (uid echo, base64 JSON Patch, warnings, status).

The one place that knows the response's wire shape, so `topoguard review` and the server send the
same bytes. No FastAPI import: the CLI uses this without loading the web stack.

Kubernetes conventions followed (Dynamic Admission Control docs):

- A refusal is HTTP 200 with `allowed: false` and `status.code` / `status.message`; the apiserver
  shows the message to the user as "admission webhook ... denied the request: <message>".
- `patch` is base64 of a JSON Patch with `patchType: JSONPatch`, and is omitted when empty.
- Warnings should stay under 120 characters where possible; the apiserver may truncate those over
  256 characters and may drop some when there are many, so both are bounded here.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from app.models.admission import API_VERSION, KIND

WARNING_MAX_CHARS = 256
MAX_WARNINGS = 12
MESSAGE_MAX_CHARS = 4000

# metav1.StatusReason for the codes topoguard answers with.
REASONS: Mapping[int, str] = {
    400: "BadRequest",
    403: "Forbidden",
    422: "Invalid",
    429: "TooManyRequests",  # a namespace held its share of the decision workers (metav1.StatusReasonTooManyRequests)
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",  # the server's missed decision deadline (metav1.StatusReasonTimeout)
}


def encode_patch(ops: Sequence[Mapping[str, Any]]) -> str:
    """base64 of the compact JSON encoding of a JSON Patch.

    NB: `binascii.b2a_base64(..., newline=False)` is what `base64.b64encode` calls (CPython 3.11
    Lib/base64.py), without its Python frame; a list (what build_patch returns) is dumped as it is.
    """
    return binascii.b2a_base64(orjson.dumps(ops if type(ops) is list else list(ops)), newline=False).decode("ascii")


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, marking the cut with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


# A policy named in a message: its kind, then one or more `namespace/name [rule]` (engine/flows.py, lead.py).
_POLICY_REF = re.compile(
    r"(?:CiliumClusterwideNetworkPolicy|CiliumNetworkPolicy|NetworkPolicy) "
    r"[\w.-]+(?:/[\w.-]+)?(?: \w+(?:\.\w+)*\[\d+\])?(?:, [\w.-]+/[\w.-]+(?: \w+(?:\.\w+)*\[\d+\])?)*"
)


def clip_keeping_policies(text: str, limit: int) -> str:
    """`text` cut to `limit` characters by cutting the explanation, never a policy name: the policies the
    kept part no longer names are listed after the cut (`… [CiliumNetworkPolicy ml/a]`). Only when
    the policy names alone do not fit are they cut too."""
    if len(text) <= limit:
        return text
    refs = list(dict.fromkeys(m.group(0) for m in _POLICY_REF.finditer(text)))
    for end in range(limit - 1, 0, -1):
        head = text[:end].rstrip()
        missing = [r for r in refs if r not in head]
        tail = f" [{'; '.join(missing)}]" if missing else ""
        if len(head) + 1 + len(tail) <= limit:
            return f"{head}…{tail}"
    return clip(text, limit)


def bound_warnings(warnings: Iterable[str]) -> list[str]:
    """Non-empty, de-duplicated warnings, each at most 256 characters (cut in the explanation, keeping
    the policy names), at most MAX_WARNINGS of them; past that the last one says how many more."""
    out: list[str] = []
    for w in warnings:
        w = clip_keeping_policies(" ".join(w.split()), WARNING_MAX_CHARS)
        if w and w not in out:
            out.append(w)
    if len(out) > MAX_WARNINGS:
        hidden = len(out) - (MAX_WARNINGS - 1)
        out = [*out[: MAX_WARNINGS - 1], f"... and {hidden} more (topoguard explain shows all)"]
    return out


def _review(
    uid: str,
    allowed: bool,
    *,
    status: Mapping[str, Any] | None = None,
    patch: str | None = None,
    warnings: list[str] | None = None,
    audit: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The wire form of `AdmissionReview(response=AdmissionResponse(...)).to_wire()`, built directly: the
    same keys in the same order, unset fields omitted (the models stay the schema; building and dumping
    them costs ~10 µs per review, a dict literal under 1 µs; tests/unit/admission/test_responses.py checks
    they agree)."""
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if status is not None:
        response["status"] = status
    if patch is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = patch
    if warnings:
        response["warnings"] = warnings
    if audit:
        response["auditAnnotations"] = dict(audit)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def allowed(
    uid: str,
    *,
    patch: Sequence[Mapping[str, Any]] = (),
    warnings: Iterable[str] = (),
    audit: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The review that admits the object, with its JSON Patch when there is one."""
    return _review(uid, True, patch=encode_patch(patch) if patch else None, warnings=bound_warnings(warnings),
                   audit=audit)


def refused(
    uid: str,
    *,
    code: int,
    message: str,
    warnings: Iterable[str] = (),
    audit: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The review that refuses the object: `allowed: false` with `status.code` and `status.message`."""
    status: dict[str, Any] = {"code": code, "message": clip(message, MESSAGE_MAX_CHARS)}
    if code in REASONS:
        status["reason"] = REASONS[code]
    return _review(uid, False, status=status, warnings=bound_warnings(warnings), audit=audit)
