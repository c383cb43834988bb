"""The "Memory on | off" tab in a real browser (webapp/web/pair.js): Step writes one
character on each side, Play streams pair Steps until Pause, Generate writes n, the
parting point is marked where /pair_generate says, Reset empties both sides, a bad prompt
gets the page's message. Every wait is on something the page sets (data-steps on the
view, data-loop on Play), never on time."""

from __future__ import annotations

import pytest

from tests.test_app import MEM_LEN, new_client, serve
from tests.test_app_memory_pair import parting_model
from tests.test_browser import browser_page  # noqa: F401  (a fixture)
from webapp.tabs.examples import TEMPERATURE, TOP_P

pytestmark = pytest.mark.browser
PROMPT = "ROMEO:\nI will not stay.\n\nJULIET:\nNo"
VIEW = "#pair_view .txl-pair"
# The page's settings (the tab's: the page's sampler, mem_len the model's), as the API takes them
SETTINGS = dict(mem_len=MEM_LEN, temperature=TEMPERATURE, top_k=0, top_p=TOP_P, seed=0)


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    import app

    demo, url = serve(app.Demo.serving(parting_model(tmp_path_factory.mktemp("pair") / "m")))
    yield url
    demo.close()


def open_tab(page, url: str) -> None:
    page.goto(url, wait_until="load")
    page.get_by_role("tab", name="Memory on | off").click()
    page.wait_for_selector("#pair_step")
    page.fill("#pair_prompt textarea", PROMPT)


def steps(page) -> int:
    return int(page.get_attribute(VIEW, "data-steps") or 0)


def wait_steps(page, n: int) -> None:
    page.wait_for_selector(f'{VIEW}[data-steps="{n}"]', state="attached")


def texts(page) -> tuple[str, str]:
    """Both sides' texts as drawn (a differing newline is drawn as ↵ and a new line)."""
    sides = page.eval_on_selector_all(f"{VIEW} .txl-pair-text", "els => els.map(e => e.innerText)")
    return tuple(t.replace("↵\n", "\n") for t in sides)


def api_generate(url: str, n: int) -> dict:
    view, _ = new_client(url).predict(prompt=PROMPT, n=n, **SETTINGS, api_name="/pair_generate")
    return view


def test_step_play_pause_and_reset(app_url, browser_page):  # noqa: F811
    page, log = browser_page
    open_tab(page, app_url)
    for i in range(1, 4):
        page.click("#pair_step")
        wait_steps(page, i)
    memory, window = texts(page)
    expected = api_generate(app_url, 3)  # another session, the same arguments
    assert (memory, window) == (expected["memory_text"], expected["window_text"])
    assert len(memory) == len(PROMPT) + 3

    # Play streams Steps until Pause; the session is then where the page says.
    page.click("#pair_play")
    page.wait_for_function(f"+document.querySelector('{VIEW}').dataset.steps >= 15")
    assert page.inner_text("#pair_play") == "Pause"
    page.click("#pair_play")
    page.wait_for_selector("#pair_play[data-loop='stopped']", state="attached")
    stopped = steps(page)
    page.click("#pair_step")
    wait_steps(page, stopped + 1)
    expected = api_generate(app_url, stopped + 1)  # Play and Steps are Steps
    assert texts(page) == (expected["memory_text"], expected["window_text"])

    page.click("#pair_reset")
    wait_steps(page, 0)
    assert texts(page) == ("", "")
    assert "Nothing generated yet" in page.inner_text("#pair_status")
    assert not [text for kind, text in log["console"] if kind == "error"]


def test_generate_marks_the_parting_where_the_api_says(app_url, browser_page):  # noqa: F811
    page, log = browser_page
    open_tab(page, app_url)
    page.fill("#pair_n input[type=number]", "80")
    page.press("#pair_n input[type=number]", "Enter")
    page.click("#pair_generate")
    wait_steps(page, 80)
    expected = api_generate(app_url, 80)
    assert texts(page) == (expected["memory_text"], expected["window_text"])
    part = expected["parting"]
    assert part is not None and page.get_attribute(VIEW, "data-parting") == str(part["position"])
    # The parting character is outlined on both sides, each side's own character.
    marked = page.eval_on_selector_all(
        f"{VIEW} .txl-pair-parting", "els => els.map(e => e.textContent)"
    )
    chars = [part["with_memory"]["char"], part["without_memory"]["char"]]
    assert [m.replace("↵\n", "\n") for m in marked] == chars
    # Every differing character is marked, on both sides.
    differ = expected["counts"]["differ"]
    assert page.locator(f"{VIEW} .txl-pair-diff").count() == 2 * differ
    assert page.get_attribute(VIEW, "data-differ") == str(differ)
    head = page.inner_text(f"{VIEW} .txl-pair-head")
    assert f"They part at position {part['position']}" in head
    assert page.is_visible(f"{VIEW} canvas.txl-pair-strip")
    assert f"{differ} characters differ" in page.inner_text("#pair_status")

    # Open in Watch: the Watch tab, the shared text as its prompt, memory on; one Step
    # there writes the memory side's character, with both predictions.
    page.click("#pair_watch")
    shared = expected["memory_text"][: part["position"]]
    page.wait_for_function(
        "([n]) => { const box = document.querySelector('#prompt textarea');"
        " return box && box.offsetParent !== null && box.value.length === n; }",
        arg=[len(shared)],
    )
    assert page.input_value("#prompt textarea") == shared
    assert page.is_checked("#memory input[type=checkbox]")
    page.wait_for_selector(f'#attention [data-position="{part["position"] - 1}"]')
    page.click("#step")
    page.wait_for_selector(f'#predictions .txl-pred[data-position="{part["position"]}"]')
    chosen = page.get_attribute("#predictions .txl-pred-col .txl-pred-chosen", "data-token")
    assert chosen == part["with_memory"]["char"]
    assert not [text for kind, text in log["console"] if kind == "error"]


def test_a_prompt_too_long_gets_the_pages_message(app_url, browser_page):  # noqa: F811
    page, _ = browser_page
    open_tab(page, app_url)
    page.fill("#pair_prompt textarea", "a" * 20_001)
    page.click("#pair_step")
    page.get_by_text("the limit is 20,000").first.wait_for()
    assert steps(page) == 0
