"""Play as one stream of steps (webapp/tabs/watch_play.py): through gradio_client, and its handler
in-process for the races. A Play of n steps is n Steps; Pause leaves the session where the
last message says; the page's other streams send their views packed."""

from __future__ import annotations

import itertools
import json
import threading
import time
import weakref
from types import SimpleNamespace

import gradio as gr
import pytest

from tests.test_app import MEM_LEN, new_client, server, settings  # noqa: F401  (server: a fixture)
from webapp.tabs import watch as watch_tab
from webapp.tabs import watch_play as play_module

PROMPT = "ROMEO:\n"
TIMINGS = ("latency_ms", "counterfactual_ms", "handler_ms")  # wall-clock fields


def untimed(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in TIMINGS}


def unpacked(value):
    return None if value is None else json.loads(value["packed"])


def play_then_pause(client, play_id: int, messages: int = 3):
    """Play on the client's session until ``messages`` messages came, then Pause; the
    stream's messages (each the page's outputs, packed)."""
    job = client.submit(play_id, PROMPT, *settings().values(), None, None, api_name="/play")
    for received, _ in enumerate(job, start=1):  # each message as it comes
        if received == messages:
            break
    client.predict(play_id, api_name="/play_stop")
    job.result()
    return job.outputs()


def test_a_play_of_n_steps_is_n_steps_with_the_same_seed(server):  # noqa: F811
    url, _ = server
    player, stepper = new_client(url), new_client(url)
    messages = play_then_pause(player, play_id=1)
    text = messages[-1][0]
    n = len(text) - len(PROMPT)
    assert len(messages) >= 3 and n >= len(messages) - 1  # several steps, several messages
    lengths = [len(m[0]) for m in messages]
    assert lengths == sorted(lengths)  # the text only grows, each message the newest
    for _ in range(n):
        stepped = stepper.predict(PROMPT, *settings().values(), None, None, api_name="/step")
    assert stepped[0] == text  # the same text
    # One more Step on each: the same character, attention over the memory (which is
    # the memory's keys, exactly) and predictions. The Play left the session where its
    # last message said: the next Step is the next character.
    after_play = player.predict(PROMPT, *settings().values(), None, None, api_name="/step")
    after_steps = stepper.predict(PROMPT, *settings().values(), None, None, api_name="/step")
    assert after_play[0] == after_steps[0] and after_play[0][:-1] == text
    assert after_play[3] == after_steps[3]  # the attention view
    assert after_play[6] == after_steps[6]  # the predictions view
    assert untimed(after_play[5]) == untimed(after_steps[5])  # the summary: memory, keys


def test_play_messages_are_the_pages_packed_views(server):  # noqa: F811
    url, _ = server
    client = new_client(url)
    messages = play_then_pause(client, play_id=1, messages=2)
    text, text_view, status, attention, history, summary, predictions = messages[-1]
    assert history == 0 and status
    assert unpacked(text_view)["pos"] == len(text) - 1  # the newest step, painted
    assert unpacked(attention)["pos"] == unpacked(summary)["position"] == len(text) - 1
    assert unpacked(predictions) is not None


def start_state(txl_app):
    *_, state = txl_app.watch.step(PROMPT, *settings().values(), None, None, None)
    return state


_VISITOR_KEYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NEW_KEYS = itertools.count()


def visitor(state):
    """A stand-in for the Gradio request of the page that owns ``state``: its key, one per
    state for the whole run. Not ``id(state)``: a later test's state can get a freed one's
    id, and PlayControl would take it for that visitor, its Play 1 already paused (a CI run
    failed so: the stream stopped before its first step)."""
    if state is None:  # a request before the visitor has a state
        return SimpleNamespace(session_hash="visitor-without-state")
    key = _VISITOR_KEYS.setdefault(state, f"visitor-{next(_NEW_KEYS)}")
    return SimpleNamespace(session_hash=key)


def play(txl_app, state, play_id=1):
    return txl_app.watch.play.run(
        play_id, PROMPT, *settings().values(), None, None, state, visitor(state)
    )


def pause(txl_app, state, play_id=1):
    txl_app.watch.play.stop(play_id, visitor(state))


@pytest.mark.parametrize("after", [1, 2, 5])
def test_pause_leaves_the_session_where_the_last_message_says(server, after):  # noqa: F811
    """Pause lands while the stream runs in another thread, after ``after`` messages:
    every step taken is in a message (the last one says where the session is), and none
    is taken after the stream has stopped."""
    _, txl_app = server
    state = start_state(txl_app)
    messages, arrived, ended = [], threading.Semaphore(0), threading.Event()

    def consume():
        try:
            for message in play(txl_app, state):
                messages.append(message)
                arrived.release()
        finally:
            ended.set()

    threading.Thread(target=consume, daemon=True).start()
    for _ in range(after):
        assert arrived.acquire(timeout=120)
    pause(txl_app, state, 1)
    assert ended.wait(timeout=120)
    s = state.session
    assert messages[-1][0] == s.text  # the page shows the session as it is
    assert unpacked(messages[-1][1])["pos"] == len(s.ids) - 1
    assert len(s.history) >= 1 and s.last_trace.position == len(s.ids) - 1


def test_a_pause_before_its_play_started_stops_it_and_a_newer_play_runs(server):  # noqa: F811
    _, txl_app = server
    state = start_state(txl_app)
    text = state.session.text
    pause(txl_app, state, 1)  # Play 1 still queued when its Pause came
    assert list(play(txl_app, state, play_id=1)) == []  # no step taken
    assert state.session.text == text
    stream = play(txl_app, state, play_id=2)  # the next Play
    first = next(stream)
    assert len(first[0]) > len(text)
    pause(txl_app, state, 2)
    rest = list(stream)
    assert (rest or [first])[-1][0] == state.session.text


def test_a_newer_play_stops_the_older_one(server):  # noqa: F811
    _, txl_app = server
    state = start_state(txl_app)
    older = play(txl_app, state, play_id=1)
    next(older)
    newer = play(txl_app, state, play_id=2)
    last = next(newer)  # Play 2 has started: Play 1 takes no more steps
    assert list(older) == []  # ... nor sends anything: the session is Play 2's now
    pause(txl_app, state, 2)
    last = ([last] + list(newer))[-1]
    assert last[0] == state.session.text


def test_another_event_on_the_session_ends_the_stream(server):  # noqa: F811
    """A Step (or Generate, Reset, Load) while Play runs: the stream stops at once,
    without another step or message; the session is the Step's."""
    _, txl_app = server
    state = start_state(txl_app)
    stream = play(txl_app, state)
    next(stream)
    stepped = txl_app.watch.step(PROMPT, *settings().values(), None, None, state)
    assert list(stream) == []
    assert state.session.text == stepped[0]


def test_play_stops_at_the_text_cap_after_showing_its_steps(server, monkeypatch):  # noqa: F811
    _, txl_app = server
    state = start_state(txl_app)
    cap = len(state.session.text) + 40
    monkeypatch.setattr(watch_tab, "MAX_TEXT_CHARS", cap)
    messages = []
    with pytest.raises(gr.Error, match="the most one session holds"):
        for message in play(txl_app, state):
            messages.append(message)
    assert messages[-1][0] == state.session.text and len(state.session.text) == cap


def test_generate_and_redraw_send_the_page_packed_views(server):  # noqa: F811
    """The page's Generate and Continue stream /generate's outputs packed, and the
    layer/head/history redraw sends its four views packed: unpacked, the same dicts."""
    _, txl_app = server
    args = (PROMPT, 30, *settings().values(), "layer 1", "head 0")
    api = list(txl_app.watch.generate(*args, None))
    page = list(txl_app.watch.generate_page(*args, None))
    final_api, final_page = api[-1], page[-1]
    assert final_page[0] == final_api[0]
    for i in (1, 3, 6):  # text view, attention, predictions
        assert unpacked(final_page[i]) == final_api[i]
    assert untimed(unpacked(final_page[5])) == untimed(final_api[5])
    state = final_page[-1]
    more = list(txl_app.watch.continue_page(*args, state))[-1]
    assert len(more[0]) == len(final_api[0]) + 30 and list(more[1]) == ["packed"]
    dicts = txl_app.watch.redraw(-2, "layer 0", None, state)
    packed = txl_app.watch.redraw_page(-2, "layer 0", None, state, visitor(state))
    assert [unpacked(v) for v in packed] == list(dicts)
    no_session = txl_app.watch.redraw_page(0, None, None, None, visitor(None))
    assert no_session == (gr.skip(),) * 4  # no session: nothing drawn


def test_settings_layer_and_head_changed_during_play_apply_from_the_next_step(server):  # noqa: F811
    """The page's events while Play runs: a sampling setting applies at once (as it would
    at the next Step), and a layer and head chosen are what the next messages draw."""
    _, txl_app = server
    state = start_state(txl_app)
    stream = play(txl_app, state)
    assert unpacked(next(stream)[3])["terms"] is None  # all layers: no single head's terms
    txl_app.watch.settings_changed(True, MEM_LEN, 0.0, 0, 1.0, 0, None, None, state)
    assert state.session.temperature == 0.0
    txl_app.watch.redraw_page(0, "layer 1", "head 0", state, visitor(state))
    message = next(stream)  # Play goes on, with the layer and head chosen
    assert unpacked(message[3])["terms"] is not None  # one head: its four score terms
    pause(txl_app, state, 1)
    assert ([message] + list(stream))[-1][0] == state.session.text


def test_play_leaves_the_core_to_others_requests_between_steps(server, monkeypatch):  # noqa: F811
    """While another request is in flight, Play waits as long as its last step took
    before the next one; alone, it does not wait."""
    _, txl_app = server
    slept = []
    clock = SimpleNamespace(perf_counter=time.perf_counter, sleep=slept.append)
    monkeypatch.setattr(play_module, "time", clock)
    state = start_state(txl_app)
    stream = play(txl_app, state)
    next(stream)
    next(stream)
    assert slept == []  # alone
    with txl_app.service.traffic.short():  # another visitor's Step, say
        next(stream)
    assert slept and all(s > 0 for s in slept)
    pause(txl_app, state)
    list(stream)
