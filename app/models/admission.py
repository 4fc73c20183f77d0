"""AdmissionReview `admission.k8s.io/v1` as the apiserver sends it and as topoguard answers it.

Types only. Input models allow extra fields (the apiserver adds fields over releases and a webhook
must not break on them); the response model forbids them so nothing unexpected is ever sent.
Field names are snake_case in Python and camelCase on the wire (`populate_by_name`, `by_alias`).
Reference: https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class GroupVersionKind(_Wire):
    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(_Wire):
    group: str = ""
    version: str = ""
    resource: str = ""


class AdmissionRequest(_Wire):
    """The `request` of an AdmissionReview. `object` is absent only for DELETE and CONNECT."""

    uid: str
    kind: GroupVersionKind = Field(default_factory=GroupVersionKind)
    resource: GroupVersionResource = Field(default_factory=GroupVersionResource)
    sub_resource: str | None = None
    request_kind: GroupVersionKind | None = None
    request_resource: GroupVersionResource | None = None
    request_sub_resource: str | None = None
    name: str | None = None
    namespace: str | None = None  # empty or absent for cluster-scoped objects
    operation: Operation
    user_info: dict[str, Any] | None = None
    obj: dict[str, Any] | None = Field(default=None, alias="object")
    old_object: dict[str, Any] | None = None
    dry_run: bool | None = None
    options: dict[str, Any] | None = None


class RequestKind(NamedTuple):
    """`request.kind` as read: the group, version and kind of the object under review."""

    group: str = ""
    version: str = ""
    kind: str = ""


class ReviewRequest(NamedTuple):
    """What the admission pipeline reads of a validated `request` (`AdmissionRequest` is the schema).

    A plain record (a NamedTuple: about a third of the cost of a frozen dataclass to build, once per
    review): `admission.parse_review` builds it straight from a request written the way the apiserver
    writes one, and from the validated `AdmissionRequest` otherwise, with the same values.
    """

    uid: str
    operation: Operation
    kind: RequestKind = RequestKind()
    name: str | None = None
    namespace: str | None = None  # empty or absent for cluster-scoped objects
    sub_resource: str | None = None
    obj: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = None
    dry_run: bool | None = None

    @classmethod
    def of(cls, request: AdmissionRequest) -> ReviewRequest:
        kind = request.kind
        return cls(request.uid, request.operation, RequestKind(kind.group, kind.version, kind.kind), request.name,
                   request.namespace, request.sub_resource, request.obj, request.old_object, request.dry_run)


class Status(BaseModel):
    """The subset of metav1.Status a webhook sets when it refuses: `code` and `message` (+ reason)."""

    model_config = ConfigDict(extra="forbid")

    code: int
    message: str
    reason: str | None = None


class AdmissionResponse(BaseModel):
    """The `response` of an AdmissionReview. `patch` is base64 of a JSON Patch, omitted when empty."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    uid: str
    allowed: bool
    status: Status | None = None
    patch_type: Literal["JSONPatch"] | None = None
    patch: str | None = None
    warnings: list[str] | None = None
    audit_annotations: dict[str, str] | None = None


class AdmissionReview(_Wire):
    api_version: str = API_VERSION
    kind: str = KIND
    request: AdmissionRequest | None = None
    response: AdmissionResponse | None = None

    def to_wire(self) -> dict[str, Any]:
        """The JSON object sent back: camelCase keys, unset optional fields omitted."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
