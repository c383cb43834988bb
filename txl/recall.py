"""How far back can the model recall? A made-up speaker, planted k characters back.

The probe is a text Tiny Shakespeare could contain: a speaker no play has (``NAME:`` on its
own line, one line of speech), then ``k`` characters of ordinary text (the filler), then
the speaker returns (a blank line and the first ``CUE`` letters of the name). The rest of
the name can only be predicted by recalling it, so its cost in bits per character says
whether the model reached back ``k`` characters:

    text  = "NAME:\\n" + speech + "\\n\\n" + filler[:k] + "\\n\\n" + NAME
    start = len(text) - (len(NAME) - CUE)          the scored characters are text[start:]

Each probe is read three ways, as ``python -m txl.evaluate`` reads validation text:

- with memory: the text read as one stream in segments of ``tgt_len``, memory ``mem_len``;
- through the window: each character predicted from exactly the ``tgt_len`` before it,
  recomputed, no memory (the fair baseline: the same attention length, no cache);
- segments alone: segments of ``tgt_len``, each read with nothing before it.

Within the window all three can see the name; beyond it only memory can.

    python -m txl.evaluate --model weights/shakespeare-char --data tinyshakespeare.txt \\
        --recall ZANTHOR
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from .model import TransformerXL
from .scoring import memory_nll, sliding_nll

CUE = 3  # letters of the name given back as the cue; the rest is scored
SPEECH = "Stand, and unfold yourself; the hour grows late."
DISTANCES = (32, 64, 128, 256, 512, 1024, 2048)
LN2 = math.log(2)


@dataclass
class RecallRow:
    distance: int  # k: characters of filler between the planted speech and the return
    text: str  # the whole probe
    start: int  # index of the first scored character: the scored characters are text[start:]
    bits_memory: float  # their mean surprisal (bits/char), read with memory
    bits_window: float  # ... through a sliding window of tgt_len, no memory
    bits_segments: float  # ... in segments of tgt_len read alone

    def to_dict(self) -> dict:
        return asdict(self)


def probe_text(name: str, filler: str, distance: int, speech: str = SPEECH) -> tuple[str, int]:
    """The probe for one distance: (text, start). The filler is repeated when it is shorter
    than ``distance`` and cut at ``distance`` characters."""
    check_probe(name, filler)
    body = (filler * (distance // len(filler) + 1))[:distance]
    text = f"{name}:\n{speech}\n\n{body}\n\n{name}"
    return text, len(text) - (len(name) - CUE)


def check_probe(name: str, filler: str) -> None:
    """A clear message for a probe that cannot be made."""
    if len(name) <= CUE:
        raise ValueError(f"the name needs more than {CUE} letters (the first {CUE} are the cue)")
    if "\n" in name or ":" in name:
        raise ValueError("the name is one line without ':' (it is written as 'NAME:')")
    if not filler:
        raise ValueError("the filler is empty")


@torch.no_grad()
def recall_row(
    model: TransformerXL, name: str, filler: str, distance: int, mem_len: int
) -> RecallRow:
    """One distance, read the three ways (module docstring)."""
    text, start = probe_text(name, filler, distance)
    ids = torch.tensor(model.tokenizer.encode(text), dtype=torch.long)
    seg = model.config.tgt_len

    def bits(nll: torch.Tensor) -> float:
        return nll.double().mean().item() / LN2

    return RecallRow(
        distance=distance,
        text=text,
        start=start,
        bits_memory=bits(memory_nll(model, ids, seg, mem_len, start=start)),
        bits_window=bits(sliding_nll(model, ids, seg, start=start)),
        bits_segments=bits(memory_nll(model, ids, seg, 0, start=start)),
    )


def recall_probe(
    model: TransformerXL,
    name: str,
    filler: str,
    distances=DISTANCES,
    mem_len: int | None = None,
):
    """Yield a RecallRow per distance, in order (memory ``mem_len``; default the config's).
    A generator, so that a caller can show each row as soon as it is read."""
    mem_len = model.config.mem_len if mem_len is None else mem_len
    unknown = set(name + filler) - set(model.tokenizer.vocab)
    if unknown:
        raise ValueError(f"characters the model does not know: {''.join(sorted(unknown))!r}")
    for k in distances:
        yield recall_row(model, name, filler, k, mem_len)


def recall_summary(rows: list[RecallRow], window: int, threshold: float = 2.0) -> str:
    """One sentence: how far back the name was recalled (under ``threshold`` bits/char)
    with memory and through the window alone."""

    def reach(key: str) -> int | None:
        ok = [r.distance for r in rows if getattr(r, key) <= threshold]
        return max(ok) if ok else None

    mem, win = reach("bits_memory"), reach("bits_window")
    said_mem = (
        f"recalled up to {mem} characters back with memory"
        if mem
        else "not recalled with memory at any distance tried"
    )
    said_win = f"through the window ({window}) only within {win}" if win else (
        f"through the window ({window}) at no distance tried"
    )
    return f"{said_mem}; {said_win} (recalled = under {threshold:g} bits per character)."


def format_recall(rows: list[RecallRow], mem_len: int, window: int) -> str:
    lines = [
        f"{'k':>6} | {'memory ' + str(mem_len):>12} | {'window ' + str(window):>10} | "
        f"{'segments':>9}   (bits/char of the name's rest)"
    ]
    for r in rows:
        lines.append(
            f"{r.distance:>6} | {r.bits_memory:>12.3f} | {r.bits_window:>10.3f} | "
            f"{r.bits_segments:>9.3f}"
        )
    return "\n".join(lines)
