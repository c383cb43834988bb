"""The Watch tab at first sight, on the bundled model, in a real browser (Chromium as in
test_browser.py): every label says what is true of the state on screen. The text's legend
and "shade by" switch stay in view over a long text; memory off speaks of no memory; the
guide above the prompt says what the first Step shows, and follows the prompt. Every wait
is on something the page sets (a data attribute, a text), never on time."""

from __future__ import annotations

import json
import re

import pytest

import app
from tests.test_app import serve
from tests.test_browser import (  # noqa: F401  (browser_page: a fixture)
    OUT,
    browser_page,
    canvas_pixel,
    step_and_wait,
    wait_painted,
)
from webapp.serve import ROOT
from webapp.tabs import watch_examples
from webapp.tabs.examples import ROMEO_AND_JULIET

pytestmark = pytest.mark.browser
WEIGHTS = ROOT / "weights" / "shakespeare-char"
MEMORY_BLUE = "rgb(59, 130, 246)"  # the "with memory" colour of the bars (#3b82f6)


@pytest.fixture(scope="module")
def bundled_url():
    demo, url = serve(app.Demo.serving(str(WEIGHTS)))
    yield url
    demo.close()


def in_view(page, selector: str) -> bool:
    """The element's own pixels are on screen: the topmost element at a point inside it
    (its first few pixels, vertically centred) is the element or one of its children."""
    return page.evaluate(
        """(sel) => { const e = document.querySelector(sel), r = e.getBoundingClientRect();
        if (!r.width || !r.height) return false;
        const x = r.left + Math.min(4, r.width / 2), y = r.top + r.height / 2;
        const hit = document.elementFromPoint(x, y);
        return !!hit && (hit === e || e.contains(hit)); }""",
        selector,
    )


def wait_predictions(page, position: int) -> None:
    page.wait_for_selector(f'#predictions .txl-pred[data-position="{position}"]')


def test_the_legend_and_the_switch_stay_in_view_over_a_long_text(bundled_url, browser_page):  # noqa: F811
    page, log = browser_page
    page.goto(bundled_url, wait_until="load")
    page.wait_for_selector("#prompt textarea")
    prompt = ROMEO_AND_JULIET[:1500]
    page.fill("#prompt textarea", prompt)
    assert step_and_wait(page) == len(prompt)  # 1,500 characters, then the new one
    page.locator("#text").scroll_into_view_if_needed()
    # The newest character is in view, and so are the legend and the switch above it.
    assert in_view(page, "#text .txl-text .txl-r-newest")
    assert in_view(page, "#text .txl-legend .txl-r-current")
    assert in_view(page, "#text button[data-shade='effect']")
    page.click("#text button[data-shade='effect']")  # the switch works where it is
    page.wait_for_selector("#text .txl-textview[data-shade='effect']")
    # Steps keep the newest character in view under the legend.
    position = step_and_wait(page)
    assert in_view(page, "#text .txl-text .txl-r-newest") and in_view(page, "#text .txl-legend")
    assert position == len(prompt) + 1
    # "⤓ PNG" covers none of the attention view's labels: it lies under the canvas.
    canvas = page.locator("#attention canvas").bounding_box()
    png = page.locator("#attention .txl-png").bounding_box()
    assert png["y"] >= canvas["y"] + canvas["height"]
    page.screenshot(path=str(OUT / "first-sight-long-text.png"), full_page=True)
    assert not [text for kind, text in log["console"] if kind == "error"]


def test_memory_off_reads_as_memory_off(bundled_url, browser_page):  # noqa: F811
    page, log = browser_page
    page.goto(bundled_url, wait_until="load")
    page.wait_for_selector("#prompt textarea")
    page.fill("#prompt textarea", "ROMEO:\n")
    step_and_wait(page)
    first = step_and_wait(page)  # memory on: memory saved something over two characters
    wait_predictions(page, first)
    assert "memory saved" in page.inner_text("#status")
    page.click("#memory input[type=checkbox]")  # memory off
    page.wait_for_function("document.querySelector('#status').innerText.includes('Memory off')")
    position = step_and_wait(page)
    wait_predictions(page, position)
    status = page.inner_text("#status")
    assert status.startswith("Memory off") and position == first + 1
    assert "memory saved" not in status and "beyond the window" not in status
    # One list of bars, none in memory's colour: the model on its window alone.
    colours = page.eval_on_selector_all(
        "#predictions .txl-pred-bar > span",
        "els => els.map(e => getComputedStyle(e).backgroundColor)",
    )
    assert colours and MEMORY_BLUE not in colours, colours
    assert page.locator("#predictions .txl-pred-col").count() == 1
    # No "beyond the window" bars right of the attention view: its margin stays white.
    box = page.locator("#attention canvas").bounding_box()
    assert canvas_pixel(page, box["width"] - 58 + 6 + 24, 30 + 10) == [255, 255, 255, 255]
    page.screenshot(path=str(OUT / "first-sight-memory-off.png"), full_page=True)
    assert not [text for kind, text in log["console"] if kind == "error"]


def test_the_guide_says_what_the_first_step_shows_and_follows_the_prompt(
    bundled_url,
    browser_page,  # noqa: F811
):
    page, log = browser_page
    report = watch_examples.load_moments()
    moment = report["moments"][0]
    page.goto(bundled_url, wait_until="load")
    page.wait_for_selector("#example_guide")
    assert page.input_value("#prompt textarea") == moment["passage"]  # the opening passage
    guide = page.inner_text("#example_guide")
    # The guide names the character the play goes on with and its probability with memory.
    named = re.search(r"goes on with (.+?) \(", guide).group(1)
    assert named == watch_examples.shown(moment["char"])
    p_guide = float(re.search(r"p = ([\d.]+) %", guide).group(1))

    position = step_and_wait(page)
    assert position == len(moment["passage"])
    wait_predictions(page, position)
    # The Step wrote that character, and the bars say so: written, not sampled.
    assert page.get_attribute("#predictions .txl-pred", "data-given") == "true"
    head = page.inner_text("#predictions .txl-pred-head")
    assert "the text's own next character" in head and "sampled" not in head.replace(
        "not sampled", ""
    )
    newest = page.inner_text("#text .txl-text .txl-r-newest").replace("↵\n", "\n").replace("␣", " ")
    assert newest == moment["char"]
    chosen = page.locator("#predictions .txl-pred-col").nth(0).locator(".txl-pred-chosen")
    assert chosen.get_attribute("data-token") == moment["char"]
    p_bars = 100 * float(chosen.get_attribute("title").rsplit("p = ", 1)[1])
    assert p_bars == pytest.approx(p_guide, rel=0.05)  # the guide rounds to two digits
    # The next Step samples, as the guide says.
    step_and_wait(page)
    wait_predictions(page, position + 1)
    assert page.get_attribute("#predictions .txl-pred", "data-given") == "false"

    # A prompt of one's own: the guide says so, the menu shows no passage.
    page.fill("#prompt textarea", "JULIET:\nAy me!\n")
    page.wait_for_function(
        "document.querySelector('#example_guide').innerText.includes('Your own prompt')"
    )
    assert page.input_value("#example input") == ""
    # Back to a passage by typing it: the menu and the guide follow.
    other = report["moments"][1]
    page.fill("#prompt textarea", other["passage"])
    said = json.dumps(f"{other['bits_memory']:.2f} bits")  # this passage's figure
    page.wait_for_function(f"document.querySelector('#example_guide').innerText.includes({said})")
    assert page.input_value("#example input") == watch_examples.label(other)
    assert not [text for kind, text in log["console"] if kind == "error"]
