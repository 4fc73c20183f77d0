"""The chart's Prometheus rules as a rules file, for Prometheus's own `promtool check rules` / `test rules`.

`python -m tests.chart.promrules DIR` renders charts/topoguard's PrometheusRule with ci/monitoring-values.yaml
and tests/chart/promtool/values.yaml (every optional rule on) and writes DIR/topoguard.rules.yaml beside a
copy of each tests/chart/promtool/*.test.yaml (promtool reads a test's rule_files relative to the test), and
DIR/no-prices.rules.yaml as ci/monitoring-values.yaml alone renders it (for `promtool check rules`).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.chart.rendering import CHART, one, template

TESTS = Path(__file__).resolve().parent / "promtool"
VALUES = (CHART / "ci" / "monitoring-values.yaml", TESTS / "values.yaml")
RULES_FILE = "topoguard.rules.yaml"
NO_PRICES_FILE = "no-prices.rules.yaml"


def rule_groups(values: dict[str, Any] | None = None, *, values_files: tuple[Path, ...] = VALUES) -> dict[str, Any]:
    """The PrometheusRule's spec (`groups`) as the chart renders it with `values_files` (and `values` on top)."""
    return dict(one(template(values=values, values_files=values_files), "PrometheusRule")["spec"])


def write(directory: Path, values: dict[str, Any] | None = None) -> list[Path]:
    """Write the rules file and copies of the rule tests into `directory`; returns the tests' paths."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RULES_FILE).write_text(yaml.safe_dump(rule_groups(values), sort_keys=False))
    no_prices = rule_groups(values_files=VALUES[:1])
    (directory / NO_PRICES_FILE).write_text(yaml.safe_dump(no_prices, sort_keys=False))
    tests = []
    for test in sorted(TESTS.glob("*.test.yaml")):
        tests.append(Path(shutil.copy(test, directory / test.name)))
    return tests


def main(argv: list[str]) -> int:
    for path in write(Path(argv[0])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
