"""The budgets of tests/tolerance.py let rounding through and nothing else.

Each bug the exactness tests stand guard against (a logit off by 1e-2, a relative position
off by one, a key too many in the window, a future key let through the causal mask) is
rejected, by MARGIN budgets at least, on the same peaky models the Session and model
tests use, in float32 (where the budgets are widest), while the right answer passes.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.test_session import TEXT, full_forward, tiny_model
from tests.tolerance import SAME_SUMS, assert_ulps_close, eps_of, ulps_apart
from txl import TransformerXL
from txl.session import Session

SHIPPED = Path(__file__).resolve().parents[1] / "weights" / "shakespeare-char"
MARGIN = 10  # a bug must sit this many budgets away, not just outside one


# ---- the helper itself -------------------------------------------------------------


def test_eps_follows_the_coarser_dtype_or_the_one_named():
    x32, x64 = torch.ones(3), torch.ones(3, dtype=torch.float64)
    assert eps_of(x32) == 2.0**-23 and eps_of(x64) == 2.0**-52
    assert eps_of(np.ones(2, dtype=np.float16)) == 2.0**-10 and eps_of(1.0) == 2.0**-52
    assert ulps_apart(x32, x64).eps == 2.0**-23  # float32 against float64: float32's ulps
    assert ulps_apart(1.0, 1.0 + 2**-20, dtype=torch.float32).ulps == pytest.approx(8)


def test_budget_is_in_ulps_of_the_largest_value():
    expected = torch.tensor([4.0, -1.0, 0.5])
    step = 4.0 * 2.0**-23  # one float32 ulp of the largest magnitude, 4
    assert ulps_apart(expected + torch.tensor([0, 0, 3 * step]), expected).ulps == 3
    assert_ulps_close(expected + torch.tensor([0, 0, 3 * step]), expected, 3)
    with pytest.raises(AssertionError, match="3.0 ulps of 4 .* more than the 2 allowed"):
        assert_ulps_close(expected + torch.tensor([0, 0, 3 * step]), expected, 2)
    assert ulps_apart(expected, expected, scale=1.0).ulps == 0


def test_shapes_nan_and_scalars():
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_ulps_close(torch.zeros(2, 3), torch.zeros(3), 1e9)  # no broadcasting
    with pytest.raises(AssertionError):
        assert_ulps_close(torch.tensor([1.0, math.nan]), torch.ones(2), 1e9)
    assert_ulps_close(np.full(4, 1.0, dtype=np.float32), 1.0, 0)  # a scalar for all
    with pytest.raises(AssertionError):
        assert_ulps_close(torch.tensor([1.0]), torch.tensor([0.0]), 1e9)  # scale 0: exact


# ---- bugs, against the budgets ---------------------------------------------------


@pytest.fixture(scope="module", params=["tiny", "shipped"])
def model(request):
    """The Session tests' peaky float32 model (logits of ~2) and the shipped one (float32,
    6 layers of 256, logits of ~9: there 1e-2 is the fewest ulps, ~9,000)."""
    return tiny_model() if request.param == "tiny" else TransformerXL.from_pretrained(SHIPPED)


def ids_of(model) -> list[int]:
    text = TEXT if model.config.vocab_size <= 10 else "ROMEO:\nWhat light through yonder"
    return model.tokenizer.encode(text[:12])


@torch.no_grad()
def all_logits(model, ids) -> torch.Tensor:
    """[T, vocab]: every position's next-token logits, one forward, no memory."""
    return model(torch.tensor([ids]), mem_len=len(ids)).logits[0]


def assert_rejected(buggy, right) -> None:
    with pytest.raises(AssertionError, match=f"more than the {SAME_SUMS} allowed"):
        assert_ulps_close(buggy, right, SAME_SUMS)
    apart = ulps_apart(buggy, right)
    assert apart.ulps > MARGIN * SAME_SUMS, apart


def test_the_right_answer_passes(model):
    """The memory-off step (the last_only path) against a forward over its window."""
    s = Session(model, memory=False, seg_len=5, temperature=1.0)
    s.start(model.tokenizer.decode(ids_of(model)))
    assert_ulps_close(s.next_logits, full_forward(model, s.ids[-5:]), SAME_SUMS)


def test_a_logit_off_by_1e_2_is_rejected(model):
    right = full_forward(model, ids_of(model)[-5:])
    buggy = right.clone()
    buggy[int(right.abs().argmin())] += 1e-2  # the smallest logit, the least of the scale
    assert_rejected(buggy, right)


def test_a_position_off_by_one_is_rejected(model, monkeypatch):
    """Every key one place further back than it is (R_{Δ+1} for R_Δ)."""
    ids = ids_of(model)[-5:]
    right = full_forward(model, ids)
    shifted = TransformerXL.distances
    monkeypatch.setattr(TransformerXL, "distances",
                        lambda self, K, device=None: shifted(self, K, device) + 1)
    assert_rejected(full_forward(model, ids), right)


def test_a_key_too_many_is_rejected(model):
    """A window of 6 where the step should see 5: the mask one key too short."""
    ids = ids_of(model)
    assert_rejected(full_forward(model, ids[-6:]), full_forward(model, ids[-5:]))


def test_a_future_key_let_through_is_rejected(model, monkeypatch):
    """The causal mask one diagonal too high: each query also sees the next key."""
    ids = ids_of(model)
    right = all_logits(model, ids)

    def leaky(self, T, M, mem_len, device=None):
        return torch.triu(torch.ones(T, M + T, dtype=torch.bool, device=device), 2 + M)

    monkeypatch.setattr(TransformerXL, "attention_mask", leaky)
    assert_rejected(all_logits(model, ids), right)
