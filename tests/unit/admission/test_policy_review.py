"""POST /validate-policy (app/admission/policy_changes.py): the validating webhook on policy objects.

warn by default with warnings naming the jobs and flows; deny opt-in (config, namespace label) with a
break-glass annotation; only jobs of the policy's own namespace named; topoguard's own pods always warn;
what it cannot judge is admitted with a warning; Events only for stored changes.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from app.admission import pipeline, policy_changes
from app.cache import projections
from app.cache.files import load_snapshot
from app.cache.store import StaticStore
from app.config import PolicyChangeSettings, Settings, load_settings
from app.engine import budget
from app.engine.whatif import Change, JobImpact
from app.http.app import create_app
from app.models.cluster import Snapshot
from tests.builders import make_namespace, make_pod

ROOT = Path(__file__).resolve().parents[3]
CLUSTERS = ROOT / "tests" / "data" / "clusters"
LOCK = ROOT / "examples" / "what-if" / "lock-coordinator.yaml"
SETTINGS = load_settings(str(CLUSTERS / "lab-config.yaml"))
DENY = SETTINGS.model_copy(update={"policy_changes": PolicyChangeSettings(enforcement="deny")})


def lab(**labels: str) -> Snapshot:
    snap = load_snapshot(CLUSTERS / "lab-audit-after.yaml")
    if labels:
        ns = snap.namespaces["ml-demo"]
        snap = dataclasses.replace(snap, namespaces={**snap.namespaces,
                                                     "ml-demo": make_namespace("ml-demo", {**ns.labels, **labels})})
    return snap


def lock() -> dict[str, Any]:
    return next(yaml.safe_load_all(LOCK.read_text()))


def review(obj: dict[str, Any] | None, *, operation: str = "CREATE", old: dict[str, Any] | None = None,
           dry_run: bool = False, kind: str = "CiliumNetworkPolicy") -> dict[str, Any]:
    meta = (obj or old or {}).get("metadata", {})
    group, version = {"CiliumNetworkPolicy": ("cilium.io", "v2"), "NetworkPolicy": ("networking.k8s.io", "v1"),
                      "CiliumClusterwideNetworkPolicy": ("cilium.io", "v2")}[kind]
    request: dict[str, Any] = {
        "uid": "3f6b7e2c-0000-4000-8000-000000000001", "operation": operation,
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
        "name": meta.get("name"), "namespace": meta.get("namespace"), "dryRun": dry_run,
        "userInfo": {"username": "security@example.com"},
    }
    if obj is not None:
        request["object"] = obj
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def answer(body: dict[str, Any], snapshot: Snapshot, settings: Settings = SETTINGS,
           **kw: Any) -> policy_changes.PolicyOutcome:
    return policy_changes.answer(pipeline.parse_review(body), snapshot=snapshot, settings=settings, **kw)


def test_warn_admits_a_breaking_change_with_warnings_naming_job_and_flow() -> None:
    got = answer(review(lock()), lab())
    response = got.review["response"]
    assert response["allowed"] is True and got.outcome == "warned"
    assert response["warnings"][0].startswith(
        "topoguard: CiliumNetworkPolicy ml-demo/lock-coordinator would break the required connections of 1 "
        "training job; admitted (policyChanges.enforcement=warn)")
    assert response["warnings"][1:] == [
        "PyTorchJob ml-demo/ml-training: Worker → Master TCP/23456 (rendezvous): allow → deny by "
        "CiliumNetworkPolicy ml-demo/lock-coordinator ingressDeny[0]"]
    assert [j.ref for j in got.events] == ["PyTorchJob ml-demo/ml-training"]


def test_a_dry_run_gets_the_same_warnings_and_leaves_no_event() -> None:
    stored, dry = answer(review(lock()), lab()), answer(review(lock(), dry_run=True), lab())
    assert dry.review == stored.review
    assert dry.events == ()


@pytest.mark.parametrize("settings, labels, allowed", [
    (DENY, {}, False),
    (SETTINGS, {"topoguard.io/policy-changes": "deny"}, False),
    (DENY, {"topoguard.io/policy-changes": "warn"}, True),
])
def test_deny_by_config_or_namespace_label(settings: Settings, labels: dict[str, str], allowed: bool) -> None:
    got = answer(review(lock()), lab(**labels), settings)
    response = got.review["response"]
    assert response["allowed"] is allowed
    if not allowed:
        assert response["status"]["code"] == 403
        assert response["status"]["message"].startswith(
            "topoguard: CiliumNetworkPolicy ml-demo/lock-coordinator would break the required connections of "
            "PyTorchJob ml-demo/ml-training: Worker → Master TCP/23456 (rendezvous): allow → deny by")
        assert got.events == ()  # refused: nothing is stored


def test_break_glass_admits_under_deny_with_the_warnings() -> None:
    policy = lock()
    policy["metadata"]["annotations"] = {"topoguard.io/break-glass": "true"}
    got = answer(review(policy), lab(), DENY)
    assert got.review["response"]["allowed"] is True
    assert "(break-glass)" in got.review["response"]["warnings"][0]
    assert got.events


def test_an_additive_change_is_admitted_silently() -> None:
    metrics = yaml.safe_load((ROOT / "examples" / "what-if" / "allow-metrics.yaml").read_text())
    got = answer(review(metrics), lab(), DENY)
    assert got.review["response"]["allowed"] is True and "warnings" not in got.review["response"]
    assert got.outcome == "unchanged"


def test_delete_of_the_allow_that_keeps_a_default_deny_open_is_judged() -> None:
    snap = lab()
    # Another policy selects the Master and allows only `trusted`: deleting allow-intra-zone-a breaks the job.
    extra = {"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
             "metadata": {"name": "only-trusted", "namespace": "ml-demo"},
             "spec": {"endpointSelector": {"matchLabels": {"role": "coordinator"}},
                      "ingress": [{"fromEndpoints": [{"matchLabels": {"trusted": "yes"}}]}]}}
    snap = dataclasses.replace(snap, policies=(*snap.policies, projections.project_policy(extra)))
    old = {"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy",
           "metadata": {"name": "allow-intra-zone-a", "namespace": "ml-demo"}}
    got = answer(review(None, operation="DELETE", old=old), snap, DENY)
    assert got.review["response"]["allowed"] is False
    assert "CiliumNetworkPolicy ml-demo/only-trusted" in got.review["response"]["status"]["message"]


def test_a_namespaced_policy_names_no_other_tenants_job() -> None:
    other = dict(lock(), metadata={"name": "lock-coordinator", "namespace": "team-b"})
    got = answer(review(other), lab())
    assert got.outcome == "unchanged" and got.result is not None and got.result.jobs == ()


def test_a_change_selecting_topoguards_own_pods_always_warns() -> None:
    snap = lab()
    me = make_pod("topoguard-abc", namespace="topoguard", labels={"app.kubernetes.io/name": "topoguard",
                                                                 "app.kubernetes.io/instance": "topoguard"})
    snap = dataclasses.replace(snap, pods=(*snap.pods, me), pod_index=None)
    isolate = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "default-deny", "namespace": "topoguard"},
               "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}
    own = policy_changes.own_pods(snap, "topoguard", "topoguard-abc")
    assert [p.name for p in own] == ["topoguard-abc"]
    got = answer(review(isolate, kind="NetworkPolicy"), snap, DENY, own=own)
    response = got.review["response"]
    assert response["allowed"] is True
    assert response["warnings"][0].startswith(
        "topoguard: NetworkPolicy topoguard/default-deny selects topoguard's own pods (topoguard/topoguard-abc)")


def test_a_cache_problem_admits_with_a_warning() -> None:
    got = answer(review(lock()), lab(), DENY, cache_problem="cache not synced yet")
    assert got.review["response"]["allowed"] is True
    assert "was not checked against the training jobs: cache not synced yet" in got.review["response"]["warnings"][0]


def test_other_kinds_and_subresources_are_skipped() -> None:
    body = review(lock())
    body["request"]["subResource"] = "status"
    assert answer(body, lab(), DENY).outcome == "skipped"


def test_the_route_answers_and_records_events_for_stored_changes(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")  # the log line of each answer is built (its keys must not clash with LogRecord's)
    recorded: list[tuple[Change, list[JobImpact]]] = []
    app = create_app(SETTINGS, StaticStore(lab()), policy_events=lambda c, jobs: recorded.append((c, list(jobs))))
    with TestClient(app) as client:
        dry = client.post("/validate-policy", json=review(lock(), dry_run=True))
        stored = client.post("/validate-policy", json=review(lock()))
        bad = client.post("/validate-policy", content=b"{", headers={"content-type": "application/json"})
        metrics = client.get("/metrics").text
    assert dry.status_code == stored.status_code == 200
    assert dry.json()["response"]["warnings"] == stored.json()["response"]["warnings"]
    assert bad.status_code == 400
    assert [(c.ref, [j.ref for j in jobs]) for c, jobs in recorded] == [
        ("CiliumNetworkPolicy ml-demo/lock-coordinator", ["PyTorchJob ml-demo/ml-training"])]
    assert 'operation="validate-policy"' in metrics
    judged = [r for r in caplog.records if r.getMessage() == "policy change judged"]
    assert [(r.__dict__["what_if"], r.__dict__["dry_run"]) for r in judged] == [("breaks", True), ("breaks", False)]


def test_events_are_deduplicated_like_the_audits() -> None:
    from app.controller.policy_events import PolicyChangeEvents
    from app.engine.whatif import what_if

    class Api:
        def __init__(self) -> None:
            self.calls: list[tuple[str, str, Any]] = []
            self.names: set[str] = set()

        def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
            from app.cache.errors import ApiError
            self.calls.append((method, path, body))
            if method == "POST":
                if body["metadata"]["name"] in self.names:
                    raise ApiError(409, "AlreadyExists", "exists")
                self.names.add(body["metadata"]["name"])
            return {}

    api = Api()
    events = PolicyChangeEvents(api, instance="topoguard-0")  # type: ignore[arg-type]
    result = what_if(lab(), SETTINGS, [Change.apply(projections.project_policy(lock()))])
    events(result.changes[0], result.broken)
    events(result.changes[0], result.broken)  # the same change again: the Event's series goes on
    PolicyChangeEvents(api, instance="topoguard-1")(result.changes[0], result.broken)  # on another replica
    methods = [m for m, _, _ in api.calls]
    assert methods == ["POST", "PATCH", "POST", "PATCH"]  # the other replica's create is 409: it continues it
    event = api.calls[0][2]
    assert (event["reason"], event["action"], event["reportingController"]) == (
        "TopoguardPolicyChange", "PolicyChange", "topoguard.io/policy-changes")
    assert event["regarding"]["name"] == "ml-training"
    assert event["note"].startswith("Apply of CiliumNetworkPolicy ml-demo/lock-coordinator breaks connections this "
                                    "job needs: Worker → Master TCP/23456 (rendezvous): allow → deny by")
    assert json.dumps(event)


def test_a_change_not_judged_in_time_is_admitted_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    def slow(*args: Any, **kwargs: Any) -> policy_changes.PolicyOutcome:
        while True:  # a what-if of many jobs: the engine checks the deadline once per job
            time.sleep(0.01)
            budget.check()

    monkeypatch.setattr(policy_changes, "answer", slow)
    settings = DENY.model_copy(update={"policy_changes": PolicyChangeSettings(enforcement="deny",
                                                                              deadline_seconds=0.3)})
    with TestClient(create_app(settings, StaticStore(lab()))) as client:
        got = client.post("/validate-policy", json=review(lock()))
    response = got.json()["response"]
    assert got.status_code == 200 and response["allowed"] is True
    assert response["warnings"] == ["topoguard: the change was not checked against the training jobs (no answer "
                                    "within the 0.3s deadline); it is admitted unchecked"]
