"""Our own error types for the cache, so callers never handle `kubernetes` exceptions.

`ApiError` wraps `kubernetes.client.ApiException` (always `raise ApiError.from_exception(e) from e`,
so the original stays in `__cause__`) and keeps the apiserver's Status message, which is what an
operator needs to read ("nodes is forbidden: User ... cannot list ..."). Nothing here performs I/O.
"""

from __future__ import annotations

import json
from typing import Any

HTTP_GONE = 410
HTTP_NOT_FOUND = 404


class CacheError(Exception):
    """Base class of every error raised by app.cache."""


class CacheNotReadyError(CacheError):
    """The watch cache has not finished the first list of every kind; there is no snapshot to serve."""


class ClientConfigError(CacheError):
    """Neither in-cluster config nor the kubeconfig gives a usable API client."""


class StreamError(CacheError):
    """A watch stream or list body that is not the JSON the Kubernetes API sends."""


class ApiError(CacheError):
    """An HTTP error answered by the Kubernetes API (or a transport failure reported as one).

    Attributes:
        status: the HTTP status code (0 for transport errors the client reports without one).
        reason: the Status `reason` (e.g. "Forbidden", "Expired") or the HTTP reason phrase.
        message: the Status `message`, the most useful text for a human.
    """

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"HTTP {status} {reason}: {message}" if message else f"HTTP {status} {reason}")

    @property
    def gone(self) -> bool:
        """410: the resourceVersion or continue token is too old; the caller must relist."""
        return self.status == HTTP_GONE

    @property
    def not_found(self) -> bool:
        return self.status == HTTP_NOT_FOUND

    @classmethod
    def from_status(cls, status: Any) -> ApiError:
        """Build from a `Status` object (dict), as sent in a watch ERROR event."""
        body = status if isinstance(status, dict) else {}
        code = body.get("code")
        return cls(
            code if isinstance(code, int) and not isinstance(code, bool) else 0,
            str(body.get("reason") or "Unknown"),
            str(body.get("message") or ""),
        )

    @classmethod
    def from_exception(cls, error: Any) -> ApiError:
        """Build from a `kubernetes.client.ApiException`, reading the Status body when there is one."""
        status = getattr(error, "status", None)
        reason = str(getattr(error, "reason", None) or "")
        body = getattr(error, "body", None)
        message = ""
        if isinstance(body, bytes):
            body = body.decode("utf-8", "replace")
        if isinstance(body, str) and body:
            try:
                parsed = json.loads(body)
            except ValueError:
                message = body.strip()[:500]
            else:
                if isinstance(parsed, dict):
                    message = str(parsed.get("message") or "")
                    reason = str(parsed.get("reason") or reason)
        return cls(status if isinstance(status, int) else 0, reason or "Error", message)
