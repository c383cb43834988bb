"""Moments where memory mattered: the characters of a text that a model predicts far better
with its memory than through a window of its training length, each with the passage that
leads up to it, for the Watch tab's examples (scripts/find_memory_moments.py).

Two stages, so that a scan of thousands of characters stays cheap and the figures a visitor
sees are exact:

1. **Scan** (``scan``): every character of a range, its surprisal read with memory (the text
   as one stream in segments of ``seg_len``, ``txl.scoring.memory_nll``) and through the
   sliding window of ``seg_len`` (``txl.scoring.sliding_nll``); the bits memory saves are
   ``window - memory``.
2. **Measure and pick** (``find_moments``): the ``shortlist`` characters that saved the most
   in the scan, their passages disjoint (``pick_disjoint``), are read again as the Watch tab
   reads them: their passage alone as the prompt (a fresh ``Session``, segments of
   ``seg_len``, memory ``mem_len``), then the next-token scores a Step samples from (with
   memory) and its counterfactual (``window_logits``: the last ``seg_len`` characters
   alone). The passage starts ~``context`` characters back, so the figures differ a little
   from the long stream's (whose memory reaches further back); they are what one Step from
   that prompt shows. The k that saved the most there are kept.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .model import TransformerXL
from .predictions import log_probs
from .scoring import LN2, Moment, memory_nll, sliding_nll, window_logits
from .session import Session

LINE_SEARCH = 80  # a passage starts at a line start found within this many characters


def passage_record(m: Moment) -> dict:
    """A passage's entry of the moments report (weights/.../memory_moments.json)."""
    return {
        "position": m.position,
        "start": m.context_start,
        "char": m.char,
        "passage": m.context,
        "bits_memory": m.bits_memory,
        "bits_window": m.bits_window,
        "rank_memory": m.rank_memory,
        "rank_window": m.rank_window,
        "bits_saved": m.bits_saved,
    }


def scan(
    model: TransformerXL, ids: Tensor, start: int, stop: int, seg_len: int, mem_len: int
) -> tuple[Tensor, Tensor]:
    """(bits with memory, bits through the window) of the tokens ids[start:stop], each [stop -
    start] float32. ids [L] (1-D) is read as one stream from its first token (the tokens
    before ``start`` fill the memory); the window is the ``seg_len`` tokens before each."""
    memory = memory_nll(model, ids, seg_len, mem_len, start=start, stop=stop) / LN2
    window = sliding_nll(model, ids, seg_len, start=start, stop=stop) / LN2
    return memory, window


def passage_start(text: str, position: int, context: int) -> int:
    """Where the passage before ``text[position]`` starts: ``context`` characters back, moved
    on to the next line start when one comes within LINE_SEARCH characters (a passage that
    opens mid-word reads badly)."""
    if not 0 < context <= position:
        raise ValueError(f"need 0 < context <= position, got context={context}, {position=}")
    start = position - context
    if start == 0 or text[start - 1] == "\n":
        return start
    newline = text.find("\n", start, min(start + LINE_SEARCH, position - 1))
    return start if newline == -1 else newline + 1


@torch.no_grad()
def measure(
    model: TransformerXL, text: str, start: int, position: int, seg_len: int, mem_len: int
) -> Moment:
    """``text[position]`` right after the passage ``text[start:position]``, read as the
    Watch tab reads a prompt: a fresh Session fed the passage (memory on, segments of
    ``seg_len``, memory ``mem_len``), the pending scores a Step samples from, and the
    memory-off counterfactual a Step shows beside them (float64 log-softmax, temperature 1)."""
    passage, char = text[start:position], text[position]
    session = Session(model, mem_len=mem_len, seg_len=seg_len, history=0)
    unknown = session.start(passage)
    if unknown:
        raise ValueError(f"the model does not know {unknown!r}")
    (token,) = model.tokenizer.encode(char)
    with_memory = log_probs(session.next_logits)  # [V]
    through_window = log_probs(window_logits(model, session.ids, seg_len))  # [V]
    return Moment(
        position,
        char,
        bits_memory=-with_memory[token].item() / LN2,
        bits_window=-through_window[token].item() / LN2,
        context=passage,
        context_start=start,
        rank_memory=1 + int((with_memory > with_memory[token]).sum()),
        rank_window=1 + int((through_window > through_window[token]).sum()),
    )


def pick_disjoint(
    savings: list[float], starts: list[int], positions: list[int], k: int
) -> list[int]:
    """Indices of at most k candidates, the largest saving first, no two of whose spans
    [start, position] (the passage and its character) share a character: greedily, each
    candidate in order of saving (ties: the earlier position first) is kept unless it
    overlaps one already kept."""
    if not len(savings) == len(starts) == len(positions):
        raise ValueError("savings, starts and positions must have the same length")
    order = sorted(range(len(savings)), key=lambda i: (-savings[i], positions[i]))
    kept: list[int] = []
    for i in order:
        if len(kept) == k:
            break
        if all(positions[i] < starts[j] or positions[j] < starts[i] for j in kept):
            kept.append(i)
    return kept


def find_moments(
    model: TransformerXL,
    text: str,
    start: int,
    stop: int,
    k: int = 4,
    context: int = 600,
    shortlist: int = 12,
    progress=print,
) -> list[Moment]:
    """The k characters of ``text[start:stop]`` where memory saves the most bits over the
    window, their passages (~``context`` characters before each) disjoint: the scan's
    ``shortlist`` best, passages disjoint, measured as one Step would see them
    (``measure``), and the k that saved the most there. Memory ``mem_len`` and
    segments of ``tgt_len``: the model's own. Characters with fewer than ``context``
    before them are not scanned."""
    if model.tokenizer is None or model.tokenizer.unit != "character":
        raise ValueError("find_moments needs a character model (its positions are characters)")
    c = model.config
    if context - LINE_SEARCH < c.tgt_len + c.mem_len:
        raise ValueError(
            f"context={context} is too short: a passage of at least {context - LINE_SEARCH} "
            f"characters must fill a segment and the memory ({c.tgt_len} + {c.mem_len})"
        )
    start = max(start, context)
    if not start < stop <= len(text):
        raise ValueError(f"need {context} <= start < stop <= {len(text)}: {start=}, {stop=}")
    # Read from `context` before `start`: the scanned characters' memory is as full as a
    # passage's. Indices below are relative to `first`.
    first = start - context
    ids = torch.tensor(model.tokenizer.encode(text[first:stop]), dtype=torch.long)
    memory, window = scan(model, ids, context, len(ids), c.tgt_len, c.mem_len)
    saved = window - memory  # [stop - start]
    progress(f"scanned {stop - start:,} characters ({start:,}:{stop:,})")

    # The scan's best, passages disjoint, then each measured alone: the k best of those.
    positions = list(range(start, stop))
    starts = [passage_start(text, p, context) for p in positions]
    candidates = pick_disjoint(saved.tolist(), starts, positions, shortlist)
    measured = [
        measure(model, text, starts[i], positions[i], c.tgt_len, c.mem_len) for i in candidates
    ]
    progress(f"measured {len(measured)} passages as the Watch tab reads them")
    best = pick_disjoint(
        [m.bits_saved for m in measured],
        [m.context_start for m in measured],
        [m.position for m in measured],
        k,
    )
    return [measured[i] for i in best]
