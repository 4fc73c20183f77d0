"""What the CLI says to a user: every command's help, config errors in the user's words, `review JOB.yaml`."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from app import cli
from app.config import ConfigError, load_settings

ROOT = Path(__file__).resolve().parents[2]
LAB_CLUSTER = ROOT / "examples" / "lab-cluster.yaml"
LAB_JOB = ROOT / "examples" / "pytorchjob-lab.yaml"
LAB_CONFIG = ROOT / "examples" / "config.yaml"


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_every_command_help_has_a_description_defaults_exit_codes_and_an_example(command: str) -> None:
    parser = _subparsers()[command]
    text = parser.format_help()
    assert parser.description and len(parser.description) > 40
    assert "exit codes:\n" in text and "\n  2  " in text
    assert f"example:\n  topoguard {command} " in text
    for action in parser._actions:
        if action.option_strings and action.help != argparse.SUPPRESS:
            assert action.help, f"{command} {action.option_strings} has no help"
        if action.default not in (None, False, argparse.SUPPRESS) and action.dest != "help":
            assert f"(default: {action.default})" in " ".join(text.split()), (command, action.dest)


def test_a_misspelt_key_says_did_you_mean_and_lists_the_valid_keys(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("zoneIdentityLabell: zone\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    message = str(caught.value)
    assert message.startswith(f"config {path}: unknown key 'zoneIdentityLabell' (did you mean 'zoneIdentityLabel'?); "
                              "valid keys: ")
    assert "zoneLabel" in message and "pydantic" not in message and "https://" not in message


def test_a_misspelt_nested_key_names_its_path(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("limits: {podsPerJobb: 3}\n")
    with pytest.raises(ConfigError, match=r"unknown key 'limits\.podsPerJobb' \(did you mean 'podsPerJob'\?\)"):
        load_settings(path, environ={})


@pytest.mark.parametrize(
    "value, want",
    [
        pytest.param("[nvidia.com/gpu]", ("nvidia.com/gpu",), id="a YAML flow list is a list"),
        pytest.param("[nvidia.com/gpu, amd.com/gpu]", ("nvidia.com/gpu", "amd.com/gpu"), id="of two"),
        pytest.param("nvidia.com/gpu,amd.com/gpu", ("nvidia.com/gpu", "amd.com/gpu"), id="comma-separated as before"),
    ],
)
def test_gpu_resources_from_the_environment_read_as_a_list(value: str, want: tuple[str, ...]) -> None:
    assert load_settings(environ={"TOPOGUARD_GPU_RESOURCES": value}).gpu_resources == want


@pytest.mark.parametrize("value", ["[nvidia.com/gpu", "{a: b}", "nvidia.com/gpu]"])
def test_gpu_resources_that_are_no_list_of_names_are_rejected(value: str) -> None:
    with pytest.raises(ConfigError, match="gpuResources: "):
        load_settings(environ={"TOPOGUARD_GPU_RESOURCES": value})


def _review(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "app", "review", "--cluster", str(LAB_CLUSTER), *args],
                          capture_output=True, text=True, timeout=120, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def test_review_wraps_a_job_manifest_in_the_review_the_apiserver_would_send(tmp_path: Path) -> None:
    import yaml

    from app.commands.review import wrap_job

    job = yaml.safe_load(LAB_JOB.read_text())
    review = wrap_job(job)
    request = review["request"]
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert (request["operation"], request["namespace"], request["name"]) == ("CREATE", "ml-demo", "ml-training")
    assert request["kind"] == {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob"}
    assert request["resource"]["resource"] == "pytorchjobs" and request["userInfo"]["username"]
    assert request["uid"] == wrap_job(job)["request"]["uid"]  # the same file, the same uid

    wrapped = tmp_path / "review.json"
    wrapped.write_text(json.dumps(review))
    from_job = _review("--config", str(LAB_CONFIG), str(LAB_JOB))
    from_review = _review("--config", str(LAB_CONFIG), str(wrapped))
    assert from_job[0] == 0 and from_job == from_review
    assert json.loads(from_job[1])["response"]["allowed"] is True


def test_review_of_a_file_that_is_neither_says_so(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text("foo: bar\n")
    code, out, err = _review(str(path))
    assert (code, out) == (2, "")
    want = f"topoguard review: {path} is neither an AdmissionReview nor a job manifest (no apiVersion and kind)\n"
    assert err == want
