"""The app's views of the inside of the attention, through the API: the four score terms
of the newest token in /step's summary (and the attention view's strips), and the "Inside
the attention" tab's /anatomy."""

from __future__ import annotations

import math
import os
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tests import test_app  # noqa: E402
from tests.test_app import MEM_LEN, settings  # noqa: E402
from txl import anatomy  # noqa: E402
from webapp.tabs import watch_views  # noqa: E402

server, client = test_app.server, test_app.client  # the app's fixtures: a tiny model


def step(client, layer="all layers", head="mean over heads", **kw):
    return client.predict(
        prompt="ROMEO:\n", **settings(**kw), layer=layer, head=head, api_name="/step"
    )


def softmax_of_terms(terms) -> np.ndarray:
    scores = terms["scale"] * sum(np.asarray(terms[t], dtype=np.float64) for t in "abcd")
    e = np.exp(scores - scores.max())
    return e / e.sum()


def row_as_shown(attention, terms) -> np.ndarray:
    """softmax(scale · Σ) summed into the view's columns (one key each up to 160 keys)."""
    weights = dict(zip(terms["key_positions"], softmax_of_terms(terms)))
    return np.array(
        [
            sum(weights.get(p, 0.0) for p in range(first, last + 1))
            for first, last in zip(attention["first"], attention["last"])
        ]
    )


@pytest.mark.parametrize("mem_len", [MEM_LEN, 300])  # 300: the view sums keys into buckets
def test_step_terms_give_the_attention_row_the_view_shows(client, mem_len):
    client.predict(
        prompt="ROMEO:\n", n_tokens=320, **settings(mem_len=mem_len), api_name="/generate"
    )
    out = step(client, layer="layer 1", head="head 0", mem_len=mem_len)
    attention, summary = out[3], out[5]
    terms = summary["terms"]
    assert (terms["layer"], terms["head"]) == (1, 0) and attention["rows"] == ["L1 head 0"]
    assert terms["scale"] == pytest.approx(1 / math.sqrt(8))
    keys = terms["key_positions"]
    assert keys == list(range(summary["key_range"][0], summary["key_range"][1] + 1))
    assert all(len(terms[t]) == len(keys) for t in "abcd")
    assert attention["terms"] == terms  # the strips draw the same numbers
    shown = np.asarray(attention["w"][0])
    assert (len(shown) < len(keys)) == (mem_len > 160)
    np.testing.assert_allclose(row_as_shown(attention, terms), shown, atol=2e-4)
    assert "reads by" in terms["words"] and "(b)+(d) span" in terms["words"]


def test_terms_only_for_one_layer_and_one_head(client):
    for layer, head in [
        ("all layers", "head 0"),
        ("layer 0", "mean over heads"),
        ("all layers", "mean over heads"),
    ]:
        out = step(client, layer=layer, head=head)
        assert out[5]["terms"] is None and out[3]["terms"] is None


def test_memory_off_terms(client):
    out = step(client, layer="layer 0", head="head 1", memory=False)
    terms, attention = out[5]["terms"], out[3]
    assert len(terms["key_positions"]) == out[5]["n_keys"]
    np.testing.assert_allclose(row_as_shown(attention, terms), attention["w"][0], atol=2e-4)


def test_past_steps_have_no_terms(server):
    service = server[1].service
    state = service.new_state(service.default_source, service.default_model)
    state.session.start("ROMEO:\n")
    for _ in range(3):
        state.session.step()
    _, newest = watch_views.past_views(state, 0, "layer 1", "head 1")
    _, past = watch_views.past_views(state, 2, "layer 1", "head 1")
    assert newest["terms"] is not None and past["terms"] is None and past["history"][0] == 2


# ---- the "Inside the attention" tab: /anatomy -------------------------------------


TEXT = "To be, or not to be, that is the question.\n" * 4


def test_anatomy_returns_the_profiles_and_both_figures(server, client):
    status, words, fig5, fig7, numbers, file, heads = client.predict(
        text=TEXT, mem_len=MEM_LEN, order="mean", head="all heads", api_name="/anatomy"
    )
    assert "Read **172 characters** in 11 segments" in status and "figures drawn" in status
    assert "Farthest-reading heads" in words and "The paper" in words
    assert "Read" not in words  # said once, in the status line
    for figure in (fig5, fig7):
        assert Path(figure["path"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert numbers["tokens"] == len(TEXT) and numbers["mem_len"] == MEM_LEN
    # the same numbers as txl.anatomy on the app's model
    model = server[1].service.default_model
    direct = anatomy.profiles(model, model.tokenizer.encode(TEXT), MEM_LEN)
    np.testing.assert_allclose(numbers["attention"], direct.attention, atol=2e-6)
    np.testing.assert_allclose(numbers["terms"]["b"], direct.terms[1], atol=2e-6)
    assert len(numbers["heads"]) == 2 * 2 and set(numbers["heads"][0]) == {
        "layer",
        "head",
        "mean_distance",
        "share_beyond_segment",
    }


@pytest.mark.parametrize(
    "text, message",
    [("", "empty"), ("   ", "empty"), ("x" * 5001, "5,001 characters"), ("{}", "vocabulary")],
)
def test_anatomy_bad_text_says_why(client, text, message):
    status, *_ = client.predict(text=text, mem_len=MEM_LEN, api_name="/anatomy")
    assert status.startswith("⚠️") and message in status


def test_reading_streams_its_progress(server, monkeypatch):
    from webapp.tabs import anatomy as tab_module

    monkeypatch.setattr(tab_module, "STAGE_EVERY_S", 0.0)  # a stage after every segment
    text = "All the world's a stage,\n" * 4  # 100 characters: 7 segments of 16
    stages = list(tab_module.read(server[1].service, text, MEM_LEN, "layer", "all heads", None,
                                  tab_module.AnatomyState(), lambda *a, **k: 0))
    assert [s[0].split(" (")[0] for s in stages[:6]] == [
        f"Reading… {16 * k} of 100 characters" for k in range(1, 7)]
    assert "drawing Figure 7" in stages[6][0] and len(stages) == 8


def test_a_newer_click_stops_the_older_job(server, monkeypatch):
    """The job checks between segments whether a newer click took over; if so it stops
    without drawing anything."""
    from webapp.tabs import anatomy as tab_module
    from webapp.tabs.anatomy import AnatomyState, read

    # No progress stages (they come on a timer: a slow first segment would send one
    # before the job looks again), so that what the jobs yield is the code's, not the clock's.
    monkeypatch.setattr(tab_module, "STAGE_EVERY_S", math.inf)
    service, tab = server[1].service, AnatomyState()
    text = "All the world's a stage,\n" * 40  # 1,000 characters: many segments

    def newer_click(*_, **__):  # a second click arrives while the first reads
        tab.job += 1

    first = list(read(service, text, MEM_LEN, "layer", "all heads", None, tab, newer_click))
    assert first == [] and tab.result is None
    figures = list(read(service, text, MEM_LEN, "layer", "all heads", None, tab, lambda *a, **k: 0))
    assert len(figures) == 2 and tab.result is not None  # Figure 5 first, then Figure 7
    assert figures[0][2].endswith(".png") and "drawing Figure 7" in figures[0][0]
    assert figures[1][3].endswith(".png") and "figures drawn" in figures[1][0]
