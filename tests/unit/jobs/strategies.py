"""Hypothesis strategies for job objects: JSON values, and seed jobs with a subtree or two changed."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

LEAVES = st.sampled_from([None, True, False, 0, 1, 2, -1, 70000, 2.0, 1.5, "", "x", "2", "1.5", "TCP", "tcp", "Always"])


def json_values(keys: st.SearchStrategy[str], leaves: st.SearchStrategy[Any] = LEAVES) -> st.SearchStrategy[Any]:
    """Small JSON documents whose object members are named from `keys`."""
    return st.recursive(
        leaves | st.text(max_size=3),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
        max_leaves=12,
    )


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, seeds: Sequence[Any], keys: st.SearchStrategy[str], values: st.SearchStrategy[Any]) -> Any:
    """A seed with one or two subtrees replaced, deleted or given a new member (named from `keys`)."""
    doc = copy.deepcopy(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 2))):
        paths = _paths(doc)[1:]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for token in path[:-1]:
            parent = parent[token]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        target = parent[path[-1]]
        if action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(target, dict):
            target[draw(keys)] = draw(values)
        elif action == "add" and isinstance(target, list):
            target.append(draw(values))
        else:
            parent[path[-1]] = draw(values)
    return doc
