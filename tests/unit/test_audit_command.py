"""`topoguard audit`: exit codes (0 nothing found, 1 findings, 2 bad input), the JSON shape of DESIGN.md
("Round 2", Audit), the text's lead lines, and /map's "jobs"."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app import cli
from app.cache.files import load_snapshot
from app.cache.store import StaticStore
from app.commands import audit as audit_command
from app.config import load_settings
from app.http import maps
from app.http.deps import AppState
from app.metrics import Metrics

CLUSTERS = Path(__file__).resolve().parent.parent / "data" / "clusters"
CONFIG = CLUSTERS / "lab-config.yaml"
BEFORE, AFTER = CLUSTERS / "lab-audit-before.yaml", CLUSTERS / "lab-audit-after.yaml"


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    parsed = cli.build_parser().parse_args(["audit", *args])
    code = audit_command.run(parsed, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_findings_exit_1_and_the_text_leads_with_one_line_per_job() -> None:
    code, out, err = run("--cluster", str(BEFORE), "--config", str(CONFIG))
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert lines[0] == (
        "PyTorchJob ml-demo/ml-training: Worker pods in zone-a cannot reach Master in zone-b on TCP 23456 and "
        "TCP 32768-60999 (collective traffic): CiliumNetworkPolicy ml-demo/deny-cross-zone-gpu-traffic, "
        "ml-demo/allow-intra-zone-a, ml-demo/allow-intra-zone-b (+2 more)"
    )
    assert "  split: Job split across zones zone-a and zone-b: 1 Master pod in zone-b, 4 Worker pods in zone-a" in lines
    assert lines[-1] == "1 training job audited (scope opted-in), 1 with findings"


def test_nothing_found_exits_0() -> None:
    code, out, _ = run("--cluster", str(AFTER), "--config", str(CONFIG))
    assert (code, out) == (0, "1 training job audited (scope opted-in), 0 with findings\n")


def test_json_is_the_design_shape() -> None:
    code, out, _ = run("--cluster", str(BEFORE), "--config", str(CONFIG), "-o", "json")
    got = json.loads(out)
    assert code == 1 and list(got) == ["jobs"]
    (job,) = got["jobs"]
    assert list(job) == ["kind", "namespace", "name", "zones", "pending", "findings"]
    assert (job["kind"], job["namespace"], job["name"], job["zones"], job["pending"]) == (
        "PyTorchJob", "ml-demo", "ml-training", {"zone-a": 4, "zone-b": 1}, 0)
    assert [f["type"] for f in job["findings"]] == ["split", "blocked", "blocked"]
    assert all(list(f) == ["type", "message", "flows"] for f in job["findings"])
    flow = job["findings"][1]["flows"][0]
    assert (flow["src"], flow["dst"], flow["port"], flow["verdict"]) == ("Worker", "Master", "TCP/23456", "deny")
    assert "CiliumNetworkPolicy ml-demo/allow-intra-zone-b" in flow["policies"]


def test_scope_flag_overrides_the_setting(tmp_path: Path) -> None:
    text = BEFORE.read_text().replace('topoguard.io/enabled: "true"', 'topoguard.io/enabled: "false"')
    cluster = tmp_path / "not-opted-in.yaml"
    cluster.write_text(text)
    assert run("--cluster", str(cluster), "--config", str(CONFIG), "-o", "json")[:2] == (0, '{\n  "jobs": []\n}\n')
    code, out, _ = run("--cluster", str(cluster), "--config", str(CONFIG), "--scope", "all", "-o", "json")
    assert code == 1 and len(json.loads(out)["jobs"]) == 1


def test_no_jobs_in_scope_says_so() -> None:
    code, out, _ = run("--cluster", str(CLUSTERS / "lab.yaml"))
    assert (code, out) == (0, "no training jobs in scope (opted-in)\n")


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["--cluster", "/nonexistent/x.yaml"], "no such file or directory", id="missing snapshot"),
        pytest.param(["--cluster", str(BEFORE), "--config", "/nonexistent/c.yaml"], "config /nonexistent/c.yaml",
                     id="missing config"),
    ],
)
def test_bad_input_exits_2_with_a_message(args: list[str], message: str) -> None:
    code, out, err = run(*args)
    assert (code, out) == (2, "") and err.startswith("topoguard audit: ") and message in err


def test_a_bad_scope_is_a_usage_error_without_a_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "app", "audit", "--cluster", str(BEFORE), "--scope", "some"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "invalid choice: 'some'" in proc.stderr and "Traceback" not in proc.stderr


def test_map_json_lists_the_running_jobs_audit() -> None:
    settings = load_settings(CONFIG)
    snapshot = load_snapshot(BEFORE, gpu_resources=settings.gpu_resources)
    state = AppState(settings=settings, store=StaticStore(snapshot), metrics=Metrics(), workers=None)
    got = maps.build_map(state)
    (job,) = got["jobs"]
    assert (job["name"], [f["type"] for f in job["findings"]]) == ("ml-training", ["split", "blocked", "blocked"])
    assert maps.build_map(state)["jobs"] == got["jobs"]  # served from the snapshot's memo


def test_map_leaves_the_jobs_out_when_asked_or_when_the_audit_is_off() -> None:
    # ?jobs=false serves callers that poll the zones (an audit pass covers every job); audit.enabled false
    # means no audit anywhere, /map included.
    settings = load_settings(CONFIG)
    snapshot = load_snapshot(BEFORE, gpu_resources=settings.gpu_resources)
    state = AppState(settings=settings, store=StaticStore(snapshot), metrics=Metrics(), workers=None)
    assert "jobs" not in maps.build_map(state, with_jobs=False)
    off = settings.model_copy(update={"audit": settings.audit.model_copy(update={"enabled": False})})
    quiet = AppState(settings=off, store=StaticStore(snapshot), metrics=Metrics(), workers=None)
    assert "jobs" not in maps.build_map(quiet) and maps.build_map(quiet)["zones"]


def test_html_is_one_self_contained_page_of_the_map() -> None:
    code, page, err = run("--cluster", str(BEFORE), "--config", str(CONFIG), "-o", "html")
    assert (code, err) == (1, "")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"""\b(src|href)=|@import|url\((?!#)""", page), "nothing loaded from elsewhere"
    assert page.count('class="flow flow-deny"') == 2
    assert '4 GPUs held · 4 GPU-hours wasted per hour' in page
    assert 'data-job="PyTorchJob ml-demo/ml-training" data-finding="blocked"' in page
    code, page, _ = run("--cluster", str(AFTER), "--config", str(CONFIG), "-o", "html")
    assert code == 0 and "flow-deny" not in page and "✓ nothing found" in page


def test_html_escapes_what_the_cluster_names(tmp_path: Path) -> None:
    text = BEFORE.read_text().replace("zone-b", "zone-<b>")
    cluster = tmp_path / "odd.yaml"
    cluster.write_text(text)
    _, page, _ = run("--cluster", str(cluster), "--config", str(CONFIG), "-o", "html")
    assert "zone-<b>" not in page and "zone-&lt;b&gt;" in page
