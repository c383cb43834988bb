"""The Gradio app end to end: gradio_client against the app launched in-process on
127.0.0.1, with a tiny random model made in a temporary folder."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import gradio as gr  # noqa: E402
import huggingface_hub.constants  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from gradio_client import Client  # noqa: E402

import app  # noqa: E402
from benchmarks.bench_app import api_client  # noqa: E402
from txl import TransformerXL, TXLConfig  # noqa: E402
from txl.scoring import score_text  # noqa: E402
from txl.session import Session  # noqa: E402
from webapp import serve as webapp_serve  # noqa: E402
from webapp.serve import Settings  # noqa: E402
from webapp.tabs import score as score_tab  # noqa: E402
from webapp.tabs import watch as watch_tab  # noqa: E402
from webapp.tabs import watch_views  # noqa: E402
from webapp.tabs.examples import ROMEO_AND_JULIET  # noqa: E402

VOCAB = sorted(set("\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))
SEG_LEN, MEM_LEN = 16, 32
PUBLIC = {"/generate", "/step", "/reset", "/score", "/load_model", "/anatomy", "/recall"}
PUBLIC |= {"/pair_step", "/pair_generate"}  # the "Memory on | off" tab


def tiny_model(folder, n_layer=2, seed=0):
    torch.manual_seed(seed)
    config = TXLConfig(
        vocab=VOCAB,
        d_model=32,
        n_layer=n_layer,
        n_head=2,
        d_head=8,
        d_inner=64,
        tgt_len=SEG_LEN,
        mem_len=MEM_LEN,
        dropout=0.0,
    )
    TransformerXL(config).save_pretrained(folder)
    return str(folder)


def serve(txl_app: app.Demo):
    """Build and launch the app on a free loopback port; returns (demo, url).

    One torch thread per model call, as `python app.py` runs, comes from conftest.py."""
    demo = txl_app.build()
    _, url, _ = app.launch(
        demo,
        server_name="127.0.0.1",
        server_port=None,
        prevent_thread_lock=True,
        quiet=True,
        ssr_mode=False,
    )
    return demo, url


def new_client(url: str) -> Client:
    """A gradio_client Client for the tests: 300 s per request, patient on a loaded
    machine (a real hang is stopped by pytest-timeout)."""
    return api_client(url, timeout=300)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    txl_app = app.Demo.serving(folder, model_dirs=[str(tmp_path_factory.getbasetemp())])
    assert txl_app.service.load_error is None
    demo, url = serve(txl_app)
    yield url, txl_app
    demo.close()


@pytest.fixture
def client(server):
    return new_client(server[0])


def settings(**overrides):
    """The sampling settings as keyword arguments (temperature 1 so seeds matter)."""
    values = dict(memory=True, mem_len=MEM_LEN, temperature=1.0, top_k=0, top_p=1.0, seed=0)
    values.update(overrides)
    return values


def generate(c, prompt="ROMEO:\n", n_tokens=20, **kw):
    return c.predict(prompt=prompt, n_tokens=n_tokens, **settings(**kw), api_name="/generate")


def step(c, prompt="ROMEO:\n", **kw):
    return c.predict(prompt=prompt, **settings(**kw), api_name="/step")


def test_public_api(client):
    api = client.view_api(print_info=False, return_format="dict")
    assert set(api["named_endpoints"]) == PUBLIC
    params = [p["parameter_name"] for p in api["named_endpoints"]["/generate"]["parameters"]]
    assert params[:8] == [
        "prompt",
        "n_tokens",
        "memory",
        "mem_len",
        "temperature",
        "top_k",
        "top_p",
        "seed",
    ]
    params = [p["parameter_name"] for p in api["named_endpoints"]["/step"]["parameters"]]
    assert params[:7] == ["prompt", "memory", "mem_len", "temperature", "top_k", "top_p", "seed"]
    assert not api["unnamed_endpoints"]


def test_the_page_samples_at_temperature_0_8_in_the_0_9_nucleus_by_default(client):
    """The sliders every sampling tab opens with, as the API reports them: the sampler the
    model card's writing figures are read at (scripts/generation_check.py's default)."""
    api = client.view_api(print_info=False, return_format="dict")
    for endpoint in ("/generate", "/step", "/pair_generate"):
        defaults = {
            p["parameter_name"]: p["parameter_default"]
            for p in api["named_endpoints"][endpoint]["parameters"]
        }
        assert (defaults["temperature"], defaults["top_k"], defaults["top_p"]) == (0.8, 0, 0.9)


def test_generate_returns_text_first_and_same_seed_same_text(server):
    a, b = (new_client(server[0]) for _ in range(2))
    first = generate(a, n_tokens=25, seed=7)
    assert isinstance(first[0], str) and first[0].startswith("ROMEO:\n")
    assert len(first[0]) == len("ROMEO:\n") + 25
    assert generate(b, n_tokens=25, seed=7)[0] == first[0]  # another session, same seed
    assert generate(a, n_tokens=25, seed=7)[0] == first[0]  # again: Generate starts over
    assert generate(a, n_tokens=25, seed=8)[0] != first[0]


def test_generate_streams(client, monkeypatch):
    # Streaming is on a timer (STREAM_EVERY_S): how many partial texts a real Generate
    # sends depends on the machine's speed. With the timer at 0 every step but the last
    # sends one, so the count is the code's, not the clock's.
    monkeypatch.setattr(watch_tab, "STREAM_EVERY_S", 0.0)
    job = client.submit(prompt="A", n_tokens=60, **settings(), api_name="/generate")
    final = job.result(timeout=300)
    texts = [out[0] for out in job.outputs()]
    assert texts[-1] == final[0] and len(final[0]) == 61
    assert [len(t) for t in texts[:-1]] == list(range(2, 61))  # one per step, in order
    assert all(final[0].startswith(t) for t in texts)


def test_generate_streams_the_views(client, monkeypatch):
    monkeypatch.setattr(watch_tab, "STREAM_EVERY_S", 0.0)  # read at call time: every step streams
    job = client.submit(prompt="A", n_tokens=400, **settings(), api_name="/generate")
    final = job.result(timeout=300)
    partial = job.outputs()[:-1]
    assert len(partial) > 1
    attentions = [out[3] for out in partial if isinstance(out[3], dict)]
    assert len(attentions) > 1  # not just the last one
    for out in partial:
        if isinstance(out[3], dict):  # each view is of the step its text ends with
            assert out[3]["pos"] == len(out[0]) - 1 == out[1]["pos"]
    assert len({a["pos"] for a in attentions}) == len(attentions)
    assert final[3]["pos"] == len(final[0]) - 1 and final[5]["position"] == final[3]["pos"]


def test_step_continues_where_the_last_call_ended(client):
    text = generate(client, n_tokens=20, seed=3)[0]
    out = step(client, seed=3)
    assert out[0][:-1] == text and len(out[0]) == len(text) + 1
    assert out[5]["position"] == len(text) and out[5]["char"] == out[0][-1]
    again = step(client, seed=3)[0]
    assert again[:-1] == out[0]
    # stepping is the same as generating further with the same seed
    assert generate(client, n_tokens=22, seed=3)[0] == again
    # an edited prompt starts over from the new prompt
    fresh = step(client, prompt="JULIET:", seed=3)[0]
    assert fresh.startswith("JULIET:") and len(fresh) == len("JULIET:") + 1


def test_two_clients_keep_separate_memory(server):
    a, b = (new_client(server[0]) for _ in range(2))
    text_a = generate(a, prompt="ROMEO:", n_tokens=60)[0]
    text_b = step(b, prompt="JULIET:")[0]
    assert text_b.startswith("JULIET:") and len(text_b) == len("JULIET:") + 1
    out_a = step(a, prompt="ROMEO:")
    assert out_a[0][:-1] == text_a  # A's text and memory were not touched by B
    assert out_a[5]["n_memory"] == MEM_LEN and out_a[5]["memory_tokens"] == MEM_LEN
    out_b = step(b, prompt="JULIET:")
    assert out_b[0][:-1] == text_b and out_b[5]["n_memory"] == len(text_b)
    assert client_reset_is_private(a, b)


def client_reset_is_private(a, b) -> bool:
    """Reset in one session leaves the other's text alone."""
    before = step(b, prompt="JULIET:")[0]
    assert a.predict(api_name="/reset")[0] == ""
    return step(b, prompt="JULIET:")[0][:-1] == before


def test_memory_off_changes_what_attention_covers(client):
    generate(client, n_tokens=80)
    on = step(client)[5]
    assert on["memory"] and on["n_memory"] == MEM_LEN and on["n_keys"] == MEM_LEN + 1
    assert on["context"] == MEM_LEN + 1
    off_out = step(client, memory=False)
    off = off_out[5]
    assert not off["memory"] and off["n_memory"] == 0 and off["n_keys"] == SEG_LEN
    assert off["key_range"] == [off["position"] - SEG_LEN + 1, off["position"]]
    assert off["memory_mass_per_layer"] == [0.0, 0.0]
    assert off["far_mass_per_layer"] == [0.0, 0.0]  # nothing seg_len or more back
    assert on["far"] == SEG_LEN and max(on["far_mass_per_layer"]) > 0
    assert "Memory **off**" in off_out[2]
    back_on = step(client, memory=True)[5]  # memory rebuilt from the last mem_len tokens
    assert back_on["memory"] and back_on["n_memory"] == MEM_LEN
    step(client, mem_len=48)  # a longer memory grows from now on
    assert step(client, mem_len=48)[5]["n_memory"] == MEM_LEN + 1


def shown_share(status: str) -> float:
    """The percentage the status line leads with."""
    match = re.match(r"attention beyond the window: \*\*([\d.]+) %\*\*", status)
    assert match, status
    return float(match.group(1))


def test_page_step_sends_the_api_views_packed_as_one_string_each(server, client):
    """The page's Step (step_page, private) gives the page /step's four views each as one
    JSON string (figures.packed: Gradio's page copies a value number by number); unpacked,
    they are /step's values for the same seed, and the other outputs are /step's own."""
    _, txl_app = server
    choice = dict(layer="layer 1", head="head 0")  # one head: the view carries its terms
    api = client.predict(prompt="ROMEO:\n", **settings(), **choice, api_name="/step")
    page = txl_app.watch.step_page("ROMEO:\n", *settings().values(), *choice.values(), None)
    assert len(page) == 8 and page[-1] is not None  # the seven outputs, then the state
    text, text_view, status, attention, history, summary, predictions = page[:7]
    unpacked = {}
    for name, value in zip(
        ("text_view", "attention", "summary", "predictions"),
        (text_view, attention, summary, predictions),
    ):
        assert list(value) == ["packed"] and isinstance(value["packed"], str), name
        unpacked[name] = json.loads(value["packed"])
    assert text == api[0] and history == api[4] == 0
    assert unpacked["text_view"] == api[1]
    assert unpacked["attention"] == api[3] and unpacked["attention"]["terms"] is not None
    assert unpacked["predictions"] == api[6]
    timings = ("latency_ms", "counterfactual_ms", "handler_ms")  # wall times: differ
    untimed = [
        {k: v for k, v in d.items() if k not in timings} for d in (unpacked["summary"], api[5])
    ]
    assert untimed[0] == untimed[1] and untimed[0]["position"] == len(text) - 1
    # The status line too, but for the step's measured latency in it.
    assert re.sub(r"last step [\d.]+ ms", "", status) == re.sub(r"last step [\d.]+ ms", "", api[2])


def test_step_summary_share_beyond_the_window_is_the_attention_views_weights_summed(client):
    """The window line: the step summary's beyond-window share (far_mass_per_layer) is the
    attention view's weights summed over the keys tgt_len or more back, row by row (one
    row per layer, the mean over heads), and the bars the view draws; the status line
    leads with it for the shown layer and head (the text's shading summed before the
    window); the text marks the window's edge and the memory beyond it."""
    generate(client, n_tokens=3 * MEM_LEN)
    text, text_view, status, attention, _, summary, _ = step(client)
    pos = attention["pos"]
    assert summary["far"] == attention["window"] == SEG_LEN
    beyond = [c for c, last in enumerate(attention["last"]) if pos - last >= SEG_LEN]
    assert beyond == list(range(attention["n_far_cols"])) and len(beyond) == MEM_LEN + 1 - SEG_LEN
    w = attention["w"]
    summed = [sum(row[c] for c in beyond) for row in w]
    assert summary["far_mass_per_layer"] == pytest.approx(summed, abs=2e-4)
    assert attention["far"] == pytest.approx(summary["far_mass_per_layer"], abs=1e-4)
    assert max(summary["far_mass_per_layer"]) > 0.1  # something to see: not a zero check
    # The status: the mean over layers and heads, as the text is shaded.
    share = sum(text_view["w"][: pos - SEG_LEN + 1 - text_view["w0"]])
    assert status.startswith("attention beyond the window: **")
    assert shown_share(status) == pytest.approx(100 * share, abs=0.051)  # 1 decimal
    assert text_view["window_start"] == pos - SEG_LEN + 1
    roles = {first: role for role, first, _ in text_view["runs"]}
    assert roles[text_view["window_start"]] == "memory"
    assert roles[text_view["w0"]] == "far"
    # One layer and one head: the share of that head alone.
    out = client.predict(
        prompt="ROMEO:\n", **settings(), layer="layer 1", head="head 0", api_name="/step"
    )
    text_view, status, attention = out[1], out[2], out[3]
    cols = attention["n_far_cols"]
    assert attention["far"][0] == pytest.approx(sum(attention["w"][0][:cols]), abs=2e-4)
    share = sum(text_view["w"][: attention["pos"] - SEG_LEN + 1 - text_view["w0"]])
    assert shown_share(status) == pytest.approx(100 * share, abs=0.051)
    assert " %** (layer 1, head 0;" in status
    # Memory off: nothing lies beyond the window, and the status line speaks of no memory.
    off = step(client, memory=False)
    assert off[5]["far_mass_per_layer"] == [0.0, 0.0] and off[3]["n_far_cols"] == 0
    assert off[2].startswith("Memory **off**") and "beyond the window" not in off[2]


def test_step_returns_the_attention_of_the_new_character(client):
    text, text_view, status, attention, history, summary, predictions = step(client)
    assert attention["pos"] == len(text) - 1 == summary["position"] == text_view["pos"]
    assert attention["rows"] == ["layer 0", "layer 1"]  # 'all layers': one row per layer
    assert attention["n_keys"] == summary["n_keys"] == len(attention["first"])
    assert attention["last"][-1] == attention["pos"]  # the newest key is the token itself
    assert history == 0 and "Memory **on**" in status
    assert predictions["pos"] == summary["position"]  # the bars of the same step
    # the text view: every shown character once, the newest one last, weights on the keys
    positions = [first + i for _, first, piece in text_view["runs"] for i in range(len(piece))]
    assert positions == list(range(text_view["earlier"], len(text)))
    assert text_view["runs"][-1][0] == "newest"
    assert text_view["w0"] == attention["first"][0]
    assert len(text_view["w"]) == attention["n_keys"]


def test_layer_and_head_views(client):
    out = client.predict(
        prompt="ROMEO:", **settings(), layer="layer 1", head="mean over heads", api_name="/step"
    )
    attention, text_view = out[3], out[1]
    n_head = 2
    assert attention["rows"] == [f"L1 head {h}" for h in range(n_head)] + ["L1 mean"]
    assert len(attention["w"]) == n_head + 1 and len(attention["mass"]) == n_head + 1
    assert attention["n_mem_cols"] == attention["n_keys"] - 1  # memory | the new token
    assert text_view["layer"] == "layer 1" and text_view["head"] == "mean over heads"
    one = client.predict(
        prompt="ROMEO:", **settings(), layer="layer 0", head="head 1", api_name="/step"
    )[3]
    assert one["rows"] == ["L0 head 1"]


def test_reset_clears_the_views(client):
    generate(client, n_tokens=5)
    out = client.predict(api_name="/reset")
    text, text_view, status, attention, history, summary, predictions = out
    assert text == "" and attention is None and summary is None and history == 0
    assert predictions is None and text_view["effect"] is None
    assert text_view["runs"] == [] and text_view["w"] is None


def test_bad_settings_give_an_error_and_keep_the_text(client):
    text = generate(client, n_tokens=10)[0]
    for bad in (dict(temperature=-1.0), dict(top_p=0.0), dict(mem_len=99999)):
        with pytest.raises(Exception, match=r"minimum|maximum|temperature|top_p|mem_len"):
            step(client, **bad)
    assert step(client)[0][:-1] == text


SCORE_TEXT = "To be, or not to be, that is the question.\n" * 3


def test_score(client):
    plot, summary, numbers, context_plot, context_md = client.predict(
        text=SCORE_TEXT, mem_len=MEM_LEN, api_name="/score"
    )
    assert plot["type"] == "plotly" and "memory" in plot["plot"]
    assert context_plot["type"] == "plotly" and "Effective context" in context_md
    assert "bits per character" in summary and f"{len(SCORE_TEXT) - 1:,} characters" in summary
    assert numbers["tokens"] == len(SCORE_TEXT) - 1 and numbers["mem_len"] == MEM_LEN
    assert numbers["seg_len"] == numbers["sliding_window"] == SEG_LEN
    for way in ("segments_alone", "sliding_window", "memory"):
        assert math.isfinite(numbers["bpc"][way]) and numbers["seconds"][way] >= 0
    sweep = numbers["context_sweep"]
    assert sweep["effective_context"] in sweep["mem_len"]
    assert len(sweep["bpc"]) == len(sweep["mem_len"])
    with pytest.raises(Exception, match="Nothing to score"):
        client.predict(text="", mem_len=MEM_LEN, api_name="/score")


def test_score_numbers_equal_a_direct_score(server, client):
    txl_app = server[1]
    numbers = client.predict(text=SCORE_TEXT, mem_len=MEM_LEN // 2, api_name="/score")[2]
    direct = score_text(txl_app.service.default_model, SCORE_TEXT, mem_len=MEM_LEN // 2)
    expected = {
        "segments_alone": direct.bpc_without,
        "sliding_window": direct.bpc_sliding,
        "memory": direct.bpc_with,
    }
    assert numbers["bpc"] == pytest.approx(expected, abs=2e-4)
    assert numbers["mem_len"] == MEM_LEN // 2


MOMENTS_TEXT = ROMEO_AND_JULIET[:400]  # no repeats: no two characters read alike


def test_score_moments_are_the_top_5_of_direct_per_character_differences(server, client):
    """/score's numbers gain "moments": the 5 characters where memory saved the most bits
    over the sliding window, as the JSON contract says, equal to the top 5 of the per-
    character differences of a direct Score's arrays and of direct forwards."""
    from tests.test_session import assert_top_k, direct_savings

    numbers = client.predict(text=MOMENTS_TEXT, mem_len=MEM_LEN, api_name="/score")[2]
    moments = numbers["moments"]
    assert len(moments) == 5
    for m in moments:
        assert set(m) == {"position", "char", "bits_memory", "bits_window", "bits_saved", "context"}
        p = m["position"]
        assert m["char"] == MOMENTS_TEXT[p]
        assert m["context"] == MOMENTS_TEXT[max(0, p - 40) : p + 41]
        assert m["bits_saved"] == pytest.approx(m["bits_window"] - m["bits_memory"], abs=2e-4)
    model = server[1].service.default_model
    direct = score_text(model, MOMENTS_TEXT, mem_len=MEM_LEN)  # the arrays, in-process
    saved = direct.bits_sliding.astype(float) - direct.bits_with
    assert [m["position"] for m in moments] == (1 + (-saved).argsort(kind="stable")[:5]).tolist()
    for m in moments:
        assert m["bits_memory"] == pytest.approx(direct.bits_with[m["position"] - 1], abs=1e-4)
        assert m["bits_window"] == pytest.approx(direct.bits_sliding[m["position"] - 1], abs=1e-4)
    forwards = direct_savings(model, MOMENTS_TEXT, SEG_LEN, MEM_LEN)  # by direct forwards
    as_moments = [
        SimpleNamespace(position=m["position"], bits_saved=m["bits_saved"]) for m in moments
    ]
    assert_top_k(as_moments, forwards[:, 1] - forwards[:, 0], k=5, tolerance=2e-4)


def test_watch_it_prompt_is_the_text_before_the_moment(server):
    """ScoreTab.score_moments / moment_prompt: after a Score, the view and the choices of
    its moments; a moment's prompt is the text before it, at the Score's mem_len, and a
    Session started on it predicts that very character as the Score did."""
    txl_app = server[1]
    state = txl_app.service.ensure(None)
    with pytest.raises(gr.Error, match="Score a text first"):
        txl_app.score.moment_prompt(state, 5)
    *_, last = txl_app.score.score(MOMENTS_TEXT, MEM_LEN // 2, state)
    moments = last[2]["moments"]
    view, dropdown = txl_app.score.score_moments(state)
    assert [m["position"] for m in view["moments"]] == [m["position"] for m in moments]
    assert view["text"] == MOMENTS_TEXT and len(view["effect"]["with"]) == len(MOMENTS_TEXT) - 1
    assert [value for _, value in dropdown.choices] == [m["position"] for m in moments]
    assert dropdown.value == moments[0]["position"]
    tokenizer = txl_app.service.default_model.tokenizer
    for m in moments:
        prompt, mem_len, token = txl_app.score.moment_prompt(state, m["position"])
        assert prompt == MOMENTS_TEXT[: m["position"]] and mem_len == MEM_LEN // 2
        assert token == tokenizer.encode(m["char"])[0]
        s = Session(txl_app.service.default_model, mem_len=mem_len)
        s.start(prompt)
        bits = -torch.log_softmax(s.next_logits.double(), -1)[token].item() / math.log(2)
        assert bits == pytest.approx(m["bits_memory"], abs=1e-4)
    for bad in (0, len(MOMENTS_TEXT), "x", None):
        with pytest.raises(gr.Error, match="Pick a moment"):
            txl_app.score.moment_prompt(state, bad)

    # Watch it: the session starts on the prompt, memory on at the Score's mem_len, the
    # prompt's last character's attention captured; the next Step writes the moment's
    # character, its prediction with and without memory the Score's numbers.
    m = moments[1]
    memory_off = Settings(False, MEM_LEN, 1.0, 0, 1.0, 0)
    txl_app.service.apply_settings(state.session, memory_off)
    prompt = txl_app.score.watch_moment(state, m["position"], (1.0, 0, 1.0, 7))
    s = state.session
    assert prompt == s.text == MOMENTS_TEXT[: m["position"]]
    assert s.memory and s.mem_len == MEM_LEN // 2 and s.seed == 7
    t = s.last_trace
    assert t.position == m["position"] - 1 and t.attentions is not None
    assert t.key_positions[-1] == t.position and t.predictions is None
    out = txl_app.watch.step(prompt, True, MEM_LEN // 2, 1.0, 0, 1.0, 7, None, None, state)
    text, summary = out[0], out[5]
    assert text == MOMENTS_TEXT[: m["position"] + 1]  # the moment's own character
    p = summary["predictions"]
    assert p["chosen"] == m["char"]
    assert -math.log2(p["p_chosen"]["with_memory"]) == pytest.approx(m["bits_memory"], abs=1e-3)
    assert -math.log2(p["p_chosen"]["without_memory"]) == pytest.approx(m["bits_window"], abs=1e-3)
    assert p["bits_saved"] == pytest.approx(m["bits_saved"], abs=1e-3)
    # Once: the next Step samples again (a replay left by Watch it expires with its text).
    assert state.replay is None
    txl_app.score.watch_moment(state, m["position"], (1.0, 0, 1.0, 7))
    txl_app.watch.step("another prompt", True, MEM_LEN // 2, 1.0, 0, 1.0, 7, None, None, state)
    assert state.replay is None and s.text.startswith("another prompt")


def test_score_skips_the_sliding_window_of_long_texts(server, client, monkeypatch):
    monkeypatch.setattr(score_tab, "MAX_SLIDING_CHARS", len(SCORE_TEXT) - 1)
    _, summary, numbers, _, _ = client.predict(text=SCORE_TEXT, mem_len=MEM_LEN, api_name="/score")
    assert numbers["bpc"]["sliding_window"] is None
    assert numbers["seconds"]["sliding_window"] is None
    assert math.isfinite(numbers["bpc"]["memory"]) and "sliding window is computed" in summary
    assert numbers["moments"] is None  # no window: no moments, and nothing to watch
    state = server[1].service.ensure(None)
    *_, last = server[1].score.score(SCORE_TEXT, MEM_LEN, state)
    assert last[2]["moments"] is None and state.scored is None
    view, choices = server[1].score.score_moments(state)
    assert view is None and choices.choices == []


def test_score_streams_its_stages_and_ends_with_the_direct_sliding_window(server, client):
    """submit() sees the stages, each summary saying where the Score is: at once, the first
    of three stages under way; memory and segments alone (no sliding window yet: the sweep
    under way), the sweep, then all five outputs; the sliding window's bpc is
    sliding_nll's, computed directly."""
    from txl.scoring import sliding_nll

    text = SCORE_TEXT * 3
    job = client.submit(text=text, mem_len=MEM_LEN, api_name="/score")
    job.result()  # waits for the end
    stages = job.outputs()
    assert len(stages) >= 4
    assert stages[0][1] == (
        f"⏳ **Stage 1 of 3**: reading the {len(text):,} characters with memory and in "
        "segments alone…"
    )
    first_plot, first_summary, first_numbers = stages[1][:3]
    assert first_plot["type"] == "plotly" and "**Stage 2 of 3**: how far back" in first_summary
    assert "more reads" in first_summary and "then the sliding window" in first_summary
    sliding = [out[1] for out in stages[2:-1] if "Stage 3 of 3" in out[1]]
    assert sliding and all("the sliding window of" in line for line in sliding)
    assert "Stage" not in stages[-1][1]  # done: no progress line
    assert first_numbers["bpc"]["sliding_window"] is None
    assert math.isfinite(first_numbers["bpc"]["memory"])
    assert any(
        "context_sweep" in (out[2] or {}) for out in stages[1:-1] if isinstance(out[2], dict)
    )
    numbers = stages[-1][2]
    model = server[1].service.default_model
    ids = torch.tensor(model.tokenizer.encode(text))
    direct = (sliding_nll(model, ids, SEG_LEN) / math.log(2)).mean().item()
    assert numbers["bpc"]["sliding_window"] == pytest.approx(direct, abs=1e-3)
    assert numbers["bpc"]["memory"] == first_numbers["bpc"]["memory"]
    assert "context_sweep" in numbers


def test_a_new_score_cancels_the_sessions_running_one(server):
    """The handler itself (a generator): the same session's next Score, or its click,
    stops the running one at its next chunk; it then leaves the outputs alone."""
    txl_app = server[1]
    state = txl_app.service.ensure(None)
    old = txl_app.score.score(SCORE_TEXT * 3, MEM_LEN, state)
    assert "Stage 1 of 3" in next(old)[1]  # where it is, at once
    assert next(old)[2]["bpc"]["sliding_window"] is None  # the reads: the job is running
    new = txl_app.score.score(SCORE_TEXT, MEM_LEN, state)
    assert "Stage 1 of 3" in next(new)[1]  # starting it cancelled the old
    assert next(new)[2]["tokens"] == len(SCORE_TEXT) - 1
    assert list(next(old)[:5]) == [gr.skip()] * 5
    with pytest.raises(StopIteration):
        next(old)
    txl_app.score.score_click(SCORE_TEXT, state)  # the page's click cancels at once
    assert list(next(new)[:5]) == [gr.skip()] * 5
    # The visitor leaves: Gradio closes the handler's generator, which ends its job.
    left = txl_app.score.score(SCORE_TEXT * 3, MEM_LEN, state)
    next(left)
    job = txl_app.service.traffic._jobs[id(state)]
    assert not job.cancelled
    left.close()
    assert job.cancelled


def test_score_tab_opens_with_an_example_and_checks_the_text_first(server):
    """The first click works (the box is filled); a text it cannot score is refused by
    the private check before /score runs, so the charts stay as they were."""
    from webapp.tabs.examples import ROMEO_AND_JULIET

    txl_app = server[1]
    demo = txl_app.build()
    boxes = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "score_text"]
    assert boxes and boxes[0].value == ROMEO_AND_JULIET
    state = txl_app.service.ensure(None)
    for text, message in (("", "Nothing to score"), ("\x00", "Nothing to score")):
        with pytest.raises(gr.Error, match=message):
            txl_app.score.score_click(text, state)
    with pytest.raises(gr.Error, match="20,000"):
        txl_app.score.score_click("a" * 20_001, state)
    txl_app.score.score_click(ROMEO_AND_JULIET, state)  # no error


def new_state(txl_app, prompt="ROMEO:\n", steps=6):
    service = txl_app.service
    state = service.new_state(service.default_source, service.default_model)
    state.session.start(prompt)
    for _ in range(steps):
        state.session.step()
    return state


def test_past_views_show_the_text_as_it_was(server):
    txl_app = server[1]
    state = new_state(txl_app)
    s = state.session
    n = len(s.history)
    for back in range(n):
        position = len(s.text) - 1 - back
        text_view, attention = watch_views.past_views(state, back, None, None)
        assert text_view["pos"] == attention["pos"] == position
        role, first, piece = text_view["runs"][-1]  # the text ends at that step
        assert role == "newest" and first + len(piece) == position + 1
        assert "".join("".join(p) for _, _, p in text_view["runs"]) == s.text[: position + 1]
        if back > 0:
            assert attention["history"] == [back, n]
    # further back than kept: the oldest step kept
    assert watch_views.past_views(state, n + 10, None, None)[1]["pos"] == len(s.text) - n
    now_text, now_attention = watch_views.past_views(state, 0, "layer 1", "head 0")
    assert now_attention["rows"] == ["L1 head 0"] and now_text["layer"] == "layer 1"
    assert now_attention["history"] is None  # the newest step: no history marker
    # the redraw event: slider value -k is k steps back
    assert txl_app.watch.redraw(-2, None, None, state)[1]["pos"] == len(s.text) - 3


def test_fit_history_shares_the_session_budget_with_the_memory(server, monkeypatch):
    txl_app = server[1]
    monkeypatch.setenv("TXL_SESSION_MEMORY_MB", "0.02")  # a few dozen steps of history
    budget = txl_app.service.session_budget()
    state = new_state(txl_app, steps=0)
    s = state.session
    assert txl_app.service.mem_cap(s.model) > MEM_LEN  # the memory itself is not capped here
    txl_app.service.fit_history(s)
    limit = s.history_bytes_limit
    assert 0 < limit < budget
    list(s.generate(120, capture_last_only=False))
    info = s.memory_info()
    assert info["tokens"] == MEM_LEN and 0 < info["history_steps"] < 120  # the limit bites
    assert info["history_bytes"] + 1.25 * info["bytes"] <= budget
    kept = info["history_steps"]

    shorter = Settings(True, MEM_LEN // 2, 1.0, 0, 1.0, 0)  # shorter memory
    txl_app.service.apply_settings(s, shorter)
    assert s.history_bytes_limit > limit  # more room for the history
    list(s.generate(120, capture_last_only=False))
    info = s.memory_info()
    assert info["history_steps"] > kept
    assert info["history_bytes"] + 1.25 * info["bytes"] <= budget

    longer = Settings(True, 2 * MEM_LEN, 1.0, 0, 1.0, 0)  # longer memory
    txl_app.service.apply_settings(s, longer)
    assert s.history_bytes_limit < limit
    list(s.generate(2 * MEM_LEN, capture_last_only=False))  # the memory fills up
    info = s.memory_info()
    assert info["tokens"] == 2 * MEM_LEN and info["history_steps"] < kept
    assert info["history_bytes"] + 1.25 * info["bytes"] <= budget


def test_invalid_model_sources_give_errors_and_the_app_keeps_serving(client, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    text = generate(client, n_tokens=5)[0]
    with tempfile.TemporaryDirectory(prefix="txl-outside-") as outside:
        # a valid model, but in a folder the app was not told it may read
        not_allowed = tiny_model(Path(outside) / "model")
        for source, reason in [
            ("no/such-repo", "no/such-repo: "),
            ("../x", "neither a folder nor"),
            (not_allowed, "outside the ones this app may read"),
        ]:
            with pytest.raises(Exception, match="Could not load") as error:
                client.predict(source=source, api_name="/load_model")
            assert reason in str(error.value)
    assert step(client)[0][:-1] == text  # the same session, the same model


def test_unknown_characters_are_replaced(client):
    text = step(client, prompt="café {x}")[0]
    assert text.startswith("caf? ?x?") and len(text) == len("café {x}") + 1


def test_load_model_affects_only_this_session(server, tmp_path):
    url, txl_app = server
    a, b = (new_client(url) for _ in range(2))
    other = tiny_model(tmp_path / "one-layer", n_layer=1, seed=1)
    out = a.predict(source=other, api_name="/load_model")
    assert "1 layers" in out[0] and out[1] == ""
    assert len(step(a)[5]["memory_mass_per_layer"]) == 1
    assert len(step(b)[5]["memory_mass_per_layer"]) == 2  # b still has the default model
    cache = txl_app.service.cache
    assert cache.get(other) is cache.get(other)  # loaded once, shared


def test_a_missing_default_model_is_an_error_not_a_crash(tmp_path, monkeypatch):
    # (with the bundled model there, the app falls back to it: tests/test_robustness.py)
    monkeypatch.setattr(webapp_serve, "BUNDLED_MODEL", "weights/no-such-model")
    txl_app = app.Demo.serving(str(tmp_path / "missing"))
    assert txl_app.service.default_model is None and "missing" in txl_app.service.load_error
    txl_app.build()  # the page still builds, and says why there is no model
    assert "No model loaded" in txl_app.watch.model_info()
    with pytest.raises(gr.Error, match="No model is loaded"):
        txl_app.watch.step("ROMEO:", True, MEM_LEN, 0.8, 0, 1.0, 0, None, None, None)


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_openmp_idles_asleep_from_before_torch_loads(given, expected):
    """app.py sets OMP_WAIT_POLICY before anything imports torch (OpenMP reads it once, as
    it loads: set later, it does nothing), and a visitor's own setting stays."""
    watch = (
        "import os, sys\n"
        "class Watch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            print('torch loads with', os.environ.get('OMP_WAIT_POLICY'), flush=True)\n"
        "sys.meta_path.insert(0, Watch())\n"
        "import app\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given:
        env["OMP_WAIT_POLICY"] = given
    root = Path(app.__file__).resolve().parent
    out = subprocess.run(
        [sys.executable, "-c", watch], cwd=root, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[0] == f"torch loads with {expected}"
