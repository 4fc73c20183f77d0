"""Patches applied to upstream example jobs stay valid under the upstream CRD schemas and lose nothing.

Each example is parsed by the real adapter, patched by build_patch for a decision that sets every
kind of field topoguard writes (zone affinity or podAffinity, tolerations, the identity label,
the group label, the hostname spread, the annotations), applied with RFC 6902, and walked
against the CRD's own schema: the examples as written are clean, and so are the patched
objects (no type or list-map errors, nothing pruned).
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from app import jobs
from app.config import Settings
from app.engine import patches
from app.models.decision import Decision
from tests.unit.crd import structural
from tests.unit.crd.jsonpatch import apply_patch

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ZL = "topology.kubernetes.io/zone"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
PIN = Settings(zone_identity_label="zone", spread_within_zone="hostname")
COLOCATE = Settings(mode="colocate", spread_within_zone="hostname")

EXAMPLES = [
    ("pytorchjob-simple.yaml", "pytorchjob-v1"),
    ("pytorchjob-mnist-nccl.yaml", "pytorchjob-v1"),
    ("tfjob-dist-mnist.yaml", "tfjob-v1"),
    ("mpijob-v2beta1-pi.yaml", "mpijob-v2beta1"),
    ("jobset-paralleljobs.yaml", "jobset-v1alpha2"),
    ("jobset-pytorch-mnist.yaml", "jobset-v1alpha2"),
    ("trainjob-multi-node.yaml", "trainjob-v1alpha1"),
    ("trainjob-runtime-patches.yaml", "trainjob-v1alpha1"),
]


@cache
def schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / "schemas" / f"{name}.json").read_text())
    return loaded["openAPIV3Schema"]  # type: ignore[no-any-return]


def example(name: str) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((FIXTURES / "jobs" / name).read_text())
    job["metadata"]["namespace"] = "ml"
    return job


def decision_for(group_keys: list[str], settings: Settings) -> Decision:
    pin = settings.mode == "pin"
    return Decision(
        allowed=True, zone="zone-a" if pin else None, zones=(), reasons=(),
        tolerations={k: (GPU_TOLERATION,) for k in group_keys},
        labels={"zone": "zone-a"} if pin else {}, open_zones=("zone-a", "zone-c"), summary="zone-a: 8 GPUs free",
    )


def patch_example(name: str, settings: Settings) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    job = example(name)
    group = jobs.parse_job(job, gpu_resources=settings.gpu_resources, namespace="ml")
    chosen = decision_for([r.key for r in group.replicas], settings)
    ops = patches.build_patch(job, group, chosen, settings)
    return job, apply_patch(job, ops), ops


CASES = [pytest.param(f, s, settings, id=f"{f.removesuffix('.yaml')} {mode}")
         for f, s in EXAMPLES for mode, settings in (("pin", PIN), ("colocate", COLOCATE))]


@pytest.mark.parametrize("fixture, schema_name, settings", CASES)
def test_patched_example_is_valid_and_nothing_injected_is_pruned(
    fixture: str, schema_name: str, settings: Settings
) -> None:
    job, patched, ops = patch_example(fixture, settings)
    before, after = structural.check(job, schema(schema_name)), structural.check(patched, schema(schema_name))
    assert ops
    assert (before, after) == (structural.Findings(), structural.Findings())


@pytest.mark.parametrize("fixture, schema_name, settings", CASES)
def test_every_replica_template_carries_the_placement(fixture: str, schema_name: str, settings: Settings) -> None:
    _, patched, _ = patch_example(fixture, settings)
    group = jobs.parse_job(patched, gpu_resources=settings.gpu_resources, namespace="ml")
    for replica in group.replicas:
        template = patches.resolve_pointer(patched, replica.template_path)
        spec, pod_labels = template["spec"], template["metadata"]["labels"]
        assert GPU_TOLERATION in spec["tolerations"]
        assert pod_labels.get("zone") == ("zone-a" if settings.mode == "pin" else None)
        for term in spec["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]:
            assert any(e["key"] == ZL for e in term["matchExpressions"])
        if settings.mode == "colocate":
            assert spec["affinity"]["podAffinity"][REQUIRED][0]["topologyKey"] == ZL
        assert ("topologySpreadConstraints" in spec) == group.supports_spread
    where = f"; pods from {group.composed_from}" if group.composed_from else ""
    assert patched["metadata"]["annotations"]["topoguard.io/decision"] == "zone-a: 8 GPUs free" + where


@pytest.mark.parametrize("fixture, schema_name, settings", CASES)
def test_patching_the_patched_example_again_is_a_no_op(fixture: str, schema_name: str, settings: Settings) -> None:
    _, patched, _ = patch_example(fixture, settings)
    group = jobs.parse_job(patched, gpu_resources=settings.gpu_resources, namespace="ml")
    chosen = decision_for([r.key for r in group.replicas], settings)
    assert patches.build_patch(patched, group, chosen, settings) == []


# --- the checker itself must catch what the apiserver would refuse or prune -------------------------

def _trainjob_with_spread() -> dict[str, Any]:
    _, patched, _ = patch_example("trainjob-multi-node.yaml", PIN)
    pod_spec = patched["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod_spec["template"]["spec"]["template"]["spec"]["topologySpreadConstraints"] = [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}]
    return patched


def _pytorchjob_with(spec_fields: dict[str, Any]) -> dict[str, Any]:
    job = copy.deepcopy(example("pytorchjob-simple.yaml"))
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"].update(spec_fields)
    return job


TSC = {"maxSkew": 1, "topologyKey": ZL, "whenUnsatisfiable": "DoNotSchedule"}
WORKER_SPEC = "/spec/pytorchReplicaSpecs/Worker/template/spec"


@pytest.mark.parametrize(
    "job, schema_name, want",
    [
        pytest.param(_trainjob_with_spread(), "trainjob-v1alpha1", structural.Findings(pruned=[
            "/spec/runtimePatches/0/trainingRuntimeSpec/template/spec/replicatedJobs/0/template/spec/template/spec"
            "/topologySpreadConstraints"]), id="a spread constraint in a TrainJob runtime patch is pruned"),
        pytest.param(_pytorchjob_with({"topologySpreadConstraints": [TSC, dict(TSC, maxSkew=2)]}), "pytorchjob-v1",
                     structural.Findings(errors=[
                         f"{WORKER_SPEC}/topologySpreadConstraints/1: Duplicate value ['{ZL}', 'DoNotSchedule']"]),
                     id="a duplicate (topologyKey, whenUnsatisfiable) spread key is rejected"),
        pytest.param(_pytorchjob_with({"tolerations": {"key": "gpu"}}), "pytorchjob-v1",
                     structural.Findings(errors=[f"{WORKER_SPEC}/tolerations: expected array, got dict"]),
                     id="tolerations as an object is rejected"),
        pytest.param(_pytorchjob_with({"affinity": {"zoneAffinity": {}}}), "pytorchjob-v1",
                     structural.Findings(pruned=[f"{WORKER_SPEC}/affinity/zoneAffinity"]),
                     id="an unknown affinity member is pruned"),
    ],
)
def test_the_schema_check_catches_pruning_and_rejections(
    job: dict[str, Any], schema_name: str, want: structural.Findings
) -> None:
    assert structural.check(job, schema(schema_name)) == want
