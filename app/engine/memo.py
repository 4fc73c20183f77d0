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
  group (`is_colocated`, which reads the full pod labels and templates), as a boolean;
- capacity: whether the job is suspended, and what its reservations differ by from the snapshot's
  stored ledger (the job's own stored reservation left out, the replica's in-flight totals per zone:
  `ledger.Reserved.key`). In-flight holds are the only per-process state a decision reads; their
  totals are in the key, so a decision made with other reserved GPUs is never served
  (engine/ledger.py), while two reviews that count the same GPUs share it.

A burst changes the in-flight totals with every admission, so there each decision is made afresh:
what does not read capacity (the flows' verdicts and the zones' fits) is kept apart, once per shape
(`per_shape`, under `network_key`: the key without kind, colocation and capacity), and a fresh
decision only counts capacity and ranks the zones.

The job's name is not read: the engine names pods `<job>-<role>-<index>` in its messages
(`JOB_PLACEHOLDER`) and the surfaces put the name in (`render`).

The key (`DecisionKey`) is built on every review, so it is cheap to hash and compare: it keeps its
hash, holds flows and container ports as plain tuples of their fields rather than the dataclasses
(whose __hash__/__eq__ are Python code), and the per-snapshot label keys, the settings' hash and the
last flows' form are kept with the memo. For the lab's 16-pod PyTorchJob a lookup (`engine.pending`
on a hit) costs about 4.5 µs on the 2-core dev VM, 6 µs for a freshly parsed job, against 8.5 and
11 µs with the plain tuple key (issue 4); a decision costs milliseconds with a thousand policies.
A property test checks that a memoized decision equals a fresh one, another that the key makes
exactly the jobs share an entry that the tuple key did.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any, Literal, TypeVar

import orjson

from app import policy
from app.config import Settings
from app.models.cluster import BoundedMemo, Snapshot
from app.models.decision import Decision
from app.models.job import Flow, JobGroup, Replica

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


# NB: the key is built on every review, so these are written for CPython 3.11's costs: under callgrind
# a Python call (a comprehension is one) takes about 1,000 instructions, a loop iteration 150-300.


def _labels(labels: Mapping[str, str], read: frozenset[str]) -> tuple[tuple[str, str], ...]:
    found: tuple[tuple[str, str], ...] = ()
    for k in labels:
        if k in read:
            found += ((k, labels[k]),)
    return found


def _raw(value: Any) -> bytes:
    """Exact, hashable form of user-written JSON (types kept apart: 1, 1.0 and true differ)."""
    try:
        # orjson writes the same bytes with or without OPT_NON_STR_KEYS when every key is a str,
        # and is faster without it; only a dict with other keys needs the option.
        return orjson.dumps(value)
    except TypeError:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


# Flows and container ports go in as plain tuples of their fields, in field order (a Flow's ports as
# first, last): equal exactly when the dataclasses are, but hashed and compared in C, not by the
# dataclasses' generated __hash__/__eq__ (Python code, two calls a flow). NB: a field added to Flow,
# PortRange or ContainerPort must be added here; test_memo_key.py checks that every field is.
def _flows(flows: tuple[Flow, ...]) -> tuple[tuple[Hashable, ...], ...]:
    forms = []
    for f in flows:
        ports = f.ports
        forms.append((f.src, f.dst, ports.first, ports.last, f.protocol, f.purpose, f.port_name))
    return tuple(forms)


def _replica_key(replica: Replica, read: frozenset[str]) -> tuple[Hashable, ...]:
    placement = replica.placement
    pod, leader, gpus = replica.pod_labels, replica.leader_labels, replica.gpus
    selector, terms, tolerations = placement.node_selector, placement.node_selector_terms, placement.tolerations
    ports: tuple[tuple[Hashable, ...], ...] = ()
    for p in replica.ports:
        ports += ((p.port, p.protocol, p.name),)
    # Empty parts (leader labels, a CPU replica's GPUs, the usual nodeSelector and affinity) skip
    # the call that would only return ().
    return (
        replica.key,
        replica.role,
        replica.count,
        replica.index_label,
        _labels(pod, read) if pod else (),
        _labels(leader, read) if leader else (),
        tuple(gpus.items()) if gpus else (),
        tuple(replica.requests.items()) if replica.requests else (),
        replica.claims,
        ports,
        replica.service_account,
        replica.host_network,
        replica.is_coordinator,
        tuple(selector.items()) if selector else (),
        _raw(terms) if terms else b"",
        _raw(tolerations) if tolerations else b"",
    )


KEYS_READ_MEMO_KEY = "engine.decision-keys-read"


def keys_read(snapshot: Snapshot) -> frozenset[str]:
    """Every pod label key a policy selector reads or mentions: what a decision key keeps of the labels."""
    return snapshot.memo(
        KEYS_READ_MEMO_KEY, lambda s: policy.build_index(s).keys_read | policy.label_keys_mentioned(s), network=True
    )


class DecisionKey:
    """What a decision reads of a job (the module docstring): `parts`, hashed once.

    A tuple does not keep its hash, and a key is looked up on every review and again to keep a fresh
    decision. `digest` must be equal whenever `parts` are: `DecisionMemo.keys` hashes the parts with
    the settings' hash in place of the settings (pydantic hashes every field of them each time) and the
    job's parts by their hash (worked out once for both keys; the flows' form by the hash kept with it).
    """

    __slots__ = ("_hash", "_parts")

    def __init__(self, parts: tuple[Hashable, ...], digest: int) -> None:
        self._parts = parts
        self._hash = digest

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DecisionKey):
            if self._parts is other._parts:
                return True
            if self._parts == other._parts:
                # NB: equal, so from now on the same object: a review looks its shape up twice (engine.pending,
                # then the decision's `per_shape`), and the second comparison is then one identity test
                # instead of a walk over the job's parts.
                other._parts = self._parts
                return True
            return False
        return NotImplemented

    def __repr__(self) -> str:
        return f"DecisionKey({self._parts!r})"


class DecisionMemo(BoundedMemo[DecisionKey, Decision]):
    """The bounded decision cache of one snapshot, with what its keys need of the snapshot and settings.

    Under a burst every review keeps a decision of its own (its holds are in the key); the oldest goes first.
    Reads take no lock.
    """

    def __init__(self, size: int = DECISION_MEMO_SIZE) -> None:
        super().__init__(size)
        # Filled on first use (`key` has the snapshot; the memo can be made without one).
        self._read: frozenset[str] | None = None
        # The last settings seen and their hash: a server passes one Settings to every review.
        self._settings_hash: tuple[Settings, int] | None = None
        # The last flows seen and their plain form: the kubeflow parser hands every job of one shape
        # the same (immutable) flows tuple (jobs/kubeflow.py `_flows`), so most reviews reuse the form,
        # and two keys holding the same form object compare it by identity.
        # (The form's hash is kept with it.)
        self._flows_form: tuple[tuple[Flow, ...], tuple[tuple[Hashable, ...], ...], int] | None = None

    def keys(
        self,
        kind: Kind,
        group: JobGroup,
        snapshot: Snapshot,
        settings: Settings,
        *,
        colocated: bool = False,
        capacity: Hashable = (),
    ) -> tuple[DecisionKey, DecisionKey]:
        """(`decision_key`, `network_key`), reading the group once. `snapshot` is the one this memo belongs to;
        `capacity` holds what the decision counts beyond the snapshot (whether the job is suspended, the
        reservations' `Reserved.key`)."""
        settings_hash, job, job_hash = self._job(group, snapshot, settings)
        return (DecisionKey((kind, settings, colocated, (*job, capacity)),
                            hash((kind, settings_hash, colocated, job_hash, capacity))),
                DecisionKey(("network", settings, job), hash(("network", settings_hash, job_hash))))

    def network_key(self, group: JobGroup, snapshot: Snapshot, settings: Settings) -> DecisionKey:
        """What the flows' verdicts read of the job and the settings: the decision key without the kind,
        the colocation flag and the capacity. Jobs of one shape share their flow checker and zone fits
        under it (`per_shape`), whatever GPUs are free or reserved when each is reviewed."""
        settings_hash, job, job_hash = self._job(group, snapshot, settings)
        return DecisionKey(("network", settings, job), hash(("network", settings_hash, job_hash)))

    def _job(self, group: JobGroup, snapshot: Snapshot, settings: Settings) -> tuple[int, tuple[Hashable, ...], int]:
        """The settings' hash, what a decision reads of the group (the module docstring), capacity aside, and its
        hash: both keys' digests hold it, so the job's parts are hashed once (a tuple does not keep its hash)."""
        read = self._read
        if read is None:
            read = self._read = keys_read(snapshot)
        known_settings = self._settings_hash
        if known_settings is not None and known_settings[0] is settings:
            settings_hash = known_settings[1]
        else:
            settings_hash = hash(settings)
            self._settings_hash = (settings, settings_hash)
        flows, known_flows = group.flows, self._flows_form
        if known_flows is not None and known_flows[0] is flows:
            flows_form, flows_hash = known_flows[1], known_flows[2]
        else:
            flows_form = _flows(flows)
            flows_hash = hash(flows_form)
            self._flows_form = (flows, flows_form, flows_hash)
        replicas = []
        for r in group.replicas:
            replicas.append(_replica_key(r, read))
        job = (group.namespace, group.coordinator, flows_form, tuple(replicas))
        return settings_hash, job, hash((group.namespace, group.coordinator, flows_hash, job[3]))


def _new_memo(_: Snapshot) -> DecisionMemo:
    return DecisionMemo()


def memo_of(snapshot: Snapshot) -> DecisionMemo:
    return snapshot.memo(DECISION_MEMO_KEY, _new_memo)


def decision_key(
    kind: Kind, group: JobGroup, snapshot: Snapshot, settings: Settings, *, colocated: bool = False
) -> DecisionKey:
    """Everything a decision of `kind` reads of the group (see the module docstring), with the settings."""
    return memo_of(snapshot).keys(kind, group, snapshot, settings, colocated=colocated)[0]


SHAPES_MEMO_KEY = "engine.shapes"
S = TypeVar("S")


def per_shape(group: JobGroup, snapshot: Snapshot, settings: Settings, build: Callable[[], S], *,
              key: DecisionKey | None = None) -> S:
    """What every job of the group's shape shares on this snapshot (engine/decide.py `Shape`: the flow
    checker with its verdicts, the zones' fits), built the first time.

    Flows and fits are functions of the network key alone (they read no capacity), so a burst of jobs
    from one template judges them once per snapshot, while each job's capacity (the in-flight holds
    grow with every admission, so its decision key differs) is counted afresh.
    """
    if key is None:  # NB: `key`, when given, is this group's network_key (engine.pending has it)
        key = memo_of(snapshot).network_key(group, snapshot, settings)
    found: S | None = shape_of(key, snapshot)
    if found is None:
        found = build()
        _shapes(snapshot).put(key, found)
    return found


def shape_of(network_key: DecisionKey, snapshot: Snapshot) -> Any:
    """The shape kept under `network_key` on this snapshot (`per_shape`), or None: nothing is built."""
    return _shapes(snapshot).get(network_key)


def _shapes(snapshot: Snapshot) -> BoundedMemo[DecisionKey, Any]:
    return snapshot.memo(SHAPES_MEMO_KEY, _new_shapes)


def _new_shapes(_: Snapshot) -> BoundedMemo[DecisionKey, Any]:
    return BoundedMemo(DECISION_MEMO_SIZE)
