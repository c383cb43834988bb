"""Memory where it matters, in a real browser (Chromium as in test_browser.py): the window
line of the Watch tab (the attention view's edge, the text's marks, the status line) and
the Score tab's moments with Watch it. Every wait is on something the page sets (a data
attribute, a value), never on time."""

from __future__ import annotations

import pytest

from tests.test_app import MEM_LEN, SEG_LEN, new_client
from tests.test_browser import (  # noqa: F401  (fixtures)
    OUT,
    app_url,
    browser_page,
    canvas_pixel,
    painted_position,
    step_and_wait,
    wait_painted,
)

pytestmark = pytest.mark.browser

PROMPT = "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n"  # 49 characters
SCORED = (
    "ROMEO:\nBut, soft! what light through yonder window breaks?\n"
    "It is the east, and Juliet is the sun.\nArise, fair sun, and kill the envious moon,\n"
    "Who is already sick and pale with grief,\n"
)


def test_the_window_line_in_the_attention_view_the_text_and_the_status(app_url, browser_page):  # noqa: F811
    page, log = browser_page
    page.goto(app_url, wait_until="load")
    page.wait_for_selector("#prompt textarea")
    page.fill("#prompt textarea", PROMPT)
    step_and_wait(page)
    pos = step_and_wait(page)
    assert pos == len(PROMPT) + 1

    # The attention view: MEM_LEN memory keys + the new one; those SEG_LEN or more back
    # lie beyond the window, left of a solid blue edge.
    root = page.locator("#attention .txl-att")
    columns, memory, beyond = (
        int(root.get_attribute(k))
        for k in ("data-columns", "data-memory-columns", "data-window-columns")
    )
    assert (columns, memory, beyond) == (MEM_LEN + 1, MEM_LEN, MEM_LEN + 1 - SEG_LEN)
    box = page.locator("#attention canvas").bounding_box()
    left, right = 92, box["width"] - 58  # the plot's margins in webapp/web/views.js
    edge_x = left + beyond * (right - left) / columns
    blue = canvas_pixel(page, edge_x, 32)  # on the edge, above the first row
    assert blue[2] > 180 and blue[0] < 80 and blue[1] < 140, blue
    page.mouse.move(box["x"] + left + 0.5 * (right - left) / columns, box["y"] + 30 + 11)
    assert "memory, beyond the window" in page.inner_text("#attention .txl-tip")
    page.mouse.move(box["x"] + edge_x + 1.5 * (right - left) / columns, box["y"] + 30 + 11)
    assert "memory, in the window" in page.inner_text("#attention .txl-tip")

    # The text: the memory beyond the window marked, and the window's edge before the
    # first character a model without memory sees.
    first_in_window = pos - SEG_LEN + 1
    edge = page.locator("#text .txl-win")
    assert edge.count() == 1 and edge.get_attribute("data-i") == str(first_in_window)
    far = page.eval_on_selector_all("#text .txl-r-far[data-i]", "els => els.map(e => +e.dataset.i)")
    assert far == list(range(pos - MEM_LEN, first_in_window))
    assert "beyond the window of 16" in page.inner_text("#text .txl-legend")
    assert page.inner_text("#status").startswith("attention beyond the window:")
    page.screenshot(path=str(OUT / "app-window-line.png"), full_page=False)
    assert not [text for kind, text in log["console"] if kind == "error"]


def test_moments_watch_it_puts_the_text_before_the_moment_in_the_watch_tab(app_url, browser_page):  # noqa: F811
    page, log = browser_page
    OUT.mkdir(exist_ok=True)
    page.goto(app_url, wait_until="load")
    page.wait_for_selector("#step")
    page.get_by_role("tab", name="Does memory help?").click()
    page.fill("#score_text textarea", SCORED)
    page.click("#score_btn")
    # After the sliding window: the text shaded by the bits memory saved, five moments.
    page.wait_for_selector("#moments .txl-moments[data-moments]")
    positions = [
        int(p) for p in page.get_attribute("#moments .txl-moments", "data-moments").split(",")
    ]
    assert len(positions) == 5 and len(set(positions)) == 5
    assert page.locator("#moments .txl-mom-list li").count() == 5
    shaded = page.eval_on_selector_all("#moments [data-bits]", "els => els.map(e => +e.dataset.i)")
    assert shaded == list(range(1, len(SCORED)))  # every character but the first
    # The page's moments are /score's (the same text, another session).
    numbers = new_client(app_url).predict(text=SCORED, mem_len=MEM_LEN, api_name="/score")[2]
    assert positions == [m["position"] for m in numbers["moments"]]
    page.hover(f"#moments .txl-mom-text [data-i='{positions[0]}']")
    tip = page.inner_text("#moments .txl-tip")
    assert "p with memory" in tip and "through the window" in tip and "moment 1" in tip
    page.screenshot(path=str(OUT / "app-moments.png"), full_page=True)

    # Watch it: the Watch tab, the text before the first moment as the prompt, memory on,
    # and the attention of the prompt's last character (where the model looked for it).
    page.click("#watch_it")
    moment = positions[0]
    page.wait_for_function(
        "([n]) => { const box = document.querySelector('#prompt textarea');"
        " return box && box.offsetParent !== null && box.value.length === n; }",
        arg=[moment],
    )
    assert page.input_value("#prompt textarea") == SCORED[:moment]
    assert page.is_checked("#memory input[type=checkbox]")
    wait_painted(page, moment - 1)
    # One Step writes that very character.
    page.click("#step")
    wait_painted(page, moment)
    newest = page.inner_text("#text .txl-text .txl-r-newest").replace("↵\n", "\n").replace("␣", " ")
    assert newest == SCORED[moment]
    page.wait_for_selector(f'#predictions .txl-pred[data-position="{moment}"]')
    chosen = page.get_attribute("#predictions .txl-pred-col .txl-pred-chosen", "data-token")
    assert chosen == SCORED[moment]
    assert not [text for kind, text in log["console"] if kind == "error"]
