"""PolicyReports (app/controller/reports.py): one per namespace, pass/fail per job and rule, when served."""

from __future__ import annotations

import logging

import pytest

from app.controller.api import Api
from app.controller.loop import job_api_version
from app.controller.reports import PolicyReportWriter, build_report, build_results
from tests.integration.controller_helpers import BLOCKED, SPLIT, FakeClock, fake_api, job


def writer(api: Api, clock: FakeClock, **kwargs: object) -> PolicyReportWriter:
    return PolicyReportWriter(api, api_version_of=job_api_version, clock=clock, wall=clock,
                              **kwargs)  # type: ignore[arg-type]


def test_results_are_pass_or_fail_per_job_and_finding_type() -> None:
    audits = [job("llama", ("split", SPLIT), ("blocked", BLOCKED), zones={"zone-a": 3, "zone-b": 1}), job("clean")]
    report = build_report("ml-demo", build_results(audits, api_version_of=job_api_version))
    assert report["apiVersion"] == "wgpolicyk8s.io/v1alpha2" and report["kind"] == "PolicyReport"
    assert report["metadata"]["name"] == "topoguard"
    assert report["summary"] == {"pass": 6, "fail": 2, "warn": 0, "error": 0, "skip": 0}
    by = {(r["resources"][0]["name"], r["rule"]): r for r in report["results"]}
    assert len(by) == 8
    blocked = by[("llama", "blocked")]
    assert (blocked["result"], blocked["message"], blocked["policy"], blocked["source"]) == (
        "fail", BLOCKED, "topoguard", "topoguard")
    assert blocked["resources"] == [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "namespace": "ml-demo",
                                     "name": "llama", "uid": "uid-ml-demo-llama"}]
    assert blocked["properties"] == {"zones": "zone-a=3,zone-b=1", "pending": "0"}
    assert by[("llama", "unknown")]["result"] == "pass"
    assert {by[("clean", rule)]["result"] for rule in ("split", "blocked", "unknown", "zone-closed")} == {"pass"}
    assert [r["result"] for r in report["results"]][:2] == ["fail", "fail"]  # failing results first


def test_nothing_is_written_while_the_crd_is_absent_and_reports_follow_once_it_is_served(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    audits = [job("llama", ("split", SPLIT))]
    with fake_api(policy_reports=False) as (server, api):
        reports = writer(api, clock, recheck_seconds=60)
        with caplog.at_level(logging.INFO):
            assert not reports.sync(audits).served
            assert not reports.sync(audits).served
        assert [r.message for r in caplog.records].count(
            "audit: the PolicyReport CRD is not served: no PolicyReports written") == 1
        assert server.writes() == []
        discovery = [r for r in server.requests if r.path == "/apis/wgpolicyk8s.io/v1alpha2"]
        assert len(discovery) == 1  # discovered once, not per pass
        server.install_policy_reports()
        assert not reports.sync(audits).served  # not asked again before the recheck
        clock.advance(61)
        assert reports.sync(audits).written == 1
        (report,) = server.objects("PolicyReport")
        assert report["metadata"]["namespace"] == "ml-demo"
        assert report["summary"]["fail"] == 1


def test_a_report_is_written_when_results_change_and_a_cleared_finding_turns_to_pass() -> None:
    clock = FakeClock()
    with fake_api(policy_reports=True) as (server, api):
        reports = writer(api, clock)
        broken = [job("llama", ("split", SPLIT)), job("other", namespace="ml-other")]
        assert reports.sync(broken).written == 2
        clock.advance(30)
        stats = reports.sync(broken)
        assert (stats.written, stats.unchanged) == (0, 2)  # same results: no write
        clock.advance(30)
        assert reports.sync([job("llama"), job("other", namespace="ml-other")]).written == 1
        report = server.get("PolicyReport", "topoguard", "ml-demo")
        assert report is not None
        split = next(r for r in report["results"] if r["rule"] == "split")
        assert split["result"] == "pass"
        assert split["timestamp"]["seconds"] == int(clock.now)  # changed now; the others keep theirs
        unknown = next(r for r in report["results"] if r["rule"] == "unknown")
        assert unknown["timestamp"]["seconds"] == int(clock.now) - 60
        assert report["summary"] == {"pass": 4, "fail": 0, "warn": 0, "error": 0, "skip": 0}
        assert [w[0] for w in server.writes("PolicyReport")] == ["POST", "POST", "PUT"]


def test_a_namespace_without_audited_jobs_loses_its_report() -> None:
    clock = FakeClock()
    with fake_api(policy_reports=True) as (server, api):
        reports = writer(api, clock)
        reports.sync([job("llama"), job("other", namespace="ml-other")])
        assert reports.sync([job("llama")]).deleted == 1
        assert [r["metadata"]["namespace"] for r in server.objects("PolicyReport")] == ["ml-demo"]


def test_a_new_leader_finds_the_reports_by_label_and_updates_them() -> None:
    clock = FakeClock()
    with fake_api(policy_reports=True) as (server, api):
        writer(api, clock).sync([job("llama", ("split", SPLIT)), job("gone", namespace="ml-old")])
        successor = writer(api, clock)
        stats = successor.sync([job("llama", ("split", SPLIT))])
        assert (stats.written, stats.unchanged, stats.deleted, stats.errors) == (0, 1, 1, 0)
        stats = successor.sync([job("llama")])
        assert stats.written == 1
        assert [w[0] for w in server.writes("PolicyReport")] == ["POST", "POST", "DELETE", "PUT"]


def test_a_report_changed_by_someone_else_is_overwritten_not_lost() -> None:
    clock = FakeClock()
    with fake_api(policy_reports=True) as (server, api):
        reports = writer(api, clock)
        reports.sync([job("llama")])
        stored = server.get("PolicyReport", "topoguard", "ml-demo")
        assert stored is not None
        server.apply({**stored, "results": []})  # another writer: our resourceVersion is stale now
        assert reports.sync([job("llama", ("split", SPLIT))]).written == 1
        report = server.get("PolicyReport", "topoguard", "ml-demo")
        assert report is not None and report["summary"]["fail"] == 1


def test_results_past_the_bound_are_dropped_failing_ones_kept() -> None:
    clock = FakeClock()
    with fake_api(policy_reports=True) as (server, api):
        reports = writer(api, clock, max_results=6)
        stats = reports.sync([job("a"), job("b"), job("c", ("blocked", BLOCKED))])
        assert stats.truncated == 6
        (report,) = server.objects("PolicyReport")
        assert len(report["results"]) == 6
        assert report["results"][0]["result"] == "fail"
