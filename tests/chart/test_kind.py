"""End-to-end on a kind cluster (hack/e2e-kind.sh): off unless TOPOGUARD_E2E_KIND=1.

Needs Docker, kind, kubectl and helm; builds the image, creates the lab (zones, GPU taint, fake
GPUs, Cilium, the training operator), installs the chart and submits the seed lab's jobs.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.chart.rendering import ROOT

E2E_TIMEOUT_SECONDS = 3600

pytestmark = [
    pytest.mark.kind,
    pytest.mark.skipif(os.environ.get("TOPOGUARD_E2E_KIND") != "1", reason="set TOPOGUARD_E2E_KIND=1 to run on kind"),
]


def test_chart_pins_the_lab_job_and_refuses_the_split_one_on_kind() -> None:
    missing = [tool for tool in ("docker", "kind", "kubectl") if shutil.which(tool) is None]
    assert not missing, f"TOPOGUARD_E2E_KIND=1 but {', '.join(missing)} not found"
    proc = subprocess.run([str(ROOT / "hack" / "e2e-kind.sh")], cwd=ROOT, timeout=E2E_TIMEOUT_SECONDS, check=False)
    assert proc.returncode == 0, "hack/e2e-kind.sh failed; its output above says which check"
