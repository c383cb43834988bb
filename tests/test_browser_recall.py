""" "How far back can it recall?" in a real browser (Chromium, offline, as test_browser.py):
Probe draws the chart as the rows come; Watch it opens the Watch tab with the probe up to
its first scored letter as the prompt, and one Step predicts that letter. Every wait is on
something the page shows, never on time."""

from __future__ import annotations

import pytest

from tests.test_browser import OUT, app_url, browser_page, wait_painted  # noqa: F401
from txl.recall import DISTANCES, probe_text
from webapp.tabs.examples import RECALL_BEFORE, RECALL_FILLER
from webapp.tabs.recall import DEFAULT_NAME, DEFAULT_WATCH

pytestmark = pytest.mark.browser


def test_probe_draws_the_chart_and_watch_it_steps_to_the_scored_letter(app_url, browser_page):  # noqa: F811
    page, log = browser_page
    OUT.mkdir(exist_ok=True)
    page.goto(app_url, wait_until="load")
    page.get_by_role("tab", name="How far back can it recall?").click()
    assert page.input_value("#recall_name input") == DEFAULT_NAME  # the first click works
    assert page.input_value("#recall_before textarea") == RECALL_BEFORE
    page.click("#recall_btn")
    page.wait_for_function(
        "document.querySelector('#recall_summary')?.innerText.includes('distances read in')"
    )
    # The chart: the three reads, each a line through every distance.
    page.wait_for_function(
        "document.querySelectorAll('#recall_plot .scatterlayer .trace').length === 3"
    )
    points = page.eval_on_selector_all(
        "#recall_plot .scatterlayer .trace",
        "ts => ts.map(t => t.querySelectorAll('.point').length)",
    )
    assert points == [len(DISTANCES)] * 3
    summary = page.inner_text("#recall_summary")
    assert "with memory" in summary and "through the window" in summary
    page.screenshot(path=str(OUT / "recall.png"), full_page=True)

    # Watch it (k = DEFAULT_WATCH): the Watch tab, its prompt the probe up to the scored letter.
    text, start = probe_text(DEFAULT_NAME, RECALL_FILLER, DEFAULT_WATCH, before=RECALL_BEFORE)
    page.click("#recall_watch")
    page.wait_for_function(
        f"document.querySelector('#prompt textarea')?.value.length === {start}"
        " && document.querySelector('#prompt textarea').checkVisibility()"
    )
    assert page.input_value("#prompt textarea") == text[:start]
    assert page.is_checked("#memory input[type=checkbox]")
    page.click("#step")  # one Step predicts the first scored letter: position start
    wait_painted(page, start)
    page.wait_for_selector(f'#predictions .txl-pred[data-position="{start}"]')  # both ways
    errors = [text for kind, text in log["console"] if kind == "error"]
    assert not errors, errors
