"""JSON Patch (RFC 6902) that applies a `Decision` to the job as the user wrote it.

PURE: no I/O, no Kubernetes client. Two paths give the same ops (issue 4: the job as received carries
managedFields and a last-applied annotation that no edit touches, and deep-copying and diffing them
cost more than the rest of the review):

The fast path (`_build_patch_fast`) writes the ops directly, for templates written the usual way:
every replica's template is there as an object with `metadata` and `spec` objects (so
`prepare_templates` has nothing to do), no spec has an `affinity`, the fields the edits write (pod
labels, tolerations, topologySpreadConstraints, the job's annotations) are absent, null or of their
type, the template pointers are canonical and in document order under one root key, and no
container on the way holds a float (a NaN, unequal to itself, is a `replace` in the diff). For
anything else it returns None, having emitted nothing, and the general path answers (its errors
included). It reproduces the diff's op order: keys that exist keep their place, new keys follow in
the order the edits create them; null becomes `replace`, a list gets `add` at `/-`, and an op whose
value is empty is dropped. test_patch_fast_path.py holds it to the general path.

The general path (`_build_patch_general`) edits a copy-on-write copy, then diffs it, with the copy
made only where an edit writes:

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
import hashlib
import json
import operator
import re
from collections.abc import Callable, Mapping, MutableMapping, Sequence
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
_ABSENT = object()
_CONTAINERS = (dict, list)  # NB: for isinstance; a tuple is faster there than `dict | list`
_SCALARS = frozenset({str, int, float, bool, type(None)})  # exact JSON scalar types: copies share them
_DICT = frozenset({dict})
_HOSTNAME_SPREAD_KEY = (labels.HOSTNAME_LABEL, "ScheduleAnyway")  # the key of the spread list's entries
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


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
    if isinstance(old, _CONTAINERS):
        return old is new or old == new  # NB: identity is O(1); equality is C-level
    return old == new and type(old) is type(new)


def _diff_into(ops: list[PatchOp], old: Any, new: Any, path: str, fresh: Callable[[Any], Any]) -> None:
    """Append to `ops` the operations for a pair that `_unchanged` found different; `fresh` copies op values."""
    if isinstance(old, dict) and isinstance(new, dict):
        if not old.keys() <= new.keys():
            key = next(k for k in old if k not in new)
            raise PatchError(f"{path}/{escape_json_pointer(key)}: an edit removed a key")
        for key, value in new.items():
            prev = old.get(key, _ABSENT)
            if prev is value and type(value) is not float:
                continue  # NB: shared with `old`, so unchanged (but a float may be NaN, unequal to itself)
            token = key if type(key) is str and "~" not in key and "/" not in key else escape_json_pointer(str(key))
            if prev is _ABSENT:
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


def copy_json(value: Any) -> Any:
    """A deep copy of JSON data (objects become dicts); several times faster than copy.deepcopy."""
    if type(value) in _SCALARS:
        return value  # NB: exact types first; most leaves are scalars and the Mapping check is an ABC's
    if type(value) is dict:
        return {k: copy_json(v) for k, v in value.items()}
    if type(value) is list:
        return [copy_json(v) for v in value]
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
    ops = _build_patch_fast(raw_job, group, decision, settings)
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
    old = dict(raw_job)
    ops: list[PatchOp] = []
    if not _unchanged(old, edited):
        _diff_into(ops, old, edited, "", _copy_pruned)
    # An op that would only add empty scaffolding (e.g. `labels: {}` with no label to set) is dropped.
    return [op for op in ops if not (isinstance(op["value"], _CONTAINERS) and not op["value"])]


def _build_patch_fast(
    raw_job: Mapping[str, Any], group: JobGroup, decision: Decision, settings: Settings
) -> list[PatchOp] | None:
    """The ops `_build_patch_general` returns, emitted without a copy or a diff; None to fall back to it.

    For an allowed decision and a job written the usual way (see the module docstring); None,
    before anything could differ, for the rest. The ops come in the diff's order: the job's root
    keys as written (`metadata` against the templates' common first key), the templates in document
    order (`_usual_templates`), within a template its `metadata` and `spec` as written, and within
    those the diff's key order.

    NB: the diff reports an unchanged float that is NaN (unequal to itself) in a container it walks
    as a `replace`; the ops here do not. So a float among the values of any container on the way to
    an edit sends the job to the general path (each is checked where it is read).
    """
    metadata = raw_job.get("metadata") if type(raw_job) is dict else None
    if type(metadata) is not dict:
        return None
    found = _usual_templates(raw_job, group.replicas)
    if found is None:
        return None
    templates, metadata_first = found
    updates: dict[str, Any] = {}
    if decision.zone and settings.mode == "pin":
        updates[labels.ZONE_ANNOTATION] = decision.zone
    if decision.summary:
        updates[labels.DECISION_ANNOTATION] = decision.summary
    annotations = metadata.get("annotations", _ABSENT)
    if _holds_float(metadata, annotations if type(annotations) is dict else ()):
        return None
    annotation_ops: list[PatchOp] = []
    if not _emit_flat(annotation_ops, annotations, updates, "/metadata/annotations"):
        return None
    template_ops = _template_ops(raw_job, group, templates, decision, settings)
    if template_ops is None:
        return None
    return annotation_ops + template_ops if metadata_first else template_ops + annotation_ops


def _holds_float(*containers: Any) -> bool:
    """Whether a value of one of the dicts or lists is a float (a loop: cheaper than `map` on a few values)."""
    for container in containers:
        for value in container.values() if type(container) is dict else container:
            if type(value) is float:
                return True
    return False


@functools.lru_cache(maxsize=1024)
def _plain_tokens(pointer: str) -> tuple[str, ...] | None:
    """The tokens of `pointer` when the diff spells their path as `pointer` does; None otherwise.

    The diff escapes keys (RFC 6901) and writes list indexes in decimal, so a superfluous escape
    (`~2`), an index with a leading zero or non-ASCII digits would not come back as written. The
    adapters build canonical pointers; anything else takes the general path.
    """
    if not pointer.startswith("/"):
        return None
    raw = pointer[1:].split("/")
    for token in raw:
        if escape_json_pointer(unescape_json_pointer(token)) != token:
            return None
        if token.isdigit() and not (token.isascii() and str(int(token)) == token):
            return None
    return tuple(unescape_json_pointer(t) for t in raw)


def _usual_templates(raw_job: Mapping[str, Any], replicas: Sequence[Replica]) -> tuple[list[Any], bool] | None:
    """Every replica's pod template (a dict at its pointer, reached through dicts and lists), and
    whether the job's `metadata` comes before them; None when that is not how the diff would see it.

    That is: the pointers as `_walks` wants them, the templates in document order (the diff emits ops
    in document order, the fast path in replica order), and no float in a container on the way (see
    `_build_patch_fast`; the templates' own values are checked later).
    """
    walks = _walks(tuple(map(_TEMPLATE_PATH, replicas)))
    if walks is None or _holds_float(raw_job):
        return None
    templates: list[Any] = []
    nodes: list[Any] = [raw_job]  # the containers on the previous pointer, by depth
    for fork, before, steps in walks:
        del nodes[fork + 1 :]
        node = nodes[fork]
        for token in steps:
            if type(node) is dict and token in node:
                node = node[token]
            elif type(node) is list and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return None
            nodes.append(node)
        if type(node) is not dict or (before and not _in_order(nodes[fork], before, steps[0])):
            return None
        if _holds_float(*nodes[fork + 1 : -1]):  # NB: the one at `fork` was reached (and checked) before
            return None
        templates.append(node)
    root = walks[0][2][0]
    for key in raw_job:
        if key == "metadata" or key == root:
            return templates, key == "metadata"
    return None


_TEMPLATE_PATH = operator.attrgetter("template_path")


@functools.lru_cache(maxsize=1024)
def _walks(pointers: tuple[str, ...]) -> tuple[tuple[int, str, tuple[str, ...]], ...] | None:
    """How to reach each template from the one before: (depth where its pointer leaves the previous
    one, the previous pointer's token there ("" for the first), the tokens from there on).

    None when a pointer is not spelled as the diff would spell it (`_plain_tokens`), or the pointers
    do not follow one another under one root key other than `metadata` (another root key, the same
    template twice, one template inside another).
    """
    out: list[tuple[int, str, tuple[str, ...]]] = []
    prev: tuple[str, ...] = ()
    for pointer in pointers:
        tokens = _plain_tokens(pointer)
        if not tokens or tokens[0] == "metadata":
            return None
        fork = 0
        if prev:
            while fork < min(len(tokens), len(prev)) and tokens[fork] == prev[fork]:
                fork += 1
            if fork == 0 or fork == len(tokens) or fork == len(prev):
                return None
        out.append((fork, prev[fork] if prev else "", tokens[fork:]))
        prev = tokens
    return tuple(out) if out else None


def _in_order(container: Any, first: str, second: str) -> bool:
    """Whether `first` comes before `second` in `container` (a dict's key order, a list's indexes)."""
    if type(container) is not dict:
        return int(first) < int(second)
    for key in container:
        if key == first:
            return True
        if key == second:
            return False
    return False


def _emit_flat(ops: list[PatchOp], old: Any, updates: Mapping[str, Any], path: str) -> bool:
    """Append the ops that set `updates` (string values) in the map `old` at `path`; False to fall back.

    `old` absent or null becomes one `add` / `replace` of the whole map (no op when there is nothing
    to set); an existing map gets a `replace` per changed value (in the map's order), then an `add`
    per new key (in `updates`' order): what `update` and then the diff make of it.
    """
    if old is _ABSENT or old is None:
        if not all(type(k) is str and type(v) is str for k, v in updates.items()):
            return False
        if updates:
            ops.append({"op": "add" if old is _ABSENT else "replace", "path": path, "value": dict(updates)})
        return True
    if type(old) is not dict:
        return False
    replaced: list[str] = []
    for name, value in updates.items():
        if type(name) is not str or type(value) is not str:
            return False
        prev = old.get(name, _ABSENT)
        if prev is _ABSENT:
            ops.append({"op": "add", "path": f"{path}/{_escaped(name)}", "value": value})
        elif not (type(prev) is str and prev == value):
            replaced.append(name)
    if replaced:  # NB: rare (a label the user set differently); they go before the adds, in the map's order
        at = len(ops) - sum(1 for name in updates if name not in old)
        ops[at:at] = [
            {"op": "replace", "path": f"{path}/{_escaped(name)}", "value": updates[name]}
            for name in old
            if name in replaced
        ]
    return True


@functools.lru_cache(maxsize=256)
def _escaped(key: str) -> str:
    """`escape_json_pointer`, memoized: the label and annotation keys set are few (settings and constants)."""
    return escape_json_pointer(key)


def _template_ops(
    raw_job: Mapping[str, Any], group: JobGroup, templates: list[Any], decision: Decision, settings: Settings
) -> list[PatchOp] | None:
    """The ops on every template, in order, each with `metadata` and `spec` as written; None to fall back."""
    selector = {labels.GROUP_LABEL: group_label_value(raw_job, group)} if _needs_group_label(group, settings) else {}
    pod_labels = {**decision.labels, **selector}  # NB: the order of the edits' two `update`s
    zones: Sequence[str] = ()
    if settings.mode == "pin" and decision.zone:
        zones = (decision.zone,)
    elif settings.mode == "colocate" and decision.open_zones:
        zones = sorted(decision.open_zones)
    edits: _Edits = (zones, settings.mode == "colocate", settings.zone_label, selector, _spreads(group, settings))
    ops: list[PatchOp] = []
    for replica, template in zip(group.replicas, templates, strict=True):
        metadata, spec = template.get("metadata"), template.get("spec")
        if type(metadata) is not dict or type(spec) is not dict or "affinity" in spec:
            return None
        old = metadata.get("labels", _ABSENT)
        if _holds_float(template, metadata, spec, old if type(old) is dict else ()):
            return None
        path = replica.template_path
        for key in template:
            if key == "metadata" or key == "spec":
                spec_first = key == "spec"
                break
        at = len(ops)
        if not _emit_flat(ops, old, pod_labels, f"{path}/metadata/labels"):
            return None
        spec_ops = _spec_ops(spec, f"{path}/spec", decision.tolerations.get(replica.key, ()), edits)
        if spec_ops is None:
            return None
        if spec_first:
            ops[at:at] = spec_ops
        else:
            ops += spec_ops
    return ops


# What every template's spec gets, worked out once per job: zones for the node affinity (() for none),
# colocate (podAffinity on the group), the zone label, the group selector, the hostname spread.
_Edits = tuple[Sequence[str], bool, str, Mapping[str, str], bool]


def _spec_ops(
    spec: dict[str, Any], path: str, wanted: Sequence[Mapping[str, Any]], edits: _Edits
) -> list[PatchOp] | None:
    """The ops on a template's `spec` (no `affinity`, values checked for floats); None to fall back.

    Keys the spec has keep their place (null is replaced, a list appended to); new keys follow in
    the order the edits create them: affinity, tolerations, topologySpreadConstraints.
    """
    zones, colocate, zone_label, selector, spread = edits
    placed: dict[str, list[PatchOp]] = {}
    tail: list[PatchOp] = []
    affinity = _new_affinity(spec, zones, colocate, zone_label, selector)
    if affinity is None:
        return None
    if affinity:
        tail.append({"op": "add", "path": f"{path}/affinity", "value": affinity})
    if wanted:
        old = spec.get("tolerations", _ABSENT)
        if not _DICT.issuperset(map(type, wanted)):
            return None  # NB: the engine's tolerations are dicts; anything else is the general path's to judge
        if old is _ABSENT:
            tail.append({"op": "add", "path": f"{path}/tolerations", "value": _new_tolerations([], wanted)})
        elif old is None:
            value = _new_tolerations([], wanted)
            placed["tolerations"] = [{"op": "replace", "path": f"{path}/tolerations", "value": value}]
        elif type(old) is list and not _holds_float(old):
            added = _new_tolerations(list(old), wanted)
            # NB: an empty item's op has an empty value, and such ops are dropped
            placed["tolerations"] = [{"op": "add", "path": f"{path}/tolerations/-", "value": t} for t in added if t]
        else:
            return None
    if spread:
        old = spec.get("topologySpreadConstraints", _ABSENT)
        spread_op = _spread_op(old, f"{path}/topologySpreadConstraints", selector)
        if spread_op is None:
            return None
        if spread_op and old is not _ABSENT:
            placed["topologySpreadConstraints"] = [spread_op]
        elif spread_op:
            tail.append(spread_op)
    if not placed:
        return tail
    return [op for key in (spec if len(placed) > 1 else placed) for op in placed.get(key, ())] + tail


def _new_affinity(
    spec: Mapping[str, Any], zones: Sequence[str], colocate: bool, zone_label: str, selector: Mapping[str, str]
) -> dict[str, Any] | None:
    """What `_require_zone` / `_require_pod_affinity` write into a spec without affinity ({}: nothing)."""
    out: dict[str, Any] = {}
    if zones:
        node_selector = spec.get("nodeSelector")
        pinned: Any = None
        if node_selector is not None:
            if type(node_selector) is not dict:
                return None
            pinned = node_selector.get(zone_label)
            if pinned is not None and type(pinned) is not str:
                return None  # NB: `_require_zone` looks it up in a set, where an unhashable one raises
        if pinned not in zones:
            requirement = {"key": zone_label, "operator": "In", "values": list(zones)}
            out["nodeAffinity"] = {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [requirement]}]}}
    if colocate:
        term = {"labelSelector": {"matchLabels": dict(selector)}, "topologyKey": zone_label}
        out["podAffinity"] = {REQUIRED: [term]}
    return out


def _new_tolerations(current: list[Any], wanted: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Copies of the `wanted` tolerations that `current`, growing as they are added, does not cover."""
    added = []
    for toleration in wanted:
        if not current or not _already_tolerated(toleration, current):  # NB: an empty list covers nothing
            item = dict(toleration)
            current.append(item)
            added.append(item if _SCALARS.issuperset(map(type, item.values())) else _copy_pruned(item))
    return added


def _spread_op(old: Any, path: str, selector: Mapping[str, str]) -> PatchOp | None:
    """The op that adds the hostname spread as `_add_hostname_spread` does ({}: there; None: fall back)."""
    constraint = {
        "maxSkew": 1,
        "topologyKey": labels.HOSTNAME_LABEL,
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": dict(selector)},
    }
    if old is _ABSENT:
        return {"op": "add", "path": path, "value": [constraint]}
    if old is None:
        return {"op": "replace", "path": path, "value": [constraint]}
    if type(old) is not list or _holds_float(old):
        return None
    for c in old:
        if isinstance(c, Mapping) and (c.get("topologyKey"), c.get("whenUnsatisfiable")) == _HOSTNAME_SPREAD_KEY:
            return {}
    return {"op": "add", "path": f"{path}/-", "value": constraint}


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


def _copy_pruned(value: Any) -> Any:
    """A deep copy of `value` (as `copy_json`) without the empty objects and lists in its objects.

    They are the parents the edits created and then did not fill. Pruning is bottom-up (an object
    left empty goes too); list items are kept even when empty.
    """
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if type(item) not in _SCALARS:
                item = _copy_pruned(item)
                if not item and isinstance(item, _CONTAINERS):
                    continue
            out[key] = item
        return out
    if isinstance(value, list):
        return [item if type(item) in _SCALARS else _copy_pruned(item) for item in value]
    if type(value) in _SCALARS:
        return value
    if isinstance(value, Mapping | tuple):
        return _copy_pruned(dict(value) if isinstance(value, Mapping) else list(value))
    return value


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
