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

from benchmarks.bench_browser import FLAGS  # noqa: E402  (one list: tests and benchmark)
from tests.test_app import serve, tiny_model  # noqa: E402

pytestmark = pytest.mark.browser
playwright_api = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "test-output"
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
TIMEOUT_MS = 180_000  # waits on events: a loaded machine only makes them slower; a hang fails


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    import app

    folder = tiny_model(tmp_path_factory.mktemp("browser") / "model")
    demo, url = serve(app.Demo.serving(folder))
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


# The text the view holds, as JavaScript: its newest character is drawn visible when it is a
# space or a new line (␣, or ↵ then the line break: webapp/web/views.js), which no character
# of the model's vocabulary is; read back as the character it stands for.
PAGE_TEXT_JS = (
    "document.querySelector('#text .txl-text').innerText"
    ".replace(/↵\\n?$/, '\\n').replace(/␣$/, ' ')"
)


def page_text(page) -> str:
    return page.evaluate(PAGE_TEXT_JS)


def text_length(page) -> int:
    """How many characters the text holds (a newest new line, drawn as ↵ and a line break,
    is one)."""
    return len(page_text(page))


def wait_text_longer(page, n: int) -> int:
    page.wait_for_function(
        f"{PAGE_TEXT_JS}.length > {n}"
        " && !document.querySelector('#text .txl-text').innerText.includes('no text yet')"
    )
    return text_length(page)


def painted_position(page) -> int | None:
    """The text position whose attention the view shows, once it has been painted."""
    value = page.evaluate(
        "document.querySelector('#attention [data-position]')?.dataset.position ?? null"
    )
    return None if value is None else int(value)


def wait_painted(page, position: int) -> None:
    page.wait_for_function(
        f"document.querySelector('#attention [data-position=\"{position}\"]') !== null"
    )


def step_and_wait(page) -> int:
    """Click Step; wait until the new step's view is painted; its position."""
    before = painted_position(page)
    page.click("#step")
    expected = (before + 1) if before is not None else None
    if expected is None:
        page.wait_for_selector("#attention [data-position]")
    else:
        wait_painted(page, expected)
    return painted_position(page)


def canvas_pixel(page, x: float, y: float) -> list[int]:
    """[r, g, b, a] of the attention canvas at CSS pixel (x, y)."""
    return page.evaluate(
        """([x, y]) => { const c = document.querySelector('#attention canvas');
        const r = window.devicePixelRatio || 1, g = c.getContext('2d');
        return [...g.getImageData(Math.round(x * r), Math.round(y * r), 1, 1).data]; }""",
        [x, y],
    )


def test_page_steps_generates_and_stays_offline(app_url, browser_page):
    page, log = browser_page
    OUT.mkdir(exist_ok=True)
    page.goto(app_url, wait_until="load")
    page.wait_for_selector("#prompt textarea")
    assert "Transformer-XL" in page.inner_text("#header")

    page.fill("#prompt textarea", "JULIET:\n")
    positions = [step_and_wait(page) for _ in range(3)]
    assert positions == [8, 9, 10]  # "JULIET:\n" is 8 characters: the first new one is 8
    assert text_length(page) == len("JULIET:\n") + 3
    assert page.inner_text("#text .txl-r-newest")  # the newest token is marked

    # The attention view: memory columns left of a dashed red boundary.
    root = page.locator("#attention .txl-att")
    memory_columns, columns = (
        int(root.get_attribute(k)) for k in ("data-memory-columns", "data-columns")
    )
    assert columns == 11 and memory_columns == 10  # 10 in memory, the new token itself
    box = page.locator("#attention canvas").bounding_box()
    left, right = 92, box["width"] - 58  # the plot's margins in webapp/web/views.js
    boundary_x = left + memory_columns * (right - left) / columns
    red = canvas_pixel(page, boundary_x, 32)  # on the dashed line, above the first row
    assert red[0] > 180 and red[1] < 120 and red[2] < 120, red
    # Hover a cell: the query and key characters, the distance and the weight.
    cell_x = left + 7.5 * (right - left) / columns  # key 7: "\n" (positions 0..10)
    page.mouse.move(box["x"] + cell_x, box["y"] + 30 + 11)
    tip = page.inner_text("#attention .txl-tip")
    assert "layer 0" in tip and "query" in tip and "key '↵' at 7, 3 back" in tip and "weight" in tip
    # Hover a character of the text: its weight and distance from the newest one.
    page.hover("#text .txl-k[data-i='2']")
    assert "'L' at 2 · 8 back · weight" in page.inner_text("#text .txl-tip")

    # PNG download of the view.
    with page.expect_download() as download:
        page.click("#attention .txl-png")
    path = download.value.path()
    assert download.value.suggested_filename == "attention-pos10.png"
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    page.click("#memory input[type=checkbox]")  # memory off
    page.wait_for_function("document.querySelector('#status').innerText.includes('Memory off')")
    before = text_length(page)
    # Generate streams the views (that the server sends more than one is test_app's
    # test_generate_streams_the_views; how many the browser paints depends on its speed,
    # it may coalesce them): every view painted is one of this Generate's steps, in text
    # order, and the page ends on the last one.
    page.evaluate(
        "window.painted = [];"
        "document.addEventListener('txl-painted', e => window.painted.push(e.detail.position))"
    )
    page.click("#generate")
    last = len("JULIET:\n") + 120 - 1
    wait_painted(page, last)
    after = text_length(page)
    assert after == len("JULIET:\n") + 120 and after > before  # Generate starts over
    streamed = page.evaluate("window.painted")
    assert streamed and streamed[-1] == last, streamed
    assert streamed == sorted(streamed) and streamed[0] >= len("JULIET:\n"), streamed
    assert root.get_attribute("data-memory-columns") == "0"  # no memory: no boundary
    assert page.inner_text("#text .txl-r-gone")  # text beyond the window is greyed out
    page.screenshot(path=str(OUT / "app-desktop.png"), full_page=True)

    page.click("#export")  # the step's attention as a JSON file
    page.wait_for_selector("#export_file a[href*='attention-pos']")

    page.get_by_role("tab", name="Does memory help?").click()
    page.get_by_text("A quatrain, twice").click()
    page.click("#score_btn")
    # The Score streams: memory first, the sliding window last; this line comes at the end.
    page.wait_for_function(
        "document.querySelector('#score_summary').innerText.includes('Memory vs the sliding')"
    )
    page.wait_for_selector("#score_plot .main-svg")
    page.wait_for_selector("#context_plot .main-svg")
    legend = page.eval_on_selector_all(
        "#score_plot .legendtext", "els => els.map(e => e.textContent)"
    )
    assert len([t for t in legend if "bpc" in t]) == 3, legend  # three ways of reading
    assert "Effective context" in page.inner_text("#context_summary")

    errors = [text for kind, text in log["console"] if kind == "error"]
    assert not errors, errors
    outside = {urlparse(u).hostname for u in log["requests"]} - {"127.0.0.1"}
    assert not outside, f"requests left 127.0.0.1: {sorted(outside)}"
    assert not [u for u in log["failed"] if urlparse(u).hostname != "127.0.0.1"]


def test_score_tab_works_at_the_first_click_and_keeps_its_charts_on_a_bad_text(
    app_url, browser_page
):
    page, log = browser_page
    page.goto(app_url, wait_until="load")
    page.wait_for_selector("#step")  # the page is up
    page.get_by_role("tab", name="Does memory help?").click()
    box = page.locator("#score_text textarea")
    assert box.input_value().startswith("ROMEO:")  # the first example is there already
    page.click("#score_btn")
    page.wait_for_function(
        "document.querySelector('#score_summary').innerText.includes('Memory vs the sliding')"
    )
    page.wait_for_function("document.querySelectorAll('#context_plot .main-svg').length > 0")
    summary = page.inner_text("#score_summary")
    charts = page.locator("#score_plot .main-svg, #context_plot .main-svg").count()

    box.fill("")
    page.click("#score_btn")
    page.wait_for_selector("text=Nothing to score")  # the check's message
    # The charts and the summary are the last Score's, with no error badge on them.
    assert page.locator("#score_plot .main-svg, #context_plot .main-svg").count() == charts
    assert page.inner_text("#score_summary") == summary
    assert page.locator("#score_plot .error, #context_plot .error").count() == 0
    errors = [text for kind, text in log["console"] if kind == "error"]
    assert not errors, errors


def test_play_steps_until_clicked_again_and_history_goes_back(app_url, browser_page):
    page, log = browser_page
    page.goto(app_url, wait_until="load")
    page.wait_for_selector("#step")
    first = step_and_wait(page)
    page.click("#play")
    page.wait_for_function(
        f"+document.querySelector('#attention [data-position]').dataset.position >= {first + 4}"
    )
    assert page.inner_text("#play") == "Pause"
    assert page.get_attribute("#play", "data-loop") == "running"
    page.click("#play")  # the second click pauses
    page.wait_for_function("document.querySelector('#play').innerText === 'Play'")
    # The loop ends once the step it had in flight is painted: then no step is in flight
    # and none will be sent (Play sends the next Step only from that loop).
    page.wait_for_selector("#play[data-loop='stopped']", state="attached")
    stopped = painted_position(page)
    assert text_length(page) == stopped + 1
    # The next Step is the next character: Play sent nothing in between.
    assert step_and_wait(page) == stopped + 1
    assert text_length(page) == stopped + 2
    stopped += 1

    # The history: three steps back shows that step's attention over the text as it was.
    page.fill("#history input[type=number]", "-3")
    page.press("#history input[type=number]", "Enter")
    wait_painted(page, stopped - 3)
    # The text view's watch() may run after the attention's (one update, two components):
    # wait for it; a text that never goes back times out.
    page.wait_for_function(f"{PAGE_TEXT_JS}.length === {stopped - 2}")
    assert "3 steps ago" not in page.inner_text("#attention")  # drawn on the canvas, not text
    page.click("#step")  # a new step shows the newest again
    wait_painted(page, stopped + 1)
    assert page.input_value("#history input[type=number]") == "0"

    # No run history in the page: Gradio 6 would keep every Step's outputs in localStorage.
    stored = "Object.entries(localStorage).reduce((n, [k, v]) => n + k.length + v.length, 0)"
    assert page.evaluate(stored) < 2_000

    # Reset stops Play.
    page.click("#play")
    page.wait_for_function("document.querySelector('#play').innerText === 'Pause'")
    page.click("#reset")
    page.wait_for_function("document.querySelector('#play').innerText === 'Play'")
    assert not [text for kind, text in log["console"] if kind == "error"]


def test_summary_is_drawn_only_while_open_and_status_bold_is_rendered(app_url, browser_page):
    """The page's Step sends the summary packed (one JSON string): nothing is drawn while
    "Last step (JSON)" is closed, opening it shows the newest step's summary, and while
    open each Step redraws it. The status line's **bold** is rendered, not asterisks."""
    page, log = browser_page
    page.goto(app_url, wait_until="load")
    page.wait_for_selector("#prompt textarea")
    page.fill("#prompt textarea", "JULIET:\n")
    step_and_wait(page)
    closed = step_and_wait(page)
    shown = "document.querySelector('#summary .txl-summary')?.textContent || ''"
    assert page.evaluate(shown) == ""  # closed: nothing written (or not even mounted)
    # Opening the accordion mounts its content a moment later: until then there is no
    # .txl-summary, and the wait must go on rather than throw.
    summary_position = (
        "+JSON.parse(document.querySelector('#summary .txl-summary')?.textContent || 'null')"
        "?.position"
    )
    page.get_by_text("Last step (JSON)").click()
    page.wait_for_function(f"{summary_position} === {closed}")
    opened = step_and_wait(page)
    page.wait_for_function(f"{summary_position} === {opened}")
    assert opened == closed + 1

    status = page.inner_html("#status .txl-status")
    assert "<b>on</b>" in status and "**" not in status
    assert page.inner_text("#status").startswith("attention beyond the window:")
    assert not [text for kind, text in log["console"] if kind == "error"]


def test_phone_width_stacks_columns(app_url, browser_page):
    page, log = browser_page
    OUT.mkdir(exist_ok=True)
    page.set_viewport_size({"width": 400, "height": 860})
    page.goto(app_url, wait_until="load")
    page.wait_for_selector("#step")
    step_and_wait(page)
    left, right = page.locator("#left").bounding_box(), page.locator("#right").bounding_box()
    assert right["y"] >= left["y"] + left["height"] - 1  # stacked, not side by side
    for box in (left, right):
        assert box["x"] >= 0 and box["x"] + box["width"] <= 400 + 1
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"the page scrolls sideways by {overflow}px"
    for button in ("#generate", "#step", "#play", "#reset"):
        box = page.locator(button).bounding_box()
        assert box["width"] >= 40 and box["x"] + box["width"] <= 400 + 1
    view = page.locator("#attention canvas").bounding_box()
    assert 250 <= view["width"] <= 400
    step_and_wait(page)  # still usable
    page.screenshot(path=str(OUT / "app-phone.png"), full_page=True)
    assert not [text for kind, text in log["console"] if kind == "error"]
