"""Errors a job adapter raises: an unsupported kind, or a job whose fields cannot be read.

Validation problems are accumulated as `FieldError(path, message)` and raised together in one
`InvalidJobError`, so a user sees every problem at once (kueue's `field.ErrorList`). Nothing in
app/jobs raises anything but a `JobError` on bad input.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, TypeAlias


class FieldError(NamedTuple):
    """One unusable field: `path` as in kubectl explain (e.g. `spec.tfReplicaSpecs.PS.replicas`)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class JobError(Exception):
    """Base class: the job cannot be turned into a group."""


class UnsupportedKindError(JobError):
    """The object is not one of the job kinds topoguard understands."""

    def __init__(self, api_version: str, kind: str) -> None:
        self.api_version = api_version
        self.kind = kind
        super().__init__(f"unsupported job kind {kind!r} in apiVersion {api_version!r}")


class InvalidJobError(JobError):
    """The job is of a supported kind but some of its fields are malformed."""

    def __init__(self, errors: Iterable[FieldError]) -> None:
        self.errors = list(errors)
        super().__init__("invalid job: " + "; ".join(str(e) for e in self.errors))


def join_path(path: str, *keys: str | int) -> str:
    """`path` extended by map keys and list indexes, one field at a time.

    Keys with a dot or a slash (label keys, resource names) are bracketed so the path stays
    unambiguous: `resources.limits[nvidia.com/gpu]`, `containers[0]`.
    """
    for key in keys:
        if isinstance(key, int) or "." in key or "/" in key or not key:
            path = f"{path}[{key}]"
        else:
            path = f"{path}.{key}" if path else key
    return path


# A field path built lazily: a path string, or `(parent, key)` for the field `key` below `parent`.
# The readers run on every admission review and hand these down instead of joined strings; only
# an error message renders one (`render_path`), so a well-formed job builds no path strings.
LazyPath: TypeAlias = "str | tuple[LazyPath, str | int]"


def render_path(at: LazyPath) -> str:
    """The path string of `at`: `(("spec", "containers"), 0)` → `spec.containers[0]`."""
    keys: list[str | int] = []
    while isinstance(at, tuple):
        at, key = at
        keys.append(key)
    return join_path(at, *reversed(keys))
