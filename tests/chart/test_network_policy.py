"""The chart's CiliumNetworkPolicy, judged by topoguard's own Cilium evaluator (`topoguard reach`).

Pods are stand-ins: the apiserver is an entity (kube-apiserver/host/remote-node) that no pod can
impersonate, so these cases check what the policy shuts out — every ordinary pod, on every port,
in both directions — and that the optional Prometheus rule lets exactly the scraper in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import main
from tests.chart.rendering import NAMESPACE, Render, one

WEBHOOK = f"{NAMESPACE}/topoguard-abc"
SCRAPER_SELECTOR = {"matchLabels": {"k8s:io.kubernetes.pod.namespace": "monitoring",
                                    "app.kubernetes.io/name": "prometheus"}}


def pod(namespace: str, name: str, labels: dict[str, str], ip: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "x",
                                                            "ports": [{"name": "https", "containerPort": 8443}]}]},
            "status": {"phase": "Running", "podIP": ip}}


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}}


@pytest.fixture(scope="module")
def snapshot(render: Render, tmp_path_factory: pytest.TempPathFactory) -> Path:
    objects = render(values={"networkPolicy": {"enabled": True, "metricsFrom": [SCRAPER_SELECTOR]}})
    policy = one(objects, "CiliumNetworkPolicy")
    webhook_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    path = tmp_path_factory.mktemp("cnp") / "cluster.yaml"
    path.write_text(yaml.safe_dump_all([
        namespace(NAMESPACE), namespace("ml-demo"), namespace("monitoring"), policy,
        pod(NAMESPACE, "topoguard-abc", webhook_labels, "10.0.0.5"),
        pod(NAMESPACE, "neighbour", {"app": "other"}, "10.0.0.6"),
        pod("ml-demo", "trainer", {"app": "ml-training"}, "10.0.0.7"),
        pod("monitoring", "prometheus", {"app.kubernetes.io/name": "prometheus"}, "10.0.0.8"),
    ]))
    return path


@pytest.mark.parametrize(("src", "dst", "port", "want"), [
    pytest.param("ml-demo/trainer", WEBHOOK, "8443", "deny", id="a workload pod cannot call the webhook"),
    pytest.param(f"{NAMESPACE}/neighbour", WEBHOOK, "8443", "deny",
                 id="a pod in the webhook's own namespace cannot call it"),
    pytest.param("ml-demo/trainer", WEBHOOK, "22", "deny", id="no other port is open either"),
    pytest.param(WEBHOOK, "ml-demo/trainer", "443", "deny", id="the webhook cannot reach workload pods"),
    pytest.param(WEBHOOK, "monitoring/prometheus", "53", "deny", id="nor anything else (egress is apiserver only)"),
    pytest.param("monitoring/prometheus", WEBHOOK, "8443", "allow", id="the configured scraper reaches /metrics"),
    pytest.param("monitoring/prometheus", WEBHOOK, "9090", "deny", id="the scraper only on the webhook port"),
])
def test_chart_network_policy_verdicts(
    snapshot: Path, capsys: pytest.CaptureFixture[str], src: str, dst: str, port: str, want: str,
) -> None:
    code = main(["reach", "--cluster", str(snapshot), "--from", src, "--to", dst, "--port", port, "-o", "json"])
    got = json.loads(capsys.readouterr().out)
    assert (got["verdict"], code) == (want, {"allow": 0, "deny": 1}[want]), got["reasons"]
    assert got["policyProblems"] == []
