"""The ClusterNetworkPolicy objects the tests and the oracle's generator use are ones the CRD accepts
(sigs.k8s.io/network-policy-api v0.2.0, copied into tests/unit/policy/data), so the cases compare Cilium and
topoguard on objects that can exist in a cluster."""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.crd import structural
from tests.unit.policy.test_policy_kcnp import INVALID, KCNPS

CRD = Path(__file__).parent / "data" / "policy.networking.k8s.io_clusternetworkpolicies.yaml"
ROOT = Path(__file__).resolve().parents[3]


@cache
def schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    root = dict(version["schema"]["openAPIV3Schema"])
    # structural.check skips ObjectMeta (the apiserver validates it), so it is not required here either.
    root["required"] = [r for r in root.get("required", []) if r != "metadata"]
    return root


def kcnps(policies: Any) -> list[dict[str, Any]]:
    return [p for p in policies if p.get("kind") == "ClusterNetworkPolicy"]


@pytest.mark.parametrize("case", KCNPS)
def test_table_policies_are_accepted_by_the_crd(case: Any) -> None:
    for policy in kcnps(case.policies):
        assert structural.check(policy, schema()) == structural.Findings(), policy


def test_generated_policies_are_accepted_by_the_crd() -> None:
    spec = importlib.util.spec_from_file_location("oracle_cases", ROOT / "hack" / "oracle" / "cases.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("oracle_cases", module)
    spec.loader.exec_module(module)
    generated = module.Generator(14, kinds=("ClusterNetworkPolicy",)).cases(200)
    policies = [p for case in generated for p in kcnps(case["policies"])]
    assert len(policies) > 200
    for policy in policies:
        assert structural.check(policy, schema()) == structural.Findings(), policy


# The enum checks; the priority maximum and the range rule (CEL) are the apiserver's, not structural.py's.
@pytest.mark.parametrize("policy", [INVALID[0].values[0], INVALID[2].values[0]], ids=["tier", "action"])
def test_invalid_table_policies_are_refused_by_the_crd(policy: dict[str, Any]) -> None:
    found = structural.check(policy, schema())
    assert found.errors or found.pruned, policy
