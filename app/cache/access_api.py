"""The TokenReview and SubjectAccessReview calls behind `access.CachedAccess` (see access.py for the rules).

One call each, no retries, a short timeout: a failure is an `error` answer (503 at the server), so
a slow apiserver is never waited on twice and never turns into access.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from app.cache.access import ACCESS_REVIEWS_IN_FLIGHT, Access, AccessReviewer, CachedAccess
from app.cache.watchers import build_api_client

# Per call to the apiserver (connect, read); a review that takes longer is an error, not a wait.
ACCESS_REVIEW_TIMEOUT_SECONDS = 5.0


def _post(api: Callable[..., Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """Create one review object and return the apiserver's answer (its `status`), raw JSON."""
    response = api(body=body, _preload_content=False, _request_timeout=ACCESS_REVIEW_TIMEOUT_SECONDS)
    answer = json.loads(response.data)
    status = answer.get("status") if isinstance(answer, dict) else None
    return status if isinstance(status, dict) else {}


def _failure(what: str, error: Exception) -> Access:
    if isinstance(error, ApiException):
        return Access("error", reason=f"{what} failed: HTTP {error.status} {error.reason or ''}".rstrip())
    return Access("error", reason=f"{what} failed: {type(error).__name__}: {error}")


class ApiAccessReviewer:
    """TokenReview + SubjectAccessReview through the official client (one call each, no retries)."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._authn = client.AuthenticationV1Api(api_client)
        self._authz = client.AuthorizationV1Api(api_client)

    def review(self, token: str, *, verb: str, path: str) -> Access:
        try:
            authn = _post(self._authn.create_token_review, {
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token},
            })
        except Exception as e:  # any failure to ask is an error answer, never access
            return _failure("TokenReview", e)
        if authn.get("authenticated") is not True:
            return Access("unauthenticated", reason=str(authn.get("error") or "the token is not valid"))
        found = authn.get("user")
        user: dict[str, Any] = found if isinstance(found, dict) else {}
        name = str(user.get("username") or "")
        spec: dict[str, Any] = {
            "user": name, "groups": list(user.get("groups") or []),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        try:
            authz = _post(self._authz.create_subject_access_review, {
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec,
            })
        except Exception as e:
            return _failure("SubjectAccessReview", e)
        if authz.get("allowed") is True and authz.get("denied") is not True:
            return Access("allowed", user=name)
        why = str(authz.get("reason") or authz.get("evaluationError") or "no RBAC rule allows it")
        return Access("denied", user=name, reason=why)


def build_access_reviewer(kubeconfig: str | None) -> AccessReviewer:
    """The cached reviewer on its own ApiClient (from `kubeconfig`, else in-cluster config).

    Raises:
        ClientConfigError: no usable client configuration.
    """
    # The same configuration rules as the watch cache (build_api_client), on a client of its own.
    return CachedAccess(ApiAccessReviewer(build_api_client(kubeconfig, pool_size=ACCESS_REVIEWS_IN_FLIGHT)))
