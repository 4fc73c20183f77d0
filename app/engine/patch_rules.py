"""What both ways of building the JSON Patch share: the op type, which edits a job gets, the shapes
the edits add (zone requirement, podAffinity term, hostname spread), when a toleration or a spread
is already there, and the copy that op values are made of.

PURE: no I/O, no Kubernetes client. `patches` (the public entry and the general copy-and-diff path)
and `patch_ops` (the fast path that writes the ops directly) must give the same ops, so what they
both decide is defined once, here. It imports neither of them: `patches` imports `patch_ops`, and
both import this module, so there is no import cycle.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from app.config import Settings
from app.models import labels
from app.models.decision import Decision
from app.models.job import JobGroup

__all__ = [
    "ABSENT",
    "CONTAINERS",
    "LABEL_VALUE_MAX_CHARS",
    "REQUIRED",
    "SCALARS",
    "PatchOp",
    "already_tolerated",
    "copy_pruned",
    "group_label_value",
    "hostname_spread",
    "is_hostname_spread",
    "needs_group_label",
    "pod_affinity_term",
    "spreads",
    "tolerates",
    "zone_requirement",
]

PatchOp = dict[str, Any]

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
# Kubernetes label values: at most 63 characters, alphanumeric at both ends.
LABEL_VALUE_MAX_CHARS = 63
ABSENT = object()  # what a missing key reads as (None is a value: JSON null)
CONTAINERS = (dict, list)  # NB: for isinstance; a tuple is faster there than `dict | list`
SCALARS = frozenset({str, int, float, bool, type(None)})  # exact JSON scalar types: copies share them
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def group_label_value(raw_job: Mapping[str, Any], group: JobGroup) -> str:
    """The value of `topoguard.io/group` that ties this job's pods together.

    A value already present on a template wins (a patched job keeps its value, so a second
    review is a no-op). Otherwise the job name when it is a valid label value; otherwise (a long
    name, or none yet because of generateName) a readable prefix plus a hash of the job content.
    podAffinity and spread terms are namespaced, so the namespace need not be part of the value.
    """
    for replica in group.replicas:
        metadata = replica.template.get("metadata")
        pod_labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
        if isinstance(pod_labels, Mapping) and isinstance(pod_labels.get(labels.GROUP_LABEL), str):
            return str(pod_labels[labels.GROUP_LABEL])
    name = group.name
    if name and len(name) <= LABEL_VALUE_MAX_CHARS and _LABEL_VALUE_RE.match(name):
        return name
    digest = hashlib.sha256(json.dumps(raw_job, sort_keys=True, default=str).encode()).hexdigest()[:10]
    metadata = raw_job.get("metadata") or {}
    stem = name or str(metadata.get("generateName", "") if isinstance(metadata, Mapping) else "")
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", stem)[: LABEL_VALUE_MAX_CHARS - len(digest) - 1].strip("-_.")
    return f"{stem}-{digest}" if stem else digest


def spreads(group: JobGroup, settings: Settings) -> bool:
    """Whether to add the hostname spread: asked for, and kept by the kind's schema."""
    return settings.spread_within_zone == "hostname" and group.supports_spread


def needs_group_label(group: JobGroup, settings: Settings) -> bool:
    return settings.mode == "colocate" or spreads(group, settings)


def tolerates(toleration: Mapping[str, Any], key: str, value: str, effect: str) -> bool:
    """Kubernetes' ToleratesTaint: whether `toleration` tolerates the taint key=value:effect."""
    if toleration.get("effect") and toleration.get("effect") != effect:
        return False
    if toleration.get("key") and toleration.get("key") != key:
        return False
    if toleration.get("operator") == "Exists":
        return True
    # An empty key is only valid with Exists; with Equal it tolerates nothing.
    return bool(toleration.get("key")) and (toleration.get("value") or "") == value


def already_tolerated(wanted: Mapping[str, Any], existing: Sequence[Any]) -> bool:
    present = [t for t in existing if isinstance(t, Mapping)]
    if any(dict(t) == dict(wanted) for t in present):
        return True
    key, effect = wanted.get("key"), wanted.get("effect")
    if not key or not effect or wanted.get("operator") == "Exists":
        return False  # not a single taint: only an identical toleration covers it
    return any(tolerates(t, str(key), str(wanted.get("value") or ""), str(effect)) for t in present)


def copy_pruned(value: Any) -> Any:
    """A deep copy of `value` (as `patches.copy_json`) without the empty objects and lists in its objects.

    They are the parents the edits created and then did not fill. Pruning is bottom-up (an object
    left empty goes too); list items are kept even when empty.
    """
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if type(item) not in SCALARS:
                item = copy_pruned(item)
                if not item and isinstance(item, CONTAINERS):
                    continue
            out[key] = item
        return out
    if isinstance(value, list):
        return [item if type(item) in SCALARS else copy_pruned(item) for item in value]
    if type(value) in SCALARS:
        return value
    if isinstance(value, Mapping | tuple):
        return copy_pruned(dict(value) if isinstance(value, Mapping) else list(value))
    return value


# What the edits add, one shape for both paths (patches edits it in, patch_ops emits it as an op value).


def zone_requirement(zone_label: str, zones: Sequence[str]) -> dict[str, Any]:
    """The nodeSelectorTerm expression `zone_label In zones`."""
    return {"key": zone_label, "operator": "In", "values": list(zones)}


def pod_affinity_term(selector: Mapping[str, str], zone_label: str) -> dict[str, Any]:
    """The required podAffinity term that keeps the group's pods (`selector`) in one zone."""
    return {"labelSelector": {"matchLabels": dict(selector)}, "topologyKey": zone_label}


def hostname_spread(selector: Mapping[str, str]) -> dict[str, Any]:
    """The soft spread of the group's pods over the nodes of their zone."""
    return {
        "maxSkew": 1,
        "topologyKey": labels.HOSTNAME_LABEL,
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": dict(selector)},
    }


def is_hostname_spread(constraint: Any) -> bool:
    """Whether a topologySpreadConstraints entry has `hostname_spread`'s key: the CRDs key the list on
    (topologyKey, whenUnsatisfiable) and reject a second entry with the same pair."""
    return isinstance(constraint, Mapping) and (
        constraint.get("topologyKey"), constraint.get("whenUnsatisfiable")
    ) == (labels.HOSTNAME_LABEL, "ScheduleAnyway")


def decision_annotation(decision: Decision, group: JobGroup) -> str:
    """The `topoguard.io/decision` value: the decision's summary and, for a job whose pods come from
    elsewhere (a TrainJob's runtime), where they were composed from: `...; pods from
    ClusterTrainingRuntime torch-distributed@42 via runtimePatches`."""
    if not decision.summary or not group.composed_from:
        return decision.summary
    return f"{decision.summary}; pods from {group.composed_from}"
