"""Node selector and toleration predicates (app/engine/nodes.py), against the Kubernetes semantics."""

from __future__ import annotations

from typing import Any

import pytest

from app.engine import nodes
from app.models.cluster import Taint
from tests.builders import make_placement

LABELS = {"zone": "zone-a", "gpu": "true", "cores": "64"}


@pytest.mark.parametrize(
    "requirement, want",
    [
        pytest.param(
            {"key": "zone", "operator": "In", "values": ["zone-a", "zone-b"]}, True, id="In matches a listed value"
        ),
        pytest.param({"key": "zone", "operator": "In", "values": ["zone-b"]}, False, id="In rejects an unlisted value"),
        pytest.param({"key": "rack", "operator": "In", "values": ["r1"]}, False, id="In rejects a missing key"),
        pytest.param(
            {"key": "zone", "operator": "NotIn", "values": ["zone-b"]}, True, id="NotIn matches another value"
        ),
        pytest.param({"key": "rack", "operator": "NotIn", "values": ["r1"]}, True, id="NotIn matches a missing key"),
        pytest.param(
            {"key": "zone", "operator": "NotIn", "values": ["zone-a"]}, False, id="NotIn rejects a listed value"
        ),
        pytest.param({"key": "gpu", "operator": "Exists"}, True, id="Exists matches a present key"),
        pytest.param({"key": "rack", "operator": "Exists"}, False, id="Exists rejects a missing key"),
        pytest.param({"key": "rack", "operator": "DoesNotExist"}, True, id="DoesNotExist matches a missing key"),
        pytest.param({"key": "gpu", "operator": "DoesNotExist"}, False, id="DoesNotExist rejects a present key"),
        pytest.param({"key": "cores", "operator": "Gt", "values": ["32"]}, True, id="Gt compares integers"),
        pytest.param({"key": "cores", "operator": "Gt", "values": ["64"]}, False, id="Gt is strict"),
        pytest.param({"key": "cores", "operator": "Lt", "values": ["128"]}, True, id="Lt compares integers"),
        pytest.param(
            {"key": "zone", "operator": "Gt", "values": ["1"]}, False, id="Gt on a non-integer label is false"
        ),
        pytest.param(
            {"key": "cores", "operator": "Gt", "values": ["x"]}, False, id="Gt with a non-integer bound is false"
        ),
        pytest.param(
            {"key": "zone", "operator": "in", "values": ["zone-a"]}, False, id="an unknown operator matches nothing"
        ),
    ],
)
def test_match_requirement(requirement: dict[str, Any], want: bool) -> None:
    assert nodes.match_requirement(requirement, LABELS) is want


@pytest.mark.parametrize(
    "selector, terms, want",
    [
        pytest.param({}, [], True, id="no constraints match every node"),
        pytest.param({"gpu": "true"}, [], True, id="nodeSelector matches equal labels"),
        pytest.param({"gpu": "false"}, [], False, id="nodeSelector rejects a different value"),
        pytest.param(
            {},
            [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["zone-b"]}]},
                {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
            ],
            True,
            id="terms are ORed",
        ),
        pytest.param(
            {},
            [
                {
                    "matchExpressions": [
                        {"key": "zone", "operator": "In", "values": ["zone-a"]},
                        {"key": "rack", "operator": "Exists"},
                    ]
                }
            ],
            False,
            id="expressions in one term are ANDed",
        ),
        pytest.param({}, [{}], False, id="an empty term matches nothing"),
        pytest.param(
            {},
            [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}],
            True,
            id="matchFields selects by node name",
        ),
        pytest.param(
            {},
            [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-1"]}]}],
            False,
            id="matchFields NotIn excludes the node",
        ),
        pytest.param(
            {"gpu": "false"},
            [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}],
            False,
            id="nodeSelector and affinity must both match",
        ),
    ],
)
def test_match_placement(selector: dict[str, str], terms: list[dict[str, Any]], want: bool) -> None:
    assert nodes.match_placement(make_placement(selector, terms), LABELS, "gpu-1") is want


GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


@pytest.mark.parametrize(
    "toleration, taint, want",
    [
        pytest.param({"key": "nvidia.com/gpu", "operator": "Exists"}, GPU_TAINT, True, id="Exists on the key"),
        pytest.param({"operator": "Exists"}, GPU_TAINT, True, id="Exists without a key tolerates everything"),
        pytest.param(
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            GPU_TAINT,
            True,
            id="Equal is the default operator",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"},
            GPU_TAINT,
            False,
            id="Equal with another value does not tolerate",
        ),
        pytest.param(
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
            GPU_TAINT,
            False,
            id="another effect does not tolerate",
        ),
        pytest.param({"key": "gpu", "operator": "Exists"}, GPU_TAINT, False, id="another key does not tolerate"),
        pytest.param(
            {"key": "dedicated", "operator": "Exists"},
            Taint("dedicated", "", "NoExecute"),
            True,
            id="a valueless taint is tolerated by Exists",
        ),
    ],
)
def test_tolerates(toleration: dict[str, str], taint: Taint, want: bool) -> None:
    assert nodes.tolerates(toleration, taint) is want


def test_untolerated_ignores_prefer_no_schedule() -> None:
    taints = (GPU_TAINT, Taint("spot", "true", "PreferNoSchedule"), Taint("infra", "", "NoExecute"))
    assert nodes.untolerated(taints, [{"key": "nvidia.com/gpu", "operator": "Exists"}]) == (
        Taint("infra", "", "NoExecute"),
    )


@pytest.mark.parametrize(
    "taint, want",
    [
        pytest.param(
            GPU_TAINT,
            {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
            id="a valued taint gets an Equal toleration",
        ),
        pytest.param(
            Taint("gpu", "", "NoSchedule"),
            {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
            id="a valueless taint gets an Exists toleration",
        ),
    ],
)
def test_toleration_for(taint: Taint, want: dict[str, str]) -> None:
    assert nodes.toleration_for(taint) == want
    assert nodes.tolerates(want, taint)
