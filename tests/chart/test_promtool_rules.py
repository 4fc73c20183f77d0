"""The chart's rules under Prometheus's own engine: every recording rule and alert has a `promtool test rules`
case (tests/chart/promtool/*.test.yaml; hack/chart-lint.sh runs them), and the GPU-hours rule agrees with
the audit loop run over the seed lab's "before" state for two simulated hours.

promtool comes from $TOPOGUARD_PROMTOOL (hack/chart-lint.sh builds it: hack/go-tool.sh promtool); without it
the tests that run it skip.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cache.files import load_snapshot
from app.cache.store import StaticStore
from app.config import load_settings
from app.metrics import Metrics
from tests.chart import promrules
from tests.integration.controller_helpers import FakeClock, fake_api
from tests.integration.test_audit_waste_hour import DATA, lab_controller
from tests.integration.test_controller_loop import samples

PROMTOOL = os.environ.get("TOPOGUARD_PROMTOOL", "")
needs_promtool = pytest.mark.skipif(not PROMTOOL, reason="TOPOGUARD_PROMTOOL not set (make chart-lint builds it)")
# The labels the ServiceMonitor's scrape gives a topoguard series (test files use the same).
TARGET = {"namespace": "topoguard-system", "service": "topoguard", "pod": "topoguard-0", "job": "topoguard",
          "instance": "10.0.0.1:8443"}


def _tests() -> list[dict[str, Any]]:
    return [group for path in sorted(promrules.TESTS.glob("*.test.yaml"))
            for group in yaml.safe_load(path.read_text())["tests"]]


def test_every_recording_rule_and_alert_has_a_promtool_test() -> None:
    rules = [r for g in promrules.rule_groups()["groups"] for r in g["rules"]]
    records = {r["record"] for r in rules if "record" in r}
    alerts = {r["alert"] for r in rules if "alert" in r}
    assert len(alerts) >= 10 and len(records) >= 10
    groups = _tests()
    exprs = " ".join(t["expr"] for g in groups for t in g.get("promql_expr_test", []))
    tested = set(re.findall(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", exprs))
    assert records <= tested, f"recording rules without a promql_expr_test: {sorted(records - tested)}"
    cases = [t for g in groups for t in g.get("alert_rule_test", [])]
    fired = {t["alertname"] for t in cases if t.get("exp_alerts")}
    quiet = {t["alertname"] for t in cases if not t.get("exp_alerts")}
    assert alerts <= fired, f"alerts never expected to fire: {sorted(alerts - fired)}"
    assert alerts <= quiet, f"alerts never expected to stay quiet: {sorted(alerts - quiet)}"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=300, check=False)


def _series(labels: dict[str, str]) -> str:
    """A scraped series' selector: the target's labels, the series' own `namespace` kept as exported_namespace."""
    own = {("exported_namespace" if k == "namespace" else k): v for k, v in labels.items()}
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted({**TARGET, **own}.items())) + "}"


@needs_promtool
def test_the_gpu_hours_rule_agrees_with_two_simulated_hours_of_the_lab(tmp_path: Path) -> None:
    """The audit loop runs a pass a minute over the lab's "before" state (4 GPUs held by a blocked job) for two
    simulated hours; what /metrics says after each pass becomes the input series of a promtool test of the
    chart's rules: 4 GPU-hours in the last hour, 10 at gpuHourPrice 2.5, and 8 GPU-hours over the two."""
    settings = load_settings(DATA / "lab-config.yaml")
    store = StaticStore(load_snapshot(DATA / "lab-audit-before.yaml", gpu_resources=settings.gpu_resources))
    metrics, clock = Metrics(), FakeClock()
    scrapes: list[dict[str, float]] = []
    with fake_api() as (_, api):
        ctl = lab_controller(api, store, metrics, clock)
        for minute in range(121):
            if minute:
                clock.advance(60)
            assert ctl.run_pass() is not None
            scrapes.append({_series(dict(labels)): value for (name, labels), value in samples(metrics).items()
                            if name == "topoguard_audit_gpu_seconds_total"})
    (series,) = set().union(*scrapes)
    assert scrapes[-1][series] == 4 * 7200, "the counter itself: 4 GPUs for two hours"
    values = " ".join(str(s[series]) if series in s else "_" for s in scrapes)
    test = {
        "rule_files": [promrules.RULES_FILE],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": f"topoguard_audit_gpu_seconds_total{series}", "values": values}],
            "promql_expr_test": [
                {"expr": "namespace_finding:topoguard_audit_wasted_gpu_hours:increase1h", "eval_time": "2h",
                 "exp_samples": [{"labels": 'namespace_finding:topoguard_audit_wasted_gpu_hours:increase1h'
                                            '{namespace="ml-demo",finding="blocked"}', "value": 4}]},
                {"expr": "namespace:topoguard_audit_wasted_gpu_cost:increase1h", "eval_time": "2h",
                 "exp_samples": [{"labels": 'namespace:topoguard_audit_wasted_gpu_cost:increase1h'
                                            '{namespace="ml-demo"}', "value": 10}]},
                {"expr": 'sum(namespace_finding:topoguard_audit_wasted_gpu_hours:increase1d)', "eval_time": "2h",
                 "exp_samples": [{"labels": "{}", "value": 8}]},
            ],
        }],
    }
    promrules.write(tmp_path)
    (tmp_path / "lab-hour.test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    done = _promtool("test", "rules", str(tmp_path / "lab-hour.test.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_the_rule_tests_pass_and_fail_when_a_rule_is_wrong(tmp_path: Path) -> None:
    tests = promrules.write(tmp_path / "as-shipped")
    done = _promtool("test", "rules", *map(str, tests))
    assert done.returncode == 0, done.stdout + done.stderr
    # The same tests against rules rendered with another price: the money rules' tests must fail.
    tests = promrules.write(tmp_path / "other-price", values={"monitoring": {"gpuHourPrice": 3}})
    done = _promtool("test", "rules", str(tmp_path / "other-price" / "records.test.yaml"))
    assert done.returncode != 0
    assert "namespace:topoguard_audit_wasted_gpu_cost_per_hour:sum" in done.stdout + done.stderr
