"""The app in a real browser: Debian's Chromium driven by Playwright (no downloaded
browser). Every host but 127.0.0.1 is made unresolvable, and every request is recorded,
to show that the page needs nothing from outside. Screenshots go to test-output/.

Needs /usr/bin/chromium (`apt-get install -y chromium`; CHROMIUM=path overrides).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import urlparse

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest  # noqa: E402

from tests.test_app import serve, tiny_model  # noqa: E402

pytestmark = pytest.mark.browser
playwright_api = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "test-output"
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    import app

    folder = tiny_model(tmp_path_factory.mktemp("browser") / "model")
    demo, url = serve(app.TXLApp(folder))
    yield url
    demo.close()


@pytest.fixture
def browser_page(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install -y chromium", pytrace=False)
    with playwright_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            args=FLAGS,
            headless=True,
            viewport={"width": 1400, "height": 1000},
        )
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        log = {"console": [], "requests": [], "failed": []}
        page.on("console", lambda m: log["console"].append((m.type, m.text)))
        page.on("pageerror", lambda e: log["console"].append(("error", str(e))))
        page.on("request", lambda r: log["requests"].append(r.url))
        page.on("requestfailed", lambda r: log["failed"].append(r.url))
        yield page, log
        context.close()


def text_length(page) -> int:
    return page.evaluate("document.querySelector('#text .txl-text').innerText.length")


def wait_text_longer(page, n: int) -> int:
    page.wait_for_function(
        f"document.querySelector('#text .txl-text').innerText.length > {n}"
        " && !document.querySelector('#text .txl-text').innerText.includes('no text yet')"
    )
    return text_length(page)


def annotations(page) -> list[str]:
    return page.eval_on_selector_all(
        "#heatmap .annotation-text", "els => els.map(e => e.textContent)"
    )


def test_page_steps_generates_and_stays_offline(app_url, browser_page):
    page, log = browser_page
    OUT.mkdir(exist_ok=True)
    page.goto(app_url, wait_until="load")
    page.wait_for_selector("#prompt textarea")
    assert "Transformer-XL" in page.inner_text("#header")

    page.fill("#prompt textarea", "JULIET:\n")
    lengths = [0]
    for _ in range(3):
        page.click("#step")
        lengths.append(wait_text_longer(page, lengths[-1]))
    assert lengths[1] == len("JULIET:\n") + 1 and lengths[3] == lengths[1] + 2
    assert page.inner_text("#text .txl-newest")  # the newest token is marked

    # the heatmap: a plotly figure with the memory boundary (a dashed line and its label)
    page.wait_for_function(
        "[...document.querySelectorAll('#heatmap .annotation-text')]"
        ".some(e => e.textContent.includes('memory ◀'))"
    )
    assert page.locator("#heatmap .shapelayer path").count() >= 1
    assert page.locator("#heatmap g.hm image").count() == 1  # the heatmap's pixels
    page.hover("#heatmap .nsewdrag")  # the modebar (with PNG download) shows on hover
    assert page.locator("#heatmap .modebar-btn[data-title*='PNG' i]").count() == 1

    page.click("#memory input[type=checkbox]")  # memory off
    page.wait_for_function("document.querySelector('#status').innerText.includes('Memory off')")
    before = text_length(page)
    page.click("#generate")
    page.wait_for_function(
        "[...document.querySelectorAll('#heatmap .annotation-text')]"
        ".some(e => e.textContent.includes('memory off'))"
    )
    after = text_length(page)
    assert after == len("JULIET:\n") + 120 and after > before  # Generate starts over
    assert page.inner_text("#text .txl-gone")  # text beyond the window is greyed out
    page.screenshot(path=str(OUT / "app-desktop.png"), full_page=True)

    page.click("#export")  # the step's attention as a JSON file
    page.wait_for_selector("#export_file a[href*='attention-pos']")

    page.get_by_role("tab", name="Does memory help?").click()
    page.get_by_text("A quatrain, twice").click()
    page.click("#score_btn")
    page.wait_for_function(
        "document.querySelector('#score_summary').innerText.includes('bits per character')"
    )
    page.wait_for_selector("#score_plot .main-svg")

    errors = [text for kind, text in log["console"] if kind == "error"]
    assert not errors, errors
    outside = {urlparse(u).hostname for u in log["requests"]} - {"127.0.0.1"}
    assert not outside, f"requests left 127.0.0.1: {sorted(outside)}"
    assert not [u for u in log["failed"] if urlparse(u).hostname != "127.0.0.1"]


def test_phone_width_stacks_columns(app_url, browser_page):
    page, log = browser_page
    OUT.mkdir(exist_ok=True)
    page.set_viewport_size({"width": 400, "height": 860})
    page.goto(app_url, wait_until="load")
    page.wait_for_selector("#step")
    page.click("#step")
    wait_text_longer(page, 0)
    page.wait_for_selector("#heatmap .annotation-text")
    left, right = page.locator("#left").bounding_box(), page.locator("#right").bounding_box()
    assert right["y"] >= left["y"] + left["height"] - 1  # stacked, not side by side
    for box in (left, right):
        assert box["x"] >= 0 and box["x"] + box["width"] <= 400 + 1
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"the page scrolls sideways by {overflow}px"
    for button in ("#generate", "#step", "#reset"):
        box = page.locator(button).bounding_box()
        assert box["width"] >= 40 and box["x"] + box["width"] <= 400 + 1
    plot = page.locator("#heatmap .main-svg").first.bounding_box()
    assert plot["width"] <= 400 and plot["width"] >= 250
    page.click("#step")  # still usable
    wait_text_longer(page, len("ROMEO:\n") + 1)
    page.screenshot(path=str(OUT / "app-phone.png"), full_page=True)
    assert not [text for kind, text in log["console"] if kind == "error"]
