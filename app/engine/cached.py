"""`decide` and `validate`: the two decisions, memoized per snapshot (engine/memo.py says on what).

PURE. `pending` looks the decision up first, so a caller can tell a decision it already has
(microseconds: answer at once) from one it must compute (milliseconds with many policies: run it
where a deadline can be kept). `decide`/`validate` are `pending(...).result()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.config import Settings
from app.engine import ledger, memo
from app.engine.decide import decide_fresh, job_key
from app.engine.validation import is_colocated, validate_fresh
from app.models.cluster import Snapshot
from app.models.decision import Decision
from app.models.job import JobGroup


@dataclass(slots=True)
class Pending:
    """A decision about to be made: `known` when the snapshot's memo holds it already (then `result()`
    costs nothing), else `result()` computes it and keeps it for the next job of the same shape."""

    kind: memo.Kind
    key: memo.DecisionKey
    known: Decision | None
    group: JobGroup
    snapshot: Snapshot
    settings: Settings
    reserved: ledger.Reserved | None = None
    suspended: bool = False
    # A decision of this shape was made on this snapshot already (`Shape.warm`): computing this one only
    # counts the reservations (bounded by the zones, no policy is evaluated).
    warm: bool = False
    shape_key: memo.DecisionKey | None = None  # the group's network_key

    @property
    def cheap(self) -> bool:
        """Whether `result()` costs microseconds: the decision is known, or only its reservations are new."""
        return self.known is not None or self.warm

    def result(self) -> Decision:
        if self.known is not None:
            return self.known
        fresh = decide_fresh if self.kind == "decide" else validate_fresh
        # NB: not looked up again (`pending` just did): a decision two reviews make at once is the same one.
        decision = fresh(self.group, self.snapshot, self.settings, reserved=self.reserved, suspended=self.suspended,
                         shape_key=self.shape_key)
        memo.memo_of(self.snapshot).put(self.key, decision)
        return decision


def pending(
    kind: memo.Kind,
    group: JobGroup,
    snapshot: Snapshot,
    settings: Settings,
    *,
    suspended: bool = False,
    in_flight: ledger.ZoneTotals | None = None,
) -> Pending:
    """The mutating (`decide`) or validating (`validate`) decision for the group, looked up in the memo.

    `suspended`: the job waits for a queue manager; `in_flight`: per zone, the GPUs this replica holds
    for other jobs it admitted that the snapshot does not show yet (`InFlight.totals`).
    """
    colocated = kind == "validate" and is_colocated(group, settings.zone_label)
    reserved = ledger.reserved_for(snapshot, gpu_resources=settings.gpu_resources, job=job_key(group),
                                   in_flight=in_flight)
    decisions = memo.memo_of(snapshot)
    key, network = decisions.keys(kind, group, snapshot, settings, colocated=colocated,
                                  capacity=(suspended, reserved.key))
    known = decisions.get(key)
    shape = memo.shape_of(network, snapshot) if known is None else None
    warm = shape is not None and (kind == "validate", suspended) in shape.warm
    return Pending(kind, key, known, group, snapshot, settings, reserved, suspended, warm, network)


def decide(group: JobGroup, snapshot: Snapshot, settings: Settings, *, suspended: bool = False) -> Decision:
    """The zone the group should be pinned to (mutating path), with the per-zone table (`decide_fresh`).

    Returns allowed=False with sorted, per-zone reasons when no zone fits and is open.
    """
    return pending("decide", group, snapshot, settings, suspended=suspended).result()


def validate(group: JobGroup, snapshot: Snapshot, settings: Settings) -> Decision:
    """Judge the job as written (validating webhook; `validate_fresh`)."""
    return pending("validate", group, snapshot, settings).result()
