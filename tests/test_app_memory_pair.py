"""The "Memory on | off" tab through its API (gradio_client against the app in-process,
a tiny model whose two sides part within a few dozen steps): /pair_step and
/pair_generate give the texts and parting point of a MemoryPair run directly, a Generate
of n is n Steps, Reset forgets, bad input gets a message that names it, and Open in Watch
leaves the Watch tab one Step before the parting point."""

from __future__ import annotations

from pathlib import Path

import pytest
from gradio_client import Client

import app
from tests.test_app import MEM_LEN, new_client, serve
from tests.test_counterfactual import tiny_float
from txl.counterfactual import MemoryPair
from webapp import memory_pair_viz

PROMPT = "ROMEO:\nI will not stay.\n\nJULIET:\nNo"
SETTINGS = dict(mem_len=MEM_LEN, temperature=1.0, top_k=0, top_p=1.0, seed=3)


def parting_model(folder) -> str:
    """A tiny model whose two sides part within a few dozen steps, saved to ``folder``."""
    tiny_float(seed=1).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = parting_model(tmp_path_factory.mktemp("parting") / "model")
    txl_app = app.Demo.serving(folder)
    demo, url = serve(txl_app)
    yield url, txl_app
    demo.close()


@pytest.fixture
def client(server) -> Client:
    return new_client(server[0])


def direct(txl_app, n: int, **overrides) -> MemoryPair:
    return direct_on(txl_app.service.default_model, n, **overrides)


def pair_step(c, **overrides):
    return c.predict(prompt=PROMPT, **{**SETTINGS, **overrides}, api_name="/pair_step")


def pair_generate(c, n, **overrides):
    return c.predict(prompt=PROMPT, n=n, **{**SETTINGS, **overrides}, api_name="/pair_generate")


def test_generate_is_the_pair_run_directly_and_n_steps(server, client):
    url, txl_app = server
    view, status = pair_generate(client, 80)
    pair = direct(txl_app, 80)
    assert view["memory_text"] == pair.with_memory.text
    assert view["window_text"] == pair.without_memory.text
    assert pair.parting is not None  # the tiny model parts: the test sees a parting point
    expected = pair.parting.as_dict()
    for key in ("step", "position", "with_memory", "without_memory"):
        assert view["parting"][key] == expected[key]
    assert view["differ"] == memory_pair_viz.differing_runs(pair.differing)
    assert view["counts"]["differ"] == len(pair.differing)
    assert f"they part at step {expected['step'] + 1}" in status
    # Step by Step, from another client: the same texts after 80 Steps.
    other = new_client(url)
    for i in range(80):
        stepped, _ = pair_step(other)
        assert stepped["steps"] == i + 1
    assert stepped["memory_text"] == view["memory_text"]
    assert stepped["window_text"] == view["window_text"]
    assert stepped["parting"] == view["parting"]


def test_settings_change_starts_over_and_seed_changes_the_draws(client):
    a, _ = pair_step(client)
    b, _ = pair_step(client)
    assert (a["steps"], b["steps"]) == (1, 2)
    c, _ = pair_step(client, seed=4)  # another seed: a new pair from the prompt
    assert c["steps"] == 1
    many = {pair_generate(client, 30, seed=s)[0]["memory_text"] for s in range(4)}
    assert len(many) > 1


def test_memory_off_at_mem_len_zero_is_still_the_pairs_memory(server, client):
    """mem_len 0 keeps memory on with no positions: the left side still differs from
    the window (it sees only the newest token); the view says mem_len 0."""
    view, _ = pair_generate(client, 20, mem_len=0)
    assert view["mem_len"] == 0 and view["memory"] is True
    assert view["memory_text"] == direct(server[1], 20, mem_len=0).with_memory.text


def test_reset_forgets_both_texts(server):
    tab = server[1].memory_pair
    view, _, state = tab.step(PROMPT, *SETTINGS.values(), None)
    view, _, state = tab.step(PROMPT, *SETTINGS.values(), state)
    assert view["steps"] == 2
    budget = server[1].service.budget
    held = budget.in_ram()  # the pair's two sessions count in the memory budget
    view, status, state = tab.reset(state)
    assert view is None and state.pair is None and "Nothing generated yet" in status
    assert budget.in_ram() < held  # and leave it on Reset
    view, _, state = tab.step(PROMPT, *SETTINGS.values(), state)
    assert view["steps"] == 1  # from the prompt again


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("mem_len", 99999, "mem_len"),
        ("temperature", -1, "temperature"),
        ("top_p", 0, "top_p"),
        ("seed", 1.5, "seed"),
        ("top_k", "many", "top_k"),
    ],
)
def test_bad_settings_are_refused_by_name(client, name, value, message):
    with pytest.raises(Exception, match=message):
        pair_step(client, **{name: value})


def test_bad_n_is_refused_by_name(client):
    with pytest.raises(Exception, match="n: Value 501 is greater than maximum value 500"):
        pair_generate(client, 501)
    with pytest.raises(Exception, match="n must be a number"):
        pair_generate(client, "x")


def test_open_in_watch_is_one_step_before_the_parting(server):
    _, txl_app = server
    tab, watch = txl_app.memory_pair, txl_app.watch
    view, _, state = None, None, None
    for _ in range(80):
        view, _, state = tab.step(PROMPT, *SETTINGS.values(), state)
        if view["parting"] is not None:
            break
    part = view["parting"]
    prompt, memory, mem_len, _, *shown = tab.open_in_watch(1.0, 0, 1.0, 0, None, None, state)
    assert prompt == view["memory_text"][: part["position"]] and memory and mem_len == MEM_LEN
    assert shown[0] == prompt  # the Watch tab's text: the shared text, nothing after it
    # One Step in Watch writes the memory side's character, with both predictions.
    after = watch.step(prompt, True, mem_len, 1.0, 0, 1.0, 0, None, None, state)
    assert after[0] == prompt + part["with_memory"]["char"]
    predictions = after.predictions
    assert predictions["chosen"] == part["with_memory"]["char"]
    assert predictions["without_memory"] is not None


def test_open_in_watch_before_a_parting_says_so(server):
    tab = server[1].memory_pair
    with pytest.raises(Exception, match="not parted yet"):
        tab.open_in_watch(1.0, 0, 1.0, 0, None, None, None)


def test_a_loaded_model_writes_both_sides(server, tmp_path):
    """Load (the Watch tab's box: a folder or a Hub id) changes the visitor's model: the
    next pair Step starts a pair of that model."""
    _, txl_app = server
    tab, service = txl_app.memory_pair, txl_app.service
    view, _, state = tab.step(PROMPT, *SETTINGS.values(), None)
    first = state.pair
    service.model_dirs.append(tmp_path.resolve())
    other = parting_model(tmp_path / "other")
    state = service.load(other, state)
    view, _, state = tab.step(PROMPT, *SETTINGS.values(), state)
    assert state.pair is not first and state.pair.model is state.model is not first.model
    assert view["steps"] == 1
    assert view["memory_text"] == direct_on(state.model, 1).with_memory.text


def direct_on(model, n: int, **overrides) -> MemoryPair:
    """The pair the app's endpoints should give: a MemoryPair run in the test."""
    pair = MemoryPair(model, **{**SETTINGS, **overrides})
    pair.start(PROMPT)
    list(pair.generate(n))
    return pair


def test_a_model_from_the_hub_writes_both_sides(server, tmp_path):
    """The same by Hub repo id, from a loopback Hub (tests/hub_server.py): the pair runs on
    the model the Hub served, its two sides the MemoryPair of that model."""
    from tests.hub_server import FakeHub, hub_environment
    from tests.test_hub import read_folder

    _, txl_app = server
    tab, service = txl_app.memory_pair, txl_app.service
    _, _, state = tab.step(PROMPT, *SETTINGS.values(), None)
    files = read_folder(Path(parting_model(tmp_path / "served")))
    with FakeHub({"someorg/parting-txl": files}) as hub, hub_environment(hub.url, tmp_path / "hf"):
        state = service.load("someorg/parting-txl", state)
    view, _, state = tab.step(PROMPT, *SETTINGS.values(), state)
    assert state.model is not service.default_model  # the one the Hub served
    assert state.pair.model is state.model and view["steps"] == 1
    *_, (view, _, state) = tab.generate(PROMPT, 40, *SETTINGS.values(), state)
    pair = direct_on(state.model, 40)
    assert (view["memory_text"], view["window_text"]) == (
        pair.with_memory.text,
        pair.without_memory.text,
    )
