"""JSON Patch (RFC 6902) that applies a `Decision` to the job as the user wrote it: `build_patch`.

PURE: no I/O, no Kubernetes client. One path for every job (issue 29); it touches only what the
edits read or write, because the job as received carries managedFields, a last-applied annotation
and whole container specs that no edit touches, and copying or walking them cost more than the rest
of the review (issue 4):

1. The templates. Every replica's pod template is looked up in the job as received. Only when one
   is missing, or lacks its `metadata` or `spec`, is a copy-on-write copy of the job made
   (`_own_path`: a shallow copy of every container on the template pointers, everything else shared
   with the job and never written to) for `jobs.prepare_templates` to create them in.
2. A plan per template (`_plan`): for each field the edits write (`metadata.labels`; the spec's
   `affinity`, `tolerations`, `topologySpreadConstraints`), what the job has there and what goes
   there. A field the template lacks gets a value made from nothing, the patch's own (the affinity
   once per job for all templates it is the same for: `_Edits.new_affinity`); labels are a merge of
   string values; a field the template has is edited copy-on-write (`_with_zone`,
   `_with_pod_affinity`, `_with_tolerations`, `_with_spread`: a container is copied before it is
   written to), so the job is not modified. A template inside a container `prepare_templates` made
   is ours: its plan is written into it (`_apply`, also `_edit_template`), and that container is
   where the op goes.
3. The ops, emitted from the plans (the job's annotations, and a container `prepare_templates` made,
   are a plan of one entry; a merge is written out in `build_patch`, the rest is `_emit`'s), in
   document order (`_before`): a new field is one `add`, a null one a `replace`, a merge an op per
   label that changes, and a field the job has the diff of it alone (`_diff_into`: `add` for a new
   key, `add` at `/-` for an appended item, `replace` for a changed scalar). These are the ops, order
   included, that the diff of the whole edited job gives (the form build_patch had before;
   test_patch_equivalence.py holds it to that), except for an unchanged NaN (unequal to itself)
   beside an edit, which that diff reported as a `replace` and which is rightly not an op here. Op
   values are never shared with the job or the decision (pruned copies where they hold either's
   values); one whose value is empty scaffolding is dropped.

Rules the edits follow (DESIGN.md "The decision", step 6):

- Nothing the user wrote is removed or reordered. Edits only add keys, append list items, AND a zone
  requirement into existing node selector terms, or replace a scalar (a label value).
- Mode `pin`: required nodeAffinity `<zoneLabel> In [zone]` is ANDed into EVERY existing
  nodeSelectorTerm (terms are ORed, so a new term would widen, not narrow). Empty terms match nothing
  in Kubernetes and are left alone (adding a requirement would make them match).
- Mode `colocate`: required podAffinity on the group label with `topologyKey: <zoneLabel>`, plus
  nodeAffinity `<zoneLabel> In <open zones>`.
- A ComputeDomain job's clique replicas are pinned the same way to the NVLink clique label (`pin`),
  or kept together on it by podAffinity (`colocate`).
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
import itertools
import json
import re
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

from app import jobs
from app.config import Settings

# RFC 6901 escaping is shared with the adapters, which build the template pointers.
from app.jobs.pointers import copy_json, escape_json_pointer, split_pointer, unescape_json_pointer
from app.models import labels
from app.models.decision import Decision
from app.models.job import JobGroup, Replica

__all__ = [
    "LABEL_VALUE_MAX_CHARS",
    "REQUIRED",
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
ABSENT = object()  # what a missing key reads as (None is a value: JSON null)
CONTAINERS = (dict, list)  # NB: for isinstance; a tuple is faster there than `dict | list`
SCALARS = frozenset({str, int, float, bool, type(None)})  # exact JSON scalar types: copies share them
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class PatchError(ValueError):
    """The job has a value of the wrong type where the patch must edit (names the JSON pointer)."""


# --- the patch -------------------------------------------------------------------------------------

# A template's plan, one entry per field the edits write, in op order: (where in the template: a
# pointer suffix `/<part>/<field>`, part `metadata` or `spec`, or `/<part>` for the whole part, which
# the template lacks or has as null; what the job has there (ABSENT: nothing), what goes there, how:
# FRESH (it is the patch's own and pruned), MERGE (string values to set in the object the job has
# there) or COPY (pruned copies of what differs)). The suffix is the op's path after the template's.
_Plan = list[tuple[str, Any, Any, int]]
COPY, FRESH, MERGE = 0, 1, 2
_LABELS, _AFFINITY, _TOLERATIONS, _SPREAD = (
    "/metadata/labels", "/spec/affinity", "/spec/tolerations", "/spec/topologySpreadConstraints"
)
# Where the patch edits: (the keys and indexes that lead there, its JSON pointer, and a plan whose
# suffixes follow that pointer: a template's, or one entry for the job's annotations or for a
# container `prepare_templates` made, whose suffix is "").
_Block = tuple[tuple[str | int, ...], str, _Plan]


def build_patch(raw_job: Mapping[str, Any], group: JobGroup, decision: Decision, settings: Settings) -> list[PatchOp]:
    """The JSON Patch that applies `decision` to `raw_job` ([] when nothing needs to change).

    Args:
        raw_job: the job exactly as received in the AdmissionReview (not modified).
        group: the job's replicas, as parsed by `jobs.parse_job` from the same object.
        decision: an allowed decision; a refused one patches nothing.
        settings: zone label, mode and spreadWithinZone.

    Raises:
        PatchError: a field the patch must edit has the wrong type (e.g. `tolerations: {}`), or two
            replicas' template pointers lead one into the other (no adapter makes such pointers).
        jobs.InvalidJobError: a replica's template cannot be created (from `prepare_templates`).
    """
    if not decision.allowed:
        return []
    selector = {labels.GROUP_LABEL: group_label_value(raw_job, group)} if needs_group_label(group, settings) else {}
    edits = _Edits(decision, settings, selector, spreads(group, settings))
    blocks: list[_Block] = []
    found: list[tuple[tuple[str | int, ...], str, dict[str, Any]]] = []
    doc: Mapping[str, Any] = raw_job  # what the document order is read from
    for replica in group.replicas:
        keys, path, template = _walk(raw_job, replica.template_path)
        # NB: what needs nothing from `prepare_templates`: there, with its metadata and spec
        if not isinstance(template, dict) or template.get("metadata") is None or template.get("spec") is None:
            break
        found.append((keys, path, template))
    if len(found) == len(group.replicas):  # NB: every template is ready (the usual case)
        for replica, (keys, path, template) in zip(group.replicas, found, strict=True):
            blocks.append((keys, path, _plan(template, replica, edits, replica.template_path)))
    else:  # NB: rare; `prepare_templates` creates the missing parts in a copy-on-write copy of the job
        doc = _prepared(raw_job, group)
        made: dict[tuple[str | int, ...], _Block] = {}
        for replica in group.replicas:
            where = replica.template_path
            keys, template, anchor = _locate(raw_job, doc, where)
            if anchor is None:  # the job has the template (perhaps without metadata or spec)
                blocks.append((keys, _spell(keys), _plan(template, replica, edits, where)))
                continue
            # In a container prepare_templates made, so the template and everything in it are ours.
            _apply(template, _plan(template, replica, edits, where))
            if (at := keys[: anchor + 1]) not in made:
                made[at] = _new_container(raw_job, doc, at)
        blocks += made.values()
    blocks.insert(0, _annotations(raw_job, decision, group, settings))  # NB: after the templates' errors
    ordered = True
    for a, b in itertools.pairwise(blocks):
        if not _before(doc, a[0], b[0]):
            ordered = False
            break
    if not ordered:

        def compare(a: _Block, b: _Block) -> int:
            return -1 if _before(doc, a[0], b[0]) else 1

        blocks.sort(key=functools.cmp_to_key(compare))
    ops: list[PatchOp] = []
    for _, path, plan in blocks:
        for suffix, old, new, how in plan:
            if how == FRESH and old is ABSENT:  # NB: the usual case, written out (as `_emit`)
                if new:
                    ops.append({"op": "add", "path": path + suffix, "value": new})
            elif how == MERGE:  # NB: as the diff has them: changed keys replaced in the object's order, then new ones
                prefix = f"{path}{suffix}/"
                start = len(ops)
                changed = False
                for key, value in new.items():
                    prev = old.get(key, ABSENT)
                    if prev is ABSENT:
                        ops.append({"op": "add", "path": prefix + _escaped(key), "value": value})
                    elif not (prev == value and type(prev) is type(value)):
                        changed = True
                if changed:  # NB: rare (a label the user set otherwise)
                    ops[start:start] = [{"op": "replace", "path": prefix + _escaped(key), "value": new[key]}
                                        for key, value in old.items()
                                        if key in new and not (value == new[key] and type(value) is type(new[key]))]
            else:
                _emit(ops, path + suffix, old, new, how)
    return ops


def _emit(ops: list[PatchOp], path: str, old: Any, new: Any, how: int) -> None:
    """The ops that put `new` where the job has `old` (ABSENT: nothing), `how` the plan says (`_Plan`;
    FRESH or COPY: MERGE is written out in `build_patch`); they are the ops the diff of `old` and the
    edited value gives (`_diff_into`), but for one that would only add empty scaffolding (e.g.
    `labels: {}` with no label to set), which is dropped."""
    if old is ABSENT or (how == FRESH and old is None):
        value = new if how == FRESH else copy_pruned(new)
        if value or not isinstance(value, CONTAINERS):
            ops.append({"op": "add" if old is ABSENT else "replace", "path": path, "value": value})
    elif not _unchanged(old, new):
        start = len(ops)
        _diff_into(ops, old, new, path, copy_pruned)
        ops[start:] = [op for op in ops[start:] if op["value"] or not isinstance(op["value"], CONTAINERS)]


def _prepared(raw_job: Mapping[str, Any], group: JobGroup) -> dict[str, Any]:
    """A copy-on-write copy of the job with every replica's template, `metadata` and `spec` created.

    Every container on the template pointers is a shallow copy (`_own_path`), everything else is
    shared with the job and never written to; `prepare_templates` writes only along those pointers and
    only creates what is missing.
    """
    doc = dict(raw_job)
    for replica in group.replicas:
        _own_path(raw_job, doc, replica.template_path)
    jobs.prepare_templates(doc, group)
    return doc


def _walk(doc: Mapping[str, Any], pointer: str) -> tuple[tuple[str | int, ...], str, Any]:
    """The keys and indexes that lead to `pointer` in `doc`, the JSON pointer to them as the diff spells
    it (`_spell`), and the value there (ABSENT: a step does not exist)."""
    tokens, spelled = _parsed(pointer)
    node: Any = doc
    try:
        for token in tokens:
            node = node[token]
        return tokens, spelled, node  # NB: objects all the way (the usual case): the memoized tuple and pointer
    except (KeyError, TypeError):  # NB: a step missing, or not an object: read it again step by step
        pass
    node = doc
    indexes: list[tuple[int, int]] = []
    for depth, token in enumerate(tokens):
        if type(node) is dict:
            node = node.get(token, ABSENT)
            if node is ABSENT:
                return tokens, spelled, ABSENT
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            indexes.append((depth, int(token)))
            node = node[int(token)]
        elif isinstance(node, dict) and token in node:
            node = node[token]
        else:
            return tokens, spelled, ABSENT
    if not indexes:
        return tokens, spelled, node
    keys: list[str | int] = list(tokens)
    for depth, index in indexes:
        keys[depth] = index
    return tuple(keys), _spell(tuple(keys)), node


def _locate(
    raw_job: Mapping[str, Any], doc: Mapping[str, Any], pointer: str
) -> tuple[tuple[str | int, ...], Any, int | None]:
    """The keys and indexes that lead to a template in `doc` (a copy `prepare_templates` completed), the
    template, and the depth of the first container on the way that `raw_job` lacks. That is None when
    the job has the template, which is then the job's (not a copy that `prepare_templates` may have
    added `metadata` or `spec` to).

    Raises:
        PatchError: a step does not exist in `doc` (as `resolve_pointer`).
    """
    keys, _, template = _walk(doc, pointer)
    if template is ABSENT:
        resolve_pointer(doc, pointer)  # NB: raises its PatchError
    old: Any = raw_job
    for depth, key in enumerate(keys):
        # NB: the job has every container on the way so far: a dict or a list
        old = old.get(key) if isinstance(old, dict) else old[key] if isinstance(key, int) and key < len(old) else None
        if old is None:
            return keys, template, depth
    return keys, old, None


def _new_container(raw_job: Mapping[str, Any], doc: Mapping[str, Any], keys: tuple[str | int, ...]) -> _Block:
    """The block for the container at `keys` that `prepare_templates` made where the job has nothing
    (a new key or list item: `add`) or null (`replace`)."""
    parent = _find(raw_job, keys[:-1])
    key = keys[-1]
    if isinstance(parent, list):
        old = parent[key] if isinstance(key, int) and key < len(parent) else ABSENT
        path = _spell(keys) if old is not ABSENT else f"{_spell(keys[:-1])}/-"
    else:
        old = parent.get(key, ABSENT)
        path = _spell(keys)
    return keys, path, [("", old, _find(doc, keys), COPY)]


def _find(doc: Any, keys: Sequence[str | int]) -> Any:
    """The value at `keys` (keys and indexes, as located) in `doc`."""
    node = doc
    for key in keys:
        node = node[key]
    return node


@functools.lru_cache(maxsize=1024)
def _spell(keys: tuple[str | int, ...]) -> str:
    """The JSON pointer to `keys` as the diff spells it (keys escaped, indexes in decimal)."""
    return "".join(f"/{escape_json_pointer(k)}" if isinstance(k, str) else f"/{k}" for k in keys)


_METADATA = ("metadata",)
_ANNOTATIONS = ("metadata", "annotations")


def _annotations(raw_job: Mapping[str, Any], decision: Decision, group: JobGroup, settings: Settings) -> _Block:
    """The block for the job's annotations: the zone (mode pin) and the decision's summary."""
    updates: dict[str, str] = {}
    if decision.zone and settings.mode == "pin":
        updates[labels.ZONE_ANNOTATION] = decision.zone
    if decision.summary:
        updates[labels.DECISION_ANNOTATION] = decision_annotation(decision, group)
    metadata = raw_job.get("metadata", ABSENT)
    if isinstance(metadata, dict):
        old = metadata.get("annotations", ABSENT)
        if isinstance(old, dict):
            return _ANNOTATIONS, "/metadata/annotations", [("", old, updates, MERGE)]
        if old is ABSENT or old is None:
            return _ANNOTATIONS, "/metadata/annotations", [("", old, updates, COPY)]
        raise PatchError(f"/metadata/annotations: expected an object, got {type(old).__name__}")
    if metadata is not ABSENT and metadata is not None:
        raise PatchError(f"/metadata: expected an object, got {type(metadata).__name__}")
    return _METADATA, "/metadata", [("", metadata, {"annotations": updates}, COPY)]


def _before(doc: Mapping[str, Any], a: tuple[str | int, ...], b: tuple[str | int, ...]) -> bool:
    """Whether the block at `a` comes before the one at `b` in `doc` (a dict's key order, a list's
    indexes; a key `doc` lacks is new, and comes last: only the job's metadata can be).

    Raises:
        PatchError: one is inside the other (a pod template inside another).
    """
    node: Any = doc
    if a and b and a[0] != b[0]:  # NB: the annotations and a template part at the root
        x, y = a[0], b[0]
    else:
        fork = _fork(a, b)
        for key in a[:fork]:
            node = node[key]
        x, y = a[fork], b[fork]
    if isinstance(node, list):
        return x < y  # type: ignore[operator]  # NB: both indexes
    for key in node:
        if key == x:
            return True
        if key == y:
            return False
    return False


@functools.lru_cache(maxsize=1024)
def _fork(a: tuple[str | int, ...], b: tuple[str | int, ...]) -> int:
    """The depth where `a` and `b` part; PatchError when one leads into the other."""
    fork = 0
    while fork < len(a) and fork < len(b) and a[fork] == b[fork]:
        fork += 1
    if fork == len(a) or fork == len(b):
        raise PatchError(f"{_spell(a)} and {_spell(b)}: one pod template inside another")
    return fork


# --- the edits: a plan per template ----------------------------------------------------------------


class _Edits:
    """What every template of one job gets, from the decision and the settings."""

    __slots__ = ("affinity_replicas", "decision", "fresh_affinity", "labels", "made", "mode", "selector", "settings",
                 "spread", "tolerations")

    def __init__(self, decision: Decision, settings: Settings, selector: Mapping[str, str], spread: bool) -> None:
        self.decision, self.settings, self.selector, self.spread = decision, settings, selector, spread
        self.labels = {**decision.labels, **selector}  # NB: as two `update`s: decision's, then the selector
        self.tolerations = decision.tolerations
        self.mode = settings.mode
        # Whose affinity is edited: everyone's (a zone to pin to, or colocate), or a clique's replicas only.
        everyone = (self.mode == "pin" and bool(decision.zone)) or self.mode == "colocate"
        self.affinity_replicas = None if everyone else frozenset(decision.clique_replicas if decision.clique else ())
        # An affinity made from nothing is ours, and pruned unless a podAffinity term has an empty selector.
        self.fresh_affinity = FRESH if selector or self.mode == "pin" else COPY
        self.made: dict[Any, Any] = {}

    def new_affinity(self, node_selector: Any, replica: Replica, where: str) -> Any:
        """`affinity` for a template without one (ABSENT: none needed), made once per job for each value it
        depends on: whether the replica is in the clique, and the nodeSelector's zone and clique labels."""
        if node_selector is not None and isinstance(node_selector, Mapping):
            seen = (node_selector.get(self.settings.zone_label), node_selector.get(self.settings.clique_label))
        else:
            seen = None
        if seen is not None and not all(v is None or type(v) is str for v in seen):
            return self.affinity(ABSENT, node_selector, replica, where)  # NB: not a key (perhaps unhashable)
        key = (seen, bool(self.decision.clique) and replica.key in self.decision.clique_replicas)
        made = self.made.get(key, self)
        if made is self:
            made = self.made[key] = self.affinity(ABSENT, node_selector, replica, where)
        return made

    def affinity(self, affinity: Any, node_selector: Any, replica: Replica, where: str) -> Any:
        """`affinity` (ABSENT or None: none) with the zone, and a ComputeDomain job's clique, required as the
        mode says; the same object when nothing is added."""
        decision, settings = self.decision, self.settings
        if self.mode == "pin" and decision.zone:
            affinity = _with_zone(affinity, node_selector, settings.zone_label, [decision.zone], where)
        elif self.mode == "colocate":
            if decision.open_zones:
                affinity = _with_zone(affinity, node_selector, settings.zone_label, sorted(decision.open_zones), where)
            affinity = _with_pod_affinity(affinity, settings.zone_label, self.selector, where)
        if decision.clique and replica.key in decision.clique_replicas:  # a ComputeDomain job: one NVLink clique
            if self.mode == "pin":
                affinity = _with_zone(affinity, node_selector, settings.clique_label, [decision.clique], where)
            else:
                affinity = _with_pod_affinity(affinity, settings.clique_label, self.selector, where)
        return affinity


def _plan(template: dict[str, Any], replica: Replica, edits: _Edits, where: str) -> _Plan:
    """What the edits write into `template`, which is not modified, in the order the diff of the edited
    template would give (fields it has keep its order; new ones follow in the order the edits make
    them). A field it lacks (or has as null) gets a new value of the patch's own; one it has, an
    edited copy-on-write copy that shares with the job whatever the edits do not write to."""
    metadata, spec = template.get("metadata"), template.get("spec")
    meta = metadata if type(metadata) is dict else _part(metadata, "metadata", where)
    old = meta.get("labels", ABSENT)
    labels: tuple[str, Any, Any, int]
    if isinstance(old, dict):
        labels = (_LABELS, old, edits.labels, MERGE)
    elif old is ABSENT or old is None:
        labels = (_LABELS, old, dict(edits.labels), FRESH)
    else:
        raise PatchError(f"{where}/metadata/labels: expected an object, got {type(old).__name__}")
    fields = spec if type(spec) is dict else _part(spec, "spec", where)
    spec_path = f"{where}/spec"
    plan: _Plan = []  # the spec's entries, then the labels' goes before or after them
    there = 0  # how many of the planned fields the spec has (they come first, in its order)
    if edits.affinity_replicas is None or replica.key in edits.affinity_replicas:
        old = fields.get("affinity", ABSENT)
        if old is ABSENT or old is None:  # NB: made from nothing: the same for every template it is the same for
            new = edits.new_affinity(fields.get("nodeSelector"), replica, spec_path)
            if new is not ABSENT:  # NB: ABSENT: nothing to add (a nodeSelector pins); a null affinity stays null
                plan.append((_AFFINITY, old, new, edits.fresh_affinity))
                there += old is None
        else:
            new = edits.affinity(old, fields.get("nodeSelector"), replica, spec_path)
            if new is not old:
                plan.append((_AFFINITY, old, new, COPY))
                there += 1
    wanted = edits.tolerations.get(replica.key)
    if wanted:
        old = fields.get("tolerations", ABSENT)
        new = _with_tolerations(old, wanted, spec_path)
        # NB: new items are shallow copies of the decision's (shared by a memo): the patch's own when flat
        flat = old is ABSENT or old is None
        for item in new if flat else ():
            if not SCALARS.issuperset(map(type, item.values())):
                flat = False
                break
        plan.append((_TOLERATIONS, old, new, FRESH if flat else COPY))
        there += old is not ABSENT
    if edits.spread:
        old = fields.get("topologySpreadConstraints", ABSENT)
        new = _with_spread(old, edits.selector, spec_path)
        made = (old is ABSENT or old is None) and bool(edits.selector)  # NB: pruned unless the selector is empty
        plan.append((_SPREAD, old, new, FRESH if made else COPY))
        there += old is not ABSENT
    if there and (there > 1 or plan[0][1] is ABSENT):  # NB: sort is stable: new ones keep their order
        order = list(fields)
        plan.sort(key=lambda entry: order.index(_field(entry[0])) if entry[1] is not ABSENT else len(order))
    if type(metadata) is dict and type(spec) is dict:  # NB: the usual case: both there, in the template's order
        for key in template:
            if key == "metadata":
                plan.insert(0, labels)
                return plan
            if key == "spec":
                break
        plan.append(labels)
        return plan
    return _join(template, [labels], plan)


def _field(suffix: str) -> str:
    """The field a plan entry's suffix names (`""` for a whole part)."""
    return suffix[1:].partition("/")[2]


def _part(value: Any, key: str, where: str) -> dict[str, Any]:
    """A template's `metadata` or `spec`, to read (`{}` when absent or null); PatchError when not an object."""
    if isinstance(value, dict):
        return value
    if value is None:
        return {}
    raise PatchError(f"{where}/{key}: expected an object, got {type(value).__name__}")


def _join(template: dict[str, Any], meta_plan: _Plan, spec_plan: _Plan) -> _Plan:
    """A template's plan from its parts' when it lacks one (or has it as null): the parts it has in its
    key order, then each part it lacks as one whole new object (`metadata`, then `spec`, as
    `prepare_templates` makes them)."""
    plan: _Plan = []
    parts = {"metadata": meta_plan, "spec": spec_plan}
    there = [key for key in template if key in parts]
    for part in [*there, *(key for key in parts if key not in there)]:
        old = template.get(part, ABSENT)
        if old is ABSENT or old is None:
            plan.append((f"/{part}", old, {_field(suffix): new for suffix, _, new, _ in parts[part]}, COPY))
        else:
            plan += parts[part]
    return plan


def _apply(template: dict[str, Any], plan: _Plan) -> None:
    """Write a plan into a template of the caller's own; the containers in it are replaced by the plan's
    values (copies where they were edited), never written to."""
    for suffix, old, new, how in plan:
        if how == MERGE:
            new = {**old, **new}
        part, _, field = suffix[1:].partition("/")
        template[part] = {**template[part], field: new} if field else new


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
    """Apply the edits to a template of the caller's own, in place (`_plan`, then `_apply`)."""
    if not isinstance(template, dict):
        raise PatchError(f"{where}: the pod template is not an object")
    _apply(template, _plan(template, replica, _Edits(decision, settings, selector, spread), where))


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


def _own(value: Any, field: str, where: str) -> dict[str, Any]:
    """A shallow copy of a spec's `field` to edit (`{}` for none: ABSENT or null); PatchError when not an object."""
    if value is ABSENT or value is None:
        return {}
    if not isinstance(value, dict):
        raise PatchError(f"{where}/{field}: expected an object, got {type(value).__name__}")
    return dict(value)


def _own_list(value: Any, field: str, where: str) -> list[Any]:
    """A shallow copy of a spec's list `field` to append to (`[]` for none); PatchError when not a list."""
    if value is ABSENT or value is None:
        return []
    if not isinstance(value, list):
        raise PatchError(f"{where}/{field}: expected a list, got {type(value).__name__}")
    return list(value)


def _restricts_zone(expr: Any, zone_label: str, allowed: set[str]) -> bool:
    """Whether one matchExpression already keeps the zone label within `allowed`."""
    if not isinstance(expr, Mapping) or expr.get("key") != zone_label or expr.get("operator") != "In":
        return False
    values = expr.get("values")
    return isinstance(values, list) and bool(values) and set(values) <= allowed


def _with_zone(affinity: Any, node_selector: Any, zone_label: str, zones: Sequence[str], where: str) -> Any:
    """`affinity` with `zone_label In zones` ANDed into every nodeSelectorTerm that does not already
    imply it (the same object when the nodeSelector already does)."""
    if node_selector is not None and isinstance(node_selector, Mapping) and node_selector.get(zone_label) in set(zones):
        return affinity  # nodeSelector is ANDed with every term: the template is already confined
    requirement = {"key": zone_label, "operator": "In", "values": list(zones)}  # NB: `zone_label In zones`
    if affinity is ABSENT or affinity is None:  # NB: the usual case, written out
        return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [requirement]}]}}}
    allowed = set(zones)
    affinity = _own(affinity, "affinity", where)
    affinity_path = f"{where}/affinity/nodeAffinity"
    node_affinity = _child_map(affinity, "nodeAffinity", f"{where}/affinity")
    required = _child_map(node_affinity, REQUIRED, affinity_path)
    terms = _child_list(required, "nodeSelectorTerms", f"{affinity_path}/{REQUIRED}")
    if not terms:
        terms.append({"matchExpressions": [requirement]})
        return affinity
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
    return affinity


def _with_pod_affinity(affinity: Any, zone_label: str, selector: Mapping[str, str], where: str) -> Any:
    """`affinity` with a required podAffinity term that keeps the group (`selector`) in one `zone_label` value."""
    affinity = _own(affinity, "affinity", where)
    pod_affinity = _child_map(affinity, "podAffinity", f"{where}/affinity")
    terms = _child_list(pod_affinity, REQUIRED, f"{where}/affinity/podAffinity")
    for term in terms:
        if not isinstance(term, Mapping) or term.get("topologyKey") != zone_label:
            continue
        match_labels = (term.get("labelSelector") or {}).get("matchLabels") or {}
        if isinstance(match_labels, Mapping) and all(match_labels.get(k) == v for k, v in selector.items()):
            return affinity
    terms.append(pod_affinity_term(selector, zone_label))
    return affinity


def _with_tolerations(existing: Any, wanted: Sequence[Mapping[str, Any]], where: str) -> list[Any]:
    """The tolerations list with each `wanted` toleration that it (as it grows) does not cover yet."""
    current = [] if existing is ABSENT or existing is None else _own_list(existing, "tolerations", where)
    for toleration in wanted:
        if not current or not already_tolerated(toleration, current):  # NB: an empty list covers nothing
            current.append(dict(toleration))
    return current


def _with_spread(existing: Any, selector: Mapping[str, str], where: str) -> list[Any]:
    """The topologySpreadConstraints list with the hostname spread, unless it has an entry with its key."""
    current = _own_list(existing, "topologySpreadConstraints", where)
    if not any(is_hostname_spread(c) for c in current):  # a second entry would be rejected
        current.append(hostname_spread(selector))
    return current


# --- what the edits decide and add -----------------------------------------------------------------


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


# --- pointers, copies and the diff -----------------------------------------------------------------


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


def _tokens(pointer: str) -> tuple[str, ...]:
    """`split_pointer`, memoized (`_parsed`)."""
    return _parsed(pointer)[0]


@functools.lru_cache(maxsize=1024)
def _parsed(pointer: str) -> tuple[tuple[str, ...], str]:
    """`split_pointer`, and the pointer as the diff spells those tokens (`_spell`), memoized: the template
    pointers recur from review to review (one per replica type), and a lookup by the pointer hashes one
    string (its hash kept in it), by the tokens a tuple of them (hashed anew each time)."""
    tokens = tuple(split_pointer(pointer))
    return tokens, _spell(tokens)


def _own_path(raw_job: Mapping[str, Any], edited: dict[str, Any], pointer: str) -> Any:
    """Put a shallow copy in place of every container on `pointer` in `edited`, the template included.

    `edited` starts as a shallow copy of `raw_job`; `prepare_templates` writes to the containers on
    the template pointers. A container is copied only while it is still the one in `raw_job`, so
    pointers with a common prefix share the copies. The walk stops where the path does not exist yet
    or meets a scalar: `prepare_templates` creates the rest inside a copy, or reports the scalar.

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


def copy_pruned(value: Any) -> Any:
    """A deep copy of `value` (as `copy_json`) without the empty objects and lists in its objects.

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
            token = key if type(key) is str and "~" not in key and "/" not in key else _escaped(str(key))
            if prev is ABSENT:
                ops.append({"op": "add", "path": f"{path}/{token}",
                            "value": value if type(value) in SCALARS else fresh(value)})
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
    ops.append({"op": "replace", "path": path, "value": new if type(new) in SCALARS else fresh(new)})


@functools.lru_cache(maxsize=1024)
def _escaped(key: str) -> str:
    """`escape_json_pointer`, memoized: the keys that need it are mostly the few the patch writes
    (`topoguard.io/zone`, label keys with a prefix)."""
    return escape_json_pointer(key)
