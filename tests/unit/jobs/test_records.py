"""`build_record` makes the instance the class's own `__init__` makes, and `build_tuple` the NamedTuple its own
`__new__` makes, for every class they are used on."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest

from app.jobs import kubeflow
from app.jobs.groups import JobMeta
from app.jobs.records import build_record, build_tuple
from app.jobs.templates import EMPTY_FACTS, PodFacts
from app.models.cluster import ContainerPort
from app.models.job import Flow, JobGroup, Replica, UserPlacement
from app.models.network import ALL_PORTS
from tests.unit.jobs.builders import GPU

PLACEMENT = {"node_selector": {"zone": "a"}, "node_selector_terms": (), "tolerations": ({"key": "gpu"},)}
REPLICA = {
    "key": "Worker",
    "role": "worker",
    "count": 2,
    "template_path": "/spec/pytorchReplicaSpecs/Worker/template",
    "template": {"spec": {}},
    "pod_labels": {"a": "b"},
    "index_label": "training.kubeflow.org/replica-index",
    "gpus": {"nvidia.com/gpu": 4},
    "ports": (ContainerPort(23456, "TCP", "pytorchjob-port"),),
    "service_account": "default",
    "host_network": False,
    "placement": UserPlacement(**PLACEMENT),
    "is_coordinator": False,
    "leader_labels": {},
    "seed": {},
    "requests": {"nvidia.com/gpu": 4, "cpu": 4000},
    "claims": (),
}
GROUP = {
    "api_version": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "name": "train",
    "namespace": "ml",
    "replicas": (Replica(**REPLICA),),
    "coordinator": "Worker",
    "flows": (Flow("Worker", "Worker", ALL_PORTS, "TCP", "collective"),),
    "group_selector": {"x": "y"},
    "annotations": {},
    "supports_spread": True,
    "composed_from": "",
}
# Every class app/jobs builds with build_record, with a value for each of its fields.
BUILT = [(UserPlacement, PLACEMENT), (Replica, REPLICA), (JobGroup, GROUP)]


@pytest.mark.parametrize(("cls", "values"), BUILT, ids=lambda v: getattr(v, "__name__", ""))
def test_class_init_only_stores_the_fields(cls: type, values: dict[str, Any]) -> None:
    assert dataclasses.is_dataclass(cls)
    assert not hasattr(cls, "__post_init__")
    assert not hasattr(cls, "__slots__")
    assert [f.name for f in dataclasses.fields(cls) if f.init] == list(values)


@pytest.mark.parametrize(("cls", "values"), BUILT, ids=lambda v: getattr(v, "__name__", ""))
def test_built_record_is_the_one_init_makes(cls: type, values: dict[str, Any]) -> None:
    want = cls(**values)
    got = build_record(cls, dict(values))
    assert type(got) is cls
    assert got == want
    assert repr(got) == repr(want)
    assert list(vars(got).items()) == list(vars(want).items())
    assert pickle.loads(pickle.dumps(got)) == want
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(got, "name", "other")  # noqa: B010 (frozen: setattr is the point)


# Every NamedTuple app/jobs builds with build_tuple, with a value for each of its fields (defaults included).
TUPLES: list[tuple[type, tuple[Any, ...]]] = [
    (PodFacts, ({"a": "b"}, {GPU: 1}, (), ("main",), "default", False, UserPlacement(**PLACEMENT), {GPU: 1}, ())),
    (JobMeta, ("train", "ml", {"x": "y"})),
    (kubeflow._Spec, ("Worker", "Worker", 2, {"spec": {}}, EMPTY_FACTS)),
    (kubeflow.ReplicaRole, ({"a": "b"}, {}, "index", "default")),
]


@pytest.mark.parametrize(("cls", "values"), TUPLES, ids=lambda v: getattr(v, "__name__", ""))
def test_built_tuple_is_the_one_the_class_makes(cls: type, values: tuple[Any, ...]) -> None:
    assert len(values) == len(cls._fields)  # type: ignore[attr-defined]
    want = cls(*values)
    got = build_tuple(cls, values)
    assert type(got) is cls
    assert got == want
    assert repr(got) == repr(want)
    assert got._asdict() == want._asdict()
