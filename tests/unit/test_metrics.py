"""app.metrics: names, labels, buckets, and one registry per app."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.admission.pipeline import OutcomeName
from app.engine import audit
from app.metrics import (
    AUDIT_FINDING_TYPES,
    AUDIT_PASS_OUTCOMES,
    AUDIT_WRITE_RESOURCES,
    REASON_CLASSES,
    REVIEW_OUTCOMES,
    Metrics,
)


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, _ = metrics.render()
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_every_contract_metric_is_exported_with_the_prefix() -> None:
    m = Metrics()
    m.record_review(operation="mutate", kind="PyTorchJob", outcome="patched", duration_seconds=0.003)
    m.record_reasons({"capacity": 1})
    m.record_cache(synced=True, age_seconds=2.0, objects={"Node": 3})
    m.record_zones({"zone-a": 8})
    m.record_blocked_flows({"zone-b": 2})
    m.record_certificate(1_900_000_000.0)
    names = {name for name, _ in samples(m)}
    assert {
        "topoguard_reviews_total", "topoguard_decision_reasons_total", "topoguard_review_duration_seconds_bucket",
        "topoguard_cache_objects", "topoguard_cache_age_seconds", "topoguard_cache_synced",
        "topoguard_zone_free_gpus", "topoguard_zone_blocked_flows",
        "topoguard_tls_certificate_expiry_timestamp_seconds",
    } <= names


def test_review_histogram_has_the_apiserver_bucket_edges() -> None:
    m = Metrics()
    m.record_review(operation="validate", kind="TFJob", outcome="denied", duration_seconds=0.02)
    got = samples(m)
    edges = {dict(labels)["le"] for name, labels in got if name == "topoguard_review_duration_seconds_bucket"}
    assert {"0.005", "0.025", "0.1"} <= edges
    assert got[("topoguard_review_duration_seconds_bucket", (("le", "0.025"), ("operation", "validate")))] == 1.0
    assert got[("topoguard_review_duration_seconds_bucket", (("le", "0.005"), ("operation", "validate")))] == 0.0
    assert got[("topoguard_reviews_total", (("kind", "TFJob"), ("operation", "validate"), ("outcome", "denied")))] == 1


def test_two_apps_have_independent_registries() -> None:
    a, b = Metrics(), Metrics()
    a.record_review(operation="mutate", kind="PyTorchJob", outcome="patched", duration_seconds=0.001)
    key = ("topoguard_reviews_total", (("kind", "PyTorchJob"), ("operation", "mutate"), ("outcome", "patched")))
    assert samples(a)[key] == 1
    assert key not in samples(b)


def test_zones_that_disappear_are_dropped_from_free_gpus() -> None:
    m = Metrics()
    m.record_zones({"zone-a": 8, "zone-b": 4})
    m.record_zones({"zone-a": 6})
    zones = {dict(labels)["zone"]: v for (name, labels), v in samples(m).items() if name == "topoguard_zone_free_gpus"}
    assert zones == {"zone-a": 6}


def test_cache_synced_is_zero_or_one() -> None:
    m = Metrics()
    m.record_cache(synced=False, age_seconds=0.0, objects={})
    assert samples(m)[("topoguard_cache_synced", ())] == 0
    m.record_cache(synced=True, age_seconds=0.0, objects={})
    assert samples(m)[("topoguard_cache_synced", ())] == 1


DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _help(metrics: Metrics, name: str) -> str:
    body, _ = metrics.render()
    prefix = f"# HELP {name} "
    return next(line[len(prefix):] for line in body.decode().splitlines() if line.startswith(prefix))


def _documented(metric: str, label: str) -> list[str]:
    """The values docs/operations.md lists in parentheses after `label` in the metric's table row."""
    row = next(line for line in DOCS.read_text().splitlines() if line.startswith(f"| `{metric}` "))
    match = re.search(rf"`{label}` \(([^)]*)\)", row)
    assert match, f"docs/operations.md lists no {label} values for {metric}"
    return [v.strip() for v in match.group(1).split(",")]


def test_outcomes_are_what_the_pipeline_and_the_server_emit() -> None:
    assert set(REVIEW_OUTCOMES) == {*get_args(OutcomeName), "bad-request", "timeout", "shed"}
    assert len(REVIEW_OUTCOMES) == len(set(REVIEW_OUTCOMES))


@pytest.mark.parametrize(
    "metric, label, values",
    [
        pytest.param("topoguard_reviews_total", "outcome", REVIEW_OUTCOMES,
                     id="help text and docs list exactly the outcomes emitted"),
        pytest.param("topoguard_decision_reasons_total", "reason", REASON_CLASSES,
                     id="help text and docs list exactly the reason classes emitted"),
        pytest.param("topoguard_audit_findings", "type", AUDIT_FINDING_TYPES,
                     id="help text and docs list exactly the audit finding types"),
        pytest.param("topoguard_audit_passes_total", "outcome", AUDIT_PASS_OUTCOMES,
                     id="help text and docs list exactly the audit pass outcomes"),
        pytest.param("topoguard_audit_writes_total", "resource", AUDIT_WRITE_RESOURCES,
                     id="help text and docs list exactly the resources the audit writes"),
    ],
)
def test_help_text_and_operations_doc_list_the_label_values(metric: str, label: str, values: tuple[str, ...]) -> None:
    assert f"({', '.join(values)})" in _help(Metrics(), metric)
    assert _documented(metric, label) == list(values)


def test_reserved_gpus_per_zone_follow_the_last_snapshot() -> None:
    m = Metrics()
    m.record_reserved({"zone-a": 12, "zone-c": 4})
    m.record_reserved({"zone-a": 8})
    series = samples(m).items()
    got = {dict(labels)["zone"]: v for (name, labels), v in series if name == "topoguard_zone_reserved_gpus"}
    assert got == {"zone-a": 8}


def test_audit_finding_types_are_the_engines() -> None:
    assert AUDIT_FINDING_TYPES == audit.AUDIT_FINDING_TYPES


def test_every_metric_has_a_row_in_the_operations_doc() -> None:
    body, _ = Metrics().render()
    declared = {line.split()[2] for line in body.decode().splitlines() if line.startswith("# HELP ")}
    declared = {re.sub(r"_total$", "", name) for name in declared if not name.endswith("_created")}
    rows = {re.sub(r"_total$", "", m) for m in re.findall(r"^\| `(topoguard_[a-z_]+)` ", DOCS.read_text(), re.M)}
    assert declared <= rows, f"metrics without a row in docs/operations.md: {sorted(declared - rows)}"


def test_a_replica_that_stops_leading_exports_no_findings() -> None:
    m = Metrics()
    m.record_audit_leader(True)
    m.record_audit(jobs=1, findings={"split": 1}, job_findings={("ml", "PyTorchJob", "a"): {"split": 1}},
                   duration_seconds=0.2, finished_at=5.0)
    assert samples(m)[("topoguard_audit_findings", (("type", "split"),))] == 1
    m.record_audit_leader(False)
    got = samples(m)
    assert got[("topoguard_audit_leader", ())] == 0
    assert not any(name in ("topoguard_audit_findings", "topoguard_audit_job_findings") for name, _ in got)


def test_connections_are_counted_by_the_serving_serial_and_only_two_certificates_are_kept() -> None:
    metrics = Metrics()
    for serial in ("A1", "B2", "C3"):
        metrics.record_certificate(1.0, serial)
        metrics.record_certificate(1.0, serial)  # the poller records the same certificate again and again
        metrics.record_connection()
    exported = {dict(labels)["serial"]: value for (name, labels), value in samples(metrics).items()
                if name == "topoguard_tls_connections_total"}
    assert exported == {"B2": 1.0, "C3": 1.0}
