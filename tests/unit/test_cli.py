"""app.cli: the argument contract, and how every command fails: a message and an exit code, never a traceback."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app import cli, jobs
from app.admission.pipeline import unsupported_message
from app.commands.reach import parse_port

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


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_the_module_docstring_names_exactly_the_commands() -> None:
    first_line = (cli.__doc__ or "").splitlines()[0]
    named = first_line.split("`topoguard ", 1)[1].split("`", 1)[0]
    assert {c.strip() for c in named.split("|")} == _commands(cli.build_parser())


def test_reach_port_help_shows_ranges_and_sctp_which_it_accepts() -> None:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert "--port PORT[-END][/TCP|UDP|SCTP|ANY]" in sub.choices["reach"].format_help()
    assert [str(parse_port(p)[0]) + "/" + parse_port(p)[1] for p in ("30000-32767", "38/SCTP")] == [
        "30000-32767/TCP", "38/SCTP"]


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["reach", "--cluster", str(LAB), "--from", "ml-demo:app=a", "--to", "ml-demo:app=b",
                      "--port", "80", "-o", "json"], id="reach into a closed pipe exits 141 without a traceback"),
        pytest.param(["explain", str(ROOT / "examples" / "pytorchjob-lab.yaml"), "--cluster", str(LAB),
                      "-o", "json"], id="explain into a closed pipe exits 141 without a traceback"),
        pytest.param(["review", "--cluster", str(LAB), str(DATA / "reviews" / "lab-pytorchjob-create.json")],
                     id="review into a closed pipe exits 141 without a traceback"),
    ],
)
def test_a_closed_stdout_ends_the_command_quietly(args: list[str]) -> None:
    # The reading end is closed before the command starts, so its first write surely fails (EPIPE).
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "app", *args], stdout=write_end, stderr=subprocess.PIPE,
                              timeout=120, check=False)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr.decode()) == (cli.EXIT_BROKEN_PIPE, "")


@pytest.mark.parametrize(
    "kubeconfig, detail",
    [
        pytest.param(None, "Invalid kube-config file", id="a missing kubeconfig exits 2 naming it"),
        pytest.param(".", "Is a directory", id="a directory as kubeconfig exits 2 naming it"),
        pytest.param("clusters: [unclosed\n", "expected ',' or ']'", id="unparsable kubeconfig YAML exits 2"),
        pytest.param("apiVersion: v1\nkind: Config\ncurrent-context: nope\n", "Expected object with name nope",
                     id="a kubeconfig without its current context exits 2"),
    ],
)
def test_serve_with_an_unusable_kubeconfig_exits_2_with_the_message(
    tmp_path: Path, kubeconfig: str | None, detail: str
) -> None:
    if kubeconfig is None:
        path = tmp_path / "nonexistent"
    elif kubeconfig == ".":
        path = tmp_path
    else:
        path = tmp_path / "kubeconfig"
        path.write_text(kubeconfig)
    proc = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--kubeconfig", str(path), "--self-signed", "--host", "127.0.0.1",
         "--port", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"topoguard serve: cannot configure the Kubernetes client from kubeconfig {path}: ")
    assert detail in proc.stderr and "Traceback" not in proc.stderr
