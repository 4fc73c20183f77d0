"""`topoguard what-if`: exit codes (0 clean, 1 breaks, 3 unknown, 2 bad input), the JSON of DESIGN.md ("Round 3",
What-if), --apply of files and directories (other kinds ignored), --delete references, text and markdown."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from app import cli
from app.commands import whatif as command

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "tests" / "data" / "clusters"
CONFIG = CLUSTERS / "lab-config.yaml"
AFTER = CLUSTERS / "lab-audit-after.yaml"
LOCK = ROOT / "examples" / "what-if" / "lock-coordinator.yaml"
METRICS = ROOT / "examples" / "what-if" / "allow-metrics.yaml"


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    parsed = cli.build_parser().parse_args(["what-if", "--cluster", str(AFTER), "--config", str(CONFIG), *args])
    code = command.run(parsed, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_a_breaking_policy_exits_1_naming_the_job_flow_and_rule() -> None:
    code, out, err = run("--apply", str(LOCK), "-o", "json")
    assert (code, err) == (1, "")
    got = json.loads(out)
    assert got["changes"] == [{"action": "apply", "kind": "CiliumNetworkPolicy", "namespace": "ml-demo",
                               "name": "lock-coordinator"}]
    (job,) = got["jobs"]
    assert (job["kind"], job["namespace"], job["name"]) == ("PyTorchJob", "ml-demo", "ml-training")
    rendezvous = job["flows"][0]
    assert {k: rendezvous[k] for k in ("from", "to", "port", "purpose", "before", "after", "policy", "rule")} == {
        "from": "Worker", "to": "Master", "port": "TCP/23456", "purpose": "rendezvous", "before": "allow",
        "after": "deny", "policy": "CiliumNetworkPolicy ml-demo/lock-coordinator", "rule": "ingressDeny[0]"}
    assert {k: got["summary"][k] for k in ("jobsChecked", "jobsBroken", "jobsUnknown")} == {
        "jobsChecked": 1, "jobsBroken": 1, "jobsUnknown": 0}
    assert got["ignored"] == []


def test_other_kinds_are_listed_as_ignored() -> None:
    code, out, _ = run("--apply", str(LOCK.parent), "-o", "json")
    assert code == 1
    got = json.loads(out)
    assert [c["name"] for c in got["changes"]] == ["allow-metrics", "lock-coordinator"]
    assert got["ignored"] == [{"kind": "ConfigMap", "namespace": "ml-demo", "name": "policy-owners",
                               "source": f"{LOCK.parent / 'owners.yaml'} document 1"}]


def test_an_additive_policy_exits_0_and_lists_no_job() -> None:
    code, out, _ = run("--apply", str(METRICS), "-o", "json")
    assert code == 0
    assert json.loads(out)["jobs"] == []


def test_a_directory_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(LOCK.read_text())
    (tmp_path / "b.yaml").write_text(METRICS.read_text())
    (tmp_path / "values.yaml").write_text("replicas: 2\n")  # not an object: skipped with a note
    code, out, _ = run("--apply", str(tmp_path), "-o", "json")
    assert code == 1
    assert [c["name"] for c in json.loads(out)["changes"]] == ["lock-coordinator", "allow-metrics"]


def test_deleting_the_only_policy_that_selects_the_master_leaves_it_unselected() -> None:
    code, out, _ = run("--delete", "cnp/ml-demo/allow-intra-zone-a")
    assert code == 0, out
    assert "1 training job checked (1 within the change's reach): 0 would break" in out


def test_a_clusternetworkpolicy_while_the_agent_switch_is_unknown_exits_3(tmp_path: Path) -> None:
    (tmp_path / "kcnp.yaml").write_text(json.dumps({
        "apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
        "metadata": {"name": "isolate"},
        "spec": {"tier": "Admin", "priority": 5, "subject": {"namespaces": {}},
                 "ingress": [{"name": "deny", "action": "Deny", "from": [{"namespaces": {}}]}]},
    }))
    code, out, _ = run("--apply", str(tmp_path / "kcnp.yaml"))
    assert code == 3, out
    assert "UNKNOWN" in out and "enable-k8s-cluster-network-policy" in out


@pytest.mark.parametrize("args, message", [
    ((), "nothing to judge"),
    (("--delete", "cnp/allow-intra-zone-a"), "CiliumNetworkPolicy is namespaced"),
    (("--delete", "ccnp/ml-demo/x"), "CiliumClusterwideNetworkPolicy is cluster-scoped"),
    (("--delete", "deployment/ml-demo/x"), "unknown kind 'deployment'"),
    (("--delete", "cnp/ml-demo/nope"), "cannot delete CiliumNetworkPolicy ml-demo/nope"),
    (("--apply", "/nonexistent/p.yaml"), "no such file or directory"),
])
def test_bad_input_exits_2(args: tuple[str, ...], message: str) -> None:
    code, out, err = run(*args)
    assert (code, out) == (2, "")
    assert message in err


def test_markdown_is_a_pull_request_comment() -> None:
    code, out, _ = run("--apply", str(LOCK), "-o", "markdown")
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "### topoguard what-if: ⛔ 1 training job would lose a required connection"
    assert "| apply | CiliumNetworkPolicy ml-demo/lock-coordinator |" in lines
    assert ("| Worker | Master | TCP/23456 | rendezvous | allow | **deny** | "
            "CiliumNetworkPolicy ml-demo/lock-coordinator ingressDeny[0] |") in lines


def test_the_console_script_name() -> None:
    proc = subprocess.run([sys.executable, "-m", "app", "what-if", "--cluster", str(AFTER), "--config", str(CONFIG),
                           "--apply", str(LOCK)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert "PyTorchJob ml-demo/ml-training: BREAKS" in proc.stdout
