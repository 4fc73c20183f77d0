"""The fast path of `patches.build_patch`: the JSON Patch ops written directly, without a copy or a diff.

PURE: no I/O, no Kubernetes client. Why it exists (issue 4): the job as received carries
managedFields and a last-applied annotation that no edit touches, and the general path's deep copy
and diff of them cost more than the rest of the review.

`build_patch_fast` writes the ops directly, for templates written the usual way: every replica's
template is there as an object with `metadata` and `spec` objects (so `prepare_templates` has
nothing to do), no spec has an `affinity`, the fields the edits write (pod labels, tolerations,
topologySpreadConstraints, the job's annotations) are absent, null or of their type, the template
pointers are canonical and in document order under one root key, and no container on the way holds
a float (a NaN, unequal to itself, is a `replace` in the diff). For anything else it returns None,
having emitted nothing, and the general path (`patches._build_patch_general`) answers (its errors
included). It reproduces the diff's op order: keys that exist keep their place, new keys follow in
the order the edits create them; null becomes `replace`, a list gets `add` at `/-`, and an op whose
value is empty is dropped. test_patch_fast_path.py holds it to the general path.

What the two paths share (the group label, the spread switch, toleration coverage, the pruned copy)
comes from `patch_rules`. This module never imports `patches`, which imports it (no cycle).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping, Sequence
from typing import Any

from app.config import Settings
from app.engine.patch_rules import (
    ABSENT,
    REQUIRED,
    SCALARS,
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
    zone_requirement,
)

# RFC 6901 escaping is shared with the adapters, which build the template pointers.
from app.jobs.pointers import escape_json_pointer, unescape_json_pointer
from app.models import labels
from app.models.decision import Decision
from app.models.job import JobGroup, Replica

__all__ = ["build_patch_fast"]

_DICT = frozenset({dict})


def build_patch_fast(
    raw_job: Mapping[str, Any], group: JobGroup, decision: Decision, settings: Settings
) -> list[PatchOp] | None:
    """The ops `patches._build_patch_general` returns, emitted without a copy or a diff; None to fall back to it
    (always for a ComputeDomain job's clique, which only the general path writes).

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
    if type(metadata) is not dict or decision.clique:
        return None
    found = _usual_templates(raw_job, group.replicas)
    if found is None:
        return None
    templates, metadata_first = found
    updates: dict[str, Any] = {}
    if decision.zone and settings.mode == "pin":
        updates[labels.ZONE_ANNOTATION] = decision.zone
    if decision.summary:
        updates[labels.DECISION_ANNOTATION] = decision_annotation(decision, group)
    annotations = metadata.get("annotations", ABSENT)
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
    `build_patch_fast`; the templates' own values are checked later).
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
    if old is ABSENT or old is None:
        if not all(type(k) is str and type(v) is str for k, v in updates.items()):
            return False
        if updates:
            ops.append({"op": "add" if old is ABSENT else "replace", "path": path, "value": dict(updates)})
        return True
    if type(old) is not dict:
        return False
    replaced: list[str] = []
    for name, value in updates.items():
        if type(name) is not str or type(value) is not str:
            return False
        prev = old.get(name, ABSENT)
        if prev is ABSENT:
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
    selector = {labels.GROUP_LABEL: group_label_value(raw_job, group)} if needs_group_label(group, settings) else {}
    pod_labels = {**decision.labels, **selector}  # NB: the order of the edits' two `update`s
    zones: Sequence[str] = ()
    if settings.mode == "pin" and decision.zone:
        zones = (decision.zone,)
    elif settings.mode == "colocate" and decision.open_zones:
        zones = sorted(decision.open_zones)
    edits: _Edits = (zones, settings.mode == "colocate", settings.zone_label, selector, spreads(group, settings))
    ops: list[PatchOp] = []
    for replica, template in zip(group.replicas, templates, strict=True):
        metadata, spec = template.get("metadata"), template.get("spec")
        if type(metadata) is not dict or type(spec) is not dict or "affinity" in spec:
            return None
        old = metadata.get("labels", ABSENT)
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
        old = spec.get("tolerations", ABSENT)
        if not _DICT.issuperset(map(type, wanted)):
            return None  # NB: the engine's tolerations are dicts; anything else is the general path's to judge
        if old is ABSENT:
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
        old = spec.get("topologySpreadConstraints", ABSENT)
        spread_op = _spread_op(old, f"{path}/topologySpreadConstraints", selector)
        if spread_op is None:
            return None
        if spread_op and old is not ABSENT:
            placed["topologySpreadConstraints"] = [spread_op]
        elif spread_op:
            tail.append(spread_op)
    if not placed:
        return tail
    return [op for key in (spec if len(placed) > 1 else placed) for op in placed.get(key, ())] + tail


def _new_affinity(
    spec: Mapping[str, Any], zones: Sequence[str], colocate: bool, zone_label: str, selector: Mapping[str, str]
) -> dict[str, Any] | None:
    """What `patches._require_zone` / `_require_pod_affinity` write into a spec without affinity ({}: nothing)."""
    out: dict[str, Any] = {}
    if zones:
        node_selector = spec.get("nodeSelector")
        pinned: Any = None
        if node_selector is not None:
            if type(node_selector) is not dict:
                return None
            pinned = node_selector.get(zone_label)
            if pinned is not None and type(pinned) is not str:
                return None  # NB: `patches._require_zone` looks it up in a set, where an unhashable one raises
        if pinned not in zones:
            requirement = zone_requirement(zone_label, zones)
            out["nodeAffinity"] = {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [requirement]}]}}
    if colocate:
        out["podAffinity"] = {REQUIRED: [pod_affinity_term(selector, zone_label)]}
    return out


def _new_tolerations(current: list[Any], wanted: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Copies of the `wanted` tolerations that `current`, growing as they are added, does not cover."""
    added = []
    for toleration in wanted:
        if not current or not already_tolerated(toleration, current):  # NB: an empty list covers nothing
            item = dict(toleration)
            current.append(item)
            added.append(item if SCALARS.issuperset(map(type, item.values())) else copy_pruned(item))
    return added


def _spread_op(old: Any, path: str, selector: Mapping[str, str]) -> PatchOp | None:
    """The op that adds the hostname spread as `patches._add_hostname_spread` does ({}: there; None: fall back)."""
    constraint = hostname_spread(selector)
    if old is ABSENT:
        return {"op": "add", "path": path, "value": [constraint]}
    if old is None:
        return {"op": "replace", "path": path, "value": [constraint]}
    if type(old) is not list or _holds_float(old):
        return None
    if any(is_hostname_spread(c) for c in old):
        return {}
    return {"op": "add", "path": f"{path}/-", "value": constraint}
