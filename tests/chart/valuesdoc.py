"""The values table in charts/topoguard/README.md, generated from values.yaml's `# --` comments.

`python -m tests.chart.valuesdoc` rewrites the table between the README's markers;
tests/chart/test_values.py fails when it is out of date (helm-docs is not available offline).
"""

from __future__ import annotations

import json
import re
import sys

import yaml

from tests.chart.rendering import CHART

README = CHART / "README.md"
BEGIN = "<!-- values:begin (python -m tests.chart.valuesdoc) -->"
END = "<!-- values:end -->"
KEY = re.compile(r"^(\s*)([A-Za-z0-9_]+):")


def documented(text: str) -> list[tuple[str, str]]:
    """(dotted key, description) for every key with a `# --` comment, in file order."""
    out: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = []
    doc: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            doc = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if doc is not None:
                doc.append(stripped[1:].strip())
            continue
        match = KEY.match(line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        if doc is not None:
            out.append((".".join(k for _, k in stack), " ".join(doc)))
        doc = None
    return out


def lookup(values: dict[str, object], path: str) -> object:
    node: object = values
    for key in path.split("."):
        assert isinstance(node, dict)
        node = node[key]
    return node


def table() -> str:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    rows = ["| key | default | description |", "|---|---|---|"]
    docs = documented(text)
    for path, desc in docs:
        value = lookup(values, path)
        if isinstance(value, dict) and any(p.startswith(path + ".") for p, _ in docs):
            default = "see below"  # a group whose keys have rows of their own
        else:
            default = "`" + json.dumps(value, ensure_ascii=False) + "`"
        cells = [f"`{path}`", default, desc]
        rows.append("| " + " | ".join(c.replace("|", r"\|") for c in cells) + " |")
    return "\n".join(rows)


def render_readme(current: str) -> str:
    head, rest = current.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


if __name__ == "__main__":
    README.write_text(render_readme(README.read_text()))
    sys.exit(0)
