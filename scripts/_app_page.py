"""The app open in a real browser, for the scripts that make the pictures of README.md and docs/."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_app import BUNDLED, start_app, stop_app  # noqa: E402
from bench_browser import CHROMIUM, FLAGS  # noqa: E402

__all__ = ["BUNDLED", "ROOT", "app_page"]


@contextmanager
def app_page(model: str, width: int = 1400, height: int = 1000, timeout_ms: int = 120_000):
    """Start the app on ``model`` (python app.py, a free port), open it in Debian's headless
    chromium (playwright) and yield the loaded page; close both afterwards."""
    from playwright.sync_api import sync_playwright

    proc, url = start_app(model)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(timeout_ms)
            page.goto(url, wait_until="load")
            yield page
            browser.close()
    finally:
        stop_app(proc)
