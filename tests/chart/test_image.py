"""The Dockerfile and the chart agree: entrypoint, user, port, and flags `topoguard serve` accepts."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from app.cli import build_parser
from tests.chart.rendering import ROOT, Render, one

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(rf"^{name}\s+(.+)$", DOCKERFILE, re.MULTILINE)]


def runtime_stage() -> str:
    return DOCKERFILE.rsplit("\nFROM ", 1)[1]


def test_multi_stage_with_a_non_root_runtime() -> None:
    assert len(instructions("FROM")) >= 2
    users = re.findall(r"^USER\s+(\S+)$", runtime_stage(), re.MULTILINE)
    assert users and users[-1].split(":")[0] not in {"0", "root"}
    assert "COPY --from=builder /opt/venv /opt/venv" in runtime_stage()
    assert "pip uninstall --yes pip" in runtime_stage(), "no installer left in the runtime image"


def test_entrypoint_is_topoguard_serve() -> None:
    (entrypoint,) = instructions("ENTRYPOINT")
    assert json.loads(entrypoint) == ["topoguard", "serve"]


@pytest.mark.parametrize("values", [
    pytest.param({}, id="default values"),
    pytest.param({"server": {"port": 9443, "logLevel": "debug"}}, id="custom port and log level"),
])
def test_chart_args_are_flags_topoguard_serve_accepts(render: Render, values: dict[str, Any]) -> None:
    container = one(render(values=values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(["serve", *container["args"]])
    assert args.command == "serve"
    assert args.config == "/etc/topoguard/config.yaml"
    assert (args.tls_cert, args.tls_key) == ("/tls/tls.crt", "/tls/tls.key")
    assert args.port == container["ports"][0]["containerPort"]
    assert args.cluster is None, "in a cluster the server watches the API, never a snapshot file"


def test_image_user_and_port_match_the_chart(default_objects: list[dict[str, Any]]) -> None:
    spec = one(default_objects, "Deployment")["spec"]["template"]["spec"]
    user = re.findall(r"^USER\s+(\d+):(\d+)$", runtime_stage(), re.MULTILINE)[-1]
    assert (int(user[0]), int(user[1])) == (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"])
    (expose,) = instructions("EXPOSE")
    assert int(expose) == spec["containers"][0]["ports"][0]["containerPort"]


def test_build_context_holds_only_the_package() -> None:
    lines = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == "*"
    assert {"!pyproject.toml", "!README.md", "!app/"} <= set(lines)
