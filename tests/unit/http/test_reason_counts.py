"""routes._reason_counts: the reason classes of topoguard_decision_reasons_total, from real decisions.

Each case answers the lab review (tests/data) through the admission pipeline against the lab
snapshot, so the classes follow what the engine really reports, not hand-built decisions.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.admission import pipeline
from app.cache.files import load_snapshot
from app.cache.store import StaticStore
from app.config import Settings, load_settings
from app.http import routes
from app.http.deps import AppState
from app.metrics import REASON_CLASSES, Metrics
from app.models.cluster import BoundedMemo
from app.models.decision import Decision

DATA = Path(__file__).resolve().parents[2] / "data"
LAB = load_snapshot(DATA / "clusters" / "lab.yaml")
LAB_REVIEW: dict[str, Any] = json.loads((DATA / "reviews" / "lab-pytorchjob-create.json").read_text())
ZONE = "topology.kubernetes.io/zone"
Edit = Callable[[dict[str, Any]], None]


def _master_spec(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    return spec


def pin_master_to_zone_b(job: dict[str, Any]) -> None:
    _master_spec(job)["nodeSelector"] = {ZONE: "zone-b"}


def as_written(job: dict[str, Any]) -> None:
    pass


def decision_for(edit: Edit, operation: pipeline.Operation, settings: Settings) -> Decision:
    review = copy.deepcopy(LAB_REVIEW)
    edit(review["request"]["object"])
    outcome = pipeline.answer(pipeline.parse_review(review), snapshot=LAB, settings=settings, operation=operation)
    assert outcome.decision is not None
    return outcome.decision


IDENTITY = load_settings(DATA / "clusters" / "lab-config.yaml", environ={})  # zoneIdentityLabel: zone


@pytest.mark.parametrize(
    "edit, operation, settings, want",
    [
        # NB: zone-a also counts under `capacity`: ZoneReport.fits is false when a replica cannot be
        # scheduled there at all, not only when GPUs are short.
        pytest.param(pin_master_to_zone_b, "mutate", IDENTITY, {"split": 1, "capacity": 1},
                     id="mutate: coordinator pinned away from the GPU zone counts as split"),
        pytest.param(as_written, "validate", IDENTITY, {"split": 1, "capacity": 1, "network-deny": 1},
                     id="validate: the lab as written shares no zone and counts as split"),
        pytest.param(as_written, "mutate", Settings(), {"network-deny": 1},
                     id="mutate: a blocked path is network-deny, not split"),
        pytest.param(as_written, "mutate", IDENTITY, {},
                     id="mutate: a placed job counts no reason"),
    ],
)
def test_reason_classes(edit: Edit, operation: pipeline.Operation, settings: Settings, want: dict[str, int]) -> None:
    got = routes._reason_counts(decision_for(edit, operation, settings))
    assert got == want
    assert set(got) <= set(REASON_CLASSES)


def test_split_is_the_decisions_structured_cause_not_its_wording() -> None:
    words = ("the group can be split across zones (Master can run in zone-a, zone-b)",)
    assert routes._reason_counts(Decision(False, None, (), words, split=True)) == {"split": 1}
    assert routes._reason_counts(Decision(False, None, (), words)) == {}


def test_decision_metrics_are_worked_out_once_per_decision_object() -> None:
    state = AppState(settings=Settings(), store=StaticStore(LAB), metrics=Metrics(), workers=None)
    first = decision_for(as_written, "mutate", Settings())
    same_content = copy.deepcopy(first)  # an equal decision, another object: worked out again
    refused = decision_for(pin_master_to_zone_b, "mutate", IDENTITY)
    got = [routes.decision_metrics(state, d) for d in (first, first, same_content, refused)]
    want = [(routes._reason_counts(d), routes._blocked_flows(d)) for d in (first, first, same_content, refused)]
    assert got == want
    assert got[0][1] is got[1][1]  # the second review of a memoized decision reuses the first's facts
    assert got[2][1] is not got[0][1]
    assert len(state.decision_metrics) == 3


def test_decision_metrics_stay_bounded() -> None:
    state = AppState(settings=Settings(), store=StaticStore(LAB), metrics=Metrics(), workers=None)
    state.decision_metrics = BoundedMemo(2)
    decisions = [Decision(False, None, (), (f"reason {i}",), split=True) for i in range(5)]
    for d in decisions:
        assert routes.decision_metrics(state, d) == ({"split": 1}, {})
    assert 1 <= len(state.decision_metrics) <= 2
