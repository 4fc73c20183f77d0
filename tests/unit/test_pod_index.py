"""The pods' aggregates kept one pod at a time equal those counted from scratch (models/pods.py)."""

from __future__ import annotations

from collections import defaultdict
from types import MappingProxyType

from hypothesis import given, settings
from hypothesis import strategies as st

from app.models.cluster import ContainerPort, PodInfo
from app.models.labels import JOBSET_NAME_LABEL, KF_JOB_NAME
from app.models.pods import OWNER_PREFIX, PodIndex, PodIndexBuilder

GPU = "nvidia.com/gpu"


@st.composite
def pods(draw: st.DrawFn) -> PodInfo:
    name = draw(st.sampled_from(["p0", "p1", "p2", "p3"]))
    labels = {}
    if draw(st.booleans()):
        labels[KF_JOB_NAME] = draw(st.sampled_from(["j1", "j2"]))
    if draw(st.booleans()):
        labels[JOBSET_NAME_LABEL] = "js"
    owner = draw(st.sampled_from([("", ""), ("PyTorchJob", "j1"), ("Job", "js-0")]))
    names = st.sampled_from(["", "nccl", "C10D"])
    ports = tuple(ContainerPort(draw(st.sampled_from([23456, 29500])), "TCP", draw(names))
                  for _ in range(draw(st.integers(0, 2))))
    gpus = draw(st.integers(0, 3))
    return PodInfo(name=name, namespace=draw(st.sampled_from(["a", "b"])), labels=MappingProxyType(labels),
                   service_account="default", node_name=draw(st.sampled_from(["", "n1", "n2"])),
                   phase=draw(st.sampled_from(["Running", "Pending", "Succeeded"])),
                   requests=MappingProxyType({GPU: gpus} if gpus else {}), ports=ports, host_network=False, ips=(),
                   owner=owner)


def counted(kept: list[PodInfo]) -> PodIndex:
    """The aggregates the slow way, straight from their definitions."""
    held: dict[str, dict[str, int]] = defaultdict(dict)
    groups: dict[tuple[str, str, str], list[PodInfo]] = defaultdict(list)
    ports: dict[str, set[int]] = defaultdict(set)
    for pod in kept:
        for port in pod.ports:
            if port.name:
                ports[port.name.lower()].add(port.port)
        if pod.terminal:
            continue
        for resource, n in pod.requests.items():
            if pod.node_name and n:
                held[pod.node_name][resource] = held[pod.node_name].get(resource, 0) + n
        for key in (KF_JOB_NAME, JOBSET_NAME_LABEL):
            if pod.labels.get(key):
                groups[(pod.namespace, key, pod.labels[key])].append(pod)
        if pod.owner[0]:
            groups[(pod.namespace, OWNER_PREFIX + pod.owner[0], pod.owner[1])].append(pod)
    return PodIndex(
        {node: per for node, per in held.items() if per},
        {k: tuple(sorted(v, key=lambda p: (p.namespace, p.name))) for k, v in groups.items()},
        {name: frozenset(n) for name, n in ports.items()},
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), pods()), max_size=30))
def test_kept_one_pod_at_a_time_equals_counted_from_scratch(steps: list[tuple[bool, PodInfo]]) -> None:
    # Events as a watch delivers them: each (namespace, name) is added, replaced or deleted.
    builder = PodIndexBuilder()
    before = builder.freeze()
    current: dict[tuple[str, str], PodInfo] = {}
    for delete, pod in steps:
        key = (pod.namespace, pod.name)
        old = current.pop(key, None)
        new = None if delete else pod
        if new is not None:
            current[key] = new
        builder.replace(old, new)
        frozen = builder.freeze()
        want = counted(list(current.values()))
        assert dict(frozen.held) == want.held
        assert dict(frozen.groups) == want.groups
        assert dict(frozen.named_ports) == want.named_ports
        # What a reader redoes after this change: exactly the groups whose members are not the same tuple.
        moved = {k for k in {*before.groups, *frozen.groups} if before.groups.get(k) is not frozen.groups.get(k)}
        nodes = {n for n in {*before.held, *frozen.held} if before.held.get(n) is not frozen.held.get(n)}
        changes = frozen.changes_since(before.serial)
        assert changes is not None and changes.groups == moved and nodes <= changes.nodes
        assert all(before.held.get(n) == frozen.held.get(n) for n in changes.nodes - nodes)  # emptied and refilled
        assert not frozen.changes_since(frozen.serial)
        before = frozen
    assert before.changes_since(0) is None and PodIndexBuilder().freeze().changes_since(before.serial) is None
    assert PodIndexBuilder.of(current.values()).freeze() == builder.freeze()


def test_a_frozen_index_does_not_change_with_the_builder() -> None:
    pod = PodInfo("p", "a", MappingProxyType({KF_JOB_NAME: "j"}), "default", "n1", "Running",
                  MappingProxyType({GPU: 2}), (), False, ())
    builder = PodIndexBuilder.of([pod])
    before = builder.freeze()
    builder.remove(pod)

    assert before.held == {"n1": {GPU: 2}} and before.groups == {("a", KF_JOB_NAME, "j"): (pod,)}
    assert builder.freeze().held == {} and builder.freeze().groups == {}


def test_an_identity_memo_keeps_what_is_asked_for_and_drops_the_rest() -> None:
    from app.models.cluster import IdentityMemo

    memo: IdentityMemo[int] = IdentityMemo(4)
    built: list[int] = []
    hot = [object() for _ in range(2)]

    def ask(x: object, n: int) -> int:
        return memo.get((x,), lambda: built.append(n) or n)

    for turn in range(10):
        for i, x in enumerate(hot):
            assert ask(x, i) == i
        ask(object(), 100 + turn)  # a value asked for once (a replaced group)
    assert built.count(0) == 1 and built.count(1) == 1  # the hot values were built once
    assert len(memo) <= 8  # the cold ones went
