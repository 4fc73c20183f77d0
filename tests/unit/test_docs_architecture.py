"""docs/architecture.md says what the code is: its layers and contracts are pyproject.toml's, every package
of app/ has its paragraph, and every module, file and name it points at exists.

Architecture docs rot silently (a renamed module, a moved package, a contract added): these checks make the
layout a claim that `make test` verifies, as the CLI docs' outputs are (tests/unit/test_docs_examples.py).
"""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
LINTER: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def section(title: str) -> str:
    start = DOC.index(f"\n## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end >= 0 else None]


def test_the_layer_stack_is_the_contracts() -> None:
    (layers,) = [c for c in LINTER["contracts"] if c["type"] == "layers"]
    block = re.search(r"```\n(.*?)```", section("The layer contract"), re.S)
    assert block is not None
    assert block.group(1).splitlines() == layers["layers"]


def test_the_contracts_table_names_every_contract_and_the_count_is_right() -> None:
    text = section("The layer contract")
    named = re.findall(r"^\| \*\*(.+?)\*\* \|", text, re.M)
    assert named == [c["name"] for c in LINTER["contracts"]]
    kept = re.search(r"Contracts: (\d+) kept, 0 broken", text)
    assert kept is not None and int(kept.group(1)) == len(LINTER["contracts"])


def packages() -> set[str]:
    return {p.parent.name for p in (ROOT / "app").glob("*/__init__.py")}


def test_every_package_has_its_paragraph_and_every_paragraph_its_package() -> None:
    described = set(re.findall(r"^\*\*`app/(\w+)`", section("Packages"), re.M))
    assert described == packages()


def test_every_file_the_document_names_exists() -> None:
    paths = set(re.findall(r"\bapp/[\w/]+\.py\b", DOC))
    assert paths, "the document names no file: the pattern is wrong"
    assert sorted(p for p in paths if not (ROOT / p).is_file()) == []


def _resolves(dotted: str) -> bool:
    """`app.x.y.Name...`: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


MODULES = {p.stem for p in (ROOT / "app").glob("*.py")} | packages()
NAMED = sorted({d for d in re.findall(r"`(app(?:\.\w+)+)", DOC) if d.split(".")[1] in MODULES})  # not app.kubernetes.io


@pytest.mark.parametrize("dotted", NAMED)
def test_every_module_and_name_the_document_points_at_exists(dotted: str) -> None:
    assert _resolves(dotted), f"docs/architecture.md names {dotted}, which does not exist"
