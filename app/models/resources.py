"""Which resource names count as GPUs: the `gpuResources` setting, exact names and `prefix*` patterns.

`nvidia.com/mig-*` covers every MIG profile the NVIDIA device plugin's `mixed` strategy exposes
(`nvidia.com/mig-1g.10gb`, `nvidia.com/mig-3g.40gb`, ...); each profile stays its own resource, so its own
pool: a pod asking for `nvidia.com/mig-1g.10gb` is placed only onto nodes offering that profile.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

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
