"""ServiceMonitor, PrometheusRule, Grafana dashboard and CiliumNetworkPolicy.

The alert and dashboard queries are checked against the metrics app/metrics.py actually declares,
so renaming a metric or a label there fails here instead of leaving a silent dashboard.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from app.metrics import Metrics
from tests.chart.rendering import CHART, NAMESPACE, RELEASE, Render, one

ALL_ON = {
    "metrics": {
        "serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}, "dashboard": {"enabled": True},
    },
    "networkPolicy": {"enabled": True},
}
# Labels Prometheus adds from the scrape target, not from topoguard.
TARGET_LABELS = {"namespace", "service", "pod", "job", "instance", "le"}
# A topoguard series, not part of a recorded series' name (level:metric:operations, the chart's rules).
SELECTOR = re.compile(r"(?<![:\w])(topoguard_[a-z_]+)\s*(\{[^}]*\})?")
RECORDED = re.compile(r"\b([a-z_]+:[a-z_]*topoguard_[a-z_]+:[a-z0-9_]+)\b")
LABEL_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def exported_series() -> dict[str, set[str]]:
    """Series name → label names, for every metric topoguard exports."""
    series: dict[str, set[str]] = {}
    metrics = Metrics()
    for collector in vars(metrics).values():
        name = getattr(collector, "_name", None)
        if name is None:
            continue
        labels = set(getattr(collector, "_labelnames", ()))
        kind = collector._type
        if kind == "counter":
            series[f"{name}_total"] = labels
        elif kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                series[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
        else:
            series[name] = labels
    return series


def check_queries(exprs: list[str]) -> list[str]:
    """Problems with the PromQL in `exprs`: unknown topoguard series or labels they do not carry."""
    exported = exported_series()
    problems = []
    for expr in exprs:
        used = SELECTOR.findall(expr)
        assert used or RECORDED.search(expr), f"no topoguard metric in {expr!r}"
        names = set()
        for name, matchers in used:
            names.add(name)
            if name not in exported:
                problems.append(f"{name}: not exported by app/metrics.py")
                continue
            for label in LABEL_MATCHER.findall(matchers or ""):
                if label not in exported[name] | TARGET_LABELS:
                    problems.append(f"{name}{{{label}}}: no such label")
        if not names:
            continue  # recorded series only: test_recorded_series_come_from_the_rules checks those
        for group in GROUPING.findall(expr):
            for label in (g.strip() for g in group.split(",") if g.strip()):
                # A series' own label that a target label displaces is scraped as exported_<label>.
                own = label.removeprefix("exported_") if label.startswith("exported_") else label
                if not any(own in exported.get(n, set()) | TARGET_LABELS for n in names):
                    problems.append(f"by ({label}) in {expr!r}: no such label")
    return problems


@pytest.fixture(scope="module")
def monitoring_objects(render: Render) -> list[dict[str, Any]]:
    return render(values=ALL_ON)


def test_optional_objects_are_off_by_default(default_objects: list[dict[str, Any]]) -> None:
    present = {o["kind"] for o in default_objects}
    assert present.isdisjoint({"ServiceMonitor", "PrometheusRule", "CiliumNetworkPolicy"})
    assert not [o for o in default_objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]


def test_alerts_cover_split_jobs_blocked_decisions_cache_and_certificate(
    monitoring_objects: list[dict[str, Any]],
) -> None:
    rules = [r for g in one(monitoring_objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert {"TopoguardJobsSplitAcrossZones", "TopoguardBlockedDecisions", "TopoguardCacheNotSynced",
            "TopoguardCertificateNearExpiry", "TopoguardNamespaceWastingGPUs"} <= set(alerts)
    for rule in alerts.values():
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["runbook_url"].endswith("#" + rule["alert"].lower())
        assert f'namespace="{NAMESPACE}",service="{RELEASE}"' in rule["expr"], "scoped to this release's targets"
    assert "topoguard_tls_certificate_expiry_timestamp_seconds" in alerts["TopoguardCertificateNearExpiry"]["expr"]
    assert "< 604800" in alerts["TopoguardCertificateNearExpiry"]["expr"], "7 days by default"
    assert "topoguard_cache_synced" in alerts["TopoguardCacheNotSynced"]["expr"]


def test_alert_queries_use_only_exported_metrics_and_labels(monitoring_objects: list[dict[str, Any]]) -> None:
    rules = [r for g in one(monitoring_objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    exprs = [r["expr"] for r in rules if "absent(up" not in r["expr"] and "DCGM_" not in r["expr"]]
    assert check_queries(exprs) == []


def test_alert_annotations_keep_prometheus_templates(monitoring_objects: list[dict[str, Any]]) -> None:
    rules = [r for g in one(monitoring_objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert "{{ $value | humanize }}" in rules[0]["annotations"]["description"], "Helm must not eat {{ $value }}"


def test_dashboard_queries_use_only_exported_metrics_and_labels(monitoring_objects: list[dict[str, Any]]) -> None:
    configmap = one(monitoring_objects, "ConfigMap", f"{RELEASE}-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["topoguard.json"])
    assert dashboard == json.loads((CHART / "files" / "dashboard.json").read_text())
    assert dashboard["uid"] == "topoguard"
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    assert check_queries(exprs) == []
    used = {m for e in exprs for m, _ in SELECTOR.findall(e)}
    exported = set(exported_series()) - {
        "topoguard_review_duration_seconds_sum", "topoguard_review_duration_seconds_count"}
    assert exported <= used, f"metrics without a panel: {sorted(exported - used)}"


def test_recorded_series_come_from_the_rules(render: Render) -> None:
    """Every recorded series the dashboard and the rules read is recorded by the chart's rules (all optional
    rules on: a price set, DCGM on)."""
    prices = {"monitoring": {"gpuHourPrice": 2.5, "interZoneGBPrice": 0.02, "splitPodGBPerHour": 50}}
    objects = render(values={**ALL_ON, **prices})
    rules = [r for g in one(objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])] + [r["expr"] for r in rules]
    read = {name for e in exprs for name in RECORDED.findall(e)}
    assert read and read <= recorded, f"not recorded by the chart: {sorted(read - recorded)}"


def test_check_queries_catches_a_renamed_metric_or_label() -> None:
    assert check_queries(['sum(rate(topoguard_review_total{outcome="denied"}[5m]))',
                          'sum by (zone) (topoguard_reviews_total{result="x"})']) == [
        "topoguard_review_total: not exported by app/metrics.py",
        "topoguard_reviews_total{result}: no such label",
        "by (zone) in 'sum by (zone) (topoguard_reviews_total{result=\"x\"})': no such label",
    ]


def test_service_monitor_scrapes_https_and_verifies_the_certificate(monitoring_objects: list[dict[str, Any]]) -> None:
    monitor = one(monitoring_objects, "ServiceMonitor")
    service = one(monitoring_objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["scheme"]) == ("https", "/metrics", "https")
    assert endpoint["tlsConfig"] == {"serverName": f"{RELEASE}.{NAMESPACE}.svc",
                                     "ca": {"secret": {"name": f"{RELEASE}-tls", "key": "ca.crt"}}}
    assert "insecureSkipVerify" not in endpoint["tlsConfig"]


def test_network_policy_admits_only_the_apiserver_and_reaches_only_the_apiserver(
    monitoring_objects: list[dict[str, Any]],
) -> None:
    policy = one(monitoring_objects, "CiliumNetworkPolicy")
    deployment = one(monitoring_objects, "Deployment")
    assert policy["spec"]["endpointSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["ingress"] == [{
        "fromEntities": ["kube-apiserver", "host", "remote-node"],
        "toPorts": [{"ports": [{"port": "8443", "protocol": "TCP"}]}],
    }]
    assert policy["spec"]["egress"] == [{
        "toEntities": ["kube-apiserver"],
        "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}, {"port": "6443", "protocol": "TCP"}]}],
    }]


def test_network_policy_can_admit_prometheus(render: Render) -> None:
    scraper = {"matchLabels": {"k8s:io.kubernetes.pod.namespace": "monitoring"}}
    policy = one(render(values={"networkPolicy": {"enabled": True, "metricsFrom": [scraper]}}), "CiliumNetworkPolicy")
    assert policy["spec"]["ingress"][1] == {"fromEndpoints": [scraper],
                                            "toPorts": [{"ports": [{"port": "8443", "protocol": "TCP"}]}]}
