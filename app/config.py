"""Settings: a YAML config file (camelCase keys), overridden by TOPOGUARD_* env, overridden by flags.

No module-level instance: entry points build one and pass it down.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from app.models.labels import DEFAULT_ZONE_LABEL

ENV_PREFIX = "TOPOGUARD_"


class ConfigError(ValueError):
    """The config file, environment or flags hold an unusable value."""


class Settings(BaseModel):
    """Every topoguard setting (DESIGN.md "Contracts"). Keys are camelCase in files."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    zone_label: str = DEFAULT_ZONE_LABEL
    zone_identity_label: str = ""
    gpu_resources: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu")
    mode: Literal["pin", "colocate"] = "pin"
    enforcement: Literal["deny", "warn"] = "deny"
    policy_enforcement: Literal["default", "always", "never"] = "default"
    spread_within_zone: Literal["none", "hostname"] = "none"
    zone_strategy: Literal["most-free", "binpack"] = "most-free"
    # Server-side knobs.
    max_body_bytes: int = Field(default=7 * 1024 * 1024, gt=0)
    request_deadline_seconds: float = Field(default=8.0, gt=0)
    cache_stale_seconds: float = Field(default=120.0, gt=0)
    # The Cilium agent's version (e.g. "1.20.2"); "" = read it from the cluster (cilium-config's
    # app.kubernetes.io/version label, else the agent DaemonSet's image tag). Selects the
    # version-dependent policy semantics (identity label filter, namespace-label peers, entities).
    cilium_version: str = ""

    @field_validator("gpu_resources", mode="before")
    @classmethod
    def _split_csv(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        return value


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """TOPOGUARD_ZONE_LABEL=... → {"zone_label": ...} for every known field."""
    out: dict[str, Any] = {}
    for name in Settings.model_fields:
        value = environ.get(ENV_PREFIX + name.upper())
        if value is not None:
            out[name] = value
    return out


def load_settings(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build Settings from file, then environment, then explicit overrides (flags)."""
    data: dict[str, Any] = {}
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"config {path}: {e}") from e
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path}: expected a mapping of settings, got {type(loaded).__name__}")
        # Accept camelCase (documented) and snake_case keys.
        fields_by_alias: dict[str, str] = {to_camel(n): n for n in Settings.model_fields}
        for key, value in loaded.items():
            data[fields_by_alias.get(str(key), str(key))] = value
    data.update(_env_overrides(os.environ if environ is None else environ))
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return Settings.model_validate(data)
    except ValidationError as e:
        where = f"config {path}" if path else "settings"
        raise ConfigError(f"{where}: {e}") from e
