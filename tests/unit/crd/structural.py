"""A minimal structural-schema checker: what the apiserver would prune, and what it would reject.

Test helper implementing the parts of CRD validation a mutating webhook can trip over
(KEP-2332 pruning; apiextensions structural schemas):

- pruning: an object member not declared in `properties`, with no `additionalProperties` and no
  `x-kubernetes-preserve-unknown-fields`, is dropped silently after mutating webhooks run; a
  `null` for a field that is not `nullable` is dropped too;
- rejection: wrong JSON types, missing `required` members, values outside `enum`, more than
  `maxItems`, and duplicate keys in `x-kubernetes-list-type: map` / `set` lists ("Duplicate value").

The object's root `metadata` is ObjectMeta, validated by the apiserver itself, and is skipped.
CEL rules (`x-kubernetes-validations`) and string formats are not evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


@dataclass
class Findings:
    pruned: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def check(obj: Any, schema: dict[str, Any]) -> Findings:
    """Walk `obj` against the CRD version's `openAPIV3Schema`."""
    found = Findings()
    root = dict(obj)
    root.pop("metadata", None)
    _walk(root, schema, "", found)
    return found


def _type_ok(value: Any, schema: dict[str, Any]) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, int | str) and not isinstance(value, bool)
    kind = schema.get("type")
    if kind is None:
        return True
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, TYPES[kind])


def _walk(value: Any, schema: dict[str, Any], path: str, found: Findings) -> None:
    if value is None:
        if not schema.get("nullable"):
            found.pruned.append(f"{path} (null)")
        return
    if not _type_ok(value, schema):
        found.errors.append(f"{path}: expected {schema.get('type')}, got {type(value).__name__}")
        return
    if "enum" in schema and value not in schema["enum"]:
        found.errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        _walk_object(value, schema, path, found)
    elif isinstance(value, list):
        _walk_array(value, schema, path, found)


def _walk_object(value: dict[str, Any], schema: dict[str, Any], path: str, found: Findings) -> None:
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
    for key in schema.get("required") or []:
        if key not in value:
            found.errors.append(f"{path}/{key}: Required value")
    for key, item in value.items():
        child = f"{path}/{key}"
        if key in props:
            _walk(item, props[key], child, found)
        elif isinstance(extra, dict):
            _walk(item, extra, child, found)
        elif not (extra is True or preserve):
            found.pruned.append(child)


def _walk_array(value: list[Any], schema: dict[str, Any], path: str, found: Findings) -> None:
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        found.errors.append(f"{path}: more than {schema['maxItems']} items")
    list_type = schema.get("x-kubernetes-list-type")
    if list_type in ("map", "set"):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen: set[str] = set()
        for i, item in enumerate(value):
            is_map_item = list_type == "map" and isinstance(item, dict)
            identity = repr([item.get(k) for k in keys]) if is_map_item else repr(item)
            if identity in seen:
                found.errors.append(f"{path}/{i}: Duplicate value {identity}")
            seen.add(identity)
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            _walk(item, items, f"{path}/{i}", found)
