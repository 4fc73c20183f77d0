"""`topoguard serve` runs the collector with the serving thresholds (app.http.app.SERVING_GC_THRESHOLDS), set before
anything else; a library user of create_app keeps the process's own."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from app import cli
from app.http.app import SERVING_GC_THRESHOLDS


def test_serve_sets_the_serving_gc_thresholds_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_to: list[tuple[int, ...]] = []
    monkeypatch.setattr(gc, "set_threshold", lambda *t: set_to.append(t))
    missing = tmp_path / "missing.yaml"
    # A config that does not exist: serve stops at once with a usage error, after setting the thresholds.
    assert cli.main(["serve", "--self-signed", "--config", str(missing), "--cluster", str(missing)]) != 0
    assert set_to == [SERVING_GC_THRESHOLDS]


def test_building_an_app_leaves_the_thresholds_alone() -> None:
    from app.cache.store import StaticStore
    from app.config import Settings
    from app.http.app import create_app
    from tests.builders import make_snapshot

    before = gc.get_threshold()
    create_app(Settings(), StaticStore(make_snapshot([])))
    assert gc.get_threshold() == before
