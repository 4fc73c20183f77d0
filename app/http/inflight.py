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

from app.engine import ledger
from app.models.cluster import Snapshot, freeze

IN_FLIGHT_SECONDS = 60.0
# More live holds than this means a flood of admissions; the oldest go first (they are the likeliest
# to be stored already). Bounds the per-review cost and the memory.
MAX_IN_FLIGHT = 4096


class InFlight:
    """This replica's holds (see the module docstring)."""

    def __init__(
        self, *, ttl_seconds: float = IN_FLIGHT_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl = ttl_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._holds: dict[ledger.JobKey, tuple[float, ledger.Hold]] = {}  # insertion order: oldest first

    def hold(self, key: ledger.JobKey, zone: str, gpus: Mapping[str, int]) -> None:
        """Hold `gpus` in `zone` for the job `key` (kind, namespace, name), replacing an earlier hold."""
        wanted = {r: n for r, n in gpus.items() if n > 0}
        if not wanted or not zone:
            return
        kind, namespace, name = key
        hold = ledger.Hold(f"{kind} {namespace}/{name}", key, zone, freeze(wanted), in_flight=True)
        with self._lock:
            self._holds.pop(key, None)
            self._holds[key] = (self._clock() + self._ttl, hold)
            while len(self._holds) > MAX_IN_FLIGHT:
                del self._holds[next(iter(self._holds))]

    def current(self, snapshot: Snapshot) -> tuple[ledger.Hold, ...]:
        """The live holds: expired ones and those whose job `snapshot` shows are released first."""
        if not self._holds:
            return ()
        stored = ledger.stored_jobs(snapshot)
        now = self._clock()
        with self._lock:
            for key in [k for k, (until, _) in self._holds.items() if until <= now or k in stored]:
                del self._holds[key]
            return tuple(h for _, h in self._holds.values())

    def __len__(self) -> int:
        return len(self._holds)
