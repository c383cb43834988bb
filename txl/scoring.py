"""Per-token surprisal of a text read segment by segment, with or without memory.

One function serves both ``python -m txl.evaluate`` (the validation loss) and
``Session.score`` (the app's "does memory help?" view), so the two always agree.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from .cached import cached_forward
from .model import TransformerXL


@torch.no_grad()
def stream_nll(
    model: TransformerXL,
    streams: Tensor,
    seg_len: int,
    mem_len: int,
    max_segments: int | None = None,
    progress: bool = False,
    desc: str = "score",
) -> Tensor:
    """Negative log-likelihood (nats) of every predicted token of ``streams``.

    streams [S, L]: S independent rows of token ids, each read left to right in segments
    of ``seg_len``, the memory (``mem_len`` positions; 0 = none, each segment alone)
    carried from one segment to the next. Token t is predicted from tokens < t.
    Returns [S, L - 1] (fewer columns with ``max_segments``). Runs in eval mode.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    n_pred = streams.size(1) - 1
    starts = range(0, n_pred, seg_len)
    if max_segments is not None:
        starts = starts[:max_segments]
    memory, losses = None, []
    for a in tqdm(starts, desc=desc, disable=not progress, leave=False):
        b = min(a + seg_len, n_pred)
        inputs = streams[:, a:b].to(device)
        targets = streams[:, a + 1 : b + 1].to(device)
        out = cached_forward(
            model, inputs, memory if mem_len > 0 else None, mem_len=mem_len, targets=targets
        )
        memory = out.memory
        losses.append(out.nll.float().cpu())
    model.train(was_training)
    return torch.cat(losses, dim=1) if losses else torch.zeros(streams.size(0), 0)


def split_streams(ids: Tensor, n_streams: int) -> Tensor:
    """Cut a 1-D id tensor into n_streams contiguous rows of equal length: [S, L]."""
    row_len = len(ids) // n_streams
    if row_len < 2:
        raise ValueError(f"{len(ids)} tokens are too few for {n_streams} streams")
    return ids[: n_streams * row_len].view(n_streams, row_len)


# ---- the vanilla baseline: a sliding window, recomputed for every token ----------------


def window_batch_size(model: TransformerXL, window: int, budget_bytes: int = 256 << 20) -> int:
    """How many windows of ``window`` tokens one forward call takes: the attention scores
    [N, H, W, W] (float32, plus a copy for the relative shift) and the activations
    [N, W, d_inner] stay within about ``budget_bytes``."""
    c = model.config
    per_window = 4 * window * (2 * c.n_head * window + c.d_inner + 4 * c.d_model)
    return max(1, budget_bytes // per_window)


# Windows per forward call of the app's sliding window, chosen by measurement
# (benchmarks/bench_score.py --sliding-batches; the bundled model, window 64, 2-core
# machine): 16 was the fastest with 1 and 2 threads (10.0 / 6.6 ms per character against
# 11.6 / 7.4 with 4 and 10.8 / 6.6 with 64; window_batch_size's 341 was slower still: its
# activations do not stay in cache). Small batches are also what lets a long Score pause
# for other visitors' Steps between them (webapp/longwork.py).
SLIDING_BATCH = 16


def sliding_chunks(n_tokens: int, window: int, batch_size: int = SLIDING_BATCH):
    """(start, stop) ranges of token positions that cover 1 .. n_tokens-1 for sliding_nll
    in pieces: the tokens with fewer than ``window`` before them (one forward), then
    ``batch_size`` full windows at a time. Scoring them in turn gives the same values as
    one call over everything."""
    short_stop = min(window, n_tokens)
    if short_stop > 1:
        yield 1, short_stop
    for a in range(max(1, window), n_tokens, batch_size):
        yield a, min(a + batch_size, n_tokens)


@torch.no_grad()
def sliding_nll(
    model: TransformerXL,
    ids: Tensor,
    window: int,
    start: int = 1,
    stop: int | None = None,
    batch_size: int | None = None,
    progress: bool = False,
    desc: str = "sliding",
) -> Tensor:
    """-log p(ids[t] | ids[t-W : t]) in nats for t = start .. stop-1: the vanilla model of
    the paper's Figure 1b, every token predicted from exactly the W tokens before it,
    recomputed from scratch, with no memory.

    ids [L] (1-D). Returns [stop - start] float32 (stop defaults to L; start >= 1: the first
    token has nothing before it). Tokens t < W see the whole (shorter) prefix ids[0:t],
    as the window would at the start of a text; with W >= t everything before t is seen.

    Batched: the windows ids[t-W : t] for t >= W are the rows of ids.unfold(0, W, 1) [N, W],
    N windows per forward call, and only the last position's logits are kept. The
    prefixes of tokens t < W come from one causal forward over ids[0 : W-1]: without
    memory, position t-1 of it sees exactly ids[0:t] at the same relative distances, so its
    logits are those of the window ids[0:t] alone.
    """
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    L = ids.numel()
    stop = L if stop is None else stop
    if not 1 <= start <= stop <= L:
        raise ValueError(f"need 1 <= start <= stop <= {L}, got start={start}, stop={stop}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids = ids.to(device)
    nll = []
    # Tokens start .. min(stop, W)-1 (fewer than W before them): one forward over the prefix.
    short_stop = min(stop, window)
    if start < short_stop:
        prefix = ids[: short_stop - 1].unsqueeze(0)  # [1, short_stop - 1]
        # mem_len = its length: same_length (when set) then hides nothing in it.
        logits = cached_forward(model, prefix, None, mem_len=prefix.size(1)).logits[0]
        logp = torch.log_softmax(logits.float(), dim=-1)  # [short_stop - 1, vocab]
        rows = torch.arange(start - 1, short_stop - 1, device=device)
        nll.append(-logp[rows, ids[rows + 1]])
    # Tokens max(start, W) .. stop-1: full windows, N per call.
    first = max(start, window)
    if first < stop:
        windows = ids[: stop - 1].unfold(0, window, 1)  # [stop - W, W]: row i = ids[i : i+W]
        batch_size = batch_size or window_batch_size(model, window)
        chunks = range(first - window, stop - window, batch_size)
        for a in tqdm(chunks, desc=desc, disable=not progress, leave=False):
            b = min(a + batch_size, stop - window)
            x = windows[a:b]  # [N, W], predicting ids[a+W : b+W]
            out = cached_forward(model, x, None, mem_len=window, last_only=True)
            logp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)  # [N, vocab]
            targets = ids[a + window : b + window]
            nll.append(-logp.gather(1, targets.unsqueeze(1))[:, 0])
    model.train(was_training)
    return torch.cat(nll).cpu() if nll else torch.zeros(0)


@torch.no_grad()
def memory_nll(
    model: TransformerXL,
    ids: Tensor,
    seg_len: int,
    mem_len: int,
    start: int = 1,
    stop: int | None = None,
    progress: bool = False,
    desc: str = "score",
) -> Tensor:
    """-log p(ids[t] | ...) in nats for t = start .. stop-1, ids [L] read as one stream from
    its first token in segments of ``seg_len`` (memory of ``mem_len``; 0 = each segment
    alone), exactly as ``stream_nll`` reads it. Tokens before ``start`` are read (they fill
    the memory) but not returned, so that every token keeps the context it has in a long
    read, whatever range is scored. Returns [stop - start] float32."""
    L = ids.numel()
    stop = L if stop is None else stop
    if not 1 <= start <= stop <= L:
        raise ValueError(f"need 1 <= start <= stop <= {L}, got start={start}, stop={stop}")
    # stream_nll of ids[0:stop] gives tokens 1 .. stop-1: column j is token j + 1.
    nll = stream_nll(model, ids[:stop].view(1, -1), seg_len, mem_len, progress=progress, desc=desc)
    return nll[0, start - 1 :]


# ---- how far back does the model read? ------------------------------------------------

# The memory lengths of the app's "How far back does it read?" chart.
CONTEXT_SWEEP_LENGTHS = (0, 16, 32, 64, 128, 256, 512, 1024)


def mean_or_nan(bits: Tensor) -> float:
    """Mean of a 1-D tensor, NaN when empty (a text too short to score)."""
    return bits.mean().item() if bits.numel() else float("nan")


@dataclass
class ContextSweep:
    """Bits per char of one text against memory length (segments of seg_len throughout)."""

    mem_lens: list[int]  # ascending
    bpc: list[float]  # bpc[i] at memory mem_lens[i] (0 = segments read alone)
    seconds: list[float]
    seg_len: int
    effective: int | None  # the shortest memory within ``tolerance`` of the best bpc
    tolerance: float  # relative: 0.01 = within 1 %

    @classmethod
    def of(cls, mem_lens, bpc, seconds, seg_len: int, tolerance: float) -> ContextSweep:
        """The sweep of these measurements, its effective context computed from them."""
        effective = effective_context(mem_lens, bpc, tolerance)
        return cls(list(mem_lens), bpc, seconds, seg_len, effective, tolerance)


def effective_context(mem_lens, bpc, tolerance: float = 0.01) -> int | None:
    """The shortest memory length whose bpc is within ``tolerance`` (relative) of the best:
    bpc <= min(bpc) * (1 + tolerance). Beyond it a longer memory buys (almost) nothing.
    None when there is no finite bpc."""
    pairs = [(n, b) for n, b in zip(mem_lens, bpc) if math.isfinite(b)]
    if not pairs:
        return None
    best = min(b for _, b in pairs)
    return min(n for n, b in pairs if b <= best * (1 + tolerance))


def context_sweep(
    model: TransformerXL,
    ids: Tensor,
    seg_len: int,
    mem_lens=CONTEXT_SWEEP_LENGTHS,
    tolerance: float = 0.01,
) -> ContextSweep:
    """Bits per token of ids [L] (one stream) read in segments of ``seg_len`` with each
    memory length of ``mem_lens``, each timed, and the effective context (the shortest
    memory within ``tolerance`` of the best bpc)."""
    lengths = sorted(set(mem_lens))
    streams = ids.view(1, -1)  # [1, L]
    bpc, seconds = [], []
    for n in lengths:
        t0 = time.perf_counter()
        bits = stream_nll(model, streams, seg_len, n)[0] / math.log(2)
        seconds.append(time.perf_counter() - t0)
        bpc.append(mean_or_nan(bits))
    return ContextSweep.of(lengths, bpc, seconds, seg_len, tolerance)


# ---- where memory mattered: the characters memory saved the most bits on ---------------

MOMENTS = 5  # the Score's list of moments
MOMENT_CONTEXT = 40  # tokens shown either side of a moment


@dataclass
class Moment:
    """One token of a scored text and what memory saved on it over the sliding window.

    ``position`` is its index in the text as scored (0-based; the first token is never
    scored: nothing comes before it); bits are its surprisal -log2 p, with memory and
    through the window; ``context`` is the text from ``context_start`` (up to
    MOMENT_CONTEXT tokens before it) to MOMENT_CONTEXT tokens after it, so the token
    itself is ``context[position - context_start]`` for a character model."""

    position: int
    char: str
    bits_memory: float
    bits_window: float
    context: str
    context_start: int

    @property
    def bits_saved(self) -> float:
        """bits_window - bits_memory: > 0 where memory made the token likelier."""
        return self.bits_window - self.bits_memory

    def as_dict(self, digits: int = 4) -> dict:
        """The /score numbers' entry (bits rounded to ``digits`` decimals; bits_saved is
        the difference of the unrounded bits, rounded)."""
        return {
            "position": self.position,
            "char": self.char,
            "bits_memory": round(self.bits_memory, digits),
            "bits_window": round(self.bits_window, digits),
            "bits_saved": round(self.bits_saved, digits),
            "context": self.context,
        }


def top_moments(
    pieces,
    bits_memory,
    bits_window,
    k: int = MOMENTS,
    context: int = MOMENT_CONTEXT,
) -> list[Moment]:
    """The ``k`` tokens where memory saved the most bits over the window, most first (a tie
    goes to the earlier token).

    pieces: the text's tokens ([L]: a str for a character model, or a list of strings);
    bits_memory, bits_window: [L - 1] surprisal in bits of tokens 1 .. L-1 (a
    ScoreResult's ``bits_with`` and ``bits_sliding``). saved = bits_window - bits_memory
    per token; tokens whose bits are not finite are left out."""
    bits_memory = np.asarray(bits_memory, dtype=np.float64)
    bits_window = np.asarray(bits_window, dtype=np.float64)
    if not len(pieces) - 1 == bits_memory.size == bits_window.size:
        raise ValueError(
            f"{len(pieces)} tokens need {len(pieces) - 1} bits each way, got "
            f"{bits_memory.size} and {bits_window.size}"
        )
    saved = bits_window - bits_memory  # [L - 1]: token t = index + 1
    candidates = np.flatnonzero(np.isfinite(saved))
    order = candidates[np.argsort(-saved[candidates], kind="stable")][: max(0, int(k))]
    moments = []
    for i in order:
        t = int(i) + 1
        a, b = max(0, t - context), t + context + 1
        moments.append(
            Moment(
                position=t,
                char=pieces[t],
                bits_memory=float(bits_memory[i]),
                bits_window=float(bits_window[i]),
                context="".join(pieces[a:b]),
                context_start=a,
            )
        )
    return moments
