"""The inside of the attention in a real browser (Chromium, offline, as test_browser.py):
the four score terms as strips under the attention view, and the "Inside the attention"
tab."""

from __future__ import annotations

import pytest

from tests.test_browser import OUT, app_url, browser_page, step_and_wait  # noqa: F401

pytestmark = pytest.mark.browser

TERMS = "#attention .txl-terms"


def choose(page, label: str, option: str) -> None:
    page.get_by_label(label, exact=True).click()
    page.get_by_role("option", name=option, exact=True).click()


def wait_terms(page, position: int) -> None:
    page.wait_for_function(
        f"document.querySelector('{TERMS}')?.dataset.position === '{position}'"
    )


def test_step_view_shows_the_four_terms(app_url, browser_page):  # noqa: F811
    page, log = browser_page
    OUT.mkdir(exist_ok=True)
    page.goto(app_url, wait_until="load")
    page.wait_for_selector("#prompt textarea")
    position = step_and_wait(page)
    # all layers: a note says how to see the terms
    assert "Choose one layer and one head" in page.inner_text(TERMS)
    choose(page, "Layer", "layer 1")
    choose(page, "Head", "head 0")
    # a step taken with all layers shown kept no terms: say so; the next Step keeps them
    page.wait_for_function(
        f"document.querySelector('{TERMS}').innerText.includes('This step kept no terms')"
    )
    position = step_and_wait(page)
    wait_terms(page, position)
    words = page.inner_text(f"{TERMS} .txl-terms-words")
    assert "Layer 1 head 0 reads by" in words and "(b)+(d) span" in words
    keys = page.evaluate(f"document.querySelector('{TERMS}').dataset.keys")
    assert int(keys) == position + 1  # every key the newest token sees, memory and itself
    assert page.locator("#attention canvas").count() == 1  # the strips are an image
    # hover the (a) strip over the first key: its four values and its weight
    box = page.locator(f"{TERMS} img").bounding_box()
    page.mouse.move(box["x"] + 95, box["y"] + 10)
    tip = page.inner_text(f"{TERMS} .txl-terms-tip")
    assert "key at 0" in tip and "(a)" in tip and "(d)" in tip and "weight" in tip
    position = step_and_wait(page)  # a new step: new strips
    wait_terms(page, position)
    page.screenshot(path=str(OUT / "terms.png"), full_page=True)
    choose(page, "Head", "mean over heads")
    page.wait_for_function(
        f"document.querySelector('{TERMS}').innerText.includes('Choose one layer')"
    )
    # the tab reads the text written here when asked (instead of its example)
    page.get_by_role("tab", name="Inside the attention").click()
    page.click("#anatomy_use_text")
    page.wait_for_function(
        f"document.querySelector('#anatomy_text textarea').value.length === {position + 1}"
    )
    errors = [text for kind, text in log["console"] if kind == "error"]
    assert not errors, errors


def image_src(page, elem_id: str) -> str | None:
    return page.evaluate(f"document.querySelector('#{elem_id} img')?.src ?? null")


def test_inside_the_attention_tab(app_url, browser_page):  # noqa: F811
    page, log = browser_page
    OUT.mkdir(exist_ok=True)
    page.goto(app_url, wait_until="load")
    page.get_by_role("tab", name="Inside the attention").click()
    text = page.input_value("#anatomy_text textarea")
    assert text.startswith("ROMEO:")  # an example is there: the first click works
    page.click("#anatomy_run")
    page.wait_for_function(
        "document.querySelector('#anatomy_status')?.innerText.includes('figures drawn')"
        " && document.querySelector('#anatomy_fig7 img') !== null"
    )
    status = page.inner_text("#anatomy_status")
    assert f"Read {len(text):,} characters" in status
    assert "Farthest-reading heads" in page.inner_text("#anatomy_words")
    fig5, fig7 = image_src(page, "anatomy_fig5"), image_src(page, "anatomy_fig7")
    page.screenshot(path=str(OUT / "anatomy.png"), full_page=True)
    # other rows' order: Figure 5 drawn again from the same numbers
    choose(page, "Rows (heads) ordered by", "mean distance, farthest first")
    page.wait_for_function(
        f"document.querySelector('#anatomy_fig5 img')?.src !== {fig5!r}"
        f" && document.querySelector('#anatomy_fig7 img')?.src !== {fig7!r}"
    )
    fig5, fig7 = image_src(page, "anatomy_fig5"), image_src(page, "anatomy_fig7")
    # an empty text: its message, and the figures stay
    page.fill("#anatomy_text textarea", "")
    page.click("#anatomy_run")
    page.wait_for_function("document.querySelector('#anatomy_status')?.innerText.includes('empty')")
    assert image_src(page, "anatomy_fig5") == fig5 and image_src(page, "anatomy_fig7") == fig7
    errors = [text for kind, text in log["console"] if kind == "error"]
    assert not errors, errors
