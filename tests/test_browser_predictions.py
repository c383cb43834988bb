"""The prediction with and without memory in a real browser (webapp/web/predictions.js) and
the text shaded by memory's effect (webapp/web/views.js): Chromium as in test_browser.py.
Every wait is on something the page sets (a data attribute), never on time."""

from __future__ import annotations

import pytest

from tests.test_browser import (  # noqa: F401  (fixtures)
    OUT,
    app_url,
    browser_page,
    painted_position,
    step_and_wait,
    wait_painted,
)

pytestmark = pytest.mark.browser


def wait_predictions(page, position: int) -> None:
    page.wait_for_selector(f'#predictions .txl-pred[data-position="{position}"]')


def test_bars_with_and_without_memory_and_the_effect_shading(app_url, browser_page):  # noqa: F811
    page, log = browser_page
    OUT.mkdir(exist_ok=True)
    page.goto(app_url, wait_until="load")
    page.wait_for_selector("#prompt textarea")
    page.fill("#prompt textarea", "JULIET:\n")
    positions = [step_and_wait(page) for _ in range(4)]
    wait_predictions(page, positions[-1])

    # Two aligned lists of 10, one scale; the sampled character marked once in each.
    columns = page.locator("#predictions .txl-pred-col")
    assert columns.count() == 2
    assert "with memory" in columns.nth(0).inner_text()
    assert "without memory" in columns.nth(1).inner_text()
    for c in range(2):
        rows = columns.nth(c).locator(".txl-pred-row:not(.txl-pred-extra)")
        assert rows.count() == 10
        assert columns.nth(c).locator(".txl-pred-chosen").count() == 1
    newest = page.inner_text("#text .txl-text .txl-r-newest")
    chosen = page.get_attribute("#predictions .txl-pred-col .txl-pred-chosen", "data-token")
    assert chosen == newest.replace("↵\n", "\n").replace("␣", " ")
    words = page.inner_text("#predictions .txl-pred-words")
    assert "with memory" in words and "without" in words and "bits" in words and "KL" in words

    # The second shading: every produced character carries its bits saved; the prompt none.
    page.click("#text button[data-shade='effect']")
    page.wait_for_selector("#text .txl-textview[data-shade='effect']")
    bits = page.eval_on_selector_all("#text [data-bits]", "els => els.map(e => +e.dataset.i)")
    assert bits == positions
    saved = page.get_attribute("#predictions .txl-pred", "data-bits-saved")
    shown = page.get_attribute(f"#text [data-i='{positions[-1]}']", "data-bits")
    assert float(shown) == pytest.approx(float(saved), abs=0.02)  # centibits in the text
    page.hover(f"#text [data-i='{positions[0]}']")
    tip = page.inner_text("#text .txl-tip")
    assert "p with memory" in tip and "without" in tip and "bits" in tip
    assert "memory saved" in page.inner_text("#status")
    # The mode stays while stepping on; the new character is shaded too.
    after = step_and_wait(page)
    page.wait_for_selector(f"#text [data-i='{after}'][data-bits]")
    page.screenshot(path=str(OUT / "app-predictions.png"), full_page=True)

    # The history shows the prediction of the step it shows.
    page.fill("#history input[type=number]", "-2")
    page.press("#history input[type=number]", "Enter")
    wait_painted(page, after - 2)
    wait_predictions(page, after - 2)
    assert "2 steps ago" in page.inner_text("#predictions")

    # Back to attention shading, then memory off: one distribution, no counterfactual.
    page.click("#text button[data-shade='attention']")
    page.wait_for_selector("#text .txl-textview[data-shade='attention']")
    page.click("#memory input[type=checkbox]")
    page.wait_for_function("document.querySelector('#status').innerText.includes('Memory off')")
    page.click("#step")  # the history showed 2 steps back: the new step is after + 1
    off = after + 1
    wait_painted(page, off)
    wait_predictions(page, off)
    assert page.locator("#predictions .txl-pred-col").count() == 1
    assert "Memory is off" in page.inner_text("#predictions .txl-pred-words")
    assert painted_position(page) == off
    assert not [text for kind, text in log["console"] if kind == "error"]
