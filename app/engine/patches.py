"""JSON Patch (RFC 6902) that applies a `Decision` to the job as the user wrote it: `build_patch`, and its general path.

PURE: no I/O, no Kubernetes client. `build_patch` has two paths that give the same ops (issue 4: the
job as received carries managedFields and a last-applied annotation that no edit touches, and
deep-copying and diffing them cost more than the rest of the review):

- the fast path (`patch_ops.build_patch_fast`) writes the ops directly, for templates written the
  usual way (its module docstring says which), and returns None, having emitted nothing, for
  anything else;
- the general path (`_build_patch_general`, here) answers the rest, its errors included, and is the
  reference: test_patch_fast_path.py holds the fast path to it.

What both follow (the op type, the group label and its value, whether to spread, when a toleration
is already there, the pruned copy of op values) is defined once in `patch_rules`. This module
imports both; neither imports it back. It stays the public entry: everything in `__all__` is here.

The general path edits a copy-on-write copy, then diffs it, with the copy made only where an edit
writes:

- `edited` starts as a shallow copy of the job. Every container on the way to each replica's
  template pointer, the template included, is replaced by a shallow copy (`_own_path`); below a
  template (and in `metadata`), the edits get every container they write to through `_child_map` /
  `_child_list`, which put a shallow copy in its place first. Everything else stays shared with the
  job by identity and is never written to, so the job is not modified.
- The adapter makes every replica's pod template exist (`jobs.prepare_templates`). It writes only to
  containers on the template pointers (for a TrainJob: `spec`, `spec.runtimePatches` and topoguard's
  own entry, all on them), i.e. to copies, and creates the rest. It only creates what is missing, so
  it is skipped when every template is there with its `metadata` and `spec`.
- `diff_documents` turns original → edited into `add` / `replace` operations. A value shared by
  identity is unchanged, so the diff walks only the copied containers, and emits the ops (order
  included) that the diff of a full deep copy, edited the same way, would.

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

import functools
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

from app import jobs
from app.config import Settings
from app.engine.patch_ops import build_patch_fast
from app.engine.patch_rules import (
    ABSENT,
    CONTAINERS,
    REQUIRED,
    PatchOp,
    already_tolerated,
    copy_pruned,
    decision_annotation,
    group_label_value,
    hostname_spread,
    is_hostname_spread,
    needs_group_label,
    pod_affinity_term,
    spreads,
    tolerates,
    zone_requirement,
)
from app.engine.patch_rules import LABEL_VALUE_MAX_CHARS as LABEL_VALUE_MAX_CHARS  # NB: tests read it here

# RFC 6901 escaping is shared with the adapters, which build the template pointers.
from app.jobs.pointers import copy_json, escape_json_pointer, split_pointer, unescape_json_pointer
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


class PatchError(ValueError):
    """The job has a value of the wrong type where the patch must edit (names the JSON pointer)."""


def resolve_pointer(doc: Any, pointer: str) -> Any:
    """The value at `pointer` in `doc`; PatchError when a step does not exist."""
    node = doc
    try:
        tokens = _tokens(pointer)
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


@functools.lru_cache(maxsize=1024)
def _tokens(pointer: str) -> tuple[str, ...]:
    """`split_pointer`, memoized: the template pointers recur from review to review (one per replica type)."""
    return tuple(split_pointer(pointer))


def diff_documents(old: Any, new: Any, path: str = "") -> list[PatchOp]:
    """RFC 6902 operations that turn `old` into `new`, for edits that only add or narrow.

    Missing keys become one `add` of the whole subtree (so absent parents are created), items
    appended to a list become `add` at `/-`, changed scalars (or a value that changes type) become
    `replace`. Removed keys and shortened lists are never produced by the edits here; they are a
    programming error and raise PatchError rather than being silently dropped from the patch.

    NB: subtrees are compared by identity, then with Python equality (the fast paths for everything
    an edit did not touch: shared with `old`, or an equal copy), so a scalar swapped for an equal one
    of another JSON type (1 → true, 1 → 1.0) deep in a subtree is not reported. The edits here never
    do that.
    """
    ops: list[PatchOp] = []
    if not _unchanged(old, new):
        _diff_into(ops, old, new, path, copy_json)
    return ops


def _unchanged(old: Any, new: Any) -> bool:
    """Whether old → new needs no op, decided without walking into either side in Python."""
    if isinstance(old, CONTAINERS):
        return old is new or old == new  # NB: identity is O(1); equality is C-level
    return old == new and type(old) is type(new)


def _diff_into(ops: list[PatchOp], old: Any, new: Any, path: str, fresh: Callable[[Any], Any]) -> None:
    """Append to `ops` the operations for a pair that `_unchanged` found different; `fresh` copies op values."""
    if isinstance(old, dict) and isinstance(new, dict):
        if not old.keys() <= new.keys():
            key = next(k for k in old if k not in new)
            raise PatchError(f"{path}/{escape_json_pointer(key)}: an edit removed a key")
        for key, value in new.items():
            prev = old.get(key, ABSENT)
            if prev is value and type(value) is not float:
                continue  # NB: shared with `old`, so unchanged (but a float may be NaN, unequal to itself)
            token = key if type(key) is str and "~" not in key and "/" not in key else escape_json_pointer(str(key))
            if prev is ABSENT:
                ops.append({"op": "add", "path": f"{path}/{token}", "value": fresh(value)})
            elif not _unchanged(prev, value):
                _diff_into(ops, prev, value, f"{path}/{token}", fresh)
        return
    if isinstance(old, list) and isinstance(new, list):
        if len(new) < len(old):
            raise PatchError(f"{path}: an edit removed list items")
        for i, item in enumerate(old):
            if not _unchanged(item, new[i]):
                _diff_into(ops, item, new[i], f"{path}/{i}", fresh)
        ops += [{"op": "add", "path": f"{path}/-", "value": fresh(item)} for item in new[len(old):]]
        return
    if path == "":
        raise PatchError("an edit replaced the whole document")
    ops.append({"op": "replace", "path": path, "value": fresh(new)})


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
    ops = build_patch_fast(raw_job, group, decision, settings)
    return _build_patch_general(raw_job, group, decision, settings) if ops is None else ops


def _build_patch_general(
    raw_job: Mapping[str, Any], group: JobGroup, decision: Decision, settings: Settings
) -> list[PatchOp]:
    """`build_patch` for any job: edit a copy-on-write copy, then diff it (see the module docstring)."""
    if not decision.allowed:
        return []
    edited = dict(raw_job)  # copy-on-write: see the module docstring
    found = [_own_path(raw_job, edited, replica.template_path) for replica in group.replicas]
    if not all(isinstance(t, dict) and t.get("metadata") is not None and t.get("spec") is not None for t in found):
        jobs.prepare_templates(edited, group)  # NB: it only creates what is missing; skipped when nothing is
    selector = {labels.GROUP_LABEL: group_label_value(raw_job, group)} if needs_group_label(group, settings) else {}
    for replica in group.replicas:
        template = resolve_pointer(edited, replica.template_path)
        _edit_template(template, replica, decision, settings, selector, spread=spreads(group, settings),
                       where=replica.template_path)
    annotations = _child_map(_child_map(edited, "metadata", ""), "annotations", "/metadata")
    if decision.zone and settings.mode == "pin":
        annotations[labels.ZONE_ANNOTATION] = decision.zone
    if decision.summary:
        annotations[labels.DECISION_ANNOTATION] = decision_annotation(decision, group)
    old = dict(raw_job)
    ops: list[PatchOp] = []
    if not _unchanged(old, edited):
        _diff_into(ops, old, edited, "", copy_pruned)
    # An op that would only add empty scaffolding (e.g. `labels: {}` with no label to set) is dropped.
    return [op for op in ops if not (isinstance(op["value"], CONTAINERS) and not op["value"])]


def _own_path(raw_job: Mapping[str, Any], edited: dict[str, Any], pointer: str) -> Any:
    """Put a shallow copy in place of every container on `pointer` in `edited`, the template included.

    `edited` starts as a shallow copy of `raw_job`. `prepare_templates` writes to the containers on
    the template pointers and the edits write to the template itself; below it they write only through
    `_child_map` / `_child_list`, which copy first. A container is copied only while it is still the
    one in `raw_job`, so pointers with a common prefix share the copies. The walk stops where the
    path does not exist yet or meets a scalar: `prepare_templates` creates the rest inside a copy, or
    reports the scalar.

    Returns:
        The value at `pointer` in `edited` (a copy when a container), None when the walk stopped early.
    """
    old: Any = raw_job
    new: Any = edited
    for token in _tokens(pointer):
        key: str | int = token
        if isinstance(new, list):
            if not token.isdigit() or int(token) >= len(new):
                return None
            key = int(token)
        elif not isinstance(new, dict) or token not in new:
            return None
        child, original = new[key], old[key]
        if child is original:
            if isinstance(child, dict):
                child = new[key] = dict(child)
            elif isinstance(child, list):
                child = new[key] = list(child)
        old, new = original, child
    return new


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
    if decision.clique and replica.key in decision.clique_replicas:  # a ComputeDomain job: one NVLink clique
        if settings.mode == "pin":
            _require_zone(spec, settings.clique_label, [decision.clique], where=spec_path)
        else:
            _require_pod_affinity(spec, settings.clique_label, selector, where=spec_path)
    _add_tolerations(spec, decision.tolerations.get(replica.key, ()), where=spec_path)
    if spread:
        _add_hostname_spread(spec, selector, where=spec_path)


def _child_map(parent: MutableMapping[str, Any], key: str, where: str) -> dict[str, Any]:
    """parent[key] as a dict of the caller's own, to edit; PatchError when it is not an object.

    `parent` must be the caller's own. The child may still be shared with the job as received
    (copy-on-write), so a shallow copy takes its place (same key position); an absent or null child
    becomes a new `{}`. Copying a container that is already a copy is harmless, so no bookkeeping.
    """
    value = parent.get(key)
    if value is None:
        value = {}
    elif isinstance(value, dict):
        value = dict(value)
    else:
        raise PatchError(f"{where}/{escape_json_pointer(key)}: expected an object, got {type(value).__name__}")
    parent[key] = value
    return value


def _child_list(parent: MutableMapping[str, Any], key: str, where: str) -> list[Any]:
    """parent[key] as a list of the caller's own (a shallow copy, or new when absent or null); see `_child_map`."""
    value = parent.get(key)
    if value is None:
        value = []
    elif isinstance(value, list):
        value = list(value)
    else:
        raise PatchError(f"{where}/{escape_json_pointer(key)}: expected a list, got {type(value).__name__}")
    parent[key] = value
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
    requirement = zone_requirement(zone_label, zones)
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
        term = terms[i] = dict(term)  # ours to write to (see _child_map)
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
    terms.append(pod_affinity_term(selector, zone_label))


def _add_tolerations(spec: dict[str, Any], wanted: Sequence[Mapping[str, Any]], *, where: str) -> None:
    if not wanted:
        return
    existing = _child_list(spec, "tolerations", where)
    for toleration in wanted:
        if not already_tolerated(toleration, existing):
            existing.append(dict(toleration))


def _add_hostname_spread(spec: dict[str, Any], selector: Mapping[str, str], *, where: str) -> None:
    constraints = _child_list(spec, "topologySpreadConstraints", where)
    if not any(is_hostname_spread(c) for c in constraints):  # a second entry would be rejected
        constraints.append(hostname_spread(selector))
