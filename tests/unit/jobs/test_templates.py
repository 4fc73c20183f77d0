"""Reading pod templates: GPU demand (limits, requests, init containers, sidecars) and quantities."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from app.jobs import templates
from app.jobs.errors import FieldError
from app.jobs.templates import parse_quantity, read_pod_template, resource_amounts
from app.models.cluster import BoundedMemo
from tests.unit.jobs.builders import GPU, GPU_RESOURCES, container, template

AMD = "amd.com/gpu"


@pytest.mark.parametrize(
    "value, want",
    [
        pytest.param(2, 2, id="integer"),
        pytest.param("2", 2, id="string integer"),
        pytest.param("2000m", 2, id="milli units that make a whole number"),
        pytest.param("1k", 1000, id="decimal suffix"),
        pytest.param("1Ki", 1024, id="binary suffix"),
        pytest.param("1e3", 1000, id="decimal exponent"),
        pytest.param("20E-1", 2, id="negative exponent that makes a whole number"),
        pytest.param(2.0, 2, id="integral float from yaml"),
        pytest.param(" 3 ", 3, id="surrounding blanks"),
        pytest.param("1.5", Fraction(3, 2), id="a fraction"),
        pytest.param("500m", Fraction(1, 2), id="milli units"),
        pytest.param(-1, None, id="negative integer"),
        pytest.param("-1", None, id="negative string"),
        pytest.param(True, None, id="boolean is not a quantity"),
        pytest.param("two", None, id="word is not a quantity"),
        pytest.param([], None, id="list is not a quantity"),
    ],
)
def test_parse_quantity(value: Any, want: int | Fraction | None) -> None:
    assert parse_quantity(value) == want


def gpus_of(tpl: dict[str, Any]) -> tuple[dict[str, int], list[FieldError]]:
    errors: list[FieldError] = []
    facts = read_pod_template(tpl, "t", errors, gpu_resources=GPU_RESOURCES)
    return dict(facts.gpus), errors


@pytest.mark.parametrize(
    "tpl, want",
    [
        pytest.param(template(container(gpus=2)), {GPU: 2}, id="limits"),
        pytest.param(template(container(requests={GPU: "1"})), {GPU: 1}, id="requests only"),
        pytest.param(
            template({"name": "c", "resources": {"requests": {GPU: 1}, "limits": {GPU: 2}}}),
            {GPU: 2},
            id="limits win over requests",
        ),
        pytest.param(template(container(gpus=1), container("b", gpus=2)), {GPU: 3}, id="containers add up"),
        pytest.param(
            template(container(requests={"cpu": "4", "example.com/fpga": 1})), {}, id="other resources are not gpus"
        ),
        pytest.param(
            template({"name": "c", "resources": {"limits": {AMD: 4}}}),
            {AMD: 4},
            id="every configured gpu resource counts",
        ),
        pytest.param(template(container(gpus=0)), {}, id="zero gpus leaves the map empty"),
        pytest.param(
            template(container(gpus=1), initContainers=[container("init", gpus=4)]),
            {GPU: 4},
            id="init container asking more sets the peak",
        ),
        pytest.param(
            template(container(gpus=2), initContainers=[container("init", gpus=1)]),
            {GPU: 2},
            id="init container asking less does not add",
        ),
        pytest.param(
            template(container(gpus=2), initContainers=[{**container("side", gpus=1), "restartPolicy": "Always"}]),
            {GPU: 3},
            id="sidecar init container adds to the running sum",
        ),
        pytest.param({}, {}, id="empty template"),
    ],
)
def test_pod_gpu_demand(tpl: dict[str, Any], want: dict[str, int]) -> None:
    assert gpus_of(tpl) == (want, [])


def test_bad_gpu_quantity_names_the_field() -> None:
    assert gpus_of(template(container(gpus="1.5"))) == (
        {},
        [FieldError("t.spec.containers[0].resources.limits[nvidia.com/gpu]", "must be a whole non-negative quantity")],
    )


# Values read one after the other for one resource; those equal to another but of another JSON type
# (True and 1.0 beside 1) must not be taken for it by the memo of quantities read.
QUANTITY_SEQUENCE: list[Any] = [1, True, 1.0, "1", " 1", 2, "2", "2000m", "1.5", -1, "-1", "x" * 40, "1" * 40, 2**70]


@pytest.mark.parametrize("resource", [GPU, "cpu", "memory"])
def test_quantities_read_again_give_what_a_first_reading_gives(
    resource: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_all() -> list[Any]:
        return [resource_amounts({"requests": {resource: v}}, GPU_RESOURCES) for v in QUANTITY_SEQUENCE]

    first = read_all()
    again = read_all()  # answered by the memo where it keeps the value
    for value, answer in zip(QUANTITY_SEQUENCE, first, strict=True):
        monkeypatch.setattr(templates, "_QUANTITIES", BoundedMemo(templates.QUANTITY_MEMO_SIZE))
        assert resource_amounts({"requests": {resource: value}}, GPU_RESOURCES) == answer, value
    assert again == first
    assert first[1][1] and not first[0][1]  # True is no quantity, 1 is


def test_memo_of_quantities_keeps_only_short_values(monkeypatch: pytest.MonkeyPatch) -> None:
    memo = BoundedMemo[Any, Any](templates.QUANTITY_MEMO_SIZE)
    monkeypatch.setattr(templates, "_QUANTITIES", memo)
    resource_amounts({"requests": {"cpu": "1" * 40, "memory": 2**70, "x" * 300: "1", "gpu": True}}, ())
    assert len(memo) == 0
    resource_amounts({"requests": {"cpu": "16", "memory": 4}}, ())
    assert len(memo) == 2


# Containers read one after the other: each asks like one before it but for one thing (a value's JSON type, a
# section, the order of entries, a GPU resource the setting does not name), which the memo of containers read
# must not take for the one before.
CONTAINER_SEQUENCE: list[dict[str, Any]] = [
    {"limits": {GPU: 1, "cpu": "2"}},
    {"limits": {GPU: True, "cpu": "2"}},
    {"limits": {GPU: 1.0, "cpu": "2"}},
    {"limits": {GPU: "1", "cpu": "2"}},
    {"requests": {GPU: 1, "cpu": "2"}},
    {"limits": {"cpu": "2", GPU: 1}},
    {"limits": {GPU: 1}, "requests": {GPU: 2, "cpu": "2"}},
    {"limits": {"cpu": "1"}, "requests": {"cpu": "2"}},
    {"limits": {"cpu": 0, "memory": "1Gi"}},
    {"limits": {AMD: 1, "example.com/fpga": 1}},
    {"limits": {GPU: "1.5"}},
    {"limits": {GPU: [1]}},
    {"limits": [], "requests": {"cpu": "1"}},
    {"limits": {"cpu": "1" * 40}},
    {"requests": {f"example.com/r{i}": 1 for i in range(20)}},
    {"requests": {f"example.com/{'r' * 200}{i}": 1 for i in range(3)}},
]


@pytest.mark.parametrize("gpu_resources", [GPU_RESOURCES, (GPU,)])
def test_containers_read_again_give_what_a_first_reading_gives(
    gpu_resources: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    def read(resources: dict[str, Any]) -> tuple[Any, list[FieldError]]:
        errors: list[FieldError] = []
        facts = read_pod_template(template({"name": "c", "resources": resources}), "t", errors,
                                  gpu_resources=gpu_resources)
        return (dict(facts.requests), dict(facts.gpus)), errors

    first = [read(r) for r in CONTAINER_SEQUENCE]
    again = [read(r) for r in CONTAINER_SEQUENCE]  # answered by the memo where it keeps the container
    assert again == first
    for resources, answer in zip(CONTAINER_SEQUENCE, first, strict=True):
        monkeypatch.setattr(templates, "_AMOUNTS", BoundedMemo(templates.AMOUNTS_MEMO_SIZE))
        monkeypatch.setattr(templates, "_QUANTITIES", BoundedMemo(templates.QUANTITY_MEMO_SIZE))
        assert read(resources) == answer, resources
    assert first[1][1] and not first[0][1]  # True is no quantity, 1 is
    assert first[11][1] and first[12][1]  # problems are reported however often the container is read


def test_memo_of_containers_keeps_only_few_short_entries_read_without_a_problem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memo = BoundedMemo[Any, Any](templates.AMOUNTS_MEMO_SIZE)
    monkeypatch.setattr(templates, "_AMOUNTS", memo)
    for resources in CONTAINER_SEQUENCE[10:]:  # a problem, a long value, too many entries, too many characters
        read_pod_template(template({"name": "c", "resources": resources}), "t", [], gpu_resources=GPU_RESOURCES)
    assert len(memo) == 0
    read_pod_template(template({"name": "c", "resources": CONTAINER_SEQUENCE[0]}), "t", [], gpu_resources=GPU_RESOURCES)
    assert len(memo) == 1


def test_requests_of_a_container_read_again_are_a_dict_of_its_own() -> None:
    tpl = template({"name": "c", "resources": {"requests": {"cpu": "3"}}},
                   {"name": "d", "resources": {"requests": {"cpu": "1"}}})
    for _ in range(3):  # the second container adds to the first's requests: the memo's copy stays as read
        facts = read_pod_template(tpl, "t", [], gpu_resources=GPU_RESOURCES)
        assert dict(facts.requests) == {"cpu": 4000}


def test_every_bad_field_of_a_template_is_named_in_reading_order() -> None:
    """Structure first, then every container's name, every port, the account and host network, every request
    (containers, init containers, overhead), placement and claims: the order users have always been shown."""
    tpl = {
        "metadata": {"labels": {"a": 1}},
        "spec": {
            "containers": [
                {"name": 1, "ports": [{"containerPort": 0}], "resources": {"limits": {GPU: "x"}}},
                {"name": "b", "ports": "p", "resources": {"requests": []}},
                3,
            ],
            "initContainers": [{"name": "i", "resources": {"limits": {GPU: "y"}}}, 4],
            "serviceAccountName": 5,
            "serviceAccount": 6,
            "hostNetwork": "x",
            "overhead": {"cpu": "z"},
            "nodeSelector": {"a": 1},
            "affinity": {"nodeAffinity": []},
            "tolerations": [1],
            "resourceClaims": [2],
        },
    }
    errors: list[FieldError] = []
    read_pod_template(tpl, "t", errors, gpu_resources=(GPU,))
    assert errors == [
        FieldError("t.metadata.labels.a", "must be a string, got integer"),
        FieldError("t.spec.containers[2]", "must be an object, got integer"),
        FieldError("t.spec.initContainers[1]", "must be an object, got integer"),
        FieldError("t.spec.containers[0].name", "must be a string, got integer"),
        FieldError("t.spec.containers[0].ports[0].containerPort", "must be an integer in 1..65535"),
        FieldError("t.spec.containers[1].ports", "must be a list, got string"),
        FieldError("t.spec.serviceAccountName", "must be a string, got integer"),
        FieldError("t.spec.serviceAccount", "must be a string, got integer"),
        FieldError("t.spec.hostNetwork", "must be a boolean, got string"),
        FieldError("t.spec.containers[0].resources.limits[nvidia.com/gpu]", "must be a whole non-negative quantity"),
        FieldError("t.spec.containers[1].resources.requests", "must be an object, got list"),
        FieldError(
            "t.spec.initContainers[0].resources.limits[nvidia.com/gpu]", "must be a whole non-negative quantity"
        ),
        FieldError("t.spec.overhead.requests.cpu", "must be a non-negative quantity (like 500m, 2Gi)"),
        FieldError("t.spec.nodeSelector.a", "must be a string, got integer"),
        FieldError("t.spec.affinity.nodeAffinity", "must be an object, got list"),
        FieldError("t.spec.tolerations[0]", "must be an object, got integer"),
        FieldError("t.spec.resourceClaims[0]", "must be an object, got integer"),
    ]
