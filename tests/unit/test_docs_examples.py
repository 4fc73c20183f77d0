"""Every example of topoguard's output in README.md and docs/*.md is its real output, checked here.

A fenced block right after a marker line

    <!-- output: [VAR=value ...] topoguard ARGS... [| SELECTOR] -->

must equal what the command prints when run from the repository root. SELECTOR picks from a
`review` answer: `message` (status.message), `kubectl-error FILE` (as kubectl prints a refusal of
FILE), `kubectl-warnings NAME` (the Warning lines and kubectl's "created"). No hand-written copies
that drift: after a change to a message, `TOPOGUARD_WRITE_DOCS=1 pytest tests/unit/test_docs_examples.py`
writes the blocks again from the real output.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- output: (?P<command>.+?) -->\n```[a-z]*\n(?P<body>.*?)^```$", re.M | re.S)


def _run(command: str) -> str:
    line, _, selector = command.partition(" | ")
    words = shlex.split(line)
    env = {**os.environ, **dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))}
    args = [w for w in words if not ("=" in w and not w.startswith("-"))]
    assert args[0] == "topoguard", command
    proc = subprocess.run([sys.executable, "-m", "app", *args[1:]], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    out = proc.stdout or proc.stderr
    if not selector:
        return out.rstrip("\n")
    response = json.loads(out)["response"]
    what, _, arg = selector.partition(" ")
    if what == "message":
        return str(response["status"]["message"])
    if what == "kubectl-error":
        return (f'Error from server (Forbidden): error when creating "{arg}": admission webhook '
                f'"mutate.topoguard.io" denied the request: {response["status"]["message"]}')
    if what == "kubectl-warnings":
        return "\n".join([*(f"Warning: {w}" for w in response.get("warnings", [])), f"{arg} created"])
    raise AssertionError(f"unknown selector {selector!r}")


EXAMPLES = [(doc, m.group("command")) for doc in DOCS for m in MARKER.finditer(doc.read_text())]


def test_the_docs_hold_checked_examples() -> None:
    assert {doc.name for doc, _ in EXAMPLES} >= {"README.md", "cli.md"}


@pytest.mark.parametrize("doc, command", EXAMPLES, ids=[f"{d.name}: {c}" for d, c in EXAMPLES])
def test_a_documented_output_is_the_real_output(doc: Path, command: str) -> None:
    text = doc.read_text()
    match = next(m for m in MARKER.finditer(text) if m.group("command") == command)
    got = _run(command)
    if os.environ.get("TOPOGUARD_WRITE_DOCS") == "1":
        doc.write_text(text[: match.start("body")] + got + "\n" + text[match.end("body"):])
        return
    assert match.group("body").rstrip("\n") == got


# Paths the docs name as files of this repository (in backticks or as relative links).
_PATH = re.compile(r"(?:`|\]\()((?:app|docs|deploy|examples|hack|tests|bench)/[\w./-]+?)(?:`|\)|#)")


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_the_files_the_docs_name_exist(doc: Path) -> None:
    base = doc.parent
    missing = sorted({p for p in _PATH.findall(doc.read_text())
                      if "*" not in p and "<" not in p and not (ROOT / p).exists() and not (base / p).exists()})
    assert missing == []


def test_the_demo_prints_no_ansi_escapes_into_a_pipe() -> None:
    proc = subprocess.run(["bash", "hack/demo.sh"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "BIN": str(Path(sys.executable).parent)}, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr
    assert "BuildBackendWarning" not in proc.stdout + proc.stderr
    step2 = proc.stdout.split("== 2.", 1)[1].split("\n\n", 1)[1]
    assert step2.startswith("Refused: ")  # the demo leads with the verdict
