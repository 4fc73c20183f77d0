"""The kind lab's story without kind: the chart's rendered config + deploy/samples + the nodes
hack/kind-up.sh makes, through `topoguard review` exactly as the installed webhook would answer.

What hack/e2e-kind.sh and docs/install.md promise must already hold here: the lab job is pinned to
zone-a with its `zone` label rewritten, the split job is refused naming zone-b, and without
zoneIdentityLabel the refusal names the static label and the blocking policy.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import main
from tests.chart.rendering import RELEASE, ROOT, Render, one

SAMPLES = ROOT / "deploy" / "samples"
NODES = Path(__file__).parent / "data" / "kind-lab-nodes.yaml"


def review_of(job: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "e2e-1", "operation": "CREATE", "namespace": job["metadata"]["namespace"],
        "name": job["metadata"]["name"], "userInfo": {"username": "alice"},
        "kind": {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob"},
        "resource": {"group": "kubeflow.org", "version": "v1", "resource": "pytorchjobs"},
        "object": job, "dryRun": False}}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cluster = tmp_path_factory.mktemp("lab")
    for source in (SAMPLES / "namespace.yaml", SAMPLES / "zone-policies.yaml", NODES):
        shutil.copy(source, cluster / source.name)
    return cluster


def answer(render: Render, lab: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *, sample: str,
           config: dict[str, Any], operation: str = "mutate") -> dict[str, Any]:
    configmap = one(render(values={"config": config}), "ConfigMap", f"{RELEASE}-config")
    (tmp_path / "config.yaml").write_text(configmap["data"]["config.yaml"])
    (tmp_path / "review.json").write_text(json.dumps(review_of(yaml.safe_load((SAMPLES / sample).read_text()))))
    code = main(["review", "--cluster", str(lab), "--config", str(tmp_path / "config.yaml"),
                 "--operation", operation, str(tmp_path / "review.json")])
    assert code == 0
    response: dict[str, Any] = json.loads(capsys.readouterr().out)["response"]
    return response


def patched(response: dict[str, Any]) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def test_lab_job_is_pinned_to_zone_a_with_the_identity_label(
    render: Render, lab: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    response = answer(render, lab, tmp_path, capsys, sample="pytorchjob-lab.yaml", config={"zoneIdentityLabel": "zone"})
    assert response["allowed"] is True
    ops = patched(response)
    annotations = next(op["value"] for op in ops if op["path"] == "/metadata/annotations")
    assert annotations["topoguard.io/zone"] == "zone-a"
    text = json.dumps(ops)
    assert "zone-b" not in text, "nothing left pointing at zone-b"
    assert '"zone-a"' in text


def test_split_job_is_refused_naming_zone_b(
    render: Render, lab: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    for operation in ("mutate", "validate"):
        response = answer(render, lab, tmp_path, capsys, sample="pytorchjob-split.yaml",
                          config={"zoneIdentityLabel": "zone"}, operation=operation)
        assert response["allowed"] is False
        assert response["status"]["code"] == 403
        assert "zone-b" in response["status"]["message"]


def test_without_identity_label_the_refusal_names_the_label_and_the_policy(
    render: Render, lab: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    response = answer(render, lab, tmp_path, capsys, sample="pytorchjob-lab.yaml", config={})
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "zoneIdentityLabel" in message
    assert "ml-demo/deny-cross-zone-gpu-traffic" in message
