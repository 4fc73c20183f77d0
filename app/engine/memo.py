"""Decisions memoized per snapshot, on exactly what a decision reads of the job.

PURE. `decide` and `validate` are functions of (group, snapshot, settings), and a snapshot never
changes, so a decision can be kept with the snapshot and reused for every later job that is the
same *to the engine*. Jobs rarely repeat byte for byte, but they repeat in placement: a sweep of
runs from one template, the retries and dry runs of one submission, the mutating review followed by
the reinvocation. What the engine reads of a `JobGroup` (and so what the key holds):

- per replica: key, role, count, index label, GPUs, ports, service account, hostNetwork, the
  coordinator flag and the user's placement (nodeSelector, required node affinity, tolerations);
- pod labels and the labels of pod 0, but only under the keys some policy reads
  (`PolicyIndex.keys_read`, `label_keys_mentioned`), in their order: a label no policy reads
  cannot change a verdict, the label hints or anything else. The job name is such a label (the
  operators' `job-name`) unless a policy selects on it;
- the namespace, the coordinator and the required flows;
- validate only: whether the templates require podAffinity over the zone topology to the whole
  group (`is_colocated`, which reads the full pod labels and templates), as a boolean.

The job's name is not read: the engine names pods `<job>-<role>-<index>` in its messages
(`JOB_PLACEHOLDER`) and the surfaces put the name in (`render`). The key is built in about
10-20 µs for a two-replica job; a decision costs milliseconds with a thousand policies.
A property test checks that a memoized decision equals a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any, Literal

import orjson

from app import policy
from app.config import Settings
from app.models.cluster import BoundedMemo, Snapshot
from app.models.decision import Decision
from app.models.job import JobGroup, Replica

# How the engine names the job in its messages; `render` replaces it with the job's name.
JOB_PLACEHOLDER = "<job>"
DECISION_MEMO_KEY = "engine.decisions"
# Decisions kept per snapshot; the oldest goes first. A snapshot lives until the cache publishes
# the next one (seconds to minutes), so this only caps memory under a flood of distinct jobs.
DECISION_MEMO_SIZE = 1024

Kind = Literal["decide", "validate"]


def render(text: str, name: str) -> str:
    """`text` from the engine with the job's name where the engine wrote `JOB_PLACEHOLDER`."""
    return text.replace(JOB_PLACEHOLDER, name or "job") if JOB_PLACEHOLDER in text else text


def render_json(value: Any, name: str) -> Any:
    """`render` applied to every string in JSON-like data (dicts, lists, tuples become lists)."""
    if isinstance(value, str):
        return render(value, name)
    if isinstance(value, Mapping):
        return {k: render_json(v, name) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [render_json(v, name) for v in value]
    return value


def _labels(labels: Mapping[str, str], read: frozenset[str]) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in labels.items() if k in read)


def _raw(value: Any) -> bytes:
    """Exact, hashable form of user-written JSON (types kept apart: 1, 1.0 and true differ)."""
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def _replica_key(replica: Replica, read: frozenset[str]) -> tuple[Hashable, ...]:
    placement = replica.placement
    return (
        replica.key,
        replica.role,
        replica.count,
        replica.index_label,
        _labels(replica.pod_labels, read),
        _labels(replica.leader_labels, read),
        tuple(replica.gpus.items()),
        replica.ports,
        replica.service_account,
        replica.host_network,
        replica.is_coordinator,
        tuple(placement.node_selector.items()),
        _raw(placement.node_selector_terms) if placement.node_selector_terms else b"",
        _raw(placement.tolerations) if placement.tolerations else b"",
    )


KEYS_READ_MEMO_KEY = "engine.decision-keys-read"


def keys_read(snapshot: Snapshot) -> frozenset[str]:
    """Every pod label key a policy selector reads or mentions: what a decision key keeps of the labels."""
    # NB: the two inputs are built first: a memo builder must not build another memo (the lock is not
    # reentrant), so the union's builder only combines what exists.
    index, mentioned = policy.build_index(snapshot), policy.label_keys_mentioned(snapshot)
    return snapshot.memo(KEYS_READ_MEMO_KEY, lambda _: index.keys_read | mentioned)


def decision_key(
    kind: Kind, group: JobGroup, snapshot: Snapshot, settings: Settings, *, colocated: bool = False
) -> tuple[Hashable, ...]:
    """Everything a decision of `kind` reads of the group (see the module docstring), with the settings."""
    read = keys_read(snapshot)
    return (
        kind,
        settings,
        group.namespace,
        group.coordinator,
        group.flows,
        tuple(_replica_key(r, read) for r in group.replicas),
        colocated,
    )


class DecisionMemo(BoundedMemo[tuple[Hashable, ...], Decision]):
    """The bounded decision cache of one snapshot."""

    def __init__(self, size: int = DECISION_MEMO_SIZE) -> None:
        super().__init__(size)


def memo_of(snapshot: Snapshot) -> DecisionMemo:
    return snapshot.memo(DECISION_MEMO_KEY, lambda _: DecisionMemo())


def memoized(key: tuple[Hashable, ...], snapshot: Snapshot, compute: Callable[[], Decision]) -> Decision:
    """The decision under `key`, computed (and kept) only the first time."""
    memo = memo_of(snapshot)
    found = memo.get(key)
    if found is None:
        found = compute()
        memo.put(key, found)
    return found
