"""`topoguard audit -o html` in a real browser: Debian's headless chromium loads the page of the seed lab's
"before" state, lays it out and runs the page's own check; the blocked flows are drawn between zone-a and zone-b,
naming the policies that block them. The "after" state draws none.

Skips when no chromium is installed, unless TOPOGUARD_REQUIRE_CHROMIUM=1 (.ci/run installs it and sets that).
"""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.browser import dump_dom, find_chromium, screenshot
from tests.unit.test_audit_command import AFTER, BEFORE, CONFIG, run

if find_chromium() is None and os.environ.get("TOPOGUARD_REQUIRE_CHROMIUM") != "1":
    pytest.skip("no chromium (apt-get install chromium)", allow_module_level=True)


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}))


def _rendered(cluster: Path, tmp_path: Path) -> list[tuple[str, dict[str, str]]]:
    code, page, _ = run("--cluster", str(cluster), "--config", str(CONFIG), "-o", "html")
    assert code in (0, 1)
    path = tmp_path / "audit.html"
    path.write_text(page)
    parser = _Elements()
    parser.feed(dump_dom(path))
    return parser.found


def test_the_lab_before_state_draws_its_blocked_flows(tmp_path: Path) -> None:
    elements = _rendered(BEFORE, tmp_path)
    (body,) = [a for tag, a in elements if tag == "body"]
    flows = [a for tag, a in elements if tag == "path" and "flow" in a.get("class", "").split()]
    assert {(f["data-src-zone"], f["data-dst-zone"]) for f in flows} == {("zone-a", "zone-b"), ("zone-b", "zone-a")}
    # What the browser laid out: every arrow has a length and starts and ends in its zones' columns.
    assert body["data-flows-drawn"] == body["data-flows-placed"] == str(len(flows))
    worker_to_master = next(f for f in flows if f["data-src-zone"] == "zone-a")
    assert "TCP/23456" in worker_to_master["data-ports"].split()
    assert "CiliumNetworkPolicy ml-demo/allow-intra-zone-b" in worker_to_master["data-policies"].split("; ")
    pods = [a for tag, a in elements if tag == "rect" and "pod" in a.get("class", "").split()]
    assert sorted((p["data-zone"], p["data-role"], "gpu" in p["class"]) for p in pods) == [
        *[("zone-a", "Worker", True)] * 4, ("zone-b", "Master", False)]


def test_the_lab_after_state_draws_no_flow(tmp_path: Path) -> None:
    elements = _rendered(AFTER, tmp_path)
    (body,) = [a for tag, a in elements if tag == "body"]
    assert not [a for tag, a in elements if tag == "path" and "flow" in a.get("class", "").split()]
    assert body["data-flows-drawn"] == "0"
    assert {p["data-zone"] for tag, p in elements if tag == "rect" and "pod" in p.get("class", "").split()} == {
        "zone-a"}


def test_a_screenshot_is_a_picture(tmp_path: Path) -> None:
    _, page, _ = run("--cluster", str(BEFORE), "--config", str(CONFIG), "-o", "html")
    (tmp_path / "audit.html").write_text(page)
    shot = tmp_path / "audit.png"
    screenshot(tmp_path / "audit.html", shot, width=800, height=400)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (800, 400)
    assert re.search(rb"IDAT", data)
