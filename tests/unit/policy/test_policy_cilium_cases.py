"""The documented Cilium cases (a copy of the acceptance file cilium-cases.yaml) through check_flow.

Each case's `expect` (or one of its `accept` verdicts) must come out for a snapshot holding its
policies, two Namespaces and two Pods — the same shape `topoguard reach` reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cache.files import build_snapshot
from app.models.network import PortRange
from app.policy import check_flow, endpoint_for_pod

CASES = yaml.safe_load((Path(__file__).parent / "data" / "cilium-cases.yaml").read_text())


def _pod(name: str, side: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox", "ports": side.get("containerPorts") or []}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": side["namespace"], "labels": side.get("labels") or {}},
        "spec": {"serviceAccountName": side.get("serviceAccountName", "default"), "containers": [container]},
    }


def _objects(case: dict[str, Any]) -> list[dict[str, Any]]:
    namespaces: dict[str, dict[str, str]] = {}
    for side in (case["src"], case["dst"]):
        labels = namespaces.setdefault(side["namespace"], {"kubernetes.io/metadata.name": side["namespace"]})
        labels.update(side.get("namespaceLabels") or {})
    objects = list(case.get("policies") or [])
    objects += [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n, "labels": labels}}
        for n, labels in namespaces.items()
    ]
    return [*objects, _pod("src", case["src"]), _pod("dst", case["dst"])]


@pytest.mark.parametrize("case", [pytest.param(c, id=f"{c['name']}: {c['expect']}") for c in CASES])
def test_documented_case(case: dict[str, Any]) -> None:
    snapshot = build_snapshot(_objects(case))
    src, dst = (endpoint_for_pod(snapshot, p) for p in snapshot.pods)
    mode = (case.get("config") or {}).get("policyEnforcementMode", "default")
    verdict = check_flow(
        snapshot, src, dst, PortRange.single(int(case["port"])), case.get("protocol", "TCP"), enforcement=mode
    )
    assert verdict.verdict in (case.get("accept") or [case["expect"]]), verdict.reasons
