"""What memory changes: the next-token prediction with and without memory, at every step.

At each step the session samples a token from its pending logits: with memory on, the
model's scores after the last token, which attended over the memory. The counterfactual
is the same model on only the last ``seg_len`` tokens before the new one, with no memory:
exactly what a memory-off Step would have computed at that point (``txl.scoring.window_logits``;
a Generate computes them many at once, behind its text: ``window_batches``).
Both are read as the model's own distributions, softmax at temperature 1, before top-k or
top-p, so that they compare across sampling settings:

    p_with    = softmax(logits_with)          [V]   (the pending logits)
    p_without = softmax(logits_without)       [V]   (the window, no memory)
    bits_saved = log2 p_with[x] - log2 p_without[x]  for the sampled token x
                 (> 0: memory made x likelier; < 0: memory hurt)
    kl_bits    = KL(p_with || p_without) = sum_v p_with[v] (log2 p_with[v] - log2 p_without[v])

Everything is computed in float64 from the logits, whatever the model's dtype. A word
model's adaptive softmax gives log-probabilities as its logits: their softmax is the same
distribution, so the same code serves both.

``Predictions`` is one step's result (plain Python data: it stays in RAM when a session's
memory is offloaded); ``MemoryEffect`` is a session's running record of p_with and
p_without of every token produced with memory on, for the text's second shading mode and
the status line's running total.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from dataclasses import dataclass

import torch
from torch import Tensor

from .scoring import LN2

TOP_K = 10  # tokens shown in each bar list


def log_probs(logits: Tensor) -> Tensor:
    """[V] float64 log-probabilities: log_softmax of the logits at temperature 1."""
    return torch.log_softmax(logits.detach().reshape(-1).to(torch.float64), dim=-1)


def top_tokens(logp: Tensor, k: int = TOP_K) -> list[tuple[int, float]]:
    """The k likeliest token ids and their probabilities, most likely first."""
    values, ids = torch.topk(logp, min(k, logp.numel()))
    return [(int(i), math.exp(float(v))) for i, v in zip(ids, values)]


def bits_saved(logp_with: Tensor, logp_without: Tensor, token: int) -> float:
    """log2 p_with(token) - log2 p_without(token): the bits memory saved on ``token``."""
    return float(logp_with[token] - logp_without[token]) / LN2


def kl_bits(logp_with: Tensor, logp_without: Tensor) -> float:
    """KL(p_with || p_without) in bits. Tokens with p_with = 0 add nothing (0 log 0 = 0);
    KL >= 0, so rounding below 0 (two equal distributions: -1e-16) gives 0."""
    p_with = logp_with.exp()
    terms = torch.where(p_with > 0, p_with * (logp_with - logp_without), 0.0)
    return max(0.0, float(terms.sum()) / LN2)


@dataclass
class Predictions:
    """One step's next-token distribution with memory and without (None: memory was off,
    there is no counterfactual). Token ids, texts and probabilities as plain Python."""

    chosen: int  # the token the step sampled
    chosen_text: str
    with_memory: list[tuple[int, str, float]]  # top tokens (id, text, p), p descending
    p_with: float  # p of the chosen token with memory (or with the memory-off model)
    without_memory: list[tuple[int, str, float]] | None = None
    p_without: float | None = None
    bits_saved: float | None = None  # log2 p_with - log2 p_without of the chosen token
    kl_bits: float | None = None  # KL(with || without), bits
    counterfactual_ms: float = 0.0  # wall time of the memory-off forward and of the above

    def as_dict(self) -> dict:
        """The API's JSON (/step's summary["predictions"]): tokens by their text,
        probabilities to 6 significant digits (~0.6 KB for two lists of 10)."""

        def tokens(top):
            return None if top is None else [[text, _round(p)] for _, text, p in top]

        return {
            "with_memory": tokens(self.with_memory),
            "without_memory": tokens(self.without_memory),
            "chosen": self.chosen_text,
            "p_chosen": {
                "with_memory": _round(self.p_with),
                "without_memory": _round(self.p_without),
            },
            "bits_saved": _round(self.bits_saved),
            "kl_bits": _round(self.kl_bits),
        }


def _round(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


def predictions(
    logits_with: Tensor,
    logits_without: Tensor | None,
    chosen: int,
    token_text,
    k: int = TOP_K,
) -> Predictions:
    """A step's Predictions from its two sets of logits ([V] each; ``logits_without`` None
    when memory is off, or still to come: ``add_counterfactual``). ``token_text(id)``
    gives a token's text (a character, a word)."""
    lp_with = log_probs(logits_with)
    result = Predictions(
        chosen=chosen,
        chosen_text=token_text(chosen),
        with_memory=_named(top_tokens(lp_with, k), token_text),
        p_with=math.exp(float(lp_with[chosen])),
    )
    if logits_without is not None:
        add_counterfactual(result, logits_with, logits_without, token_text, k)
    return result


def add_counterfactual(
    result: Predictions, logits_with: Tensor, logits_without: Tensor, token_text, k: int = TOP_K
) -> None:
    """Complete ``result`` (made from ``logits_with``) with the memory-off model's half:
    its top tokens, p of the chosen token, bits saved and KL."""
    lp_with, lp_without = log_probs(logits_with), log_probs(logits_without)
    chosen = result.chosen
    result.without_memory = _named(top_tokens(lp_without, k), token_text)
    result.p_without = math.exp(float(lp_without[chosen]))
    result.bits_saved = bits_saved(lp_with, lp_without, chosen)
    result.kl_bits = kl_bits(lp_with, lp_without)


def _named(top, token_text) -> list[tuple[int, str, float]]:
    return [(i, token_text(i), p) for i, p in top]


class MemoryEffect:
    """The tokens a session produced with memory on, each with its log2 probability with
    memory and without, by text position (ascending: a session's text only grows until
    reset): what the text's "memory's effect" shading and the status line's running total
    read. 32 bytes per token (100,000 tokens: 3.2 MB)."""

    def __init__(self):
        self.positions = array("q")
        self.log2_with = array("d")
        self.log2_without = array("d")
        self.cumulative = array("d")  # bits saved by the tokens up to and including i

    def __len__(self) -> int:
        return len(self.positions)

    def add(self, position: int, p_with: float, p_without: float) -> None:
        if self.positions and position <= self.positions[-1]:
            raise ValueError(f"position {position} is not after {self.positions[-1]}")
        lw, lo = _log2(p_with), _log2(p_without)
        self.positions.append(position)
        self.log2_with.append(lw)
        self.log2_without.append(lo)
        self.cumulative.append((self.cumulative[-1] if self.cumulative else 0.0) + lw - lo)

    def bits_saved(self, end: int | None = None) -> tuple[float, int]:
        """(total bits memory saved, tokens) over the tokens before position ``end`` (all
        of them when None)."""
        n = len(self.positions) if end is None else bisect_left(self.positions, end)
        return (self.cumulative[n - 1] if n else 0.0), n

    def view(self, start: int, end: int) -> dict | None:
        """The text view's shading data for positions [start, end), dense from the first
        such token: {"start": position, "with": [...], "without": [...]}, each entry the
        token's surprisal -log2 p in centibits (an int: 2^(-x/100) is p to 0.7 %), None
        where a position has none (the prompt, steps with memory off). None when no token
        in the range was produced with memory."""
        i0, i1 = bisect_left(self.positions, start), bisect_left(self.positions, end)
        if i0 == i1:
            return None
        first = self.positions[i0]
        n = self.positions[i1 - 1] + 1 - first
        with_cb, without_cb = [None] * n, [None] * n
        for i in range(i0, i1):
            k = self.positions[i] - first
            with_cb[k] = round(-100 * self.log2_with[i])
            without_cb[k] = round(-100 * self.log2_without[i])
        return {"start": first, "with": with_cb, "without": without_cb}


def _log2(p: float) -> float:
    """log2 p; a probability that underflowed to 0 counts as the smallest float64."""
    return math.log2(max(p, 5e-324))
