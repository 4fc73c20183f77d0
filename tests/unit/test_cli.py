"""app.cli: the argument contract, and how every command fails: a message and an exit code, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import cli, jobs
from app.http.admission import unsupported_message

DATA = Path(__file__).resolve().parents[1] / "data"
LAB = DATA / "clusters" / "lab.yaml"


def test_explain_names_the_supported_kinds_as_the_webhook_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    job = tmp_path / "pod.yaml"
    job.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
    code = cli.main(["explain", str(job), "--cluster", str(LAB)])
    captured = capsys.readouterr()
    want = unsupported_message(jobs.UnsupportedKindError("v1", "Pod"))
    assert (code, captured.out, captured.err) == (2, "", f"topoguard explain: {want}\n")
    assert all(f"{kind} ({api})" in captured.err for api, kind in jobs.SUPPORTED)
