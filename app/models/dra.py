"""Dynamic Resource Allocation (`resource.k8s.io/v1`) and NVIDIA ComputeDomain objects, projected.

Types only. The cache projects DeviceClass, ResourceSlice, ResourceClaim, ResourceClaimTemplate and
ComputeDomain objects into these (all optional APIs); job adapters record the claims a pod template
names (`PodClaimRef`); the engine (app/engine/devices.py) counts devices from them.

Field names follow `k8s.io/api/resource/v1` (research/gpus-2026.md section 3). Fields may be added,
never renamed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
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

# A Kubernetes quantity (k8s.io/apimachinery resource.Quantity): a signed decimal number, then a binary
# suffix (Ki..Ei), a decimal SI suffix (n u m "" k M G T P E) or a decimal exponent (e3, E-2).
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, Fraction | int] = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
                                      "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def parse_quantity(value: Any) -> Fraction | int | None:
    """A quantity as written (`80Gi`, `9856Mi`, `132`, `500m`, `1e3`, or a number) as an exact number (an int
    when it is whole and written without a fraction); None when it is no quantity."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip() if isinstance(value, str | float) else ""
    match = _QUANTITY.fullmatch(text)
    if match is None or len(text) > 64:
        return None
    digits, suffix = match.group(1), match.group(2) or ""
    number: Fraction | int = int(digits) if digits.lstrip("+-").isdecimal() else Fraction(digits)
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    if suffix:
        exponent = int(suffix[1:])
        if abs(exponent) > 30:
            return None
        return number * Fraction(10) ** exponent  # an int exponent: exact
    return number


def milli(value: Fraction | int) -> int:
    """A quantity in thousandths, rounded up (how counters and capacities are compared: exact for every
    quantity written with at most three decimals, as Kubernetes keeps them)."""
    if isinstance(value, int):
        return value * 1000
    scaled = value * 1000
    return -((-scaled.numerator) // scaled.denominator)


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
    # Why part of the class could not be read (a selector that is no CEL expression): "" when none.
    problem: str = ""
    created: str = ""  # metadata.creationTimestamp (RFC 3339): of two classes mapping one name, the newer wins


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
    allow_multiple_allocations: bool = False  # allowMultipleAllocations (consumable capacity, KEP-5075)
    # Attributes as written whose value could not be read (no known type): left out of `attributes`.
    unreadable: tuple[str, ...] = ()


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
