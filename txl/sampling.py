"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus);
and Gumbel-max with noise given from outside, for generations that share their randomness."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


def filter_logits(logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Scale by 1/temperature, keep the top_k best and the smallest set whose probability
    reaches top_p; the rest become -inf. logits [..., V] -> [..., V]."""
    logits = logits.float() / temperature
    if 0 < top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the tokens before it already reach top_p (the best one stays).
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -math.inf)
    return logits


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token id per row of logits [..., V]; temperature 0 is greedy (argmax)."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits, temperature, top_k, top_p).softmax(dim=-1)
    # A temperature so small (1e-40) that logits / temperature overflow to inf gives NaN
    # probabilities: such a row gets the distribution's limit as temperature -> 0, the argmax.
    overflow = ~torch.isfinite(probs).all(dim=-1, keepdim=True)
    if overflow.any():
        greedy = torch.nn.functional.one_hot(logits.argmax(dim=-1), probs.size(-1))
        probs = torch.where(overflow, greedy.to(probs.dtype), probs)
    flat = probs.reshape(-1, probs.size(-1))
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


# ---- shared randomness: Gumbel-max ------------------------------------------------------
#
# Sampling from p is the same as taking argmax_v (log p[v] + g[v]) with g[v] independent
# standard Gumbel draws (the Gumbel-max trick). Fix the draws of a step and the choice is a
# function of the distribution alone: two generations that see the same draws pick the same
# token wherever their distributions are equal, and another token only where the
# distributions differ enough (the Gumbel-max causal model of generation: Chatzi et al.
# 2024, arXiv 2409.17027). That is what makes a side-by-side a counterfactual.


def gumbel_noise(seed: int, step: int, vocab_size: int) -> Tensor:
    """[vocab_size] float64 standard Gumbel draws, one per vocabulary entry, for generation
    step ``step`` (0: the first token after the prompt) of seed ``seed``. A pure function
    of (seed, step): any caller, in any order, gets the same draws for the same step."""
    # SeedSequence mixes (seed, step) into independent streams; it takes non-negative ints.
    rng = np.random.default_rng([int(seed) % 2**64, int(step)])
    uniform = rng.random(vocab_size)  # [0, 1)
    uniform = np.maximum(uniform, np.finfo(np.float64).tiny)  # log 0 never comes up
    return torch.from_numpy(-np.log(-np.log(uniform)))


def gumbel_choice(
    logits: Tensor, gumbel: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> int:
    """The token argmax_v (log p[v] + gumbel[v]), p the distribution ``sample_next`` samples
    from (temperature, then top-k and top-p); temperature 0 is greedy and reads no noise.
    logits, gumbel: [V]. Equal logits and equal draws always give the same token."""
    logits = logits.reshape(-1)
    if gumbel.shape != logits.shape:
        shapes = f"{tuple(gumbel.shape)} against logits of {tuple(logits.shape)}"
        raise ValueError(f"gumbel noise must have one draw per token: {shapes}")
    if temperature <= 0:
        return int(logits.argmax())
    log_p = torch.log_softmax(filter_logits(logits, temperature, top_k, top_p).double(), -1)
    if not torch.isfinite(log_p).any():  # a temperature so small that it overflowed
        return int(logits.argmax())  # the limit as temperature -> 0, as in sample_next
    return int((log_p + gumbel.to(log_p)).argmax())
