"""The GPU resources of a snapshot: the `gpuResources` setting (names and `prefix*` patterns) resolved
against what the nodes offer. PURE.

Every part of the engine that counts GPUs (the zone index, the ledger, the audit, the map) takes the
resolved names from here, so they count the same GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.models.cluster import IdentityMemo, Snapshot, canonical
from app.models.resources import exact_names, gpu_matcher

# By the identity of the snapshot's nodes (the watch cache keeps the tuple while no node changes).
_KINDS: IdentityMemo[tuple[str, ...]] = IdentityMemo(16)


def gpu_kinds(snapshot: Snapshot, gpu_resources: Sequence[str]) -> tuple[str, ...]:
    """The exact names of `gpu_resources` plus every node resource its patterns match, sorted."""
    entries = canonical(tuple(gpu_resources))

    def build() -> tuple[str, ...]:
        is_gpu = gpu_matcher(entries)
        found = set(exact_names(entries))
        for node in snapshot.nodes:
            found.update(r for r in node.allocatable if is_gpu(r))
            found.update(r for r in node.unparsable if is_gpu(r))
        return canonical(tuple(sorted(found)))

    return _KINDS.get((snapshot.nodes, entries), build)
