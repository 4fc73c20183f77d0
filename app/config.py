"""Settings: a YAML config file (camelCase keys), overridden by TOPOGUARD_* env, overridden by flags.

No module-level instance: entry points build one and pass it down.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer, field_validator
from pydantic.alias_generators import to_camel

from app.models.labels import DEFAULT_ZONE_LABEL
from app.models.network import EPHEMERAL_PORTS, PortRange
from app.models.resources import DEFAULT_GPU_RESOURCES

ENV_PREFIX = "TOPOGUARD_"
# The Cilium agent DaemonSet's name (the cilium Helm chart's), in the namespace of `ciliumConfig`.
CILIUM_AGENT_DAEMONSET = "cilium"
DEFAULT_CILIUM_CONFIG = "kube-system/cilium-config"


# A DeviceClass name (a DNS subdomain) with fnmatch wildcards: *, ?, [...].
_CLASS_PATTERN = re.compile(r"[a-z0-9*?\[\]!.-]{1,253}")


class ConfigError(ValueError):
    """The config file, environment or flags hold an unusable value."""


# An extended resource name: an optional DNS prefix, a slash, a name (nvidia.com/gpu, amd.com/gpu).
_RESOURCE_NAME = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


class Limits(BaseModel):
    """The largest job a review considers (issue 18: a review's cost is bounded by these, not by the numbers a
    user writes). Far above real jobs; a job past one is refused (422) naming the field and the limit, or admitted
    unchanged with a warning under enforcement `warn`."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    # Pods of one replica type (PyTorchJob Worker.replicas; a JobSet replicatedJob's replicas x pods per Job).
    pods_per_replica_type: int = Field(default=10_000, gt=0)
    # Pods of the whole job, every replica type together.
    pods_per_job: int = Field(default=10_000, gt=0)
    # Replica types (kubeflow replica specs, JobSet replicatedJobs): flows grow with their square.
    replica_types_per_job: int = Field(default=64, gt=0)
    # Pod indices the cluster's policies name one by one (e.g. `replica-index In [0, 1, ... 999]`) that a job's
    # pods carry: each is judged on its own, so the flows grow with the square of their number.
    policy_index_values_per_job: int = Field(default=64, gt=0)
    # DRA claims one pod template names (spec.resourceClaims): each is resolved against the snapshot's templates.
    claims_per_pod: int = Field(default=32, gt=0)


class AuditSettings(BaseModel):
    """The audit of running training jobs (DESIGN.md "Round 2", Audit; issue 12)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    # Whether `topoguard serve` runs the audit loop (one replica at a time).
    enabled: bool = True
    # Seconds between two passes (a policy, node or job change also starts one, coalesced).
    interval_seconds: float = Field(default=30.0, gt=0)
    # Which jobs are audited: those in namespaces opted in to topoguard, or every namespace's.
    scope: Literal["opted-in", "all"] = "opted-in"
    # The coordination.k8s.io/v1 Lease (in the release namespace, POD_NAMESPACE) that elects the one replica
    # that audits (app/controller/lease.py).
    lease_name: str = Field(default="topoguard-audit", min_length=1, max_length=253,
                            pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    # Write a wgpolicyk8s.io/v1alpha2 PolicyReport per namespace when that CRD is served (the chart grants
    # the RBAC for it only when its audit.policyReports.enabled is true).
    policy_reports: bool = True


class PolicyChangeSettings(BaseModel):
    """The validating webhook on policy objects (DESIGN.md "Round 3", What-if; POST /validate-policy)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    # `warn`: a change that would break a training job's required flows is admitted with warnings naming the
    # jobs and flows; `deny`: refused. A namespace label `topoguard.io/policy-changes=deny|warn` overrides it
    # for namespaced policies (clusterwide ones follow this setting).
    enforcement: Literal["warn", "deny"] = "warn"
    # The answer's deadline: past it the change is admitted with a warning that it was not judged (the
    # chart's webhook timeout is at most 5 s, and failurePolicy Ignore admits it anyway then).
    deadline_seconds: float = Field(default=3.0, gt=0, le=10)


class Settings(BaseModel):
    """Every topoguard setting (DESIGN.md "Contracts"). Keys are camelCase in files."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    zone_label: str = DEFAULT_ZONE_LABEL
    zone_identity_label: str = ""
    # Exact names or `prefix*` patterns (models/resources.py); each matching resource is its own pool.
    gpu_resources: tuple[str, ...] = DEFAULT_GPU_RESOURCES
    # fnmatch patterns over DRA DeviceClass names: the classes whose devices are GPUs (app/engine/devices.py).
    gpu_device_classes: tuple[str, ...] = ("*gpu*", "mig.nvidia.com")
    # Node label naming a node's NVLink clique (GPU Feature Discovery / the ComputeDomain driver set it): a job
    # joining an NVIDIA ComputeDomain is kept within one clique (DESIGN.md Round 3, "NVLink cliques").
    clique_label: str = "nvidia.com/gpu.clique"
    mode: Literal["pin", "colocate"] = "pin"
    enforcement: Literal["deny", "warn"] = "deny"
    # The agent's policy-enforcement mode. Given in the file, environment or flags (and not ""), it wins;
    # otherwise the cilium-config ConfigMap's `enable-policy` decides, else `default` (see
    # `explicit_policy_enforcement`).
    policy_enforcement: Literal["", "default", "always", "never"] = "default"
    spread_within_zone: Literal["none", "hostname"] = "none"
    zone_strategy: Literal["most-free", "binpack"] = "most-free"
    # The TCP ports NCCL/Gloo/MPI collective traffic uses between a job's pods, `FIRST-LAST`: the kernel's
    # ephemeral range by default (EPHEMERAL_PORTS, where the fact is cited). A job that pins its ports says so
    # with the annotation `topoguard.io/collective-ports` (jobs/flows.py).
    collective_ports: PortRange = EPHEMERAL_PORTS
    # Server-side knobs.
    max_body_bytes: int = Field(default=7 * 1024 * 1024, gt=0)
    request_deadline_seconds: float = Field(default=8.0, gt=0)
    cache_stale_seconds: float = Field(default=120.0, gt=0)
    # Threads that compute decisions; each namespace may hold half of them (at least one).
    decision_workers: int = Field(default=4, gt=0, le=64)
    # Most memory one review may need to decode and decide (estimated from its bytes before decoding; 413 above).
    # All reviews in flight together may hold twice this; the chart's memory limit is derived from it.
    review_memory_bytes: int = Field(default=128 * 1024 * 1024, gt=0)
    limits: Limits = Field(default_factory=Limits)
    audit: AuditSettings = Field(default_factory=AuditSettings)
    policy_changes: PolicyChangeSettings = Field(default_factory=PolicyChangeSettings)
    # Who may read GET/POST /map (app/http/maps.py): `off` (not served), `loopback` (only on a listener
    # bound to 127.0.0.1:mapPort, for kubectl port-forward) or `authorized` (on the webhook port, to
    # callers the cluster authorizes for the non-resource URL /map). The default, here and in
    # the chart, is `off`: the map shows namespace labels, policy names and selector values, and even
    # `loopback` shows them to every process sharing the network namespace (a pod's other containers,
    # everything on a host-network node) and opens a second port that can collide; turning it on is
    # a choice to make, not a surprise.
    map_access: Literal["off", "authorized", "loopback"] = "off"
    map_port: int = Field(default=8444, ge=1, le=65535)

    @field_validator("map_access", mode="before")
    @classmethod
    def _off_is_not_false(cls, value: Any) -> Any:
        # NB: YAML 1.1 reads an unquoted `mapAccess: off` as the boolean false.
        return "off" if value is False else value
    # Connections (app/http/server.py): a request head (and the TLS handshake) must arrive within
    # this time; connections above the cap are answered 503 at once.
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    max_connections: int = Field(default=1000, gt=0)
    # Round 2 (DESIGN.md "Busy is not blocked"): a job that fits no zone's free GPUs now waits
    # Pending in its best open zone (`wait`) or is refused (`refuse`, round 1's behaviour).
    capacity_policy: Literal["wait", "refuse"] = "wait"
    # Whether the apiserver runs the ExtendedResourceToleration admission plugin (GKE does), which
    # makes every pod that requests a GPU resource tolerate a taint with that resource's name.
    extended_resource_toleration: bool = False
    # The Cilium agent's version (e.g. "1.20.2"); "" = read it from the cluster (cilium-config's
    # app.kubernetes.io/version label, else the agent DaemonSet's image tag). Selects the
    # version-dependent policy semantics (identity label filter, namespace-label peers, entities).
    cilium_version: str = ""
    # The Cilium agent's ConfigMap, `namespace/name` (DESIGN.md Round 2); "" = read neither it nor the
    # agent DaemonSet (`cilium` in the same namespace, whose image tag gives the version). Its
    # policy-enforcement, policy-audit-mode, policy-cidr-match-mode, cluster-name, labels and enable-*
    # policy switches decide verdicts; settings given here win.
    cilium_config: str = DEFAULT_CILIUM_CONFIG

    @field_validator("cilium_config")
    @classmethod
    def _namespaced_name(cls, value: str) -> str:
        namespace, sep, name = value.partition("/")
        if value and (not sep or not namespace or not name or "/" in name):
            raise ValueError(f"{value!r} is not namespace/name (or \"\" to not read the cilium-config ConfigMap)")
        return value

    @field_validator("collective_ports", mode="before")
    @classmethod
    def _port_range(cls, value: Any) -> Any:
        return value if isinstance(value, PortRange) else PortRange.parse(str(value))

    @field_serializer("collective_ports")
    def _port_range_text(self, value: PortRange) -> str:
        return str(value)

    def explicit_policy_enforcement(self) -> str:
        """`policyEnforcement` when it was set (and not ""), else "" (the agent's cilium-config decides)."""
        return self.policy_enforcement if "policy_enforcement" in self.model_fields_set else ""

    def cilium_objects(self) -> tuple[str, str, str] | None:
        """(namespace, ConfigMap name, DaemonSet name) of the Cilium agent; None when not to be read."""
        if not self.cilium_config:
            return None
        namespace, _, name = self.cilium_config.partition("/")
        return namespace, name, CILIUM_AGENT_DAEMONSET

    @field_validator("gpu_resources", "gpu_device_classes", mode="before")
    @classmethod
    def _split_csv(cls, value: Any) -> Any:
        """`a,b` (the env form) or a YAML/JSON flow list `[a, b]` (what the chart's values look like)."""
        if isinstance(value, str) and value.strip().startswith("["):
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError as e:
                raise ValueError(f"not a list: {value!r}") from e
            if not isinstance(value, list):
                raise ValueError(f"not a list: {value!r}")
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        return value

    @field_validator("gpu_resources")
    @classmethod
    def _resource_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        def named(v: str) -> str:  # a `prefix*` pattern is checked as a name ending in one more character
            return v[:-1] + "x" if v.count("*") == 1 and v.endswith("*") and "/" in v else v
        bad = [v for v in value if not _RESOURCE_NAME.fullmatch(named(v))]
        if bad:
            raise ValueError(
                f"not an extended resource name (like nvidia.com/gpu) or prefix pattern (like nvidia.com/mig-*): "
                f"{', '.join(map(repr, bad))}")
        return value

    @field_validator("gpu_device_classes")
    @classmethod
    def _class_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [v for v in value if not _CLASS_PATTERN.fullmatch(v)]
        if bad:
            raise ValueError("not a DeviceClass name pattern (like *gpu* or gpu.nvidia.com): "
                             + ", ".join(map(repr, bad)))
        return value


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """TOPOGUARD_ZONE_LABEL=... → {"zone_label": ...} for every known field; a nested setting's fields by their
    joined names (TOPOGUARD_LIMITS_PODS_PER_JOB=... → {"limits": {"pods_per_job": ...}})."""
    out: dict[str, Any] = {}
    for name, info in Settings.model_fields.items():
        nested = _nested_model(info)
        if nested is None:
            value = environ.get(ENV_PREFIX + name.upper())
            if value is not None:
                out[name] = value
            continue
        for sub in nested.model_fields:
            value = environ.get(f"{ENV_PREFIX}{name.upper()}_{sub.upper()}")
            if value is not None:
                out.setdefault(name, {})[sub] = value
    return out


def _nested_model(info: Any) -> type[BaseModel] | None:
    annotation = info.annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _snake_keys(model: type[BaseModel], values: Mapping[Any, Any]) -> dict[str, Any]:
    """A file's mapping with every known key in its field name (camelCase and snake_case are both accepted),
    nested settings included; unknown keys are kept as written, for the schema to refuse by name."""
    fields_by_alias: dict[str, str] = {to_camel(n): n for n in model.model_fields}
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = fields_by_alias.get(str(key), str(key))
        info = model.model_fields.get(name)
        nested = _nested_model(info) if info is not None else None
        out[name] = _snake_keys(nested, value) if nested is not None and isinstance(value, Mapping) else value
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
        data = _snake_keys(Settings, loaded)
    for name, value in _env_overrides(os.environ if environ is None else environ).items():
        if isinstance(value, dict) and isinstance(data.get(name), Mapping):
            value = {**data[name], **value}  # a nested setting's file keys stay unless overridden one by one
        data[name] = value
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return Settings.model_validate(data)
    except ValidationError as e:
        where = f"config {path}" if path else "settings"
        raise ConfigError(f"{where}: {describe_errors(e)}") from None


def _key_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(to_camel(str(part)) if isinstance(part, str) else f"[{part}]" for part in loc)


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel]:
    model: type[BaseModel] = Settings
    for part in loc:
        info = model.model_fields.get(str(part))
        nested = _nested_model(info) if info is not None else None
        if nested is None:
            break
        model = nested
    return model


def describe_errors(error: ValidationError) -> str:
    """Every problem in the user's words: the camelCase key, what is wrong, and for a misspelt key the
    closest valid one and the valid keys (no pydantic URL, no Python field names)."""
    problems = []
    for err in error.errors():
        loc = tuple(err["loc"])
        key = _key_path(loc)
        if err["type"] == "extra_forbidden":
            valid = sorted(to_camel(n) for n in _model_at(loc[:-1]).model_fields)
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1) or difflib.get_close_matches(
                to_camel(str(loc[-1])), valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"unknown key {key!r}{hint}; valid keys: {', '.join(valid)}")
        else:
            message = str(err["msg"]).removeprefix("Value error, ")
            problems.append(f"{key}: {message} (got {err.get('input')!r})")
    return "; ".join(problems)
