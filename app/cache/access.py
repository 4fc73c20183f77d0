"""Who may read the zone map: a bearer token checked by the cluster (TokenReview, then SubjectAccessReview).

The same delegation kube-rbac-proxy and controller-runtime's metrics filter
(`pkg/metrics/filters.WithAuthenticationAndAuthorization`) do: the apiserver authenticates the
token (`authentication.k8s.io/v1` TokenReview) and authorizes the user it names for a
*non-resource* URL, with the HTTP method in lower case as the verb (`authorization.k8s.io/v1`
SubjectAccessReview, `nonResourceAttributes: {path: /map, verb: get|post}`). A caller is granted
the map with a ClusterRole rule `nonResourceURLs: ["/map"], verbs: ["get"]` (and `post` for a job's
table); the webhook's own account needs `create` on tokenreviews and subjectaccessreviews (the
`system:auth-delegator` ClusterRole).

Results are kept for ACCESS_CACHE_SECONDS per (token, verb, path), at most ACCESS_CACHE_ENTRIES of
them, and at most ACCESS_REVIEWS_IN_FLIGHT calls run at once, so a caller repeating or varying
tokens cannot turn /map into load on the apiserver. Errors (apiserver unreachable, our account not
allowed to review) are not kept: they are answered as `error`, which the server turns into a 503,
never into access. The calls block: the server makes them from a worker thread, never on the loop.
This module holds the answer types and the cache; the calls themselves are in access_api.py (which
loads the kubernetes client). Neither knows HTTP: `app.http.maps` turns an `Access` into a status.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from app.models.cluster import BoundedMemo

Verdict = Literal["allowed", "denied", "unauthenticated", "error"]

# Short, so a removed RoleBinding or a revoked token stops working within seconds (controller-runtime
# keeps allows 5 min and denials 30 s; the map is not hot enough to need that).
ACCESS_CACHE_SECONDS = 10.0
ACCESS_CACHE_ENTRIES = 1024
ACCESS_REVIEWS_IN_FLIGHT = 4


@dataclass(frozen=True)
class Access:
    """The answer for one caller: `verdict`, the user the token belongs to (when known), and why."""

    verdict: Verdict
    user: str = ""
    reason: str = ""


class AccessReviewer(Protocol):
    """Decides whether the holder of `token` may use `verb` on the non-resource URL `path`."""

    def review(self, token: str, *, verb: str, path: str) -> Access: ...


class CachedAccess:
    """An `AccessReviewer` that keeps answers for `ttl_seconds` and bounds the calls in flight."""

    def __init__(
        self,
        reviewer: AccessReviewer,
        *,
        ttl_seconds: float = ACCESS_CACHE_SECONDS,
        entries: int = ACCESS_CACHE_ENTRIES,
        in_flight: int = ACCESS_REVIEWS_IN_FLIGHT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reviewer = reviewer
        self._ttl = ttl_seconds
        self._clock = clock
        self._kept: BoundedMemo[tuple[str, str, str], tuple[float, Access]] = BoundedMemo(entries)
        self._in_flight = in_flight
        self._slots = threading.BoundedSemaphore(in_flight)

    def review(self, token: str, *, verb: str, path: str) -> Access:
        # NB: the key holds a digest of the token, never the token itself.
        key = (hashlib.sha256(token.encode()).hexdigest(), verb, path)
        kept = self._kept.get(key)
        if kept is not None and kept[0] > self._clock():
            return kept[1]
        if not self._slots.acquire(blocking=False):
            return Access("error", reason=f"more than {self._in_flight} access reviews in flight")
        try:
            access = self._reviewer.review(token, verb=verb, path=path)
        finally:
            self._slots.release()
        if access.verdict != "error":
            self._kept.put(key, (self._clock() + self._ttl, access))
        return access
