"""JSON Patch (RFC 6902) that applies a `Decision` to the job as the user wrote it.

PURE: no I/O, no Kubernetes client. The approach is "edit a copy, then diff": the job is deep-copied,
the adapter makes every replica's pod template exist (`jobs.prepare_templates`), each template is
edited in place, and `diff_documents` turns original → edited into `add` / `replace` operations.

Rules the edits follow (DESIGN.md "The decision", step 6):

- Nothing the user wrote is removed or reordered. Edits only add keys, append list items, AND a zone
  requirement into existing node selector terms, or replace a scalar (a label value).
- Mode `pin`: required nodeAffinity `<zoneLabel> In [zone]` is ANDed into EVERY existing
  nodeSelectorTerm (terms are ORed, so a new term would widen, not narrow). Empty terms match nothing
  in Kubernetes and are left alone (adding a requirement would make them match).
- Mode `colocate`: required podAffinity on the group label with `topologyKey: <zoneLabel>`, plus
  nodeAffinity `<zoneLabel> In <open zones>`.
- A term that already restricts the zone label to allowed zones is left as it is; so is a template
  whose nodeSelector already does. Together with "add only what is missing" for tolerations,
  labels, spread constraints and annotations this makes a second review of a patched job `[]`.
- `spreadWithinZone: hostname` adds a soft hostname spread over the group, never a duplicate
  `(topologyKey, whenUnsatisfiable)` entry (the CRDs key the list on that pair and reject
  duplicates) and never where the schema prunes it (`JobGroup.supports_spread`, TrainJob).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from app import jobs
from app.config import Settings

# RFC 6901 escaping is shared with the adapters, which build the template pointers.
from app.jobs.pointers import escape_json_pointer, split_pointer, unescape_json_pointer
from app.models import labels
from app.models.decision import Decision
from app.models.job import JobGroup, Replica

__all__ = [
    "PatchError",
    "PatchOp",
    "build_patch",
    "diff_documents",
    "escape_json_pointer",
    "group_label_value",
    "resolve_pointer",
    "tolerates",
    "unescape_json_pointer",
]

PatchOp = dict[str, Any]

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
# Kubernetes label values: at most 63 characters, alphanumeric at both ends.
LABEL_VALUE_MAX_CHARS = 63
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class PatchError(ValueError):
    """The job has a value of the wrong type where the patch must edit (names the JSON pointer)."""


def resolve_pointer(doc: Any, pointer: str) -> Any:
    """The value at `pointer` in `doc`; PatchError when a step does not exist."""
    node = doc
    try:
        tokens = split_pointer(pointer)
    except ValueError as e:
        raise PatchError(str(e)) from e
    for token in tokens:
        if isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        elif isinstance(node, dict) and token in node:
            node = node[token]
        else:
            raise PatchError(f"{pointer}: {token!r} does not exist")
    return node


def diff_documents(old: Any, new: Any, path: str = "") -> list[PatchOp]:
    """RFC 6902 operations that turn `old` into `new`, for edits that only add or narrow.

    Missing keys become one `add` of the whole subtree (so absent parents are created), items
    appended to a list become `add` at `/-`, changed scalars (or a value that changes type) become
    `replace`. Removed keys and shortened lists are never produced by the edits here; they are a
    programming error and raise PatchError rather than being silently dropped from the patch.

    NB: subtrees are compared with Python equality first (the fast path for everything an edit did
    not touch), so a scalar swapped for an equal one of another JSON type (1 → true, 1 → 1.0)
    deep in a subtree is not reported. The edits here never do that.
    """
    if isinstance(old, dict | list) and old == new:
        return []  # NB: the fast path for untouched subtrees; C-level equality, no recursion in Python
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[PatchOp] = []
        for key in old:
            if key not in new:
                raise PatchError(f"{path}/{escape_json_pointer(key)}: an edit removed a key")
        for key, value in new.items():
            child = f"{path}/{escape_json_pointer(str(key))}"
            if key in old:
                ops += diff_documents(old[key], value, child)
            else:
                ops.append({"op": "add", "path": child, "value": copy_json(value)})
        return ops
    if isinstance(old, list) and isinstance(new, list):
        if len(new) < len(old):
            raise PatchError(f"{path}: an edit removed list items")
        ops = []
        for i, item in enumerate(old):
            ops += diff_documents(item, new[i], f"{path}/{i}")
        ops += [{"op": "add", "path": f"{path}/-", "value": copy_json(item)} for item in new[len(old):]]
        return ops
    if old == new and type(old) is type(new):
        return []
    if path == "":
        raise PatchError("an edit replaced the whole document")
    return [{"op": "replace", "path": path, "value": copy_json(new)}]


def copy_json(value: Any) -> Any:
    """A deep copy of JSON data (objects become dicts); several times faster than copy.deepcopy."""
    if isinstance(value, Mapping):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [copy_json(v) for v in value]
    return value


def build_patch(raw_job: Mapping[str, Any], group: JobGroup, decision: Decision, settings: Settings) -> list[PatchOp]:
    """The JSON Patch that applies `decision` to `raw_job` ([] when nothing needs to change).

    Args:
        raw_job: the job exactly as received in the AdmissionReview (not modified).
        group: the job's replicas, as parsed by `jobs.parse_job` from the same object.
        decision: an allowed decision; a refused one patches nothing.
        settings: zone label, mode and spreadWithinZone.

    Raises:
        PatchError: a field the patch must edit has the wrong type (e.g. `tolerations: {}`).
        jobs.InvalidJobError: a replica's template cannot be created (from `prepare_templates`).
    """
    if not decision.allowed:
        return []
    edited: dict[str, Any] = copy_json(raw_job)
    jobs.prepare_templates(edited, group)
    selector = {labels.GROUP_LABEL: group_label_value(raw_job, group)} if _needs_group_label(group, settings) else {}
    for replica in group.replicas:
        template = resolve_pointer(edited, replica.template_path)
        _edit_template(template, replica, decision, settings, selector, spread=_spreads(group, settings),
                       where=replica.template_path)
    annotations = _child_map(_child_map(edited, "metadata", ""), "annotations", "/metadata")
    if decision.zone and settings.mode == "pin":
        annotations[labels.ZONE_ANNOTATION] = decision.zone
    if decision.summary:
        annotations[labels.DECISION_ANNOTATION] = decision.summary
    return [op for op in map(_prune_op, diff_documents(dict(raw_job), edited)) if op is not None]


def _prune_empty(value: Any) -> Any:
    """`value` without the empty objects/lists the edits created as parents and then did not fill."""
    if isinstance(value, dict):
        pruned = {k: _prune_empty(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if not (isinstance(v, dict | list) and not v)}
    if isinstance(value, list):
        return [_prune_empty(v) for v in value]
    return value


def _prune_op(op: PatchOp) -> PatchOp | None:
    """Drop an op that would only add empty scaffolding (e.g. `labels: {}` with no label to set)."""
    value = _prune_empty(op["value"])
    if isinstance(value, dict | list) and not value:
        return None
    return {**op, "value": value}


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


def _spreads(group: JobGroup, settings: Settings) -> bool:
    """Whether to add the hostname spread: asked for, and kept by the kind's schema."""
    return settings.spread_within_zone == "hostname" and group.supports_spread


def _needs_group_label(group: JobGroup, settings: Settings) -> bool:
    return settings.mode == "colocate" or _spreads(group, settings)


def _edit_template(
    template: Any,
    replica: Replica,
    decision: Decision,
    settings: Settings,
    selector: Mapping[str, str],
    *,
    spread: bool,
    where: str,
) -> None:
    if not isinstance(template, dict):
        raise PatchError(f"{where}: the pod template is not an object")
    pod_labels = _child_map(_child_map(template, "metadata", where), "labels", f"{where}/metadata")
    pod_labels.update(decision.labels)
    pod_labels.update(selector)
    spec = _child_map(template, "spec", where)
    spec_path = f"{where}/spec"
    if settings.mode == "pin" and decision.zone:
        _require_zone(spec, settings.zone_label, [decision.zone], where=spec_path)
    elif settings.mode == "colocate":
        if decision.open_zones:
            _require_zone(spec, settings.zone_label, sorted(decision.open_zones), where=spec_path)
        _require_pod_affinity(spec, settings.zone_label, selector, where=spec_path)
    _add_tolerations(spec, decision.tolerations.get(replica.key, ()), where=spec_path)
    if spread:
        _add_hostname_spread(spec, selector, where=spec_path)


def _child_map(parent: MutableMapping[str, Any], key: str, where: str) -> dict[str, Any]:
    """parent[key] as a dict, created when absent or null; PatchError when it is another type."""
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise PatchError(f"{where}/{escape_json_pointer(key)}: expected an object, got {type(value).__name__}")
    return value


def _child_list(parent: MutableMapping[str, Any], key: str, where: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        value = parent[key] = []
    if not isinstance(value, list):
        raise PatchError(f"{where}/{escape_json_pointer(key)}: expected a list, got {type(value).__name__}")
    return value


def _restricts_zone(expr: Any, zone_label: str, allowed: set[str]) -> bool:
    """Whether one matchExpression already keeps the zone label within `allowed`."""
    if not isinstance(expr, Mapping) or expr.get("key") != zone_label or expr.get("operator") != "In":
        return False
    values = expr.get("values")
    return isinstance(values, list) and bool(values) and set(values) <= allowed


def _require_zone(spec: dict[str, Any], zone_label: str, zones: Sequence[str], *, where: str) -> None:
    """AND `zone_label In zones` into every nodeSelectorTerm that does not already imply it."""
    allowed = set(zones)
    node_selector = spec.get("nodeSelector")
    if isinstance(node_selector, Mapping) and node_selector.get(zone_label) in allowed:
        return  # nodeSelector is ANDed with every term: the template is already confined
    requirement = {"key": zone_label, "operator": "In", "values": list(zones)}
    affinity_path = f"{where}/affinity/nodeAffinity"
    node_affinity = _child_map(_child_map(spec, "affinity", where), "nodeAffinity", f"{where}/affinity")
    required = _child_map(node_affinity, REQUIRED, affinity_path)
    terms = _child_list(required, "nodeSelectorTerms", f"{affinity_path}/{REQUIRED}")
    if not terms:
        terms.append({"matchExpressions": [requirement]})
        return
    for i, term in enumerate(terms):
        term_path = f"{affinity_path}/{REQUIRED}/nodeSelectorTerms/{i}"
        if not isinstance(term, dict):
            raise PatchError(f"{term_path}: expected an object, got {type(term).__name__}")
        if not term.get("matchExpressions") and not term.get("matchFields"):
            continue  # NB: an empty term matches no node; a requirement would make it match some
        expressions = _child_list(term, "matchExpressions", term_path)
        if not any(_restricts_zone(e, zone_label, allowed) for e in expressions):
            expressions.append(copy_json(requirement))


def _require_pod_affinity(spec: dict[str, Any], zone_label: str, selector: Mapping[str, str], *, where: str) -> None:
    affinity = _child_map(spec, "affinity", where)
    pod_affinity = _child_map(affinity, "podAffinity", f"{where}/affinity")
    terms = _child_list(pod_affinity, REQUIRED, f"{where}/affinity/podAffinity")
    for term in terms:
        if not isinstance(term, Mapping) or term.get("topologyKey") != zone_label:
            continue
        match_labels = (term.get("labelSelector") or {}).get("matchLabels") or {}
        if isinstance(match_labels, Mapping) and all(match_labels.get(k) == v for k, v in selector.items()):
            return
    terms.append({"labelSelector": {"matchLabels": dict(selector)}, "topologyKey": zone_label})


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


def _already_tolerated(wanted: Mapping[str, Any], existing: Sequence[Any]) -> bool:
    present = [t for t in existing if isinstance(t, Mapping)]
    if any(dict(t) == dict(wanted) for t in present):
        return True
    key, effect = wanted.get("key"), wanted.get("effect")
    if not key or not effect or wanted.get("operator") == "Exists":
        return False  # not a single taint: only an identical toleration covers it
    return any(tolerates(t, str(key), str(wanted.get("value") or ""), str(effect)) for t in present)


def _add_tolerations(spec: dict[str, Any], wanted: Sequence[Mapping[str, Any]], *, where: str) -> None:
    if not wanted:
        return
    existing = _child_list(spec, "tolerations", where)
    for toleration in wanted:
        if not _already_tolerated(toleration, existing):
            existing.append(dict(toleration))


def _add_hostname_spread(spec: dict[str, Any], selector: Mapping[str, str], *, where: str) -> None:
    constraints = _child_list(spec, "topologySpreadConstraints", where)
    for c in constraints:
        if isinstance(c, Mapping) and (c.get("topologyKey"), c.get("whenUnsatisfiable")) == (
            labels.HOSTNAME_LABEL,
            "ScheduleAnyway",
        ):
            return  # the list is keyed by this pair: a second entry would be rejected
    constraints.append({
        "maxSkew": 1,
        "topologyKey": labels.HOSTNAME_LABEL,
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": dict(selector)},
    })
