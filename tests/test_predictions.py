"""The next-token prediction with and without memory (txl/predictions.py), in float64:
each step's two distributions against direct forwards of the model, bits saved and KL
against their definitions, the history and an offload keep them, a word model (adaptive
softmax) takes the same path, and the app sends them at every step."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from tests.test_app import MEM_LEN, SEG_LEN, VOCAB, serve, settings, tiny_model
from tests.tolerance import FLOAT32_VS_64, assert_ulps_close
from txl import TransformerXL, TXLConfig
from txl.predictions import TOP_K, MemoryEffect
from txl.session import Session
from webapp import watch_viz

PROMPT = "ROMEO:\nI"  # 8 characters


def tiny_double(n_layer=2, seed=0, **overrides) -> TransformerXL:
    torch.manual_seed(seed)
    fields = dict(d_model=32, n_layer=n_layer, n_head=2, d_head=8, d_inner=64)
    fields.update(tgt_len=SEG_LEN, mem_len=MEM_LEN, dropout=0.0, **overrides)
    return TransformerXL(TXLConfig(vocab=VOCAB, **fields)).double().eval()


def probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.reshape(-1).double(), dim=-1)


@torch.no_grad()
def direct(model, ids: list[int], mem_len: int | None = None) -> torch.Tensor:
    """[V] next-token probabilities after ids: model.forward over ids alone, no memory."""
    mem_len = len(ids) if mem_len is None else mem_len
    out = model(torch.tensor([ids]), mem_len=mem_len)
    return probs(out.logits[0, -1])


def check_step(trace, p_with: torch.Tensor, p_without: torch.Tensor | None, tol=1e-12):
    """trace.predictions against the full distributions it should come from."""
    pred = trace.predictions
    assert pred.chosen == trace.token_id  # its text alone: a word without its leading space
    assert pred.chosen_text in (trace.char, trace.char.removeprefix(" "))
    top = torch.topk(p_with, TOP_K)
    assert [i for i, _, _ in pred.with_memory] == top.indices.tolist()
    np.testing.assert_allclose([p for *_, p in pred.with_memory], top.values, rtol=tol, atol=0)
    assert pred.p_with == pytest.approx(float(p_with[trace.token_id]), rel=tol)
    if p_without is None:
        assert pred.without_memory is None and pred.p_without is None
        assert pred.bits_saved is None and pred.kl_bits is None
        return
    top = torch.topk(p_without, TOP_K)
    assert [i for i, _, _ in pred.without_memory] == top.indices.tolist()
    np.testing.assert_allclose([p for *_, p in pred.without_memory], top.values, rtol=tol, atol=0)
    assert pred.p_without == pytest.approx(float(p_without[trace.token_id]), rel=tol)
    x = trace.token_id
    saved = math.log2(float(p_with[x])) - math.log2(float(p_without[x]))
    kl = float((p_with * (p_with.log() - p_without.log())).sum()) / math.log(2)
    assert pred.bits_saved == pytest.approx(saved, rel=1e-9, abs=1e-12)
    assert pred.kl_bits == pytest.approx(kl, rel=1e-9, abs=1e-12) and pred.kl_bits >= 0


def test_both_distributions_equal_direct_forwards_in_float64():
    model = tiny_double()
    s = Session(model, temperature=1.0, seed=1)
    s.start(PROMPT)
    fits = 0
    for _ in range(3 * MEM_LEN):  # past a full memory: then only the pending logits agree
        pending = probs(s.next_logits)
        before = list(s.ids)
        trace = s.step()
        without = direct(model, before[-SEG_LEN:])  # a memory-off Step's, recomputed
        check_step(trace, pending, without)
        if len(before) <= MEM_LEN + 1:  # the whole text fits in memory: a direct forward
            fits += 1
            torch.testing.assert_close(pending, direct(model, before), rtol=1e-10, atol=1e-13)
            check_step(trace, direct(model, before), without, tol=1e-9)
        if len(before) <= SEG_LEN:  # the window is the whole text: both ways agree
            assert trace.predictions.bits_saved == pytest.approx(0, abs=1e-9)
    assert fits > SEG_LEN  # both regimes were checked
    # The session's record of memory's effect: every produced token, in order.
    effect = s.memory_effect
    assert list(effect.positions) == list(range(len(PROMPT), len(s.ids)))
    total, k = effect.bits_saved()
    assert k == 3 * MEM_LEN and math.isfinite(total)


def test_the_counterfactual_is_what_a_memory_off_step_computes():
    model = tiny_double()
    on = Session(model, temperature=1.0, seed=2)
    on.start(PROMPT * 5)
    list(on.generate(10))
    off = Session(model, memory=False, temperature=1.0, seed=2)
    off.start(on.text)  # the same text, read by the memory-off model
    off.generator.set_state(on.generator.get_state())
    a, b = on.step(), off.step()
    assert [i for i, *_ in a.predictions.without_memory] == [
        i for i, *_ in b.predictions.with_memory
    ]
    np.testing.assert_allclose(
        [p for *_, p in a.predictions.without_memory],
        [p for *_, p in b.predictions.with_memory],
        rtol=1e-10,
    )


def test_memory_off_has_one_distribution_and_records_no_effect():
    model = tiny_double()
    s = Session(model, memory=False, temperature=1.0, seed=0)
    s.start(PROMPT * 4)
    for _ in range(5):
        pending = probs(s.next_logits)
        check_step(s.step(), pending, None)
    assert len(s.memory_effect) == 0
    summary = watch_viz.step_summary(s.last_trace)["predictions"]
    assert summary["without_memory"] is None and summary["bits_saved"] is None
    assert summary["p_chosen"]["without_memory"] is None and len(summary["with_memory"]) == 10
    s.counterfactual = False  # memory on, no counterfactual: also one distribution
    s.set_memory(True)
    assert s.step().predictions.without_memory is None and len(s.memory_effect) == 0


def test_sampling_settings_do_not_change_the_distributions_shown():
    model = tiny_double()
    shown = []
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.3, 3, 0.5), (0.0, 0, 1.0)]:
        s = Session(model, temperature=temperature, top_k=top_k, top_p=top_p, seed=0)
        s.start(PROMPT)
        pending = probs(s.next_logits)
        trace = s.step()
        check_step(trace, pending, direct(model, s.ids[:-1][-SEG_LEN:]))
        shown.append([p for *_, p in trace.predictions.with_memory])
    assert shown[0] == shown[1] == shown[2]  # softmax at temperature 1, before top-k/top-p


def test_history_and_offload_keep_each_steps_predictions():
    model = tiny_double()
    s = Session(model, temperature=1.0, seed=3, history=8)
    s.start(PROMPT)
    traces = [s.step() for _ in range(12)]
    for back in range(8):
        kept = s.past_trace(back)
        assert kept.position == traces[-1 - back].position
        assert kept.predictions == traces[-1 - back].predictions
    effect = (list(s.memory_effect.positions), s.memory_effect.bits_saved())
    tensors = s.export_state()
    assert not any("predictions" in k for k in tensors)  # plain data: stays in RAM
    s.import_state({k: v.clone() for k, v in tensors.items()})
    assert [s.past_trace(b).predictions for b in range(8)] == [
        t.predictions for t in traces[::-1][:8]
    ]
    assert (list(s.memory_effect.positions), s.memory_effect.bits_saved()) == effect
    pending = probs(s.next_logits)
    check_step(s.step(), pending, direct(model, s.ids[:-1][-SEG_LEN:]))
    s.reset()
    assert len(s.memory_effect) == 0


def test_memory_effect_view_and_totals():
    effect = MemoryEffect()
    effect.add(5, 0.5, 0.25)  # memory doubled p: saved 1 bit
    effect.add(7, 0.125, 0.5)  # memory quartered p: cost 2 bits
    assert effect.bits_saved() == (-1.0, 2) and effect.bits_saved(end=6) == (1.0, 1)
    assert effect.view(0, 10) == {"start": 5, "with": [100, None, 300], "without": [200, None, 100]}
    assert effect.view(6, 7) is None and effect.view(6, 8)["start"] == 7
    with pytest.raises(ValueError, match="not after"):
        effect.add(7, 0.5, 0.5)
    effect.add(9, 0.0, 1e-3)  # an underflowed probability stays finite
    assert math.isfinite(effect.bits_saved()[0])


def test_text_view_and_status_carry_memorys_effect():
    model = tiny_double()
    s = Session(model, temperature=1.0, seed=4)
    s.start(PROMPT)
    list(s.generate(20, capture_last_only=False))
    roles = watch_viz.roles_from_trace(len(s.text), s.last_trace)
    view = watch_viz.text_view(s.pieces, roles, s.last_trace, effect=s.memory_effect)
    e = view["effect"]
    assert e["start"] == len(PROMPT) and len(e["with"]) == 20
    for k, position in enumerate(range(len(PROMPT), len(s.text))):
        p_with = s.memory_effect.log2_with[k]
        assert e["with"][position - e["start"]] == round(-100 * p_with)
    # every produced character is its own token in the runs; the prompt's are not shaded
    listed = {first + i for _, first, piece in view["runs"] if isinstance(piece, list)
              for i in range(len(piece))}  # fmt: skip
    assert set(range(len(PROMPT), len(s.text))) <= listed
    assert "".join("".join(p) for _, _, p in view["runs"]) == s.text
    saved = s.memory_effect.bits_saved()
    status = watch_viz.status_markdown(s.memory_info(), len(s.text), saved=saved)
    total, k = s.memory_effect.bits_saved()
    assert f"memory saved **{total:,.1f} bits** over the last {k} characters" in status


WORDS = [
    "<eos>",
    "<unk>",
    "the",
    ",",
    ".",
    "of",
    "and",
    "in",
    "to",
    "a",
    "=",
    "was",
    "The",
    "@-@",
    "'s",
    "that",
    "for",
    "on",
    "is",
    "as",
    "city",
] + [f"word{i}" for i in range(44)]  # fmt: skip  (65 words: clusters of 20, 20, 15, 10)


def test_a_word_model_with_adaptive_softmax_takes_the_same_path():
    torch.manual_seed(5)
    config = TXLConfig(
        vocab=WORDS, tokenizer="word", unk_symbol="<unk>", cutoffs=[20, 40, 55], div_val=4,
        d_model=64, d_embed=64, n_head=4, d_head=16, d_inner=128, n_layer=2, tgt_len=6,
        mem_len=12, clamp_len=10, same_length=True, untie_r=True, dropout=0.0,
    )  # fmt: skip
    model = TransformerXL(config).double().eval()
    s = Session(model, temperature=1.0, seed=0)
    s.start("The city of the")
    for _ in range(20):
        pending = probs(s.next_logits)
        before = list(s.ids)
        trace = s.step()
        check_step(trace, pending, direct(model, before[-6:]))
        if len(before) <= 6:  # same_length: the with-memory model sees the whole text too
            torch.testing.assert_close(pending, direct(model, before), rtol=1e-10, atol=1e-13)
    pred = watch_viz.step_summary(trace)["predictions"]
    texts = {model.tokenizer.pieces([i])[0] for i in range(len(WORDS))}
    assert {t for t, _ in pred["with_memory"] + pred["without_memory"]} <= texts
    assert pred["chosen"] == model.tokenizer.pieces([trace.token_id])[0]
    assert len(json.dumps(pred)) <= 2048


# ---- the app: every Step, Generate's stream and the history carry them --------------


@pytest.fixture(scope="module")
def app_server(tmp_path_factory):
    import app

    folder = tiny_model(tmp_path_factory.mktemp("pred") / "model")
    txl_app = app.Demo.serving(folder)
    demo, url = serve(txl_app)
    yield url, txl_app
    demo.close()


@pytest.fixture
def client(app_server):
    from gradio_client import Client

    return Client(app_server[0], verbose=False, analytics_enabled=False, download_files=False)


def test_step_summary_and_view_carry_the_predictions(client, app_server):
    model = TransformerXL.from_pretrained(app_server[1].service.default_source).double().eval()
    client.predict(prompt=PROMPT, n_tokens=30, **settings(), api_name="/generate")
    out = client.predict(prompt=PROMPT, **settings(), api_name="/step")
    text, summary, view = out[0], out[5], out[6]
    pred = summary["predictions"]
    assert set(pred) == {"with_memory", "without_memory", "chosen", "p_chosen", "bits_saved",
                         "kl_bits"}  # fmt: skip
    assert pred["chosen"] == text[-1] == summary["char"]
    ids = model.tokenizer.encode(text)
    without = direct(model, ids[:-1][-SEG_LEN:])  # float64, the app's float32 weights
    for token, p in pred["without_memory"]:
        # float32 against float64, in ulps of p itself (its 6 digits are 42 ulps at most)
        assert_ulps_close(p, float(without[VOCAB.index(token)]), FLOAT32_VS_64, scale=p,
                          dtype=torch.float32)
    p = pred["p_chosen"]
    assert pred["bits_saved"] == pytest.approx(
        math.log2(p["with_memory"]) - math.log2(p["without_memory"]), abs=1e-4
    )
    assert len(json.dumps(pred)) <= 2048
    assert view["pos"] == summary["position"] and view["chosen"] == pred["chosen"]
    assert view["window"] == SEG_LEN and view["memory"] is True
    # the text view: memory's effect on every character since the prompt
    effect = out[1]["effect"]
    assert effect["start"] == len(PROMPT) and len(effect["with"]) == len(text) - len(PROMPT)
    assert "memory saved" in out[2] and f"over the last {len(text) - len(PROMPT)} " in out[2]
    off = client.predict(prompt=PROMPT, **settings(memory=False), api_name="/step")
    assert off[5]["predictions"]["without_memory"] is None and off[6]["memory"] is False


def test_generate_streams_predictions_and_history_shows_each_steps(client, app_server, monkeypatch):
    from webapp.serve import HISTORY_STEPS
    from webapp.tabs import watch as watch_tab

    monkeypatch.setattr(watch_tab, "STREAM_EVERY_S", 0.0)  # read at call time: every step streams
    job = client.submit(prompt="A", n_tokens=100, **settings(), api_name="/generate")
    final = job.result(timeout=300)
    streamed = [out for out in job.outputs()[:-1] if isinstance(out[5], dict)]
    assert len(streamed) > 1
    for out in streamed + [final]:  # each summary is of the step its text ends with
        assert out[5]["position"] == len(out[0]) - 1 == out[6]["pos"]
        assert out[5]["predictions"]["chosen"] == out[0][-1]
    txl_app = app_server[1]
    generated = txl_app.watch.generate("A", 40, True, MEM_LEN, 1.0, 0, 1.0, 0, None, None, None)
    *_, state = list(generated)[-1]
    s = state.session
    for back in (0, 1, 5):
        text_view, attention, summary, view = txl_app.watch.redraw(-back, None, None, state)
        trace = s.past_trace(back)
        assert summary["position"] == view["pos"] == attention["pos"] == trace.position
        assert summary["predictions"] == trace.predictions.as_dict()
        assert view["history"] == (None if back == 0 else [back, len(s.history)])
    assert HISTORY_STEPS >= 5


def test_streamed_values_reach_the_client_whole():
    """Generate streams edits of each output; nested lists that lose items (the text
    view's runs) must come out right (webapp.serve.streaming_diff, Gradio's own got it wrong)."""
    import random

    from gradio_client.utils import apply_diff

    from webapp.serve import streaming_diff

    def value(rng, depth=0):
        r = rng.random()
        if depth > 3 or r < 0.3:
            return rng.choice([1, 2, "ab", "abc", None, 3.5])
        if r < 0.7:
            return [value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
        return {k: value(rng, depth + 1) for k in rng.sample("abcde", rng.randint(0, 4))}

    rng = random.Random(0)
    for _ in range(3000):
        old, new = value(rng), value(rng)
        assert apply_diff(old, streaming_diff(old, new)) == new, (old, new)
    runs = [["gone", 0, "ROMEO"], ["memory", 5, list(":\nI am")], ["newest", 11, ["!"]]]
    later = [["gone", 0, "ROMEO:\nI"], ["memory", 8, list(" am")], ["newest", 11, ["!"]]]
    assert apply_diff(runs, streaming_diff(runs, later)) == later
