"""What the engine decides for one job: the chosen zone, the per-zone map, and what to patch.

Owned by app/engine; fields may be added, never renamed (admission/responses and explain read them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.models.job import Flow
from app.models.network import Verdict


@dataclass(frozen=True)
class FlowCheck:
    """One required flow simulated in one zone."""

    flow: Flow
    verdict: Verdict


@dataclass(frozen=True)
class ZoneReport:
    """One candidate zone: GPUs, the flows' verdicts, and why it is (not) eligible."""

    zone: str
    gpu_nodes: int
    gpus_free: int
    gpus_needed: int
    fits: bool  # GPU capacity (with per-node fit) and schedulability for every replica
    network: str  # "allow" | "deny" | "unknown": the worst verdict over all required flows
    flows: tuple[FlowCheck, ...]
    problems: tuple[str, ...]  # human-readable, sorted: why this zone cannot take the job
    eligible: bool
    # "now": fits the free GPUs now; "wait": only once running work ends (allocatable); "never".
    capacity: str = ""
    gpus_allocatable: int = 0  # on the nodes the GPU replicas can use, as if nothing ran
    gpus_reserved: int = 0  # reserved there by admitted jobs (the ledger), of the kinds the job asks for
    capacity_note: str = ""  # the shortfall of a zone that takes the job anyway (capacity=wait)


@dataclass(frozen=True)
class Decision:
    """allowed: a zone was found. Otherwise `reasons` says, per zone, what failed (sorted)."""

    allowed: bool
    zone: str | None
    zones: tuple[ZoneReport, ...]
    reasons: tuple[str, ...]
    # Per replica key: tolerations to add so the replica can land on the zone's GPU-pool nodes.
    tolerations: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)
    # Labels every replica's pod template must carry (e.g. the zone identity label).
    labels: Mapping[str, str] = field(default_factory=dict)
    # Zones whose paths are open and that fit (mode colocate restricts nodeAffinity to these).
    open_zones: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    # Short machine-readable summary for the topoguard.io/decision annotation and metrics.
    summary: str = ""
    # Zones that are no candidate at all (the GPU replicas cannot use any node there), with why.
    excluded_zones: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Refused (at least) because the replicas share no zone, or (validate) could run split across zones.
    split: bool = False
    # The chosen zone's capacity: "now" (fits its free GPUs) or "wait" (pinned there to wait Pending).
    capacity: str = ""
    # One sentence an ML engineer understands first: what will go wrong (or where the job goes) and the
    # smallest fix (engine/lead.py); `lead_covers`: the zone problems it states, not repeated after it.
    # The NVLink clique (`cliqueLabel` value) a ComputeDomain job is kept in, and the replicas pinned to it.
    clique: str = ""
    clique_replicas: tuple[str, ...] = ()
    lead: str = ""
    lead_covers: tuple[str, ...] = ()
