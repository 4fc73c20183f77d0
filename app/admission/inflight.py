"""In-flight reservations: jobs this replica admitted that its watch has not shown yet.

Between answering a mutating review and the stored job reaching this replica's snapshot (the
apiserver still has to persist it, the watch to deliver it, the cache to publish), the job's GPUs
are in no ledger: a burst of reviews would all see the same free GPUs. So the replica keeps its own
short-lived hold per admitted job (DESIGN.md "Round 2", Reservations) and passes the live ones to
the engine as a value (`engine.pending(..., in_flight=...)`); the engine stays pure.

A hold ends when the snapshot shows the job (its reservation is then the stored job's, counted by
every replica alike), or after `IN_FLIGHT_SECONDS`, whichever comes first: a job that another
admission plugin refused, or that was deleted at once, never appears. Dry-run reviews and the
validating path never hold. This is mutable per-process state: one `InFlight` per app, guarded by
a lock; its cost per review is the number of live holds, never the number of jobs in the cluster.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

from app.engine import ledger
from app.models.cluster import Snapshot, add_counts, freeze

IN_FLIGHT_SECONDS = 60.0
# More live holds than this means a flood of admissions; the oldest go first (they are the likeliest
# to be stored already). Bounds the per-review cost and the memory.
MAX_IN_FLIGHT = 4096


class InFlight:
    """This replica's holds (see the module docstring), with their per-zone totals kept as holds come and go."""

    def __init__(
        self, *, ttl_seconds: float = IN_FLIGHT_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl = ttl_seconds
        self._clock = clock
        self._lock = threading.Lock()
        # Insertion order is expiry order (one window for all; a replaced hold moves to the end).
        self._holds: dict[ledger.JobKey, tuple[float, ledger.Hold]] = {}
        self._totals: dict[str, dict[str, int]] = {}  # zone -> resource -> GPUs held, over every hold
        self._seen: Snapshot | None = None  # the last snapshot whose stored jobs released their holds
        self._fresh: list[ledger.JobKey] = []  # holds added since, not yet checked against it
        # The jobs `_seen` stores, once read (a burst checks each hold it adds against the same snapshot).
        self._stored: frozenset[ledger.JobKey] | None = None

    def hold(self, key: ledger.JobKey, zone: str, gpus: Mapping[str, int]) -> None:
        """Hold `gpus` in `zone` for the job `key` (kind, namespace, name), replacing an earlier hold."""
        wanted = {r: n for r, n in gpus.items() if n > 0}
        if not wanted or not zone:
            return
        kind, namespace, name = key
        hold = ledger.Hold(f"{kind} {namespace}/{name}", key, zone, freeze(wanted), in_flight=True)
        with self._lock:
            self._drop(key)
            self._holds[key] = (self._clock() + self._ttl, hold)
            self._count(hold, +1)
            self._fresh.append(key)
            while len(self._holds) > MAX_IN_FLIGHT:
                self._drop(next(iter(self._holds)))

    def current(self, snapshot: Snapshot) -> tuple[ledger.Hold, ...]:
        """The live holds: expired ones and those whose job `snapshot` shows are released first."""
        with self._lock:
            self._release(snapshot)
            return tuple(h for _, h in self._holds.values())

    def totals(self, snapshot: Snapshot, *, job: ledger.JobKey) -> ledger.ZoneTotals:
        """What a decision for `job` counts: per zone, the GPUs the live holds keep for other jobs not stored
        yet, without a pass over them.

        Cost: the zones, plus the holds that expired or that `snapshot` shows (each released once).
        """
        if not self._holds:
            return freeze({})
        totals: dict[str, Mapping[str, int]] = {}
        with self._lock:
            self._release(snapshot)
            own = self._holds.get(job)
            mine = own[1] if own is not None else None
            for zone, per in self._totals.items():
                counts = dict(per)  # NB: the one copy, wrapped read-only (freeze would copy it again)
                if mine is not None and mine.zone == zone:
                    for resource, count in mine.gpus.items():
                        counts[resource] -= count
                totals[zone] = MappingProxyType(counts)
        return MappingProxyType(totals)

    def _release(self, snapshot: Snapshot) -> None:
        now = self._clock()
        while self._holds:
            first = next(iter(self._holds))
            if self._holds[first][0] > now:
                break
            self._drop(first)
        # A new snapshot: one pass for the jobs it now stores; the same one: only the holds added since.
        if snapshot is not self._seen:
            checked, self._stored = list(self._holds), None
        else:
            checked = self._fresh
        if checked:
            stored = self._stored
            if stored is None:
                stored = self._stored = ledger.stored_jobs(snapshot)
            for key in [k for k in checked if k in stored]:
                self._drop(key)
        self._seen, self._fresh = snapshot, []

    def _drop(self, key: ledger.JobKey) -> None:
        found = self._holds.pop(key, None)
        if found is not None:
            self._count(found[1], -1)

    def _count(self, hold: ledger.Hold, sign: int) -> None:
        per = self._totals.setdefault(hold.zone, {})
        add_counts(per, hold.gpus, sign)
        if not per:
            del self._totals[hold.zone]

    def __len__(self) -> int:
        return len(self._holds)
