"""Chart tests: render charts/topoguard with a real helm and assert on the objects.

Not in pytest's default testpaths; `make chart-lint` runs them (`pytest -q tests/chart`). helm
comes from $HELM or ./bin/helm (hack/helm.sh fetches it); without one every test here is skipped.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.rendering import HELM, Render, template


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if HELM is not None:
        return
    skip = pytest.mark.skip(reason="helm not found: run hack/helm.sh (or set HELM=/path/to/helm)")
    for item in items:
        if "/tests/chart/" in str(item.path):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_objects() -> list[dict[str, Any]]:
    # Session scope: most tests read the default render; each helm run costs ~0.2 s of a shared CPU.
    return template()


@pytest.fixture(scope="session")
def render() -> Render:
    return template
