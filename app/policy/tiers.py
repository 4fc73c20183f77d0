"""Precedence inside one ClusterNetworkPolicy tier (Admin or Baseline): which entry decides each port.

Owns: `Hit` (an entry that applies to a flow's peer on some ports) and `resolve`, which walks a tier's
hits in Cilium's order and says, per port interval, Accept, Deny, `unknown` or "not decided here"
(no entry, or a Pass: evaluation goes on in the next tier).
Must not: know sides, reasons or the Normal tier (verdicts.py composes the tiers).

Cilium's order (pkg/policy rules.go resolveL4Policy, l4.go HasPrecedenceOver): lower precedence
numbers first (`spec.priority + rule index / 100`); at one precedence Deny beats Accept beats Pass.
The first entry covering a port decides it: Accept and Deny are final, Pass skips the rest of
the tier. An entry whose peer match or effect is not certain (`maybe`, a DNS-proxy condition)
leaves its ports `unknown`: what it decides, or what comes after it, cannot both be known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from app.policy import ports as portsets
from app.policy.rules import Entry, Rule
from app.policy.selectors import Match

Outcome = Literal["allow", "deny", "unknown"]
# Same precedence: Deny first, then Accept, then Pass (pkg/policy/l4.go HasPrecedenceOver).
_ACTION_ORDER = {"deny": 0, "allow": 1, "pass": 2}


@dataclass(frozen=True)
class Hit:
    """An entry that applies to the flow's peer (`match` yes or maybe) on the ports `span`."""

    span: portsets.Interval
    entry: Entry
    rule: Rule
    why: str
    match: Match = "yes"

    @property
    def action(self) -> str:
        return "deny" if self.entry.deny else "pass" if self.entry.passes else "allow"


@dataclass(frozen=True)
class Piece:
    """Ports one hit decided."""

    parts: tuple[portsets.Interval, ...]
    outcome: Outcome
    hit: Hit


def resolve(spans: Sequence[portsets.Interval], hits: Sequence[Hit]) -> tuple[list[Piece], list[portsets.Interval]]:
    """The pieces of `spans` the tier's `hits` decide, and the ports left for the next tier.

    Passed ports and ports no hit covers are both left (merged, sorted).
    """
    remaining = portsets.merge(spans)
    decided: list[Piece] = []
    passed: list[portsets.Interval] = []
    for hit in sorted(hits, key=lambda h: (h.entry.priority, _ACTION_ORDER[h.action])):
        if not remaining:
            break
        part = [p for span in remaining for p in portsets.intersect(span, [hit.span])]
        if not part:
            continue
        remaining = [g for span in remaining for g in portsets.subtract(span, [hit.span])]
        if hit.match != "yes" or hit.entry.conditions:
            decided.append(Piece(tuple(part), "unknown", hit))
        elif hit.action == "pass":
            passed += part
        else:
            decided.append(Piece(tuple(part), "deny" if hit.action == "deny" else "allow", hit))
    return decided, portsets.merge(remaining + passed)
