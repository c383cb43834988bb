"""Play in a real browser (webapp/tabs/watch_play.py, webapp/web/views.js): one stream of steps,
painted as they come; Pause leaves the session at the painted step; a Play of n steps is
n Steps. Waits are on the page's own state (data-position, data-loop), never on time."""

from __future__ import annotations

import json

import pytest

from tests.test_app import new_client, settings
from tests.test_browser import (  # noqa: F401  (app_url, browser_page: fixtures)
    app_url,
    browser_page,
    page_text,
    painted_position,
    step_and_wait,
    text_length,
    wait_painted,
)
from tests.test_play_stream import untimed
from webapp.tabs.examples import TEMPERATURE, TOP_P

pytestmark = pytest.mark.browser
PROMPT = "ROMEO:\n"


def play_until(page, position: int) -> int:
    """Play until the page has painted ``position`` or beyond, Pause, and wait until the
    stream has ended and its last views are painted: the position painted then."""
    page.click("#play")
    page.wait_for_function(
        f"+document.querySelector('#attention [data-position]')?.dataset.position >= {position}"
    )
    assert page.inner_text("#play") == "Pause"
    assert page.get_attribute("#play", "data-loop") == "running"
    page.click("#play")  # Pause
    page.wait_for_selector("#play[data-loop='stopped']", state="attached")
    assert page.inner_text("#play") == "Play"
    return painted_position(page)


def open_page(page, url: str) -> None:
    page.goto(url, wait_until="load")
    page.wait_for_selector("#step")
    page.fill("#prompt textarea", PROMPT)


def open_summary(page) -> dict:
    return json.loads(page.inner_text("#summary .txl-summary"))


def test_play_streams_and_pause_leaves_the_session_at_the_painted_step(app_url, browser_page):  # noqa: F811
    page, log = browser_page
    open_page(page, app_url)
    page.evaluate(
        "window.painted = [];"
        "document.addEventListener('txl-painted', e => window.painted.push(e.detail.position))"
    )
    first = step_and_wait(page)
    stopped = play_until(page, first + 40)
    # The page paints the newest step as it comes and skips those between: the positions
    # painted only go forward, and the text keeps every step.
    painted = page.evaluate("window.painted")
    assert painted == sorted(painted) and painted[-1] == stopped, painted
    assert text_length(page) == stopped + 1
    # The session is where the page says: the next Step is the next character.
    assert step_and_wait(page) == stopped + 1
    assert text_length(page) == stopped + 2
    # Play again, and Reset during it stops Play: the stream takes no step after the
    # Reset (the session is no longer as its last step left it), so the next Step is the
    # first character after the prompt.
    page.click("#play")
    page.wait_for_function(
        f"+document.querySelector('#attention [data-position]').dataset.position > {stopped + 2}"
    )
    page.click("#reset")
    page.wait_for_selector("#play[data-loop='stopped']", state="attached")
    assert page.inner_text("#play") == "Play"
    page.wait_for_function(  # the Reset's answer: no text, no attention
        "document.querySelector('#text .txl-text').innerText === ''"
        " && !document.querySelector('#attention [data-position]')"
    )
    page.click("#step")
    wait_painted(page, len(PROMPT))
    assert text_length(page) == len(PROMPT) + 1
    errors = [text for kind, text in log["console"] if kind == "error"]
    assert not errors, errors


def test_a_play_of_n_steps_in_the_page_is_n_steps_through_the_api(app_url, browser_page):  # noqa: F811
    """The page Plays and Pauses; an API client makes as many Steps with the same seed:
    the same text, and the next step of each has the same summary (memory, predictions)."""
    page, log = browser_page
    open_page(page, app_url)
    page.get_by_text("Last step (JSON)").click()  # the summary, drawn while open
    stopped = play_until(page, len(PROMPT) + 30)
    text = page_text(page)
    assert len(text) == stopped + 1
    client = new_client(app_url)
    pages = settings(temperature=TEMPERATURE, top_p=TOP_P).values()  # the page's sampler
    for _ in range(len(text) - len(PROMPT)):
        stepped = client.predict(PROMPT, *pages, None, None, api_name="/step")
    assert stepped[0] == text
    after_steps = client.predict(PROMPT, *pages, None, None, api_name="/step")
    assert step_and_wait(page) == stopped + 1
    page.wait_for_function(
        f"document.querySelector('#summary .txl-summary').innerText.includes("
        f"'\"position\": {stopped + 1}')"
    )
    assert page_text(page) == after_steps[0]
    assert untimed(open_summary(page)) == untimed(after_steps[5])
    assert not [text for kind, text in log["console"] if kind == "error"]


def test_pause_at_once_after_play_on_a_new_page_stops_it(app_url, browser_page):  # noqa: F811
    """Play, then Pause before the first step came back (the visitor's state not made
    yet): the stream stops all the same, and the next Step follows the painted text."""
    page, log = browser_page
    open_page(page, app_url)
    page.evaluate(
        "document.querySelector('#play').click(); document.querySelector('#play').click()"
    )
    page.wait_for_selector("#play[data-loop='stopped']", state="attached")
    assert page.inner_text("#play") == "Play"
    before = painted_position(page)  # None: stopped before its first step
    after = step_and_wait(page)
    assert after == (len(PROMPT) if before is None else before + 1)
    assert text_length(page) == after + 1
    assert not [text for kind, text in log["console"] if kind == "error"]
