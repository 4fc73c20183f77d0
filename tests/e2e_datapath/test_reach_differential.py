"""Reach cases on Cilium's real datapath against `topoguard reach` (see differential.py).

Counts go to stdout and, per case, to build/e2e-datapath/differential.json. The test fails on any
disagreement not listed, with the datapath's evidence, in known-differences.yaml, and on any error.
Env: TOPOGUARD_DATAPATH_GENERATED (seeded generated cases, default 10), TOPOGUARD_DATAPATH_SEED
(default 1), TOPOGUARD_DATAPATH_TABLES=1 (also the unit tests' reach verdict tables).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import yaml

from tests.e2e_datapath import differential
from tests.e2e_datapath.node import DatapathNode

KNOWN = Path(__file__).parent / "known-differences.yaml"
REPORT = differential.REPO / "build" / "e2e-datapath" / "differential.json"


def test_reach_cases_agree_with_the_datapath(node: DatapathNode, tmp_path: Path) -> None:
    cases = differential.load_cases(int(os.environ.get("TOPOGUARD_DATAPATH_GENERATED", "10")),
                                    int(os.environ.get("TOPOGUARD_DATAPATH_SEED", "1")),
                                    tables=os.environ.get("TOPOGUARD_DATAPATH_TABLES") == "1")
    runner = differential.Runner(node, tmp_path)
    outcomes = [runner.run(case) for case in cases]
    counts = differential.summary(outcomes)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps({"counts": counts, "cases": [asdict(o) for o in outcomes]}, indent=1))
    reasons = Counter(o.reason for o in outcomes if o.status == "not-runnable")
    print(f"\ndatapath differential: {len(outcomes)} cases: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    for reason, n in reasons.most_common():
        print(f"  not runnable ({n}): {reason}")
    for o in outcomes:
        if o.status in ("disagreed", "unknown", "error"):
            print(f"  {o.status}: {o.name} {o.ports} {o.reason[:400]}")
    runnable = [o for o in outcomes if o.status != "not-runnable"]
    print(f"  runnable cases took {sum(o.seconds for o in runnable):.0f}s "
          f"({sum(o.seconds for o in runnable) / max(1, len(runnable)):.1f}s each)")
    known = {entry["case"]: entry for entry in (yaml.safe_load(KNOWN.read_text()) or [])}
    errors = [o for o in outcomes if o.status == "error"]
    unexplained = [o for o in outcomes if o.status == "disagreed" and o.name not in known]
    assert not errors, [(o.name, o.reason) for o in errors]
    assert not unexplained, [(o.name, o.ports) for o in unexplained]
    assert counts["agreed"] > 0
