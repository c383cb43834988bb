"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus)."""

from __future__ import annotations

import math

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
