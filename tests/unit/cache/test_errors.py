"""ApiError: what an operator reads when the apiserver says no."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from app.cache.errors import ApiError


def status_body(code: int, reason: str, message: str) -> str:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                       "reason": reason, "message": message})


@pytest.mark.parametrize(
    "exception, want",
    [
        pytest.param(
            ApiException(status=403, reason="Forbidden",
                         body=status_body(403, "Forbidden", 'nodes is forbidden: User "x" cannot list')),
            (403, "Forbidden", 'nodes is forbidden: User "x" cannot list'),
            id="the Status message is kept",
        ),
        pytest.param(
            ApiException(status=410, reason="Gone", body=status_body(410, "Expired", "too old resource version")),
            (410, "Expired", "too old resource version"),
            id="the Status reason wins over the HTTP phrase",
        ),
        pytest.param(
            ApiException(status=502, reason="Bad Gateway", body="<html>proxy error</html>"),
            (502, "Bad Gateway", "<html>proxy error</html>"),
            id="a non-JSON body is shown as text",
        ),
        pytest.param(ApiException(status=0, reason="SSLError\ncertificate verify failed"),
                     (0, "SSLError\ncertificate verify failed", ""), id="transport errors have status 0"),
    ],
)
def test_from_exception(exception: ApiException, want: tuple[int, str, str]) -> None:
    got = ApiError.from_exception(exception)

    assert (got.status, got.reason, got.message) == want


def test_from_exception_is_raised_with_the_cause_kept() -> None:
    original = ApiException(status=404, reason="Not Found", body=status_body(404, "NotFound", "no such CRD"))

    with pytest.raises(ApiError) as caught:
        try:
            raise original
        except ApiException as e:
            raise ApiError.from_exception(e) from e

    assert caught.value.__cause__ is original
    assert (caught.value.not_found, caught.value.gone, str(caught.value)) == (
        True, False, "HTTP 404 NotFound: no such CRD")


@pytest.mark.parametrize(
    "status, want",
    [
        pytest.param({"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version: 1"},
                     (410, "Expired", "too old resource version: 1", True), id="a watch 410 is gone"),
        pytest.param({"kind": "Status", "code": 500, "reason": "InternalError", "message": "etcd"},
                     (500, "InternalError", "etcd", False), id="a watch 500 is not gone"),
        pytest.param({"code": True}, (0, "Unknown", "", False), id="a bool code is not a code"),
        pytest.param("garbage", (0, "Unknown", "", False), id="a non-object is an unknown error"),
    ],
)
def test_from_status(status: Any, want: tuple[int, str, str, bool]) -> None:
    got = ApiError.from_status(status)

    assert (got.status, got.reason, got.message, got.gone) == want
