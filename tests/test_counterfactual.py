"""Memory on | off side by side (txl/counterfactual.py) and the Gumbel-max choice it rests
on (txl/sampling.py): equal distributions and equal draws always choose alike, the draws
sample the distribution, both sides are plain Sessions stepped with the same draws, and
the parting step's two predictions are the model's direct forwards."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_app import VOCAB
from tests.test_predictions import direct, tiny_double
from txl import TransformerXL, TXLConfig
from txl.counterfactual import MemoryPair
from txl.sampling import filter_logits, gumbel_choice, gumbel_noise
from txl.session import Session

V = 24
PROMPT = "ROMEO:\nI will"

logits_strategy = st.lists(
    st.floats(-12, 12, allow_nan=False, allow_infinity=False), min_size=V, max_size=V
).map(lambda xs: torch.tensor(xs, dtype=torch.float32))
sampling = dict(
    temperature=st.sampled_from([0.0, 0.3, 0.8, 1.0, 1.7]),
    top_k=st.integers(0, V + 2),
    top_p=st.sampled_from([0.1, 0.5, 0.9, 1.0]),
    seed=st.integers(-(2**63), 2**64 - 1),
    step=st.integers(0, 10**6),
)


@settings(max_examples=300, deadline=None)
@given(logits=logits_strategy, **sampling)
def test_equal_distributions_and_equal_draws_choose_alike(
    logits, temperature, top_k, top_p, seed, step
):
    g = gumbel_noise(seed, step, V)
    assert torch.equal(g, gumbel_noise(seed, step, V))  # a pure function of (seed, step)
    chosen = gumbel_choice(logits, g, temperature, top_k, top_p)
    # The same distribution from other tensors (a copy, float64): the same token.
    assert gumbel_choice(logits.clone(), g.clone(), temperature, top_k, top_p) == chosen
    assert gumbel_choice(logits.double(), g, temperature, top_k, top_p) == chosen
    if temperature == 0:
        assert chosen == int(logits.argmax())
        return
    kept = torch.isfinite(filter_logits(logits, temperature, top_k, top_p))
    assert kept[chosen]  # never a token that top-k or top-p dropped


def test_the_draws_differ_by_step_and_seed():
    a = gumbel_noise(7, 0, 1000)
    assert not torch.equal(a, gumbel_noise(7, 1, 1000))
    assert not torch.equal(a, gumbel_noise(8, 0, 1000))
    # standard Gumbel: mean is the Euler-Mascheroni constant, variance pi^2 / 6
    assert float(a.mean()) == pytest.approx(0.5772, abs=0.1)
    assert float(a.var()) == pytest.approx(math.pi**2 / 6, rel=0.15)


def test_the_draws_sample_the_distribution():
    """Gumbel-max over many steps picks each token as often as p says (temperature,
    top-k applied): a chi-square test at the 0.1 % level, on fixed seeds."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    temperature, n = 0.9, 6000
    p = torch.softmax(filter_logits(logits, temperature, top_k=5), -1).double().numpy()
    counts = np.zeros(len(p))
    for t in range(n):
        counts[gumbel_choice(logits, gumbel_noise(3, t, 6), temperature, top_k=5)] += 1
    assert counts[5] == 0  # dropped by top-k
    expected = n * p[:5]
    chi2 = float(((counts[:5] - expected) ** 2 / expected).sum())
    assert chi2 < 18.47  # the 99.9 % quantile of chi-square with 4 degrees of freedom


@torch.no_grad()
def peaked(model: TransformerXL, scale: float = 10.0) -> TransformerXL:
    """The model with its weight matrices scaled up: at its initialisation (std 0.02) a
    random model's predictions hardly depend on the text, and the shared draws keep its
    two sides together for hundreds of steps; scaled, they part within a few dozen."""
    for p in model.parameters():
        if p.dim() > 1:
            p.mul_(scale)
    return model


def tiny_float(seed=0, mem_len=32) -> TransformerXL:
    torch.manual_seed(seed)
    fields = dict(d_model=32, n_layer=2, n_head=2, d_head=8, d_inner=64, tgt_len=16)
    config = TXLConfig(vocab=VOCAB, mem_len=mem_len, dropout=0.0, **fields)
    return peaked(TransformerXL(config).eval())


def test_memory_off_on_both_sides_writes_one_text():
    pair = MemoryPair(tiny_float(), temperature=1.0, seed=5, memory=False)
    pair.start(PROMPT)
    list(pair.generate(500))
    left, right = pair.sessions
    assert len(left.text) == len(PROMPT) + 500
    assert left.text == right.text and pair.parting is None and pair.differing == []


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (8, 0.9)])
def test_each_side_is_a_plain_session_with_the_same_noise(top_k, top_p):
    model = tiny_float(seed=1)
    chosen_by = dict(temperature=1.0, top_k=top_k, top_p=top_p)
    pair = MemoryPair(model, mem_len=24, seed=11, **chosen_by)
    pair.start(PROMPT)
    list(pair.generate(200))
    for memory, side in ((True, pair.with_memory), (False, pair.without_memory)):
        # Another seed: the session's own generator is never read, the draws decide.
        s = Session(model, memory=memory, mem_len=24, seed=99, **chosen_by)
        s.start(PROMPT)
        for t in range(200):
            s.step(capture=False, gumbel=gumbel_noise(11, t, model.config.vocab_size))
        assert s.text == side.text
    # The texts part somewhere (a random model still reads past its window), and the
    # record of where they differ is the texts' own.
    a, b = pair.with_memory.text, pair.without_memory.text
    differing = [i for i in range(len(a)) if a[i] != b[i]]
    assert differing and pair.differing == differing
    assert pair.parting.position == differing[0] >= len(PROMPT)
    assert a[: differing[0]] == b[: differing[0]]


def test_the_parting_predictions_are_direct_forwards():
    """Both distributions at the parting step against model.forward from scratch: the
    whole shared text for the memory side (it all fits in memory), its last seg_len
    tokens for the window side."""
    model = peaked(tiny_double())
    seg_len = model.config.tgt_len
    pair = MemoryPair(model, mem_len=400, temperature=1.0, seed=2)
    pair.start(PROMPT)
    while pair.parting is None and pair.steps < 300:
        pair.step()
    part = pair.parting
    assert part is not None and part.memory_token != part.window_token
    shared = pair.with_memory.ids[: part.position]
    assert shared == pair.without_memory.ids[: part.position]
    p_memory, p_window = direct(model, shared), direct(model, shared[-seg_len:])
    x, y = part.memory_token, part.window_token
    assert part.p_memory_token == pytest.approx((float(p_memory[x]), float(p_window[x])), abs=1e-5)
    assert part.p_window_token == pytest.approx((float(p_memory[y]), float(p_window[y])), abs=1e-5)
    top = torch.topk(p_memory, 10)
    assert [i for i, *_ in part.top_memory] == top.indices.tolist()
    np.testing.assert_allclose([p for *_, p in part.top_memory], top.values, atol=1e-5)
    top = torch.topk(p_window, 10)
    assert [i for i, *_ in part.top_window] == top.indices.tolist()
    # Where the memory side's last shared token looked: the token before the parting.
    assert part.looked.position == part.position - 1
    assert part.looked.attentions.shape[-1] == len(part.looked.key_positions)
    np.testing.assert_allclose(part.looked.attentions.sum(-1), 1.0, atol=1e-5)
    d = part.as_dict()
    assert d["with_memory"]["char"] == pair.with_memory.text[part.position]
    assert d["without_memory"]["char"] == pair.without_memory.text[part.position]


def test_temperature_zero_is_greedy_on_both_sides():
    model = tiny_float(seed=3)
    pair = MemoryPair(model, temperature=0.0, seed=1)
    pair.start(PROMPT)
    list(pair.generate(60))
    s = Session(model, temperature=0.0)
    s.start(PROMPT)
    list(s.generate(60))
    assert s.text == pair.with_memory.text
