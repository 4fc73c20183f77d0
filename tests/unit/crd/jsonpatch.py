"""A strict RFC 6902 applier for the ops topoguard emits (add, replace, remove, test).

Test helper: applying a patch the way the apiserver does is the only honest check that the paths
exist, parents are created and escaping is right. Strict on purpose: `add` needs its parent,
`replace` needs its target, and list indices must be in range (RFC 6902 section 4).
"""

from __future__ import annotations

import copy
from typing import Any


class PatchApplyError(ValueError):
    pass


def _tokens(pointer: str) -> list[str]:
    if not pointer.startswith("/"):
        raise PatchApplyError(f"path {pointer!r} does not start with '/'")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _parent(doc: Any, pointer: str) -> tuple[Any, str]:
    tokens = _tokens(pointer)
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, list):
            if not token.isdigit() or int(token) >= len(node):
                raise PatchApplyError(f"{pointer}: index {token!r} out of range")
            node = node[int(token)]
        elif isinstance(node, dict) and token in node:
            node = node[token]
        else:
            raise PatchApplyError(f"{pointer}: parent {token!r} does not exist")
    return node, tokens[-1]


def apply_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """A patched deep copy of `doc`; PatchApplyError on any op the apiserver would refuse."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parent, key = _parent(doc, op["path"])
        kind = op["op"]
        if isinstance(parent, list):
            if key == "-" and kind == "add":
                parent.append(copy.deepcopy(op["value"]))
                continue
            if not key.isdigit() or int(key) > len(parent) or (kind != "add" and int(key) == len(parent)):
                raise PatchApplyError(f"{op['path']}: index out of range")
            index = int(key)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[index]
            elif kind == "test" and parent[index] != op["value"]:
                raise PatchApplyError(f"{op['path']}: test failed")
        elif isinstance(parent, dict):
            if kind in ("replace", "remove", "test") and key not in parent:
                raise PatchApplyError(f"{op['path']}: {kind} of a missing member")
            if kind in ("add", "replace"):
                parent[key] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[key]
            elif kind == "test" and parent[key] != op["value"]:
                raise PatchApplyError(f"{op['path']}: test failed")
        else:
            raise PatchApplyError(f"{op['path']}: parent is a {type(parent).__name__}")
    return doc
