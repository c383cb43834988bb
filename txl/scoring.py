"""Per-token surprisal of a text, three ways: segments read in order with memory, the same
segments each read alone, and a sliding window recomputed for every token.

One module serves ``python -m txl.evaluate`` (the validation loss), the app's Score ("does
memory help?": ``score_stages``, no Session needed), the Recall tab, and the counterfactual
of a Session's steps (``window_logits``), so that they always agree.

The window's arithmetic (``window_batches``) runs many windows at once: the windows
ids[p-W : p] of the positions p asked for, stacked [N, W], each read alone through every
layer, the top layer for its last query alone, ``window_batch_size`` windows per call.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from .cached import cached_forward, position_keys
from .checks import as_int
from .model import TransformerXL
from .threads import side_by_side

LN2 = math.log(2)  # nats per bit: bits = nats / LN2


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

# The working set of one batch of windows (one layer's activations and attention scores)
# the batch size aims at: half the last-level cache of the machines this runs on (32 MB:
# an AMD EPYC's L3), so that a layer's products read their operands from cache. Measured
# on the 2-core EPYC, the bundled model, window 64, best of 6 rounds, one thread: 16
# windows a call 8.0-8.7 ms a window, 32 8.4-9.4, 64 8.8-9.8 (the one-window-at-a-time
# code's forward the same at those sizes). More threads take a batch each
# (``window_batches``).
WINDOW_CACHE_BYTES = 16 << 20


def window_batch_size(
    model: TransformerXL, window: int, cache_bytes: int = WINDOW_CACHE_BYTES
) -> int:
    """How many windows of ``window`` tokens one forward call takes: what one layer holds
    per window, float32 (the attention scores [H, W, W] four times over: content,
    position, its shifted copy, the probabilities; the activations [W, d_inner] and
    [W, 4 d_model]), within about ``cache_bytes``; at least one (16 for the bundled
    model's window of 64)."""
    c = model.config
    per_window = 4 * window * (4 * c.n_head * window + c.d_inner + 4 * c.d_model)
    return max(1, cache_bytes // per_window)


def _alone(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """memory_kv of a window read alone: its own keys and values, no memory."""
    return k, v


@torch.no_grad()
def window_forward(model: TransformerXL, windows: Tensor) -> Tensor:
    """[N, W] token ids -> [N, V] next-token scores after each window's last token: each
    window read alone from scratch, no memory (the vanilla model of the paper's Figure 1b),
    the top layer for the last query alone. The same arithmetic as
    ``cached_forward(model, windows, None, mem_len=W, last_only=True)`` without the KV
    memory that call builds (and a window never uses): mem_len = W, so same_length hides
    nothing inside a window. Layer 0's projections are made once for each distinct token
    and looked up: overlapping windows hold every token up to W times."""
    N, W = windows.shape
    with torch.inference_mode():
        h = model.embed(windows)  # [N, W, d]
        tokens, index = windows.unique(return_inverse=True)  # [U], [N, W]
        first_qkv = model.first_layer_qkv(tokens)[index]  # [N, W, 3·H·Dh]
        r_k = position_keys(model, W, h.device, h.dtype)  # per layer [H, W, Dh]
        mask = model.attention_mask(W, 0, W, h.device)  # [W, W]: causal
        alone = [_alone] * len(model.layers)
        h, *_ = model.run_layers(  # [N, 1, d]
            h, alone, r_k, mask, False, last_only=True, first_qkv=first_qkv
        )
        return model.lm_head(h[:, -1])  # [N, V]


def window_batches(
    model: TransformerXL,
    ids: Tensor | list[int],
    positions,
    window: int,
    batch_size: int | None = None,
) -> Iterator[tuple[Tensor, Tensor]]:
    """The next-token scores at each of ``positions`` from the ``window`` tokens before it
    alone: for p in positions, the model on ids[max(0, p-W) : p] predicting ids[p] (p may
    be len(ids): the token after the text). Yields (positions [n], scores [n, V]) batch by
    batch: the positions p < W first, then the others, each group in the order asked.

    Positions p < W see the whole shorter prefix ids[0:p], as a window at the start of a
    text would: one causal forward over ids[0 : max p] gives them all, since without
    memory its row p-1 sees exactly ids[0:p] at the same relative distances. The others
    are the rows ids[p-W : p] of a [N, W] stack, ``batch_size`` (``window_batch_size``)
    per ``window_forward``."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    device = next(model.parameters()).device
    ids = torch.as_tensor(ids, dtype=torch.long).to(device)  # [L]
    window = min(window, len(ids) + 1)  # a longer one sees what this one sees: all of it
    positions = torch.as_tensor(positions, dtype=torch.long).reshape(-1)
    if positions.numel() and not (
        int(positions.min()) >= 1 and int(positions.max()) <= ids.numel()
    ):
        raise ValueError(f"positions must lie in 1 .. {ids.numel()}")
    was_training = model.training
    model.eval()
    try:
        short = positions < window
        if short.any():  # one forward over the longest prefix asked for
            p = positions[short]
            prefix = ids[: int(p.max())].unsqueeze(0)  # [1, max p]
            # mem_len = its length: same_length (when set) then hides nothing in it.
            scores = cached_forward(model, prefix, None, mem_len=prefix.size(1)).logits[0]
            yield p, scores[p.to(device) - 1]
        full = positions[~short]
        starts = full.to(device) - window  # window i is ids[starts[i] : starts[i] + W]
        batch_size = batch_size or window_batch_size(model, window)
        offsets = torch.arange(window, device=device)
        batches = [
            (a, min(a + batch_size, full.numel())) for a in range(0, full.numel(), batch_size)
        ]
        # With n torch threads, n batches side by side, one core and one thread each: each
        # product stays in its core's cache, where one batch over n threads shares it out
        # (2 threads: 17-33 ms a window against 10 ms on one, measured).
        at_once = torch.get_num_threads() if device.type == "cpu" else 1
        for g in range(0, len(batches), at_once):
            group = batches[g : g + at_once]
            tasks = [
                lambda a=a, b=b: window_forward(model, ids[starts[a:b, None] + offsets])
                for a, b in group
            ]  # each [n, W] -> [n, V]
            for (a, b), scores in zip(group, side_by_side(tasks, at_once)):
                yield full[a:b], scores
    finally:
        model.train(was_training)


def window_scores(
    model: TransformerXL, ids, positions, window: int, batch_size: int | None = None
) -> Tensor:
    """[n, V] ``window_batches``' scores at ``positions`` (ascending), in one tensor."""
    return torch.cat(
        [scores for _, scores in window_batches(model, ids, positions, window, batch_size)]
    )


def window_logits(model: TransformerXL, ids: Tensor | list[int], window: int) -> Tensor:
    """[V] next-token scores of the memory-off model after ``ids``: the last ``window``
    tokens alone, from scratch, no memory (what a memory-off Step computes)."""
    return window_scores(model, ids, [len(ids)], window)[0]


# Windows per chunk of the app's Score: small chunks are what lets a long Score pause for
# other visitors' Steps between them (webapp/longwork.py). A chunk of 32 windows of 64 is
# two batches of window_batch_size: ~0.3 s on one core, or side by side on two (when
# longwork gives the chunk two threads) ~0.15 s.
SLIDING_BATCH = 32


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
    recomputed from scratch, with no memory (``window_batches``).

    ids [L] (1-D). Returns [stop - start] float32 (stop defaults to L; start >= 1: the first
    token has nothing before it). Tokens t < W see the whole (shorter) prefix ids[0:t],
    as the window would at the start of a text; with W >= t everything before t is seen."""
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    L = ids.numel()
    stop = L if stop is None else stop
    if not 1 <= start <= stop <= L:
        raise ValueError(f"need 1 <= start <= stop <= {L}, got start={start}, stop={stop}")
    batches = window_batches(model, ids, range(start, stop), window, batch_size)
    nll = []
    for positions, scores in tqdm(batches, desc=desc, disable=not progress, leave=False):
        logp = torch.log_softmax(scores.float(), dim=-1)  # [n, V]
        targets = ids[positions].to(logp.device)
        nll.append(-logp.gather(1, targets.unsqueeze(1))[:, 0].cpu())
    return torch.cat(nll) if nll else torch.zeros(0)


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


def encoded(model: TransformerXL, text: str) -> tuple[Tensor, list[str]]:
    """(ids [L] of ``text`` under the tokenizer's lenient rule, the unknown symbols)."""
    if model.tokenizer is None:
        raise ValueError("scoring a text needs a model with a vocabulary (config.vocab)")
    ids, unknown = model.tokenizer.encode_known(text)
    return torch.tensor(ids, dtype=torch.long), unknown


def context_sweep(
    model: TransformerXL,
    text: str,
    seg_len: int | None = None,
    mem_lens=CONTEXT_SWEEP_LENGTHS,
    tolerance: float = 0.01,
) -> ContextSweep:
    """Bits per token of ``text`` read in segments of ``seg_len`` (the model's tgt_len) with
    each memory length of ``mem_lens`` ("how far back does it read?"), each timed, and the
    effective context: the shortest memory within ``tolerance`` (1 %) of the best bpc."""
    lengths = sorted({as_int("mem_len", n, 0) for n in mem_lens})
    seg_len = as_int("seg_len", model.config.tgt_len if seg_len is None else seg_len, 1)
    streams = encoded(model, text)[0].view(1, -1)  # [1, L]
    bpc, seconds = [], []
    for n in lengths:
        t0 = time.perf_counter()
        bits = stream_nll(model, streams, seg_len, n)[0] / LN2
        seconds.append(time.perf_counter() - t0)
        bpc.append(mean_or_nan(bits))
    return ContextSweep.of(lengths, bpc, seconds, seg_len, tolerance)


# ---- where memory mattered: the characters memory saved the most bits on ---------------

MOMENTS = 5  # the Score's list of moments
MOMENT_CONTEXT = 40  # tokens shown either side of a moment


@dataclass
class Moment:
    """One token of a text and what memory saved on it over the sliding window: the Score's
    moments (``top_moments``) and the Watch tab's passages (``txl.moments``).

    ``position`` is its index in the text (0-based; the first token is never scored:
    nothing comes before it); bits are its surprisal -log2 p, with memory and through the
    window; ``context`` is the text shown with it, from ``context_start``: for the Score, up
    to MOMENT_CONTEXT tokens either side of it (so the token itself is
    ``context[position - context_start]`` for a character model); for a passage, the
    prompt that makes one Step predict it (``text[context_start:position]``). The ranks
    (1 + how many tokens are likelier than it, with memory and through the window) are
    measured for passages only."""

    position: int
    char: str
    bits_memory: float
    bits_window: float
    context: str
    context_start: int
    rank_memory: int | None = None
    rank_window: int | None = None

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


# ---- a text scored three ways, in stages: the app's Score --------------------------------


@dataclass
class ScoreResult:
    """One text scored three ways (all arrays [len(text) - 1], bits; bpc = their mean, NaN
    when nothing was scored; seconds = wall time of each way):

    - with: segments of seg_len read in order, each over a memory of mem_len (Transformer-XL);
    - without: the same segments, each read alone (no memory): context fragmentation;
    - sliding: every char predicted from exactly the ``window`` chars before it (the
      vanilla baseline), recomputed for each char, no memory.
    """

    chars: list[str]  # the characters of the text that were scored (positions 1..)
    bits_with: np.ndarray  # [len(text) - 1] surprisal of each char with memory, in bits
    bits_without: np.ndarray  # segments read alone
    bpc_with: float  # mean of bits_with (NaN when nothing was scored)
    bpc_without: float
    dropped: list[str]  # unknown chars removed/replaced before scoring
    bits_sliding: np.ndarray | None = None  # sliding window of ``window`` chars
    bpc_sliding: float = math.nan
    window: int = 0  # the sliding window's length (seg_len)
    seg_len: int = 0
    mem_len: int = 0
    seconds_with: float = math.nan
    seconds_without: float = math.nan
    seconds_sliding: float = math.nan
    first: str = ""  # the text's first token (not scored: nothing comes before it)

    @property
    def pieces(self) -> list[str]:
        """The text as scored, token by token (position 0 is ``first``)."""
        return [self.first, *self.chars] if self.first or self.chars else []

    def moments(self, k: int = MOMENTS, context: int = MOMENT_CONTEXT) -> list[Moment] | None:
        """The ``k`` tokens where memory saved the most bits over the sliding window, most
        first, each with ``context`` tokens either side (``top_moments``); None until the
        sliding window is scored."""
        if self.bits_sliding is None:
            return None
        if not self.chars:  # nothing was scored
            return []
        return top_moments(self.pieces, self.bits_with, self.bits_sliding, k, context)


@dataclass
class ScoreStage:
    """One stage of ``score_stages``: which (``kind``), the ScoreResult so far (its sliding
    window filled in at "done"), the memory-length sweep once computed, and during the
    sliding window its progress: tokens done of ``total``, seconds left."""

    kind: str  # "reads", "sweep", "sliding" or "done"
    result: ScoreResult
    sweep: ContextSweep | None = None
    done: int = 0
    total: int = 0
    seconds_left: float = math.nan


def score_stages(
    model: TransformerXL,
    text: str,
    seg_len: int | None = None,
    mem_len: int | None = None,
    sliding: bool = True,
    sweep: bool = True,
    pace=None,
    mem_lens=CONTEXT_SWEEP_LENGTHS,
    tolerance: float = 0.01,
) -> Iterator[ScoreStage]:
    """``text`` scored three ways (``ScoreResult``), with segments of ``seg_len`` and a
    memory of ``mem_len`` (the model's tgt_len and mem_len), in stages, fastest first, for
    a page that shows each as it comes: "reads" (memory and segments alone: a ScoreResult
    without the sliding window), "sweep" (the memory-length sweep of ``context_sweep``;
    ``sweep=False`` skips it), "sliding" after every chunk of the sliding window
    (characters done, total, seconds left), and "done" (the whole ScoreResult).

    ``pace``: a context-manager factory around each chunk of work (webapp.longwork's
    ``job.turn``: threads, pauses, cancel); the sliding window's chunks, all alike, pass
    ``work=`` their windows; the reads (one per memory length) pass ``tasks=`` how many
    are left, and run as many side by side as the turn yields (``txl.threads.side_by_side``:
    one core each). The sweep reuses the two reads for memory 0 and mem_len: the same
    computation."""
    cfg = model.config
    seg_len = as_int("seg_len", cfg.tgt_len if seg_len is None else seg_len, 1)
    mem_len = as_int("mem_len", cfg.mem_len if mem_len is None else mem_len, 0)
    lengths = sorted({as_int("mem_len", n, 0) for n in mem_lens}) if sweep else []
    pace = pace or (lambda work=None, tasks=1: nullcontext(1))
    ids, unknown = encoded(model, text)  # [L]
    streams = ids.view(1, -1)  # [1, L]: one stream

    def timed(fn):
        t0 = time.perf_counter()
        nats = fn()
        return nats / LN2, time.perf_counter() - t0

    def reads(lengths) -> dict[int, tuple[Tensor, float]]:
        """The text read with each memory length: (bits [L-1], seconds) by length.
        Independent reads: pace() says how many run side by side (one core each)."""
        done, pending = {}, list(lengths)
        while pending:
            with pace(tasks=len(pending)) as at_once:
                batch, pending = pending[:at_once], pending[at_once:]
                tasks = [
                    lambda n=n: timed(lambda: stream_nll(model, streams, seg_len, n)[0])
                    for n in batch
                ]
                done.update(zip(batch, side_by_side(tasks, at_once)))
        return done

    if len(ids) > 1:  # warm up (the position table): else the first read's time pays
        with pace():
            stream_nll(model, streams[:, : seg_len + 1], seg_len, 0)
    first = reads(dict.fromkeys([mem_len, 0]))  # mem_len 0: one read
    (with_memory, s_with), (without, s_without) = first[mem_len], first[0]
    pieces = model.tokenizer.pieces(ids.tolist())
    result = ScoreResult(
        chars=pieces[1:],
        first=pieces[0] if pieces else "",
        bits_with=with_memory.numpy(),
        bits_without=without.numpy(),
        bpc_with=mean_or_nan(with_memory),
        bpc_without=mean_or_nan(without),
        dropped=unknown,
        window=seg_len,
        seg_len=seg_len,
        mem_len=mem_len,
        seconds_with=s_with,
        seconds_without=s_without,
    )
    total = max(len(ids) - 1, 0) if sliding else 0  # the sliding window's tokens
    yield ScoreStage("reads", result, total=total)

    swept = None
    if sweep:
        known = {**first, **reads([n for n in lengths if n not in first])}
        bpc = [mean_or_nan(known[n][0]) for n in lengths]
        seconds = [known[n][1] for n in lengths]
        swept = ContextSweep.of(lengths, bpc, seconds, seg_len, tolerance)
        yield ScoreStage("sweep", result, swept, total=total)

    if sliding:
        parts, s_sliding = [], 0.0
        for start, stop in sliding_chunks(len(ids), seg_len, SLIDING_BATCH):
            with pace(work=stop - start):
                bits, took = timed(lambda a=start, b=stop: sliding_nll(model, ids, seg_len, a, b))
            parts.append(bits)
            s_sliding += took
            done = stop - 1
            left = s_sliding / done * (total - done)
            yield ScoreStage("sliding", result, swept, done, total, left)
        bits_sliding = torch.cat(parts) if parts else torch.zeros(0)
        result = replace(  # a new result: the earlier stages' stays as it was
            result,
            bits_sliding=bits_sliding.numpy(),
            bpc_sliding=mean_or_nan(bits_sliding),
            seconds_sliding=s_sliding,
        )
    yield ScoreStage("done", result, swept)


def score_text(
    model: TransformerXL,
    text: str,
    seg_len: int | None = None,
    mem_len: int | None = None,
    sliding: bool = True,
) -> ScoreResult:
    """Surprisal of each token of ``text`` given the ones before it, three ways (see
    ``ScoreResult``), each timed: ``score_stages``' last stage, without the sweep."""
    *_, last = score_stages(model, text, seg_len, mem_len, sliding=sliding, sweep=False)
    return last.result
