"""`topoguard review`: prints the server's answer, exit 0 when answered, 2 with a message on unusable input."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from app import cli
from app.admission import pipeline
from app.cache.files import load_snapshot
from app.config import load_settings

DATA = Path(__file__).resolve().parents[2] / "data"
LAB = DATA / "clusters" / "lab.yaml"
LAB_CONFIG = DATA / "clusters" / "lab-config.yaml"
LAB_REVIEW = DATA / "reviews" / "lab-pytorchjob-create.json"


def run_review(capsysbinary: pytest.CaptureFixture[bytes], *args: str) -> tuple[int, bytes, str]:
    code = cli.main(["review", *args])
    captured = capsysbinary.readouterr()
    return code, captured.out, captured.err.decode()


def test_review_prints_exactly_what_the_server_sends(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    code, out, err = run_review(capsysbinary, "--cluster", str(LAB), "--config", str(LAB_CONFIG), str(LAB_REVIEW))
    request = pipeline.parse_review(json.loads(LAB_REVIEW.read_text()))
    server = pipeline.answer(request, snapshot=load_snapshot(LAB), settings=load_settings(LAB_CONFIG, environ={}),
                              operation="mutate")
    assert (code, out, err) == (0, orjson.dumps(server.review) + b"\n", "")


def test_review_answers_a_refusal_with_exit_0(capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path) -> None:
    body = json.loads(LAB_REVIEW.read_text())
    body["request"]["object"]["kind"] = "Deployment"
    path = tmp_path / "review.json"
    path.write_text(json.dumps(body))
    code, out, _ = run_review(capsysbinary, "--cluster", str(LAB), str(path))
    response = json.loads(out)["response"]
    assert (code, response["allowed"], response["status"]["code"]) == (0, False, 400)


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "files, args, fragment",
    [
        pytest.param({"r.json": "{not json"}, ["--cluster", str(LAB), "{r.json}"], "is not valid JSON",
                     id="bad JSON exits 2 naming the problem"),
        pytest.param({"r.json": '{"apiVersion": "v1", "kind": "AdmissionReview"}'}, ["--cluster", str(LAB), "{r.json}"],
                     "not a usable AdmissionReview: apiVersion must be", id="a non-review exits 2"),
        pytest.param({}, ["--cluster", str(LAB), "{missing.json}"], "cannot read",
                     id="an unreadable review file exits 2"),
        pytest.param({}, ["--cluster", "{missing-dir}", str(LAB_REVIEW)], "no such file or directory",
                     id="a missing snapshot exits 2"),
        pytest.param({"c.yaml": "mode: sideways\n"}, ["--cluster", str(LAB), "--config", "{c.yaml}", str(LAB_REVIEW)],
                     "mode", id="a bad config exits 2 naming the key"),
    ],
)
def test_unusable_input_exits_2_with_a_message_and_no_output(
    capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path, files: dict[str, str], args: list[str], fragment: str
) -> None:
    for name, text in files.items():
        _write(tmp_path, name, text)
    resolved = [str(tmp_path / a[1:-1]) if a.startswith("{") else a for a in args]
    code, out, err = run_review(capsysbinary, *resolved)
    assert (code, out) == (2, b"")
    assert err.startswith("topoguard review: ") and fragment in err


def test_a_too_deeply_nested_review_exits_2(capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path) -> None:
    body = json.loads(LAB_REVIEW.read_text())
    deep: Any = {}
    for _ in range(150):
        deep = {"x": deep}
    body["request"]["object"]["metadata"]["deep"] = deep
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(body))
    code, out, err = run_review(capsysbinary, "--cluster", str(LAB), str(path))
    assert (code, out) == (2, b"")
    assert err.startswith("topoguard review: not a usable AdmissionReview: ") and "levels deep" in err


def test_review_reads_stdin_and_validates(tmp_path: Path) -> None:
    body: dict[str, Any] = json.loads(LAB_REVIEW.read_text())
    proc = subprocess.run(
        [sys.executable, "-m", "app", "review", "--cluster", str(LAB), "--operation", "validate", "-"],
        input=json.dumps(body), capture_output=True, text=True, timeout=60, check=False,
    )
    response = json.loads(proc.stdout)["response"]
    assert (proc.returncode, response["uid"], "patch" in response) == (0, body["request"]["uid"], False)


def test_the_lab_job_gets_the_labs_fix(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    """Golden: coordinator pinned to zone-a with the GPU-pool toleration and identity label zone=zone-a."""
    code, out, _ = run_review(capsysbinary, "--cluster", str(LAB), "--config", str(LAB_CONFIG), str(LAB_REVIEW))
    response = json.loads(out)["response"]
    got = json.loads(base64.b64decode(response.pop("patch")))
    want = json.loads((DATA / "reviews" / "lab-pytorchjob-create.patch.json").read_text())
    # The summary's wording belongs to the engine; the zone in it is the contract.
    assert got[0]["value"].pop("topoguard.io/decision").startswith("zone=zone-a")
    want[0]["value"].pop("topoguard.io/decision")
    assert (code, got, response) == (0, want, {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True, "patchType": "JSONPatch",
        "auditAnnotations": {"zone": "zone-a", "outcome": "patched"}})
