"""`mapAccess` at startup: `authorized` needs the Kubernetes API, so `serve --cluster FILE` refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import cli
from app.config import ConfigError, load_settings

LAB = Path(__file__).resolve().parents[1] / "data" / "clusters" / "lab.yaml"


def test_authorized_map_with_a_cluster_file_is_refused_at_startup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("mapAccess: authorized\n")
    code = cli.main(["serve", "--cluster", str(LAB), "--self-signed", "--port", "0", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2
    assert "mapAccess: authorized" in err and "--cluster has no API" in err


@pytest.mark.parametrize("value", ["on", "public", ""])
def test_unknown_map_access_is_a_config_error(tmp_path: Path, value: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"mapAccess: '{value}'\n")
    with pytest.raises(ConfigError, match=r"map_access|mapAccess"):
        load_settings(config, environ={})


def test_map_access_comes_from_the_environment_too() -> None:
    got = load_settings(environ={"TOPOGUARD_MAP_ACCESS": "loopback", "TOPOGUARD_MAP_PORT": "9555"})
    assert (got.map_access, got.map_port) == ("loopback", 9555)


def test_an_unquoted_off_in_yaml_is_off(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("mapAccess: off\n")  # YAML 1.1 reads this as the boolean false
    assert load_settings(config, environ={}).map_access == "off"
