"""Settings precedence: file < TOPOGUARD_* environment < flags; bad values are clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import ConfigError, Settings, load_settings


def test_defaults_match_the_design_contract() -> None:
    got = load_settings(environ={})
    assert got == Settings(
        zone_label="topology.kubernetes.io/zone",
        zone_identity_label="",
        gpu_resources=("nvidia.com/gpu", "amd.com/gpu"),
        mode="pin",
        enforcement="deny",
        policy_enforcement="default",
        spread_within_zone="none",
        zone_strategy="most-free",
    )


def test_file_then_environment_then_flags_win_in_that_order(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("zoneIdentityLabel: zone\nmode: colocate\nenforcement: warn\ngpuResources: [example.com/gpu]\n")
    env = {"TOPOGUARD_MODE": "pin", "TOPOGUARD_GPU_RESOURCES": "a.io/gpu, b.io/gpu"}
    got = load_settings(cfg, environ=env, overrides={"enforcement": "deny", "zone_label": None})
    assert (got.zone_identity_label, got.mode, got.enforcement, got.gpu_resources, got.zone_label) == (
        "zone", "pin", "deny", ("a.io/gpu", "b.io/gpu"), "topology.kubernetes.io/zone")


@pytest.mark.parametrize(
    "text, fragment",
    [
        pytest.param("mode: sideways\n", "mode", id="an unknown enum value names the key"),
        pytest.param("zoneLable: x\n", "zoneLable", id="a misspelt key is refused, not ignored"),
        pytest.param("- a\n- b\n", "expected a mapping", id="a list instead of a mapping"),
        pytest.param("mode: [\n", "config", id="unparsable YAML names the file"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path: Path, text: str, fragment: str) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        load_settings(cfg, environ={})


def test_bad_environment_value_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="zoneStrategy"):
        load_settings(environ={"TOPOGUARD_ZONE_STRATEGY": "random"})


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml"):
        load_settings(tmp_path / "nope.yaml", environ={})


def test_capacity_keys_default_and_come_from_the_file_and_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("capacityPolicy: refuse\n")

    assert (Settings().capacity_policy, Settings().extended_resource_toleration) == ("wait", False)
    got = load_settings(path, environ={"TOPOGUARD_EXTENDED_RESOURCE_TOLERATION": "true"})
    assert (got.capacity_policy, got.extended_resource_toleration) == ("refuse", True)
    with pytest.raises(ConfigError, match="capacityPolicy"):
        load_settings(environ={"TOPOGUARD_CAPACITY_POLICY": "later"})


@pytest.mark.parametrize(
    "text, env, want",
    [
        pytest.param("", {}, "", id="not set: the agent's cilium-config decides"),
        pytest.param('policyEnforcement: ""\n', {}, "", id="empty (the chart's default): the agent's cilium-config"),
        pytest.param("policyEnforcement: default\n", {}, "default", id="set in the file: it wins"),
        pytest.param("", {"TOPOGUARD_POLICY_ENFORCEMENT": "always"}, "always", id="set in the environment: it wins"),
    ],
)
def test_policy_enforcement_is_explicit_only_when_given(tmp_path: Path, text: str, env: dict[str, str],
                                                        want: str) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text or "{}\n")
    assert load_settings(cfg, environ=env).explicit_policy_enforcement() == want


@pytest.mark.parametrize("value", ["cilium-config", "kube-system/", "/cilium-config", "a/b/c"])
def test_cilium_config_must_be_namespace_slash_name(tmp_path: Path, value: str) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"ciliumConfig: {value}\n")
    with pytest.raises(ConfigError, match=r"ciliumConfig|cilium_config"):
        load_settings(cfg, environ={})


def test_cilium_config_names_the_agent_objects() -> None:
    assert Settings().cilium_objects() == ("kube-system", "cilium-config", "cilium")
    assert Settings(cilium_config="").cilium_objects() is None
