"""Where a training job stands: suspended (held by a queue manager) or finished.

PURE. One reading for the job under review and for the stored jobs of the reservation ledger
(DESIGN.md "Round 2"): a suspended job is placed by network and total allocatable only and
reserves nothing; a finished one reserves nothing either.

- Suspended: `spec.runPolicy.suspend` (Kubeflow v1 kinds and MPIJob v2beta1) or `spec.suspend`
  (JobSet, TrainJob) is true; or the job names a Kueue queue (`kueue.x-k8s.io/queue-name`) and
  does not say `suspend: false`. Kueue's webhook creates such jobs suspended and unsuspends them on
  admission, so the label alone means "waiting in the queue" until the flag says otherwise.
- Finished: a condition `Succeeded`, `Failed` (Kubeflow v1, MPIJob), `Completed` (JobSet) or
  `Complete` (TrainJob) with status True, or a JobSet `status.terminalState`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.models.labels import KUEUE_QUEUE_NAME_LABEL

FINISHED_CONDITIONS = frozenset({"Succeeded", "Failed", "Completed", "Complete"})


def _dict(value: Any) -> Mapping[str, Any]:
    return value if type(value) is dict or isinstance(value, Mapping) else {}


def _flag(value: Any) -> bool | None:
    """True/False as written (a quoted "true"/"false" too), None when absent or not a boolean."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def suspend_flag(raw: Mapping[str, Any]) -> bool | None:
    """The job's own suspend field (`spec.runPolicy.suspend` or `spec.suspend`), None when unset."""
    spec = _dict(raw.get("spec"))
    for value in (_dict(spec.get("runPolicy")).get("suspend"), spec.get("suspend")):
        flag = _flag(value)
        if flag is not None:
            return flag
    return None


def is_suspended(raw: Mapping[str, Any]) -> bool:
    """Whether the job waits for a queue manager (see the module docstring)."""
    flag = suspend_flag(raw)
    if flag is not None:
        return flag
    meta = _dict(raw.get("metadata"))
    return bool(_dict(meta.get("labels")).get(KUEUE_QUEUE_NAME_LABEL))


def is_finished(raw: Mapping[str, Any]) -> bool:
    """Whether the job has succeeded or failed for good (its pods hold nothing any more)."""
    status = _dict(raw.get("status"))
    if status.get("terminalState"):
        return True
    conditions = status.get("conditions")
    return isinstance(conditions, list) and any(
        isinstance(c, Mapping) and c.get("type") in FINISHED_CONDITIONS and str(c.get("status")) == "True"
        for c in conditions
    )
