"""app.metrics keeps handles to the labelled series it records per review; the exported series stay the same.

Reference: the same calls made through prometheus_client's `.labels()` every time, as before issue 4.
"""

from __future__ import annotations

import pytest

from app import metrics as metrics_module
from app.metrics import Metrics
from tests.unit.test_metrics import samples

REVIEWS = [
    ("mutate", "PyTorchJob", "patched", 0.003),
    ("mutate", "PyTorchJob", "patched", 0.02),
    ("validate", "PyTorchJob", "denied", 0.2),
    ("mutate", "other", "skipped", 0.0005),
    ("mutate", "", "bad-request", 0.0001),
    ("mutate", "PyTorchJob", "patched", 9.0),
    ("mutate", "PyTorchJob", "denied", 0.004),
]
REASONS = [{"capacity": 1, "network-deny": 2}, {"capacity": 3}, {"split": 1}]
# A zone's value repeated, changed and changed back: the gauge must follow (the repeats are not re-set).
BLOCKED = [{"zone-a": 2, "zone-b": 0}, {"zone-a": 1}, {"zone-a": 1, "zone-b": 0}, {"zone-c": 4, "zone-b": 5},
           {"zone-a": 2}]


def _record(m: Metrics) -> None:
    for operation, kind, outcome, seconds in REVIEWS:
        m.record_review(operation=operation, kind=kind, outcome=outcome, duration_seconds=seconds)
    for reasons in REASONS:
        m.record_reasons(reasons)
    for blocked in BLOCKED:
        m.record_blocked_flows(blocked)


def _reference(times: int = 1) -> Metrics:
    m = Metrics()
    for operation, kind, outcome, seconds in REVIEWS * times:
        m.reviews.labels(operation=operation, kind=kind, outcome=outcome).inc()
        m.review_duration.labels(operation=operation).observe(seconds)
    for reasons in REASONS * times:
        for reason, count in reasons.items():
            m.decision_reasons.labels(reason=reason).inc(count)
    for blocked in BLOCKED * times:
        for zone, count in blocked.items():
            m.zone_blocked_flows.labels(zone=zone).set(count)
    return m


def _exported(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample but the `_created` timestamps, which differ between two registries."""
    return {key: value for key, value in samples(m).items() if not key[0].endswith("_created")}


def test_the_exported_series_are_those_labels_gives() -> None:
    m = Metrics()
    _record(m)
    assert _exported(m) == _exported(_reference())


def test_past_the_cap_series_are_still_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_module, "MAX_CACHED_SERIES", 1)
    m = Metrics()
    _record(m)
    _record(m)
    assert _exported(m) == _exported(_reference(times=2))
    assert {len(c) for c in (m._review_counts, m._review_durations, m._reason_counts, m._zone_blocked_flows)} == {1}
