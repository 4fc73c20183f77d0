"""Dynamic Resource Allocation (`resource.k8s.io/v1`) and NVIDIA ComputeDomain objects, projected.

Types only. The cache projects DeviceClass, ResourceSlice, ResourceClaim, ResourceClaimTemplate and
ComputeDomain objects into these (all optional APIs); job adapters record the claims a pod template
names (`PodClaimRef`); the engine (app/engine/devices.py) counts devices from them.

Field names follow `k8s.io/api/resource/v1` (research/gpus-2026.md section 3). Fields may be added,
never renamed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# KEP-5004: every DeviceClass is also reachable as this implicit extended resource name + class name.
IMPLICIT_EXTENDED_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
# What the kube-scheduler puts on the ResourceClaim it makes for a pod's mapped extended resources.
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
# NVIDIA ComputeDomain (resource.nvidia.com/v1beta1): the node label naming the domain a node serves, and
# the label the driver puts on the workload ResourceClaimTemplate it creates for a domain.
COMPUTE_DOMAIN_LABEL = "resource.nvidia.com/computeDomain"
COMPUTE_DOMAIN_CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PodClaimRef:
    """One entry of a pod template's `spec.resourceClaims`: exactly one of `template` / `claim` is set
    (`resourceClaimTemplateName` / `resourceClaimName`); both empty when the entry names neither."""

    name: str
    template: str = ""
    claim: str = ""


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One `spec.devices.requests[]` entry of a claim (or claim template): `exactly`, or `firstAvailable`
    subrequests (then `device_class` is "" and `first_available` holds them, in order)."""

    name: str
    device_class: str = ""
    selectors: tuple[str, ...] = ()  # CEL expressions of the request's own selectors
    allocation_mode: str = "ExactCount"  # ExactCount | All
    count: int = 1
    admin_access: bool = False
    first_available: tuple[DeviceRequest, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceClassInfo:
    name: str
    selectors: tuple[str, ...] = ()  # CEL expressions (spec.selectors[].cel.expression)
    extended_resource_name: str = ""  # spec.extendedResourceName ("" when unset)


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    key: str
    value: str
    effect: str  # NoSchedule | NoExecute | None


@dataclass(frozen=True, slots=True)
class CounterUse:
    """A device's `consumesCounters[]` entry: from which counter set, how much of each counter."""

    counter_set: str
    counters: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    # Attribute values by name as written (bare names are the driver's own: "type", "productName"); each
    # value is the typed value (str, int, bool) or, for a `version`, the string.
    attributes: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    capacity: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)  # name -> quantity as written
    taints: tuple[DeviceTaint, ...] = ()
    consumes_counters: tuple[CounterUse, ...] = ()
    # Per-device node selection (perDeviceNodeSelection slices); all empty: the slice's.
    node_name: str = ""
    node_selector: Mapping[str, Any] | None = None
    all_nodes: bool = False


@dataclass(frozen=True, slots=True)
class ResourceSliceInfo:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int  # pool.resourceSliceCount
    node_name: str = ""
    node_selector: Mapping[str, Any] | None = None  # a core/v1 NodeSelector as written
    all_nodes: bool = False
    per_device_node_selection: bool = False
    devices: tuple[Device, ...] = ()
    # sharedCounters[]: counter set name -> counter -> amount.
    shared_counters: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: _EMPTY)
    # Why part of the slice could not be read (an attribute of unknown type, ...): "" when none.
    problem: str = ""


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False


@dataclass(frozen=True, slots=True)
class ResourceClaimInfo:
    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    requests: tuple[DeviceRequest, ...] = ()
    allocated: tuple[AllocatedDevice, ...] = ()  # status.allocation.devices.results
    allocation_node_selector: Mapping[str, Any] | None = None  # status.allocation.nodeSelector
    reserved_for: tuple[str, ...] = ()  # status.reservedFor[].name
    problem: str = ""


@dataclass(frozen=True, slots=True)
class ResourceClaimTemplateInfo:
    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    requests: tuple[DeviceRequest, ...] = ()
    problem: str = ""


@dataclass(frozen=True, slots=True)
class ComputeDomainInfo:
    namespace: str
    name: str
    uid: str
    claim_template: str  # spec.channel.resourceClaimTemplate.name
