"""The largest job a review considers (settings `limits`, issue 18).

PURE. A review's cost must be bounded by the shape of its input, never by the numbers a user writes:
`Worker.replicas: 2147483647` is a 1.9 KB review. The job adapters already work per replica type (flows
are built per pair of replica types, never per pod), and these limits bound what is left:

- replica types per job, checked on the raw object BEFORE an adapter builds flows (their number grows
  with the square of the replica types: a 196 KB TFJob with 1,400 types would cost ~2 million flows);
- pods per replica type and per job, checked on the parsed group (the capacity and index arithmetic
  work on counts, but a job past them is not one any operator runs, and saying so is clearer than
  placing it).

A job past a limit raises `JobLimitError` (a `JobError`, not an `InvalidJobError`: the job is well-formed,
just larger than topoguard checks), listing every limit it passes with the field and the setting's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.config import Limits
from app.jobs.errors import FieldError, JobError, join_path
from app.models.job import JobGroup, Replica


class JobLimitError(JobError):
    """The job is larger than the settings' `limits` allow topoguard to check."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("job exceeds topoguard's limits: " + "; ".join(str(e) for e in errors))


def _setting(name: str) -> str:
    """`limits.podsPerJob` for the messages: the key as the config file and the chart's values spell it."""
    field = Limits.model_fields[name]
    return f"limits.{field.alias or name}"


def check_replica_types(written: tuple[str, int] | None, limits: Limits) -> None:
    """Refuse, before any flow is built, a job listing more replica types than `limits` allow.

    `written` is (field path, number of entries) of the job's replica map or list, or None where the kind
    has none of its own (TrainJob).
    """
    if written is None:
        return
    path, count = written
    if count > limits.replica_types_per_job:
        raise JobLimitError([FieldError(path, (
            f"{count:,} replica types exceed the limit of {limits.replica_types_per_job:,} per job "
            f"({_setting('replica_types_per_job')})"
        ))])


def replica_field(replica: Replica) -> str:
    """The job's field that defines `replica` (its template pointer up to the template): for messages."""
    keys: list[str | int] = []
    for part in replica.template_path.split("/")[1:]:
        if part == "template":
            break
        part = part.replace("~1", "/").replace("~0", "~")
        keys.append(int(part) if part.isdigit() else part)
    return join_path("", *keys) if keys else replica.key


def check_group(group: JobGroup, limits: Limits) -> None:
    """Refuse a parsed job whose pod counts pass `limits` (every limit passed, at once)."""
    total = 0
    within = len(group.replicas) <= limits.replica_types_per_job
    per_type, claims_per_pod = limits.pods_per_replica_type, limits.claims_per_pod
    for replica in group.replicas:  # one pass for the usual job; the errors are then worded limit by limit
        total += replica.count
        if replica.count > per_type or len(replica.claims) > claims_per_pod:
            within = False
    if within and total <= limits.pods_per_job:
        return
    errors: list[FieldError] = []
    if len(group.replicas) > limits.replica_types_per_job:
        errors.append(FieldError("spec", (
            f"{len(group.replicas):,} replica types exceed the limit of {limits.replica_types_per_job:,} per job "
            f"({_setting('replica_types_per_job')})"
        )))
    for replica in group.replicas:
        if replica.count > limits.pods_per_replica_type:
            errors.append(FieldError(replica_field(replica), (
                f"{replica.count:,} {replica.key} pods exceed the limit of {limits.pods_per_replica_type:,} "
                f"per replica type ({_setting('pods_per_replica_type')})"
            )))
    for replica in group.replicas:
        if len(replica.claims) > limits.claims_per_pod:
            errors.append(FieldError(replica_field(replica), (
                f"{len(replica.claims):,} resourceClaims in a {replica.key} pod exceed the limit of "
                f"{limits.claims_per_pod:,} per pod ({_setting('claims_per_pod')})"
            )))
    if total > limits.pods_per_job:
        errors.append(FieldError("spec", (
            f"{total:,} pods exceed the limit of {limits.pods_per_job:,} per job ({_setting('pods_per_job')})"
        )))
    if errors:
        raise JobLimitError(errors)


def replica_map_size(raw: Mapping[str, Any], map_key: str) -> tuple[str, int] | None:
    """(path, entries) of `spec.<map_key>` when it is a map or a list, else None (the adapter words that)."""
    spec = raw.get("spec")
    value = spec.get(map_key) if type(spec) is dict or isinstance(spec, Mapping) else None
    if type(value) is dict or isinstance(value, Mapping | list):
        return f"spec.{map_key}", len(value)
    return None
