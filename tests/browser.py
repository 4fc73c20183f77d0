"""Headless chromium (Debian's `chromium`) for the tests and `make screenshots`: load a local page, read back its
DOM after the page's scripts ran, or take a screenshot.

`python -m tests.browser screenshot CLUSTER CONFIG OUT.png` renders `topoguard audit -o html` of a snapshot
and photographs it (make screenshots: the seed lab's before and after in docs/).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TIMEOUT_SECONDS = 120
# No sandbox: CI runs as root, where chromium refuses its sandbox. The pages are our own files, offline.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--disable-extensions", "--disable-dev-shm-usage", "--virtual-time-budget=5000")


def find_chromium() -> str | None:
    for candidate in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


def _run(page: Path, *args: str) -> str:
    chromium = find_chromium()
    if chromium is None:
        raise RuntimeError("no chromium: apt-get install chromium (or set CHROMIUM=/path/to/chromium)")
    with tempfile.TemporaryDirectory(prefix="topoguard-chromium-") as profile:
        done = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", *args, page.resolve().as_uri()],
                              capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def dump_dom(page: Path) -> str:
    """The page's DOM as chromium serialises it once the page has loaded and its scripts have run."""
    return _run(page, "--dump-dom")


def screenshot(page: Path, out: Path, *, width: int = 1100, height: int = 520) -> None:
    _run(page, f"--window-size={width},{height}", f"--screenshot={out.resolve()}")
    if not out.is_file() or out.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no screenshot to {out}")


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] != "screenshot":
        print("usage: python -m tests.browser screenshot CLUSTER CONFIG OUT.png", file=sys.stderr)
        return 2
    cluster, config, out = argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "audit.html"
        with page.open("w") as f:
            subprocess.run([sys.executable, "-m", "app.cli", "audit", "--cluster", cluster, "--config", config,
                            "-o", "html"], stdout=f, check=False)
        screenshot(page, Path(out))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
