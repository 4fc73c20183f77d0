"""The per-job opt-out: `topoguard.io/skip: "true"` honoured only where the namespace allows it, never silently."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from app.admission import pipeline
from app.cache.files import load_snapshot
from app.cache.store import StaticStore
from app.commands.review import wrap_job
from app.config import Settings
from app.http.app import create_app

ROOT = Path(__file__).resolve().parents[3]
LAB_JOB = yaml.safe_load((ROOT / "examples" / "pytorchjob-lab.yaml").read_text())
SETTINGS = Settings(zone_identity_label="zone")


def lab_snapshot(tmp_path: Path, *, allow_skip: bool) -> Any:
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / "lab-cluster.yaml").read_text()) if d]
    for doc in docs:
        if doc["kind"] == "Namespace" and allow_skip:
            doc["metadata"].setdefault("labels", {})["topoguard.io/allow-skip"] = "true"
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return load_snapshot(path)


def skipping_job() -> dict[str, Any]:
    job = copy.deepcopy(LAB_JOB)
    job["metadata"].setdefault("annotations", {})["topoguard.io/skip"] = "true"
    return job


def answer(job: dict[str, Any], snapshot: Any, operation: pipeline.Operation = "mutate") -> pipeline.Outcome:
    return pipeline.answer(pipeline.parse_review(wrap_job(job)), snapshot=snapshot, settings=SETTINGS,
                            operation=operation)


def test_a_skip_the_namespace_allows_is_admitted_unchecked_and_written_on_the_job(tmp_path: Path) -> None:
    snapshot = lab_snapshot(tmp_path, allow_skip=True)
    got = answer(skipping_job(), snapshot)
    assert (got.outcome, got.skip, got.decision) == ("skipped", "honoured", None)
    ops = json.loads(base64.b64decode(got.review["response"]["patch"]))
    value = "skipped: topoguard.io/skip=true, allowed by namespace ml-demo (topoguard.io/allow-skip=true)"
    assert ops == [{"op": "add", "path": "/metadata/annotations/topoguard.io~1decision", "value": value}]
    # Applying the webhook twice gives an empty patch.
    again = skipping_job()
    again["metadata"]["annotations"]["topoguard.io/decision"] = value
    assert "patch" not in answer(again, snapshot).review["response"]
    assert answer(skipping_job(), snapshot, "validate").review["response"] == {
        "uid": got.review["response"]["uid"], "allowed": True,
        "auditAnnotations": {"outcome": "skipped", "skip": "honoured"}}


def test_a_skip_elsewhere_is_ignored_with_a_warning_saying_why(tmp_path: Path) -> None:
    snapshot = lab_snapshot(tmp_path, allow_skip=False)
    got = answer(skipping_job(), snapshot)
    plain = answer(copy.deepcopy(LAB_JOB), snapshot)
    assert (got.outcome, got.skip) == (plain.outcome, "ignored") == ("patched", "ignored")
    assert got.review["response"]["warnings"][0] == (
        "topoguard: topoguard.io/skip=true ignored: namespace ml-demo is not labelled topoguard.io/allow-skip=true, "
        "so PyTorchJob ml-demo/ml-training is checked as usual")
    assert got.decision is not None and plain.decision is not None
    assert got.decision.zone == plain.decision.zone == "zone-a"  # judged exactly as without the request


@pytest.mark.parametrize("allow, result", [(True, "honoured"), (False, "ignored")])
def test_skip_requests_are_counted(tmp_path: Path, allow: bool, result: str) -> None:
    app = create_app(SETTINGS, StaticStore(lab_snapshot(tmp_path, allow_skip=allow)))
    with TestClient(app) as client:
        got = client.post("/mutate", json=wrap_job(skipping_job()))
        assert got.status_code == 200 and got.json()["response"]["allowed"]
        metrics = client.get("/metrics").text
    assert f'topoguard_skip_requests_total{{result="{result}"}} 1.0' in metrics
