"""Render charts/topoguard with a real helm (from $HELM, ./bin/helm or PATH) for the chart tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "topoguard"
NAMESPACE = "topoguard-system"
RELEASE = "topoguard"
HELM_TIMEOUT_SECONDS = 60


def find_helm() -> str | None:
    for candidate in (os.environ.get("HELM"), str(ROOT / "bin" / "helm"), shutil.which("helm")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


HELM = find_helm()


class HelmError(Exception):
    """helm exited non-zero; the message is its stderr."""


def run_helm(args: Sequence[str], *, stdin: str = "") -> str:
    """Run helm; returns stdout, raises HelmError with stderr when it fails."""
    assert HELM is not None, "helm not found"
    proc = subprocess.run([HELM, *args], input=stdin, capture_output=True, text=True,
                          timeout=HELM_TIMEOUT_SECONDS, check=False)
    if proc.returncode != 0:
        raise HelmError(proc.stderr.strip())
    return proc.stdout


def template(
    *, values: dict[str, Any] | None = None, sets: Sequence[str] = (), namespace: str = NAMESPACE,
    values_files: Sequence[Path] = (), extra: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """`helm template` the chart with `values` (a dict, passed on stdin) and `--set`s."""
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, *extra]
    for f in values_files:
        args += ["-f", str(f)]
    args += ["-f", "-"]
    for s in sets:
        args += ["--set", s]
    out = run_helm(args, stdin=yaml.safe_dump(values or {}))
    return [d for d in yaml.safe_load_all(out) if d]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The single object of `kind` (and `name`); fails the test when there is not exactly one."""
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


Render = Callable[..., list[dict[str, Any]]]
