"""`topoguard reach`: exit codes, JSON/text output and usage errors, through app.cli.main."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import main
from tests.unit.policy.builders import NS, cnp, port, rule, sel

CLUSTER: list[dict[str, Any]] = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": {"team": "ml"}}},
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "worker-0", "namespace": NS, "labels": {"role": "worker"}},
        "spec": {"containers": [{"name": "c"}]},
    },
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "coord-0", "namespace": NS, "labels": {"role": "coord"}},
        "spec": {"containers": [{"name": "c", "ports": [{"name": "rdzv", "containerPort": 23456}]}]},
    },
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "host-0", "namespace": NS, "labels": {"role": "host"}},
        "spec": {"hostNetwork": True, "containers": [{"name": "c"}]},
    },
    cnp(
        "coord-in",
        spec=rule(
            sel(role="coord"),
            ingress=[
                {"fromEndpoints": [sel(role="worker")], "toPorts": [{"ports": [port("rdzv")]}]},
                {
                    "fromEndpoints": [{"matchLabels": {"io.cilium.k8s.namespace.labels.team": "ml"}}],
                    "toPorts": [{"ports": [port(8080)], "rules": {"http": [{"method": "GET"}]}}],
                },
            ],
        ),
    ),
]


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(CLUSTER))
    return path


def reach(cluster: Path, *args: str) -> list[str]:
    return ["reach", "--cluster", str(cluster), *args]


@pytest.mark.parametrize(
    "args, want_exit, want_verdict",
    [
        pytest.param(
            ["--from", f"{NS}/worker-0", "--to", f"{NS}/coord-0", "--port", "23456"],
            0,
            "allow",
            id="named port allows the rendezvous port: exit 0",
        ),
        pytest.param(
            ["--from", f"{NS}/worker-0", "--to", f"{NS}/coord-0", "--port", "23457/TCP"],
            1,
            "deny",
            id="another port: exit 1",
        ),
        pytest.param(
            ["--from", f"{NS}/worker-0", "--to", f"{NS}/coord-0", "--port", "8080"],
            3,
            "unknown",
            id="L7-only allow: exit 3",
        ),
        pytest.param(
            ["--from", f"{NS}/worker-0", "--to", f"{NS}/coord-0", "--port", "23457", "--policy-enforcement", "never"],
            0,
            "allow",
            id="mode never flag: exit 0",
        ),
        pytest.param(
            ["--from", f"{NS}:role=worker,zone=a", "--to", f"{NS}/coord-0", "--port", "23456"],
            0,
            "allow",
            id="a pod that does not exist yet by labels: exit 0",
        ),
        pytest.param(
            ["--from", f"{NS}:", "--to", f"{NS}/coord-0", "--port", "8080"],
            3,
            "unknown",
            id="labelless new pod still carries its namespace labels: exit 3",
        ),
        pytest.param(
            ["--from", f"{NS}/host-0", "--to", f"{NS}/coord-0", "--port", "23456"],
            3,
            "unknown",
            id="hostNetwork source: exit 3",
        ),
        pytest.param(
            ["--from", f"{NS}/worker-0", "--to", f"{NS}/coord-0", "--port", "23456-23457"],
            1,
            "deny",
            id="a range with one closed port: exit 1",
        ),
    ],
)
def test_verdicts_and_exit_codes(
    cluster: Path, capsys: pytest.CaptureFixture[str], args: list[str], want_exit: int, want_verdict: str
) -> None:
    code = main(reach(cluster, *args, "-o", "json"))
    out = json.loads(capsys.readouterr().out)
    assert (code, out["verdict"]) == (want_exit, want_verdict)
    assert out["reasons"] == out["egress"]["reasons"] + out["ingress"]["reasons"]
    assert all(set(r) == {"side", "effect", "policy", "kind", "rule", "message"} for r in out["reasons"])


def test_json_names_the_deciding_rule(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(reach(cluster, "--from", f"{NS}/worker-0", "--to", f"{NS}/coord-0", "--port", "23456", "-o", "json"))
    out = json.loads(capsys.readouterr().out)
    assert out["ingress"]["verdict"] == "allow"
    assert [(r["effect"], r["policy"], r["kind"], r["rule"]) for r in out["ingress"]["reasons"]] == [
        ("allow", f"{NS}/coord-in", "CiliumNetworkPolicy", "ingress[0]")
    ]


def test_text_output_shows_both_sides(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(reach(cluster, "--from", f"{NS}/worker-0", "--to", f"{NS}/coord-0", "--port", "9"))
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    assert lines[0] == f"DENY: {NS}/worker-0 -> {NS}/coord-0 on 9/TCP (policy enforcement: default)"
    assert lines[1] == f"  egress of {NS}/worker-0: allow"
    assert f"  ingress of {NS}/coord-0: deny" in lines
    assert any(f"[default-deny] CiliumNetworkPolicy {NS}/coord-in spec:" in line for line in lines)


def test_enforcement_mode_comes_from_the_config_file(
    cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("policyEnforcement: always\n")
    code = main(
        reach(
            cluster,
            "--from",
            f"{NS}/coord-0",
            "--to",
            f"{NS}/worker-0",
            "--port",
            "80",
            "--config",
            str(config),
            "-o",
            "json",
        )
    )
    assert (code, json.loads(capsys.readouterr().out)["verdict"]) == (1, "deny")


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(
            ["--from", f"{NS}/nope", "--to", f"{NS}/coord-0", "--port", "80"], "no such pod", id="missing pod: exit 2"
        ),
        pytest.param(
            ["--from", "worker-0", "--to", f"{NS}/coord-0", "--port", "80"],
            "expected NS/POD",
            id="pod ref without namespace: exit 2",
        ),
        pytest.param(
            ["--from", f"{NS}:role", "--to", f"{NS}/coord-0", "--port", "80"],
            "not a label",
            id="label without value: exit 2",
        ),
        pytest.param(
            ["--from", f"{NS}/worker-0", "--to", f"{NS}/coord-0", "--port", "http"],
            "expected PORT",
            id="port name: exit 2",
        ),
        pytest.param(
            ["--from", f"{NS}/worker-0", "--to", f"{NS}/coord-0", "--port", "70000"],
            "1-65535",
            id="port out of range: exit 2",
        ),
        pytest.param(
            ["--from", f"{NS}/worker-0", "--to", f"{NS}/coord-0", "--port", "80/ICMP"],
            "protocol",
            id="unsupported protocol: exit 2",
        ),
        pytest.param(
            ["--from", f"{NS}/worker-0", "--to", f"{NS}/coord-0", "--port", "90-80"],
            "ascending",
            id="descending range: exit 2",
        ),
    ],
)
def test_usage_errors(cluster: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(reach(cluster, *args)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(None, id="missing snapshot file: exit 2"),
        pytest.param("kind: [unclosed", id="unparsable snapshot: exit 2"),
        pytest.param("- just\n- a list\n", id="snapshot that is not an object: exit 2"),
    ],
)
def test_unreadable_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None) -> None:
    path = tmp_path / "snap.yaml"
    if content is not None:
        path.write_text(content)
    assert main(reach(path, "--from", "a/b", "--to", "a/c", "--port", "80")) == 2
    assert "topoguard reach:" in capsys.readouterr().err


def test_bad_config_is_a_usage_error(cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("policyEnforcement: sometimes\n")
    assert (
        main(
            reach(cluster, "--from", f"{NS}/worker-0", "--to", f"{NS}/coord-0", "--port", "80", "--config", str(config))
        )
        == 2
    )
    assert "policyEnforcement" in capsys.readouterr().err


def test_problems_shown_are_those_of_the_deciding_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unrelated = cnp("unrelated", spec=rule(sel(role="db"), ingress=[{"fromEntities": ["nope"]}]))
    requires = cnp("requires", spec=rule(sel(role="coord"), ingress=[{"fromRequires": [sel(env="prod")]}]))
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all([*CLUSTER, unrelated, requires]))
    code = main(reach(path, "--from", f"{NS}/worker-0", "--to", f"{NS}/coord-0", "--port", "23456", "-o", "json"))
    out = json.loads(capsys.readouterr().out)
    assert (code, out["verdict"]) == (3, "unknown")
    assert [p["policy"] for p in out["policyProblems"]] == [f"{NS}/requires"]


def _zone_cluster(tmp_path: Path) -> Path:
    """Workers may reach the coordinator only from topology.kubernetes.io/zone=zone-a pods."""
    objects: list[dict[str, Any]] = [
        cnp("coord-in", spec=rule(sel(role="coord"),
                                  ingress=[{"fromEndpoints": [sel(**{"topology.kubernetes.io/zone": "zone-a"})]}])),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
    ]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    return path


@pytest.mark.parametrize(
    "version, want, code",
    [
        pytest.param("1.15.6", "allow", 0, id="Cilium 1.15.6 keeps topology.kubernetes.io/zone in identities: allow"),
        pytest.param("1.20.2", "deny", 1, id="Cilium 1.20.2 drops it, the selector selects nothing: deny"),
        pytest.param("", "unknown", 3, id="version not known: the two versions disagree: unknown"),
    ],
)
def test_cilium_version_setting_decides_a_topology_zone_selector(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str, want: str, code: int
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"ciliumVersion: {version!r}\n")
    got = main(reach(_zone_cluster(tmp_path), "--from", f"{NS}:role=worker,topology.kubernetes.io/zone=zone-a",
                     "--to", f"{NS}:role=coord", "--port", "23456", "--config", str(config), "-o", "json"))
    assert (got, json.loads(capsys.readouterr().out)["verdict"]) == (code, want)
