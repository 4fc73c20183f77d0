"""Settings precedence: file < TOPOGUARD_* environment < flags; bad values are clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import ConfigError, Settings, load_settings
from app.models.network import PortRange


def test_defaults_match_the_design_contract() -> None:
    got = load_settings(environ={})
    assert got == Settings(
        zone_label="topology.kubernetes.io/zone",
        zone_identity_label="",
        gpu_resources=("nvidia.com/gpu", "amd.com/gpu", "nvidia.com/mig-*"),
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


def test_collective_ports_default_to_the_kernel_ephemeral_range_and_come_from_file_and_environment(
    tmp_path: Path,
) -> None:
    assert load_settings(environ={}).collective_ports == PortRange(32768, 60999)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("collectivePorts: 40000-40100\n")
    assert load_settings(cfg, environ={}).collective_ports == PortRange(40000, 40100)
    cfg.write_text("collectivePorts: 45000\n")  # YAML reads an int: one port
    assert load_settings(cfg, environ={}).collective_ports == PortRange(45000, 45000)
    got = load_settings(cfg, environ={"TOPOGUARD_COLLECTIVE_PORTS": "50000-50100"})
    assert got.collective_ports == PortRange(50000, 50100)
    assert got.model_dump(by_alias=True)["collectivePorts"] == "50000-50100"  # written back as it is read


@pytest.mark.parametrize(
    "value, fragment",
    [
        pytest.param("every", "not a port or a port range", id="not a range"),
        pytest.param("60999-32768", "ascending", id="descending"),
        pytest.param("0-100", "1-65535", id="port 0"),
        pytest.param("32768-70000", "1-65535", id="past 65535"),
        pytest.param("32768 60999", "not a port or a port range", id="the sysctl's own form"),
        pytest.param("", "not a port or a port range", id="empty"),
    ],
)
def test_bad_collective_ports_are_a_clear_error_naming_the_key(value: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=f"collectivePorts: .*{fragment}"):
        load_settings(environ={"TOPOGUARD_COLLECTIVE_PORTS": value})


@pytest.mark.parametrize("value, ok", [
    ("nvidia.com/mig-*", True), ("example.com/gpu", True), ("*", False), ("nvidia.com/*gpu", False),
    ("mig-*", False), ("a/b/c", False),
])
def test_gpu_resources_take_names_and_domain_prefix_patterns(value: str, ok: bool) -> None:
    if ok:
        assert load_settings(environ={"TOPOGUARD_GPU_RESOURCES": value}).gpu_resources == (value,)
    else:
        with pytest.raises(ValueError, match="prefix pattern"):
            load_settings(environ={"TOPOGUARD_GPU_RESOURCES": value})
