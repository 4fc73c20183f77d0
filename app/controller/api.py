"""Raw JSON requests to the Kubernetes API for the controller's writes (Leases, Events, PolicyReports).

Through the official client's ApiClient (same configuration, TLS and token as the watch cache:
`app.cache.watchers.build_api_client`) but by REST path with plain dicts, the way its DynamicClient
does: the typed models would round-trip every body, and PolicyReport has none. One request, one
timeout, no retries here: the callers decide what a failure means (the Lease loop retries every
retry period, the audit writes on the next pass).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from app.cache.errors import ApiError
from app.cache.watchers import build_api_client

# Per request (connect + read): below the Lease's renew deadline, so one hung call cannot outlast it.
REQUEST_TIMEOUT_SECONDS = 5.0
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
# Leases (2 s), Events and PolicyReports of one pass, and the discovery check share the pool.
POOL_SIZE = 4

RawObject = dict[str, Any]


class Api(Protocol):
    """One API call returning the JSON body; a non-2xx answer or a transport failure raises ApiError."""

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
                query: Sequence[tuple[str, str]] = (), content_type: str = JSON) -> RawObject: ...


class RestApi:
    """`Api` over the official client's ApiClient."""

    def __init__(self, api_client: client.ApiClient, *, timeout_seconds: float = REQUEST_TIMEOUT_SECONDS) -> None:
        self._client = api_client
        self._timeout = timeout_seconds

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
                query: Sequence[tuple[str, str]] = (), content_type: str = JSON) -> RawObject:
        try:
            serialized = self._client.param_serialize(
                method, path, query_params=list(query), body=dict(body) if body is not None else None,
                header_params={"Accept": JSON, "Content-Type": content_type}, auth_settings=["BearerToken"],
            )
            response = self._client.call_api(*serialized, _request_timeout=self._timeout)
            response.read()  # type: ignore[no-untyped-call]
        except ApiException as e:
            raise ApiError.from_exception(e) from e
        except Exception as e:  # urllib3 / socket / TLS failures: no HTTP status
            raise ApiError(0, type(e).__name__, str(e)[:500]) from e
        if not 200 <= response.status <= 299:
            raise ApiError.from_exception(ApiException(http_resp=response))
        try:
            data = json.loads(response.data or b"{}")
        except ValueError as e:
            raise ApiError(response.status, "BadResponse", f"{method} {path}: not JSON: {e}") from e
        return data if isinstance(data, dict) else {}

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]


def build_api(kubeconfig: str | None) -> RestApi:
    """A RestApi on a client of its own (from `kubeconfig`, else in-cluster config).

    Raises:
        ClientConfigError: no usable client configuration.
    """
    return RestApi(build_api_client(kubeconfig, pool_size=POOL_SIZE))


def micro_time(seconds: float) -> str:
    """A metav1.MicroTime as the apiserver writes it (RFC 3339, microseconds, UTC)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: Any) -> float | None:
    """Seconds since the epoch of a MicroTime or Time string, or None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
