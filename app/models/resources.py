"""Which resource names count as GPUs: the `gpuResources` setting, exact names and `prefix*` patterns.

`nvidia.com/mig-*` covers every MIG profile the NVIDIA device plugin's `mixed` strategy exposes
(`nvidia.com/mig-1g.10gb`, `nvidia.com/mig-3g.40gb`, ...); each profile stays its own resource, so its own
pool: a pod asking for `nvidia.com/mig-1g.10gb` is placed only onto nodes offering that profile.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

DEFAULT_GPU_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu", "nvidia.com/mig-*")


def is_pattern(entry: str) -> bool:
    return entry.endswith("*")


@functools.lru_cache(maxsize=64)
def _matcher(entries: tuple[str, ...]) -> Callable[[str], bool]:
    exact = frozenset(e for e in entries if not is_pattern(e))
    prefixes = tuple(e[:-1] for e in entries if is_pattern(e))

    @functools.lru_cache(maxsize=4096)
    def matches(name: str) -> bool:
        return name in exact or (bool(prefixes) and name.startswith(prefixes))

    return matches


def gpu_matcher(entries: Sequence[str]) -> Callable[[str], bool]:
    """A predicate telling whether a resource name counts as a GPU under `entries` (cached per setting)."""
    return _matcher(tuple(entries))


def exact_names(entries: Sequence[str]) -> tuple[str, ...]:
    """The entries that name one resource (not a pattern)."""
    return tuple(e for e in entries if not is_pattern(e))


# Kubernetes resource.Quantity, as the apiserver writes it.
_QUANTITY = re.compile(
    r"^\+?(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<suffix>m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?[0-9]{1,3}))?$"
)
_SUFFIX_SCALE: Mapping[str, Fraction] = {
    "": Fraction(1),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


def parse_quantity(value: Any) -> Fraction | None:
    """A Kubernetes resource.Quantity (`2`, `"500m"`, `"2Gi"`, `"1e3"`) as a number; None if it is none.
    (A review's container requests are read through jobs.templates' bounded memo of short values.)"""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value) if value >= 0 else None
    if isinstance(value, float):
        return Fraction(value) if value >= 0 and value == value and value != float("inf") else None
    if not isinstance(value, str):
        return None
    if value.isascii() and value.isdigit():
        return Fraction(int(value))
    match = _QUANTITY.match(value.strip())
    if not match:
        return None
    scale = Fraction(10) ** int(match["exp"]) if match["exp"] else _SUFFIX_SCALE[match["suffix"] or ""]
    return Fraction(match["num"]) * scale


def scheduler_units(name: str, amount: Fraction) -> int:
    """`amount` of `name` in the units the scheduler compares: millicores for cpu, else base units, rounded up."""
    if name == "cpu":
        amount *= 1000
    return -(-amount.numerator // amount.denominator)



def is_extended(name: str) -> bool:
    """A domain-prefixed (extended) resource, which a node lacking it has none of; the others (cpu, memory,
    ephemeral-storage, hugepages-*) every real node reports."""
    return "/" in name


def node_resources(resources: Mapping[str, Any]) -> dict[str, int]:
    """A node's allocatable cpu, memory, ephemeral-storage, hugepages (not the extended resources) in the
    scheduler's units; a value that is no quantity is left out (not judged)."""
    out: dict[str, int] = {}
    for name, value in resources.items():
        if not isinstance(name, str) or is_extended(name):
            continue
        amount = parse_quantity(value)
        if amount is not None:
            out[name] = scheduler_units(name, amount)
    return out


def add_counts(target: dict[str, int], counts: Mapping[str, int], sign: int) -> None:
    """`target` += `sign` x `counts`, per key; a key whose count reaches zero is dropped."""
    for key, count in counts.items():
        left = target.get(key, 0) + sign * count
        if left:
            target[key] = left
        else:
            target.pop(key, None)
