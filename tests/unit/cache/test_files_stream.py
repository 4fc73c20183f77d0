"""The file snapshot reads JSON a value at a time (app/cache/files.py `_JsonStream`): the objects and the
errors are those of `json.loads` on the whole file, at every chunk size, and an item is dropped once
projected, so memory follows what is kept, not the file."""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cache import files
from app.cache.files import SnapshotError, load_snapshot

SCALARS = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False) | st.text(max_size=8)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                                            max_size=4), max_leaves=12)
OBJECTS = st.fixed_dictionaries({"kind": st.sampled_from(["Pod", "Node", "ConfigMap"])}, optional={"x": VALUES})


def objects_of(path: Path, chunk: int, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.setattr(files, "CHUNK_CHARS", chunk)
    return [dict(obj) for _, obj in files._objects(path, hashlib.sha256())]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.lists(OBJECTS, max_size=5), st.dictionaries(st.sampled_from(["apiVersion", "metadata", "x"]), VALUES),
       st.sampled_from([0, 1, 2]), st.integers(1, 40), st.booleans())
def test_a_json_list_streams_to_the_objects_json_loads_reads(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    items: list[Any], head: dict[str, Any], kind_at: int, chunk: int, indent: bool,
) -> None:
    members = list(head.items())
    members.insert(min(kind_at, len(members)), ("kind", "List"))
    members.insert(len(members) // 2, ("items", items))
    path = tmp_path_factory.mktemp("stream") / "list.json"
    path.write_text(json.dumps(dict(members), indent=1 if indent else None))

    assert objects_of(path, chunk, monkeypatch) == json.loads(path.read_text())["items"]


@pytest.mark.parametrize("chunk", [1, 3, 64, 1 << 20])
@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param('{"kind": "List", "items": [{"kind": "Pod"}', "expecting ',' or ']': line 1 column 43",
                     id="a cut-off list"),
        pytest.param('{"kind": "List",\n "items": [{"kind": "Pod",}]}', "line 2 column 27", id="a trailing comma"),
        pytest.param('{"kind": "Pod"}\n{"kind": "Pod"}', "extra data: line 2 column 1", id="two documents"),
        pytest.param('{"kind": "Pod", "n": 12', "expecting ',' or '}': line 1 column 24", id="a number at the end"),
        pytest.param('{kind: "Pod"}', "expecting property name enclosed in double quotes: line 1 column 2",
                     id="an unquoted name"),
        pytest.param("", "expecting value: line 1 column 1", id="an empty file"),
    ],
)
def test_broken_json_is_named_by_line_and_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int,
                                                  text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(SnapshotError) as caught:
        objects_of(path, chunk, monkeypatch)
    assert str(caught.value).startswith(f"{path}: not valid JSON: ")
    assert str(caught.value).endswith(message)  # the line and column json.loads gives


def test_an_items_array_outside_a_list_is_an_error_not_a_guess(tmp_path: Path) -> None:
    (tmp_path / "odd.json").write_text(json.dumps({"items": [{"kind": "Node", "metadata": {"name": "n"}}]}))
    with pytest.raises(SnapshotError, match=r"odd.json document 1: has an items array but is not a List \(kind None\)"):
        load_snapshot(tmp_path)


def test_the_revision_is_the_files_digest_as_before(tmp_path: Path) -> None:
    body = json.dumps({"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "n"}}]}).encode()
    (tmp_path / "a.json").write_bytes(body)
    (tmp_path / "b.yaml").write_bytes(b"kind: Namespace\nmetadata: {name: ml}\n")
    want = hashlib.sha256(body + b"kind: Namespace\nmetadata: {name: ml}\n").hexdigest()[:16]
    assert load_snapshot(tmp_path).revision == want


def test_a_large_list_is_not_held_whole(tmp_path: Path) -> None:
    """20 MB of objects the snapshot does not keep: reading them needs about a chunk, not the file."""
    path = tmp_path / "big.json"
    filler = "x" * 10_000
    items = [{"kind": "ConfigMap", "metadata": {"name": f"c{i}", "namespace": "ml"}, "data": {"blob": filler}}
             for i in range(2_000)]
    items.append({"kind": "Node", "metadata": {"name": "n", "labels": {"topology.kubernetes.io/zone": "a"}}})
    path.write_text(json.dumps({"apiVersion": "v1", "items": items, "kind": "List"}))
    del items
    size = path.stat().st_size

    tracemalloc.start()
    try:
        snapshot = load_snapshot(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert [n.name for n in snapshot.nodes] == ["n"]
    assert size > 20_000_000
    assert peak < size / 4, f"peak {peak} bytes reading a {size}-byte file"
