"""The window's arithmetic batched (txl.scoring.window_batches) against one plain forward
per window, on random texts and positions; and Generate's counterfactual, computed behind
its text in those batches, against the one a Step computes at once.

The reference is the model's own forward over each window alone (``model(x)``): what the
paper's vanilla model computes. float64: to ~1e-12 (the same sums in another order);
float32, the precision the app runs: to 1e-5.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tests.test_predictions import direct, tiny_double
from tests.test_session import VOCAB, tiny_model
from txl.scoring import sliding_nll, window_batches, window_logits, window_scores
from txl.session import BEHIND_BATCH, Session, plain_bytes

TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}


@torch.no_grad()
def one_window(model, ids: torch.Tensor, p: int, window: int) -> torch.Tensor:
    """[V] log-probabilities of the token at p from ids[max(0, p-W) : p] alone."""
    x = ids[max(0, p - window) : p].unsqueeze(0)
    return torch.log_softmax(model(x, mem_len=x.size(1)).logits[0, -1].double(), -1)


# Layouts whose layer 0 the windows treat apart: its projections looked up per token
# (after the LayerNorm with pre_lnorm), and with one layer also the top (one query).
LAYOUTS = {"post-norm": {}, "pre-norm": dict(pre_lnorm=True), "one layer": dict(n_layer=1)}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", range(3))
def test_window_batches_equal_one_forward_per_window(dtype, same_length, layout, seed):
    """Random texts, random positions (short windows at the text's start, full ones, the
    token after the text, repeats, any order), any batch size: every window's scores are
    those of the model run on that window alone."""
    rng = random.Random(seed)
    model = tiny_model(seed=seed, same_length=same_length, **LAYOUTS[layout]).to(dtype)
    L, window = rng.randint(20, 60), rng.choice([1, 3, 7, 16])
    ids = torch.tensor([rng.randrange(len(VOCAB)) for _ in range(L)])
    positions = [rng.randint(1, L) for _ in range(rng.randint(1, 25))]
    for batch_size in (1, 4, None):
        seen = []
        for rows, scores in window_batches(model, ids, positions, window, batch_size):
            assert scores.dtype == dtype and scores.shape == (len(rows), len(VOCAB))
            for p, row in zip(rows.tolist(), scores):
                expected = one_window(model, ids, p, window)
                got = torch.log_softmax(row.double(), -1)
                torch.testing.assert_close(got, expected, rtol=0, atol=TOLERANCE[dtype])
                seen.append(p)
        # every position asked once: the short windows first, each group in the order asked
        short = [p for p in positions if p < window]
        assert seen == short + [p for p in positions if p >= window]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_first_layer_qkv_is_what_layer_0_projects_in_a_forward(layout):
    """The per-token table of layer 0's projections equals the projections layer 0 makes of
    the same tokens inside a forward, at every position of a segment with memory."""
    model = tiny_model(seed=5, **LAYOUTS[layout]).double()
    ids = torch.tensor([random.Random(5).randrange(len(VOCAB)) for _ in range(12)])
    seen = []
    hook = model.layers[0].attn.qkv.register_forward_hook(lambda m, i, out: seen.append(out))
    try:
        with torch.no_grad():
            out = model(ids[:6].unsqueeze(0))
            model(ids[6:].unsqueeze(0), mems=out.mems)  # the second segment, with memory
    finally:
        hook.remove()
    with torch.no_grad():
        table = model.first_layer_qkv(ids)  # [12, 3·H·Dh]
    torch.testing.assert_close(table, torch.cat(seen, dim=1)[0], rtol=0, atol=1e-12)


def test_window_logits_and_sliding_nll_agree_with_the_batches():
    model = tiny_model(seed=4).double()
    ids = torch.tensor([random.Random(4).randrange(len(VOCAB)) for _ in range(50)])
    scores = window_scores(model, ids, range(1, 50), 7, batch_size=5)  # [49, V]
    for p in (1, 6, 7, 30, 49):
        torch.testing.assert_close(window_logits(model, ids[:p], 7), scores[p - 1])
    logp = torch.log_softmax(scores.float(), -1)
    expected = -logp[torch.arange(49), ids[1:]]
    torch.testing.assert_close(sliding_nll(model, ids, 7), expected, rtol=0, atol=1e-5)
    with pytest.raises(ValueError):
        next(window_batches(model, ids, [0], 7))
    with pytest.raises(ValueError):
        next(window_batches(model, ids, [51], 7))


# ---- Generate: the counterfactual behind the text ------------------------------------------


def stepped(model, prompt: str, n: int, **settings) -> tuple[Session, list]:
    """A session that took n Steps after the prompt, and their traces."""
    s = Session(model, **settings)
    s.start(prompt)
    return s, [s.step() for _ in range(n)]


def assert_same_predictions(got, expected, tol: float) -> None:
    """Two steps' Predictions: the same tokens, the same probabilities within tol."""
    for name in ("with_memory", "without_memory"):
        a, b = getattr(got, name), getattr(expected, name)
        assert [(i, text) for i, text, _ in a] == [(i, text) for i, text, _ in b]
        np.testing.assert_allclose([p for *_, p in a], [p for *_, p in b], rtol=tol, atol=0)
    assert got.chosen == expected.chosen
    for name in ("p_with", "p_without", "bits_saved", "kl_bits"):
        assert getattr(got, name) == pytest.approx(getattr(expected, name), rel=tol, abs=tol)


@pytest.mark.parametrize("capture_last_only", [True, False])
def test_generate_fills_in_the_counterfactual_a_step_computes(capture_last_only):
    """Generate's tokens, text and predictions, are Step's: the same text (the same seed
    and with-memory scores), and once the generator is done every token's counterfactual
    and memory-effect entry as a Step computes it at once, in float64; more tokens than one
    batch, and a last batch that is not full."""
    model = tiny_double()
    n = 2 * BEHIND_BATCH + 5
    by_step, expected = stepped(model, "ROMEO:\nI", n, temperature=1.0, seed=3)
    s = Session(model, temperature=1.0, seed=3)
    s.start("ROMEO:\nI")
    traces = list(s.generate(n, capture_last_only=capture_last_only))
    assert s.text == by_step.text
    assert list(s.memory_effect.positions) == list(by_step.memory_effect.positions)
    np.testing.assert_allclose(s.memory_effect.log2_without, by_step.memory_effect.log2_without,
                               rtol=0, atol=1e-10)  # fmt: skip
    np.testing.assert_allclose(s.memory_effect.cumulative, by_step.memory_effect.cumulative,
                               rtol=0, atol=1e-10)  # fmt: skip
    for trace, by_step_trace in zip(traces, expected, strict=True):
        assert_same_predictions(trace.predictions, by_step_trace.predictions, tol=1e-10)
        assert trace.predictions.counterfactual_ms > 0
    # ... and that is the model on the window alone (as test_predictions checks a Step's)
    for trace in (traces[0], traces[-1]):
        window = s.ids[max(0, trace.position - s.seg_len) : trace.position]
        p_without = direct(model, window)[trace.token_id].item()
        assert trace.predictions.p_without == pytest.approx(p_without, rel=1e-10)
    assert s.history_record_bytes == sum(plain_bytes(t) for t in s.history)


def test_the_last_step_is_complete_when_the_text_ends_and_the_rest_follows():
    """The last trace comes with its counterfactual; the memory effect may still wait for
    the ones before it until the generator is done; a generator closed halfway settles what
    it took, and a Step after a half-read Generate keeps the memory effect in text order."""
    model = tiny_double()
    n = BEHIND_BATCH + 3
    s = Session(model, seed=1)
    s.start("ROMEO:\nI")
    steps = s.generate(n)
    for i, trace in enumerate(steps):
        if i == n - 1:
            assert trace.predictions.without_memory is not None
            assert trace.predictions.kl_bits is not None
    assert len(s.memory_effect) == n

    s.start("ROMEO:\nI")
    steps = s.generate(n)
    taken = [next(steps) for _ in range(BEHIND_BATCH + 1)]
    trace = s.step()  # the half-read Generate's counterfactuals come first
    assert list(s.memory_effect.positions) == [t.position for t in taken] + [trace.position]
    assert all(t.predictions.without_memory is not None for t in taken)
    steps.close()
    assert len(s.memory_effect) == BEHIND_BATCH + 2

    by_step, _ = stepped(model, "ROMEO:\nI", BEHIND_BATCH + 2, seed=1)
    np.testing.assert_allclose(s.memory_effect.cumulative, by_step.memory_effect.cumulative,
                               rtol=0, atol=1e-10)  # fmt: skip


def test_export_and_reset_with_counterfactuals_still_to_come():
    """export_state settles first (nothing is computed on a memory that left); reset drops
    them (the text they belonged to is gone)."""
    model = tiny_double()
    s = Session(model, seed=2)
    s.start("ROMEO:\nI")
    steps = s.generate(2 * BEHIND_BATCH)
    for _ in range(BEHIND_BATCH + 4):
        next(steps)
    s.import_state(s.export_state())
    assert len(s.memory_effect) == BEHIND_BATCH + 4
    for _ in range(3):
        next(steps)
    s.reset()
    assert len(s.memory_effect) == 0 and s.text == ""
    steps.close()
    assert len(s.memory_effect) == 0
