"""app.http.maps.access_refusal: which status a /map caller gets per mapAccess mode and reviewer answer."""

from __future__ import annotations

import pytest

from app.cache.access import Access
from app.http.maps import _bearer_token, access_refusal


@pytest.mark.parametrize(
    "mode, access, want_status",
    [
        pytest.param("off", Access("allowed"), 404, id="off serves nobody, not even an allowed caller"),
        pytest.param("loopback", None, 404, id="loopback refuses callers that are not on its listener"),
        pytest.param("authorized", None, 401, id="no token is a 401"),
        pytest.param("authorized", Access("unauthenticated", reason="expired"), 401, id="a bad token is a 401"),
        pytest.param("authorized", Access("denied", user="bob", reason="no rule"), 403, id="a denied user is a 403"),
        pytest.param("authorized", Access("error", reason="apiserver down"), 503,
                     id="an API error is a 503, not a 200"),
        pytest.param("authorized", Access("allowed", user="alice"), None, id="an allowed user is served"),
    ],
)
def test_access_refusal(mode: str, access: Access | None, want_status: int | None) -> None:
    got = access_refusal(access, mode=mode, map_port=8444, method="GET")
    assert (got[0] if got else None) == want_status


def test_a_denial_names_the_user_verb_and_reason() -> None:
    got = access_refusal(Access("denied", user="bob", reason="no rule"), mode="authorized", map_port=1, method="POST")
    assert got == (403, "bob may not post the non-resource URL /map: no rule")


@pytest.mark.parametrize(
    "header, want",
    [
        pytest.param("Bearer abc", "abc", id="a bearer token"),
        pytest.param("bearer  abc ", "abc", id="the scheme is case-insensitive"),
        pytest.param("Basic YWxpY2U6cHc=", None, id="basic auth is not a token"),
        pytest.param("Bearer ", None, id="an empty token"),
        pytest.param(None, None, id="no header"),
        pytest.param("Bearer " + "x" * 20000, None, id="a token far longer than any service-account token"),
    ],
)
def test_bearer_token(header: str | None, want: str | None) -> None:
    assert _bearer_token(header) == want
