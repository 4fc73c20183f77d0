"""The shared admission scenarios (fixtures/scenarios, copied from the acceptance suite) through HTTPS.

Each scenario gets its own server (its own snapshot and config). The HTTP answer must equal what
the in-process pipeline (the code behind `topoguard review`) answers for the same review, and meet
the scenario's expectations: allowed or not, the zone every replica is confined to after the patch,
the labels, the denial message, and a no-op second review of the patched job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.admission import pipeline
from app.cache.files import build_snapshot
from app.cache.store import StaticStore
from app.config import Settings
from app.http.app import create_app
from app.tls import KeyPair
from tests.integration.conftest import (
    RunningServer,
    admission_review,
    apply_patch,
    check_review_envelope,
    https_client,
    load_scenario,
    patch_ops,
    replica_templates,
    scenario_objects,
    schedulable_zones,
)

SCENARIOS = [
    "capacity-picks-zone-with-free-gpus",
    "lab-pytorchjob-managed-zone-label",
    "ssh-deny-overlay-admits-pytorchjob",
    "tfjob-avoids-blocked-zone",
    "validate-split-pin-denied",
]


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in SCENARIOS])
def test_scenario_through_https(serve: Callable[..., RunningServer], server_pair: KeyPair, name: str) -> None:
    scenario = load_scenario(name)
    expect: dict[str, Any] = scenario["expect"]
    objects = scenario_objects(scenario)
    settings = Settings.model_validate(scenario.get("config") or {})
    snapshot = build_snapshot(objects)
    operation = scenario.get("operation", "mutate")
    server = serve(create_app(settings, StaticStore(snapshot)))
    job = scenario["object"]
    review = admission_review(job)

    with https_client(server, server_pair) as client:
        got = client.post(f"/{operation}", json=review)
        assert got.status_code == 200
        answer = got.json()
        response = check_review_envelope(answer, review["request"]["uid"])
        in_process = pipeline.answer(pipeline.parse_review(review), snapshot=snapshot, settings=settings,
                                      operation=operation)
        assert answer == in_process.review  # one code path with `topoguard review`

        assert response["allowed"] is expect["allowed"], response.get("status")
        if not response["allowed"]:
            text = response["status"]["message"] + " ".join(response.get("warnings") or [])
            assert any(w.lower() in text.lower() for w in expect.get("message_contains_any") or [""])
            return

        patched = apply_patch(job, patch_ops(response))
        nodes = [o for o in objects if o.get("kind") == "Node"]
        for replica, template in replica_templates(patched).items():
            spec = template.get("spec") or {}
            if "zone" in expect:
                assert schedulable_zones(spec, nodes, settings.zone_label) == {expect["zone"]}, replica
            labels = (template.get("metadata") or {}).get("labels") or {}
            for key, value in (expect.get("labels") or {}).items():
                assert labels.get(key) == value, replica

        if expect.get("idempotent", True):
            again = client.post(f"/{operation}", json=admission_review(patched))
            again_response = check_review_envelope(again.json(), None)
            assert again_response["allowed"] is True
            assert patch_ops(again_response) == []


def test_blocked_zone_shows_in_reason_and_flow_metrics(
    serve: Callable[..., RunningServer], server_pair: KeyPair
) -> None:
    scenario = load_scenario("tfjob-avoids-blocked-zone")
    settings = Settings.model_validate(scenario["config"])
    server = serve(create_app(settings, StaticStore(build_snapshot(scenario_objects(scenario)))))
    with https_client(server, server_pair) as client:
        assert client.post("/mutate", json=admission_review(scenario["object"])).json()["response"]["allowed"]
        text = client.get("/metrics").text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("topoguard_zone_blocked_flows", (("zone", "zone-a"),))] > 0  # the quarantined PS
    assert samples[("topoguard_zone_blocked_flows", (("zone", "zone-c"),))] == 0  # the chosen zone
    assert samples[("topoguard_decision_reasons_total", (("reason", "network-deny"),))] >= 1
