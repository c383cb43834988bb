"""Session (docs/session_api.md): exact against the plain forward pass, deterministic per
seed, settings that validate, and a memory that covers exactly the text it says it does.

All on tiny random models, built here in milliseconds. "Peaky" weights (std 0.3) make
every logit depend on every key, so a memory off by one position shows up; "flat" weights
(the default init) give near-uniform logits, for the tests that need sampling to vary.
"""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import txl.session
from tests.tolerance import ROW_SUM, SAME_SUMS, assert_ulps_close
from txl import TransformerXL, TXLConfig
from txl.evaluate import evaluate_loss
from txl.scoring import context_sweep, score_stages, score_text
from txl.session import Session

VOCAB = list("abcdefgh \n")  # no "?": unknown characters are dropped
VOCAB_Q = list("abcdefgh ?")  # "?" and no newline: unknowns become "?", "" starts at id 0
SHIPPED = Path(__file__).resolve().parents[1] / "weights" / "shakespeare-char"
TEXT = "abc abd\nabe fgh hag bad cab deaf\nface"  # 37 characters


def tiny_model(vocab=VOCAB, std=0.3, seed=0, **overrides) -> TransformerXL:
    cfg = dict(d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=32, tgt_len=4, mem_len=6,
               dropout=0.0)
    cfg.update(overrides)
    with torch.random.fork_rng():  # the global generator is other tests' business
        torch.manual_seed(seed)
        model = TransformerXL(TXLConfig(vocab=vocab, **cfg))
        model.reset_parameters(std)
    return model.eval()


@pytest.fixture(scope="module")
def peaky():
    return tiny_model()


@pytest.fixture(scope="module", params=[torch.float64, torch.float32], ids=str)
def peaky_each(request):
    """The peaky model in float64 (the exactness claim, to ~1e-14) and in float32 (the
    precision the app runs): one budget in ulps of each covers both."""
    return tiny_model().to(request.param)


@pytest.fixture(scope="module")
def flat():
    return tiny_model(std=0.02)


@pytest.fixture(scope="module")
def shipped_or_tiny():
    """The shipped Shakespeare model when it has been trained, else a tiny random one."""
    if (SHIPPED / "model.safetensors").exists():
        return TransformerXL.from_pretrained(SHIPPED)
    vocab = list("\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
    return tiny_model(vocab=vocab, tgt_len=64, mem_len=128)


def full_forward(model, ids) -> torch.Tensor:
    """Next-token logits [vocab] of one plain forward over all of ids, no memory."""
    with torch.no_grad():
        return model(torch.tensor([ids]), mem_len=len(ids)).logits[0, -1]


def state(s: Session):
    """Everything a failed call must leave unchanged."""
    kv = None if s.kv is None else [k[:, :, s.kv.start : s.kv.end].clone() for k in s.kv.k]
    return (s.text, list(s.ids), s.memory, s.mem_len, s.seg_len, s.temperature, s.top_k,
            s.top_p, s.seed, s.memory_info(), kv, s.generator.get_state())


def same_state(a, b) -> bool:
    *plain_a, kv_a, gen_a = a
    *plain_b, kv_b, gen_b = b
    same_kv = (kv_a is None and kv_b is None) or (
        kv_a is not None and kv_b is not None and all(map(torch.equal, kv_a, kv_b)))
    return plain_a == plain_b and same_kv and torch.equal(gen_a, gen_b)


# ---- exactness --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("variant", [{}, {"pre_lnorm": True}, {"untie_r": False},
                                     {"same_length": True}, {"clamp_len": 5}])
def test_memory_step_equals_forward_over_everything(variant, dtype):
    """mem_len longer than the text: the memory covers all of it, so the cached step
    (fed in segments of 4, then one token at a time) is one causal forward over it all."""
    model = tiny_model(**variant).to(dtype)
    s = Session(model, memory=True, mem_len=100, seg_len=4, temperature=1.0)
    s.start(TEXT[:11])
    assert_ulps_close(s.next_logits, full_forward(model, s.ids), SAME_SUMS)
    for _ in range(6):
        s.step(capture=False)
        assert_ulps_close(s.next_logits, full_forward(model, s.ids), SAME_SUMS)


def test_a_fed_prompt_gives_back_the_segments_room_and_changes_no_number(monkeypatch):
    """After a prompt fed seg_len at a time the KV buffers keep the memory and a quarter
    of spare room, not the segment's room too; every step after it, through the buffers'
    regrowth, gives bit for bit the logits of a session that kept the room."""
    model = tiny_model(mem_len=64)
    prompt = (TEXT * 6)[:200]
    s = Session(model, memory=True, mem_len=64, seg_len=32, temperature=1.0)
    s.start(prompt)
    assert len(s.kv) == 64 and s.kv.k[0].size(2) == 64 + 16
    with monkeypatch.context() as m:
        m.setattr(type(s.kv), "shrink", lambda self, spare: None)
        kept = Session(model, memory=True, mem_len=64, seg_len=32, temperature=1.0)
        kept.start(prompt)
    assert kept.kv.k[0].size(2) >= 64 + 32  # the room of a segment and more
    assert torch.equal(s.next_logits, kept.next_logits)
    for _ in range(20):  # past the 16 spare positions: the buffers grow again
        s.step(capture=False), kept.step(capture=False)
        assert torch.equal(s.next_logits, kept.next_logits)
    assert s.text == kept.text and s.kv.k[0].size(2) > 64 + 16


def test_memory_step_exact_on_shipped_or_tiny(shipped_or_tiny):
    s = Session(shipped_or_tiny, memory=True, mem_len=200, seg_len=16, seed=3)
    s.start("ROMEO:\nWhat light")
    for trace in s.generate(4):
        assert trace.memory
    assert_ulps_close(s.next_logits, full_forward(shipped_or_tiny, s.ids), SAME_SUMS)
    assert s.memory_info()["span"] == (0, len(s.ids))


def test_memory_off_is_a_forward_over_the_last_window(peaky_each):
    """The step takes the last_only path (the top layer for the last query alone): a
    one-row product, which MKL's AVX-512 kernels round unlike the forward's five-row one."""
    s = Session(peaky_each, memory=False, seg_len=5, temperature=1.0)
    s.start(TEXT[:9])
    assert_ulps_close(s.next_logits, full_forward(peaky_each, s.ids[-5:]), SAME_SUMS)
    for _ in range(4):
        trace = s.step()
        assert_ulps_close(s.next_logits, full_forward(peaky_each, s.ids[-5:]), SAME_SUMS)
        assert trace.n_memory == 0 and trace.memory_tokens == 0 and not trace.memory
        assert trace.key_positions.tolist() == list(range(len(s.ids) - 5, len(s.ids)))
    info = s.memory_info()
    assert info.pop("history_steps") == 4 and info.pop("history_bytes") > 0
    assert info == {"memory": False, "tokens": 0, "mem_len": 6, "bytes": 0,
                    "span": (len(s.ids), len(s.ids)), "context": 5}


def test_trace_lines_up_with_the_text(peaky):
    """The new token's attention: rows sum to 1, keys = memory (the positions just before)
    + itself, and equal to the attention of the last query of a full forward."""
    s = Session(peaky, memory=True, mem_len=100, seg_len=4, temperature=1.0)
    s.start(TEXT[:10])
    for trace in s.generate(3, capture_last_only=False):
        p = trace.position
        assert s.ids[p] == trace.token_id and s.text[p] == trace.char
        assert trace.key_positions.tolist() == list(range(p + 1)) and trace.n_memory == p
        assert trace.attentions.shape == (2, 2, p + 1) and trace.attentions.dtype == np.float32
        assert_ulps_close(trace.attentions.sum(-1), 1.0, ROW_SUM)
        with torch.no_grad():
            out = peaky(torch.tensor([s.ids]), output_attentions=True, mem_len=100)
        expected = torch.stack([a[0, :, -1] for a in out.attentions]).numpy()
        assert_ulps_close(trace.attentions, expected, SAME_SUMS)
        assert trace.memory_tokens == p + 1 and trace.memory_bytes == s.kv.nbytes > 0


def test_a_captured_prompt_shows_where_its_last_token_looked(peaky):
    """start(prompt, capture=True): last_trace is the prompt's last token as it was read,
    over the memory and its own segment: with a memory that holds everything, the last
    query of a full forward; with a short one, memory + segment keys. The pending
    prediction is the same as without capture; nothing goes to the history."""
    s = Session(peaky, memory=True, mem_len=100, seg_len=4)
    s.start(TEXT[:10], capture=True)
    t = s.last_trace
    assert t.position == 9 and t.char == TEXT[9] and t.predictions is None
    assert t.key_positions.tolist() == list(range(10)) and t.n_memory == 8  # segment 8..9
    with torch.no_grad():
        out = peaky(torch.tensor([s.ids]), output_attentions=True, mem_len=100)
    expected = torch.stack([a[0, :, -1] for a in out.attentions]).numpy()
    np.testing.assert_allclose(t.attentions, expected, atol=1e-5)
    assert not s.history

    short = Session(peaky, memory=True, mem_len=6, seg_len=4)
    short.start(TEXT[:18], capture=True)  # segments ..16..17: memory 10..15
    t = short.last_trace
    assert (t.position, t.n_memory, t.key_positions.tolist()) == (17, 6, list(range(10, 18)))
    np.testing.assert_allclose(t.attentions.sum(-1), 1.0, atol=1e-5)
    assert t.memory_tokens == short.memory_info()["tokens"] == 6
    plain = Session(peaky, memory=True, mem_len=6, seg_len=4)
    plain.start(TEXT[:18])
    assert plain.last_trace is None
    torch.testing.assert_close(short.next_logits, plain.next_logits, rtol=0, atol=1e-6)

    off = Session(peaky, memory=False, seg_len=4)
    off.start(TEXT[:18], capture=True)
    t = off.last_trace
    assert t.key_positions.tolist() == [14, 15, 16, 17] and t.n_memory == 0 and not t.memory
    with torch.no_grad():
        out = peaky(torch.tensor([off.ids[14:]]), output_attentions=True, mem_len=4)
    expected = torch.stack([a[0, :, -1] for a in out.attentions]).numpy()
    np.testing.assert_allclose(t.attentions, expected, atol=1e-5)


def test_a_step_can_write_a_given_token(peaky):
    """step(token=...): the token is appended instead of a sampled one; its prediction is
    that of the pending logits; the generator is not drawn from; a bad token changes
    nothing."""
    a, b = (Session(peaky, mem_len=6, seg_len=4, temperature=1.0) for _ in range(2))
    a.start(TEXT[:9])
    b.start(TEXT[:9])
    token = a.tokenizer.encode("h")[0]
    p = torch.softmax(a.next_logits.double(), -1)[token].item()
    trace = a.step(token=token)
    assert a.text == TEXT[:9] + "h" and trace.token_id == token
    assert trace.predictions.chosen == token
    assert trace.predictions.p_with == pytest.approx(p, rel=1e-9)
    b.step(token=token)
    assert a.step().token_id == b.step().token_id  # the same generator state after it
    before = state(a)
    for bad in (-1, len(VOCAB), 2.5, "h"):
        with pytest.raises(ValueError):
            a.step(token=bad)
        assert same_state(state(a), before)


def test_trace_with_a_full_memory(peaky):
    s = Session(peaky, memory=True, mem_len=6, seg_len=4, temperature=1.0)
    s.start(TEXT[:20])
    trace = s.step()
    assert trace.position == 20 and trace.n_memory == 6
    assert trace.key_positions.tolist() == list(range(14, 21))  # 6 memory + the new token
    assert trace.attentions.shape == (2, 2, 7) and trace.memory_tokens == 6
    assert_ulps_close(trace.attentions.sum(-1), 1.0, ROW_SUM)
    assert s.memory_info() == {"memory": True, "tokens": 6, "mem_len": 6,
                               "bytes": s.kv.nbytes, "span": (15, 21), "context": 7,
                               "history_steps": 1,
                               "history_bytes": trace.attentions.size * 2 + 7 * 4}


def test_mem_len_zero_sees_only_the_new_token(peaky_each):
    s = Session(peaky_each, memory=True, mem_len=0, seg_len=4)
    s.start("abc")
    trace = s.step()
    assert trace.key_positions.tolist() == [3] and trace.n_memory == 0
    assert_ulps_close(trace.attentions, 1.0, ROW_SUM)  # a softmax over one key
    assert_ulps_close(s.next_logits, full_forward(peaky_each, s.ids[-1:]), SAME_SUMS)
    assert s.memory_info()["tokens"] == 0 and s.memory_info()["context"] == 1
    s.set_memory(False)
    s.set_memory(True)  # rebuilt from the last token alone
    assert s.memory_info()["span"] == (4, 4)
    assert_ulps_close(s.next_logits, full_forward(peaky_each, s.ids[-1:]), SAME_SUMS)


@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("mem_len", [0, 3, 6, 100])
def test_context_counts_the_keys_the_last_token_sees(same_length, mem_len):
    model = tiny_model(same_length=same_length)

    def visible(T, M):  # keys of the last of T queries over M memory positions
        mask = model.attention_mask(T, M, mem_len)
        return M + T - (0 if mask is None else int(mask[-1].sum()))

    s = Session(model, memory=True, mem_len=mem_len, seg_len=4)
    s.start(TEXT[:18])  # segments of 4, 4, 4, 4 and 2
    assert s.memory_info()["context"] == visible(2, min(mem_len, 16))
    s.step()
    assert s.memory_info()["context"] == visible(1, min(mem_len, 18))


# ---- feeding ----------------------------------------------------------------------------


def test_feed_goes_segment_by_segment(peaky, monkeypatch):
    calls = []
    original = txl.session.cached_forward

    def spy(model, input_ids, memory=None, *args, **kwargs):
        calls.append((input_ids.size(1), 0 if memory is None else len(memory)))
        return original(model, input_ids, memory, *args, **kwargs)

    monkeypatch.setattr(txl.session, "cached_forward", spy)
    s = Session(peaky, memory=True, mem_len=6, seg_len=4)
    s.start(TEXT[:23])
    assert [t for t, _ in calls] == [4, 4, 4, 4, 4, 3]  # never one giant forward
    assert max(m for _, m in calls) <= 6 and len(s.kv) == 6
    assert s.memory_info()["span"] == (17, 23)

    calls.clear()
    s.feed("abcdefghab")  # carried on from the memory, in segments of the new text
    assert calls == [(4, 6), (4, 6), (2, 6)]
    assert s.text == TEXT[:23] + "abcdefghab"


def test_feed_in_pieces_equals_feed_at_once_within_memory(peaky_each):
    """With memory covering everything, how the text is cut does not change the logits."""
    a = Session(peaky_each, memory=True, mem_len=100, seg_len=4)
    a.start(TEXT)
    b = Session(peaky_each, memory=True, mem_len=100, seg_len=7)
    b.start(TEXT[:5])
    b.feed(TEXT[5:19])
    b.feed(TEXT[19:])
    assert a.text == b.text == TEXT and a.ids == b.ids
    assert_ulps_close(a.next_logits, b.next_logits, SAME_SUMS)


def test_unknown_characters_dropped_without_a_replacement_symbol(peaky):
    s = Session(peaky)
    assert s.start("abXc é abX") == ["X", "é"]  # each once, in order of appearance
    assert s.text == "abc  ab" and s.prompt == "abXc é abX"
    assert s.feed("Zz") == ["Z", "z"] and s.text == "abc  ab"
    assert s.feed("") == []


def test_unknown_characters_replaced_when_the_vocab_has_one():
    s = Session(tiny_model(vocab=VOCAB_Q))
    assert s.unknown_mode == "replace"
    assert s.start("abXc é") == ["X", "é"]
    assert s.text == "ab?c ?" and len(s.ids) == 6


def test_empty_prompt_starts_from_a_newline_else_token_0(peaky):
    s = Session(peaky)
    assert s.start("") == [] and s.text == "\n" and s.ids == [VOCAB.index("\n")]
    assert s.start("XYZ") == ["X", "Y", "Z"] and s.text == "\n"  # empty after cleaning
    q = Session(tiny_model(vocab=VOCAB_Q))
    q.start("")
    assert q.ids == [0] and q.text == "a"


def test_step_before_start_behaves_like_start_empty(flat):
    a, b = Session(flat, temperature=1.0, seed=5), Session(flat, temperature=1.0, seed=5)
    a.step()
    b.start("")
    b.step()
    assert a.text == b.text and a.text[0] == "\n" and len(a.text) == 2 and a.prompt == ""


# ---- sampling -----------------------------------------------------------------------------


@pytest.mark.parametrize("memory", [True, False])
def test_same_seed_same_text_other_seed_other_text(flat, memory):
    def run(seed):
        s = Session(flat, memory=memory, temperature=1.0, seed=seed)
        s.start("abc")
        list(s.generate(40))
        return s.text

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_reset_and_set_seed_restart_the_generator(flat):
    s = Session(flat, temperature=1.0, seed=7)
    s.start("ab")
    list(s.generate(30))
    first = s.text
    s.start("ab")  # start resets, which reseeds
    list(s.generate(30))
    assert s.text == first
    s.reset()
    assert (s.text, s.ids, s.prompt, s.last_trace, len(s.kv)) == ("", [], "", None, 0)
    s.set_seed(8)
    s.start("ab")
    list(s.generate(30))
    assert s.text != first


def test_greedy_is_argmax_and_top_k_1_is_greedy(flat):
    s = Session(flat, temperature=0.0)
    s.start("abc")
    for _ in range(10):
        expected = int(s.next_logits.argmax())
        assert s.step(capture=False).token_id == expected
    t = Session(flat, temperature=1.0, top_k=1, seed=3)
    t.start("abc")
    list(t.generate(10))
    assert t.text == s.text


def test_generate_captures_only_the_last_step_unless_asked(peaky):
    s = Session(peaky)
    s.start("abc")
    traces = list(s.generate(4))
    assert [t.attentions is None for t in traces] == [True, True, True, False]
    assert s.last_trace is traces[-1] and [t.position for t in traces] == [3, 4, 5, 6]
    assert all(t.attentions is not None for t in s.generate(3, capture_last_only=False))
    assert list(s.generate(0)) == [] and len(s.ids) == 10
    assert traces[0].latency_ms > 0


# ---- settings -----------------------------------------------------------------------------


def test_mem_len_changes_keep_the_newest_positions(peaky):
    s = Session(peaky, memory=True, mem_len=10, seg_len=4)
    s.start(TEXT[:20])
    assert s.memory_info()["span"] == (10, 20)
    keys = s.kv.k[0][:, :, s.kv.start : s.kv.end].clone()
    s.set_mem_len(4)  # shorter: truncated now, newest kept
    assert s.memory_info()["span"] == (16, 20) and s.memory_info()["mem_len"] == 4
    # Layer 0's keys are projected embeddings: the last one, run again, is the same.
    assert_ulps_close(s.kv.k[0][:, :, s.kv.start : s.kv.end], keys[:, :, -4:], SAME_SUMS)
    assert s.memory_info()["context"] == 5  # the last token now sees 4 positions + itself
    assert s.step().key_positions.tolist() == [16, 17, 18, 19, 20]
    assert s.memory_info()["span"] == (17, 21)
    s.set_mem_len(8)  # longer: grows from now on
    assert s.memory_info()["tokens"] == 4
    list(s.generate(6))
    assert s.memory_info()["span"] == (19, 27) and s.memory_info()["tokens"] == 8


def test_shorter_mem_len_takes_effect_at_once(peaky_each):
    """The pending logits are those of the last token over the newest 4 positions before
    it: what plain forward passes give with a hidden-state memory of those 4."""
    s = Session(peaky_each, memory=True, mem_len=100, seg_len=4)
    s.start(TEXT[:20])
    s.set_mem_len(4)
    ids = torch.tensor([s.ids])
    with torch.no_grad():
        mems = peaky_each(ids[:, :19], mem_len=4).mems  # layer inputs at positions 15..18
        expected = peaky_each(ids[:, 19:], mems=mems, mem_len=4).logits[0, -1]
    assert_ulps_close(s.next_logits, expected, SAME_SUMS)
    assert s.memory_info()["span"] == (16, 20)


def test_switching_memory_off_and_on(peaky_each):
    s = Session(peaky_each, memory=True, mem_len=8, seg_len=4)
    s.start(TEXT[:20])
    s.set_memory(False)  # dropped; the next token is predicted from the last window
    assert s.kv is None and s.memory_info()["tokens"] == 0 and not s.memory
    assert_ulps_close(s.next_logits, full_forward(peaky_each, s.ids[-4:]), SAME_SUMS)
    assert not s.step().memory
    s.set_memory(True)  # rebuilt from the last mem_len tokens, in segments
    assert s.memory_info()["span"] == (13, 21) and s.memory
    fresh = Session(peaky_each, memory=True, mem_len=8, seg_len=4)
    fresh.start(s.text[-8:])
    assert_ulps_close(s.next_logits, fresh.next_logits, SAME_SUMS)
    trace = s.step()
    assert trace.memory and trace.n_memory == 8 and trace.key_positions[0] == 13

    s.set_mem_len(100)
    s.set_memory(False)
    s.set_memory(True)  # memory longer than the text: rebuilt exactly
    assert s.memory_info()["span"] == (0, len(s.ids))
    assert_ulps_close(s.next_logits, full_forward(peaky_each, s.ids), SAME_SUMS)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: setattr(s, "temperature", -0.1),
        lambda s: setattr(s, "temperature", float("nan")),
        lambda s: setattr(s, "temperature", float("inf")),
        lambda s: setattr(s, "temperature", "hot"),
        lambda s: setattr(s, "top_k", -1),
        lambda s: setattr(s, "top_k", 2.5),
        lambda s: setattr(s, "top_p", 0.0),
        lambda s: setattr(s, "top_p", 1.5),
        lambda s: setattr(s, "top_p", float("nan")),
        lambda s: s.set_mem_len(-1),
        lambda s: s.set_seg_len(0),
        lambda s: s.set_seed("x"),
        lambda s: s.set_seed(2**64),
        lambda s: setattr(s, "seed", 1.5),
        lambda s: s.generate(-1),
    ],
)
def test_invalid_settings_raise_and_change_nothing(peaky, call):
    s = Session(peaky, mem_len=5, seg_len=3, temperature=0.5, top_k=3, top_p=0.9, seed=2)
    s.start("abcdefg")
    before = state(s)
    with pytest.raises(ValueError):
        call(s)
    assert same_state(before, state(s))


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -1}, {"temperature": math.nan}, {"top_k": -2}, {"top_p": 0},
     {"top_p": 1.01}, {"mem_len": -1}, {"seg_len": 0}],
)
def test_invalid_constructor_arguments(peaky, kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Session(peaky, **kwargs)


@pytest.mark.parametrize(
    "bad",
    [dict(temperature=-1), dict(top_k=-1), dict(top_p=0), dict(seed=2**64), dict(mem_len=-1)],
)
def test_configure_checks_every_setting_before_it_changes_any(peaky, bad):
    """The last setting wrong: not even the memory, switched off first, has changed."""
    s = Session(peaky, mem_len=5, seg_len=3, temperature=0.5, top_k=3, top_p=0.9, seed=2)
    s.start("abcdefg")
    before = state(s)
    good = dict(memory=False, mem_len=2, temperature=1.0, top_k=1, top_p=0.5, seed=7)
    with pytest.raises(ValueError, match=next(iter(bad))):
        s.configure(**{**good, **bad})
    assert same_state(before, state(s))
    s.configure(**good)
    assert (s.memory, s.mem_len, s.temperature, s.top_k, s.top_p, s.seed) == tuple(good.values())
    s.step()  # the sampler moves on from seed 7 ...
    moved = s.generator.get_state()
    s.configure(seed=7)  # ... and the session's own seed again does not restart it
    assert torch.equal(s.generator.get_state(), moved)
    s.set_seed(7)  # (set_seed does)
    assert not torch.equal(s.generator.get_state(), moved)


def test_valid_settings_apply(peaky):
    s = Session(peaky)
    assert (s.mem_len, s.seg_len) == (6, 4)  # the config's mem_len and tgt_len
    s.temperature, s.top_k, s.top_p = 0, 40.0, 1  # a slider's floats are fine
    assert (s.temperature, s.top_k, s.top_p) == (0.0, 40, 1.0)
    s.set_seg_len(2)
    assert s.seg_len == 2


# ---- scoring ------------------------------------------------------------------------------


def test_score_agrees_with_evaluate(peaky):
    s = Session(peaky, mem_len=6, seg_len=4)
    s.start("abc")
    before = state(s)
    result = score_text(peaky, TEXT, seg_len=4, mem_len=6)
    assert same_state(before, state(s))  # the session's text and memory are untouched

    ids = torch.tensor(peaky.tokenizer.encode(TEXT))
    assert result.chars == list(TEXT[1:]) and result.dropped == []
    assert result.bits_with.shape == result.bits_without.shape == (len(TEXT) - 1,)
    with_memory = evaluate_loss(peaky, ids, 4, 6, n_streams=1)
    without = evaluate_loss(peaky, ids, 4, 0, n_streams=1)
    # means of float32 surprisals: ulps of float32, whatever dtype the mean arrives in
    f32 = dict(ulps=SAME_SUMS, dtype=torch.float32)
    assert_ulps_close(result.bits_with.mean() * math.log(2), with_memory, **f32)
    assert_ulps_close(result.bits_without.mean() * math.log(2), without, **f32)
    assert_ulps_close(result.bpc_with, result.bits_with.mean(), **f32)
    # The first segment has no memory either way; later ones differ.
    assert_ulps_close(result.bits_with[:4], result.bits_without[:4], SAME_SUMS)
    assert not np.allclose(result.bits_with[4:], result.bits_without[4:], atol=1e-3)


def test_score_agrees_with_evaluate_on_shipped_or_tiny(shipped_or_tiny):
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak.\n" * 3
    result = score_text(shipped_or_tiny, text)  # the config's seg_len and mem_len
    ids = torch.tensor(shipped_or_tiny.tokenizer.encode(text))
    cfg = shipped_or_tiny.config
    loss = evaluate_loss(shipped_or_tiny, ids, cfg.tgt_len, cfg.mem_len, n_streams=1)
    assert_ulps_close(result.bpc_with * math.log(2), loss, SAME_SUMS, dtype=torch.float32)
    assert result.dropped == [] and len(result.chars) == len(text) - 1


def test_score_drops_unknowns_and_handles_short_texts(peaky):
    result = score_text(peaky, "abXcZ")
    assert result.dropped == ["X", "Z"] and result.chars == ["b", "c"]
    for text in ("", "a", "XYZ"):
        result = score_text(peaky, text)
        assert result.bits_with.shape == (0,) and math.isnan(result.bpc_with)


# ---- properties ---------------------------------------------------------------------------

@functools.cache
def property_model(vocab: tuple[str, ...]) -> TransformerXL:
    return tiny_model(vocab=list(vocab), n_layer=1, d_model=8, d_head=4, d_inner=8)


CHARS = st.sampled_from(list("abcdefgh \n?X\té\x00😀"))


@settings(max_examples=40, deadline=None)
@given(prompt=st.text(CHARS, max_size=12), more=st.lists(st.text(CHARS, max_size=9), max_size=3),
       vocab=st.sampled_from([VOCAB, VOCAB_Q]), memory=st.booleans())
def test_any_text_feeds_cleanly(prompt, more, vocab, memory):
    model = property_model(tuple(vocab))
    s = Session(model, memory=memory, mem_len=5, seg_len=3)
    pieces = [prompt, *more]
    dropped = [s.start(prompt)] + [s.feed(text) for text in more]
    tok = model.tokenizer
    cleaned = [tok.decode(tok.encode(p, errors=s.unknown_mode)) for p in pieces]
    cleaned[0] = cleaned[0] or tok.vocab[s.start_id]  # an empty prompt starts a fresh line
    assert s.text == tok.decode(s.ids) == "".join(cleaned) and len(s.text) == len(s.ids)
    for piece, unknown in zip(pieces, dropped):
        assert unknown == tok.unknown_chars(piece)
    start, end = s.memory_info()["span"]
    assert end == len(s.ids) and end - start == (min(5, len(s.ids)) if memory else 0)
    assert s.step(capture=False).position == len(s.ids) - 1



# ---- three ways of reading, and how far back ----------------------------------------------


def test_score_carries_the_sliding_window_and_times(peaky):
    from tests.test_evaluate import direct_sliding

    result = score_text(peaky, TEXT, seg_len=4, mem_len=6)
    ids = torch.tensor(peaky.tokenizer.encode(TEXT))
    expected = direct_sliding(peaky, ids, 4) / math.log(2)  # window = seg_len, in bits
    assert_ulps_close(result.bits_sliding, expected, SAME_SUMS)
    assert_ulps_close(result.bpc_sliding, result.bits_sliding.mean(), SAME_SUMS,
                      dtype=torch.float32)
    assert (result.window, result.seg_len, result.mem_len) == (4, 4, 6)
    for seconds in (result.seconds_with, result.seconds_without, result.seconds_sliding):
        assert 0 < seconds < 60
    # Within the first segment all three read exactly the same prefix.
    assert_ulps_close(result.bits_sliding[:3], result.bits_without[:3], SAME_SUMS)
    # After it the window always sees 4 chars, a segment read alone only 1..4.
    assert not np.allclose(result.bits_sliding[4:], result.bits_without[4:], atol=1e-3)
    assert math.isnan(score_text(peaky, TEXT, 4, 6, sliding=False).bpc_sliding)


def test_score_three_ways_agree_when_one_segment_holds_the_text(peaky):
    """seg_len >= the text: one segment, nothing before it: the window, the segment alone
    and the segment with memory all see every earlier char."""
    result = score_text(peaky, TEXT, seg_len=len(TEXT), mem_len=6)
    assert_ulps_close(result.bits_with, result.bits_without, SAME_SUMS)
    assert_ulps_close(result.bits_sliding, result.bits_without, SAME_SUMS)
    assert result.bits_sliding.shape == (len(TEXT) - 1,)


def direct_savings(model, text: str, seg_len: int, mem_len: int) -> np.ndarray:
    """[len(text) - 1, 2] each character's surprisal (bits) with memory and through the
    window, by direct forwards: with memory, a Session fed the text before it (the prompt
    Watch it gives the Watch tab) and its pending logits; through the window, one plain
    forward over the seg_len characters before it."""
    s = Session(model, mem_len=mem_len, seg_len=seg_len)
    ids = model.tokenizer.encode(text)
    out = []
    for t in range(1, len(ids)):
        s.start(text[:t])
        with_memory = torch.log_softmax(s.next_logits.double(), -1)[ids[t]]
        window = full_forward(model, ids[max(0, t - seg_len) : t])
        through_window = torch.log_softmax(window.double(), -1)[ids[t]]
        out.append([-with_memory.item() / math.log(2), -through_window.item() / math.log(2)])
    return np.asarray(out)


def assert_top_k(moments, saved: np.ndarray, k: int, tolerance: float) -> None:
    """``moments`` are the top ``k`` of ``saved`` ([L - 1], token t at t - 1), most first:
    each one's saving is its entry, and every other token saved no more than the least of
    them (within ``tolerance``: two savings that close may swap)."""
    assert len(moments) == k
    chosen = [m.position for m in moments]
    np.testing.assert_allclose([m.bits_saved for m in moments], saved[np.array(chosen) - 1],
                               atol=tolerance)
    assert all(a.bits_saved >= b.bits_saved for a, b in zip(moments, moments[1:]))
    others = np.delete(saved, np.array(chosen) - 1)
    assert others.max() <= min(m.bits_saved for m in moments) + tolerance


def test_moments_are_the_top_5_of_direct_per_character_savings(peaky):
    """ScoreResult.moments(): the characters where memory saved the most bits over the
    sliding window, exactly the top 5 of the score's own per-character arrays, and the top
    5 of the same savings recomputed by direct forwards."""
    result = score_text(peaky, TEXT, seg_len=4, mem_len=6)
    moments = result.moments()
    saved = result.bits_sliding.astype(np.float64) - result.bits_with
    top = 1 + np.argsort(-saved, kind="stable")[:5]
    assert [m.position for m in moments] == top.tolist()
    direct = direct_savings(peaky, TEXT, seg_len=4, mem_len=6)  # [36, 2]
    np.testing.assert_allclose(result.bits_with, direct[:, 0], atol=1e-4)
    np.testing.assert_allclose(result.bits_sliding, direct[:, 1], atol=1e-4)
    assert_top_k(moments, direct[:, 1] - direct[:, 0], k=5, tolerance=2e-4)
    assert min(m.bits_saved for m in moments) > 0.2  # peaky weights: memory matters
    for m in moments:
        assert m.char == TEXT[m.position]
        assert m.context == TEXT[max(0, m.position - 40) : m.position + 41]
        np.testing.assert_allclose([m.bits_memory, m.bits_window], direct[m.position - 1],
                                   atol=1e-4)
    narrow = result.moments(k=2, context=3)
    assert [m.position for m in narrow] == top[:2].tolist()
    assert narrow[0].context == TEXT[max(0, top[0] - 3) : top[0] + 4]
    assert score_text(peaky, TEXT, 4, 6, sliding=False).moments() is None  # no window
    assert score_text(peaky, "a").moments() == []


def test_score_of_short_texts_has_empty_sliding_bits(peaky):
    for text in ("", "a", "XYZ"):
        result = score_text(peaky, text)
        assert result.bits_sliding.shape == (0,) and math.isnan(result.bpc_sliding)


def test_score_stages_come_fastest_first_and_end_in_the_whole_score(peaky):
    """score_stages: the two reads, the sweep, the sliding window chunk by chunk (more
    chunks than one: its progress counts up to every char), then everything: the same
    numbers as score() and context_sweep(), which read the text in one go."""
    from txl.scoring import SLIDING_BATCH

    text = TEXT * 2  # more windows than one sliding chunk holds
    assert len(text) - 1 - 4 > SLIDING_BATCH
    paced = []

    @contextmanager
    def pace(work=None, tasks=1):
        paced.append(work)
        yield 2 if tasks > 1 else 1  # the reads two by two, side by side

    stages = list(score_stages(peaky, text, seg_len=4, mem_len=6, pace=pace))
    kinds = [stage.kind for stage in stages]
    n_sliding = kinds.count("sliding")
    assert kinds == ["reads", "sweep"] + ["sliding"] * n_sliding + ["done"] and n_sliding > 1
    reads, sweep, done = stages[0], stages[1], stages[-1]
    assert reads.result.bits_sliding is None and math.isfinite(reads.result.bpc_with)
    progress = [(stage.done, stage.total) for stage in stages if stage.kind == "sliding"]
    assert [d for d, _ in progress] == sorted({d for d, _ in progress})
    assert progress[-1] == (len(text) - 1, len(text) - 1)
    # Every chunk of work ran inside pace(): the warm-up, the two reads (one chunk), the
    # sweep's other lengths two by two, the sliding window's chunks.
    reads_chunks = 2 + math.ceil(len(set(sweep.sweep.mem_lens) - {0, 6}) / 2)
    assert len(paced) == reads_chunks + n_sliding
    assert paced[:reads_chunks] == [None] * reads_chunks  # the sliding chunks say their size
    assert all(0 < work <= SLIDING_BATCH for work in paced[reads_chunks:])

    whole = score_text(peaky, text, seg_len=4, mem_len=6)
    assert_ulps_close(done.result.bits_sliding, whole.bits_sliding, SAME_SUMS)
    assert_ulps_close(done.result.bits_with, whole.bits_with, SAME_SUMS)
    assert_ulps_close(done.result.bits_without, whole.bits_without, SAME_SUMS)
    direct = context_sweep(peaky, text, seg_len=4)
    assert done.sweep.mem_lens == direct.mem_lens
    assert_ulps_close(done.sweep.bpc, direct.bpc, SAME_SUMS, dtype=torch.float32)
    assert done.sweep.effective == direct.effective


def test_score_stages_stop_where_pace_raises(peaky):
    """A long job's cancel: pace() raises at the next chunk, and no chunk runs after."""

    class Stop(Exception):
        pass

    calls, cancelled = [], []

    @contextmanager
    def pace(work=None, tasks=1):
        calls.append(bool(cancelled))
        if cancelled:
            raise Stop
        yield 1

    stages = score_stages(peaky, TEXT, seg_len=4, mem_len=6, pace=pace)
    assert next(stages).kind == "reads"
    cancelled.append(True)
    with pytest.raises(Stop):
        next(stages)
    assert calls.count(True) == 1  # nothing ran after the chunk that raised


def test_context_sweep_lengths_and_effective_context(peaky):
    from txl.scoring import CONTEXT_SWEEP_LENGTHS, effective_context

    s = Session(peaky, mem_len=6, seg_len=4)
    before = state(s)
    sweep = context_sweep(peaky, TEXT, 4, (8, 0, 2, 8))
    assert same_state(before, state(s))
    assert sweep.mem_lens == [0, 2, 8] and len(sweep.bpc) == len(sweep.seconds) == 3
    ids = torch.tensor(peaky.tokenizer.encode(TEXT))
    for n, bpc in zip(sweep.mem_lens, sweep.bpc):
        loss = evaluate_loss(peaky, ids, 4, n, n_streams=1)
        assert_ulps_close(bpc * math.log(2), loss, SAME_SUMS, dtype=torch.float32)
    assert sweep.effective == effective_context(sweep.mem_lens, sweep.bpc, 0.01)
    assert context_sweep(peaky, "ab").mem_lens == list(CONTEXT_SWEEP_LENGTHS)
    with pytest.raises(ValueError):
        context_sweep(peaky, TEXT, 4, (0, -1))


def test_effective_context_rule():
    from txl.scoring import effective_context

    lengths = [0, 16, 32, 64, 128]
    # best 2.00 at 128; 2.015 at 32 is within 1 % (<= 2.02), 2.03 at 16 is not
    assert effective_context(lengths, [3.0, 2.03, 2.015, 2.01, 2.0]) == 32
    assert effective_context(lengths, [3.0, 2.03, 2.015, 2.01, 2.0], tolerance=0.001) == 128
    assert effective_context(lengths, [2.0, 2.5, 2.5, 2.5, 2.5]) == 0  # memory never helps
    assert effective_context([0, 8], [math.nan, 1.0]) == 8
    assert effective_context([0, 8], [math.nan, math.nan]) is None


# ---- the step history -------------------------------------------------------------------


def history_bytes(s: Session) -> int:
    return sum(t.attentions.nbytes + t.key_positions.nbytes for t in s.history)


def test_history_keeps_only_the_steps_that_captured_attention(peaky):
    s = Session(peaky, mem_len=6, seg_len=4, temperature=1.0)
    s.start(TEXT[:10])
    assert not s.history and s.past_trace(0) is None
    captured = []
    for i in range(9):  # the last one captures
        trace = s.step(capture=i % 2 == 0)
        if trace.attentions is not None:
            captured.append(trace)
    assert [t.position for t in s.history] == [t.position for t in captured]
    for kept, trace in zip(s.history, captured):
        assert kept.attentions.dtype == np.float16 and kept.key_positions.dtype == np.int32
        assert kept.key_positions.tolist() == trace.key_positions.tolist()
        assert (kept.token_id, kept.char, kept.n_memory) == (
            trace.token_id, trace.char, trace.n_memory)
        # float16: a relative precision of 2**-11, weights <= 1
        np.testing.assert_allclose(kept.attentions, trace.attentions, rtol=2**-10, atol=1e-4)
    # float16 rounds to half an ulp of its own (eps 2**-10) at most
    assert_ulps_close(s.history[-1].attentions, s.last_trace.attentions, 1)
    info = s.memory_info()
    assert info["history_steps"] == len(captured) and info["history_bytes"] == history_bytes(s)


def test_history_keeps_at_most_history_steps(peaky):
    s = Session(peaky, mem_len=6, seg_len=4, history=3)
    s.start("abc")
    traces = list(s.generate(7, capture_last_only=False))
    assert [t.position for t in s.history] == [t.position for t in traces[-3:]]
    assert s.memory_info()["history_steps"] == 3
    none = Session(peaky, history=0)
    none.start("abc")
    none.step()
    assert not none.history and none.past_trace(0) is None
    assert none.memory_info()["history_bytes"] == 0


def test_history_bytes_limit_evicts_the_oldest(peaky):
    s = Session(peaky, mem_len=6, seg_len=4, history=100)
    s.start(TEXT[:20])  # a full memory: every step has 7 keys, the same size
    s.step()
    one = s.memory_info()["history_bytes"]
    s.history_bytes_limit = 3 * one + one // 2  # room for 3 steps
    traces = list(s.generate(6, capture_last_only=False))
    assert [t.position for t in s.history] == [t.position for t in traces[-3:]]
    assert s.memory_info()["history_bytes"] == 3 * one == history_bytes(s)
    s.history_bytes_limit = one - 1  # less than one step: none is kept
    s.step()
    assert not s.history and s.memory_info()["history_bytes"] == 0


def test_past_trace_counts_back_and_clamps(peaky):
    s = Session(peaky, mem_len=6, seg_len=4)
    s.start("abc")
    traces = list(s.generate(5, capture_last_only=False))
    for back in range(5):
        assert s.past_trace(back).position == traces[-1 - back].position
    assert s.past_trace(99).position == traces[0].position  # the oldest kept
    with pytest.raises(ValueError):
        s.past_trace(-1)


def test_reset_clears_the_history(peaky):
    s = Session(peaky, mem_len=6, seg_len=4)
    s.start("abc")
    list(s.generate(4, capture_last_only=False))
    assert s.memory_info()["history_steps"] == 4
    s.start("abc")  # start resets too
    assert not s.history and s.past_trace(0) is None
    info = s.memory_info()
    assert info["history_steps"] == 0 and info["history_bytes"] == 0


def test_history_argument_is_validated(peaky):
    for bad in (-1, 2.5, "3", None):
        with pytest.raises(ValueError, match="history"):
            Session(peaky, history=bad)
