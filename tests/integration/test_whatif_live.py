"""`topoguard what-if --kubeconfig`: the snapshot taken from a live cluster by the watch cache (the fake apiserver
here), then the same answer as from the file snapshot of the same objects."""

from __future__ import annotations

import io
import json
from pathlib import Path

import yaml

from app import cli
from app.commands import whatif as command
from tests.integration.fakeapi import FakeApiServer

ROOT = Path(__file__).resolve().parents[2]
AFTER = ROOT / "tests" / "data" / "clusters" / "lab-audit-after.yaml"
CONFIG = ROOT / "examples" / "config.yaml"
LOCK = ROOT / "examples" / "what-if" / "lock-coordinator.yaml"


def run(*args: str) -> tuple[int, dict[str, object], str]:
    out, err = io.StringIO(), io.StringIO()
    code = command.run(cli.build_parser().parse_args(["what-if", *args]), stdout=out, stderr=err)
    return code, json.loads(out.getvalue()) if out.getvalue() else {}, err.getvalue()


def test_the_live_cluster_gives_the_file_snapshots_answer(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        for obj in yaml.safe_load_all(AFTER.read_text()):
            if obj:
                api.apply(obj)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        live = run("--kubeconfig", str(kubeconfig), "--config", str(CONFIG), "--apply", str(LOCK), "-o", "json")
    offline = run("--cluster", str(AFTER), "--config", str(CONFIG), "--apply", str(LOCK), "-o", "json")
    assert live[0] == offline[0] == 1, live[2]
    assert live[1] == offline[1]
    assert live[1]["summary"]["jobsBroken"] == 1  # type: ignore[index]


def test_a_cluster_that_does_not_answer_is_bad_input(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    code, out, err = run("--kubeconfig", str(kubeconfig), "--sync-timeout", "1", "--apply", str(LOCK))
    assert (code, out) == (2, {})
    assert "not synced" in err and "after 1s (--sync-timeout)" in err


def test_cluster_and_kubeconfig_exclude_each_other(tmp_path: Path) -> None:
    code, _, err = run("--cluster", str(AFTER), "--kubeconfig", str(tmp_path / "k"), "--apply", str(LOCK))
    assert code == 2 and "mutually exclusive" in err
