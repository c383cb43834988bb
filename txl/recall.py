"""How far back can the model recall? A made-up speaker, planted k characters back.

The probe is a text Tiny Shakespeare could contain: a speaker no play has (``NAME:`` on its
own line, one line of speech), then ``k`` characters of ordinary text (the filler), then
the speaker returns (a blank line and the first ``CUE`` letters of the name). The rest of
the name can only be predicted by recalling it, so its cost in bits per character says
whether the model reached back ``k`` characters:

    text  = before + "NAME:\\n" + speech + "\\n\\n" + filler[:k] + "\\n\\n" + NAME
    start = len(text) - (len(NAME) - CUE)          the scored characters are text[start:]

``before`` (empty by default: the name opens the text) is text read before the speaker
enters, as a new speaker enters a scene already under way. A name that opens the text is
read from states computed with no context at all, a case of its own that a model trained
on one long stream may recall far worse (docs/recall-training.md).

Each probe is read three ways, as ``python -m txl.evaluate`` reads validation text:

- with memory: the text read as one stream in segments of ``tgt_len``, memory ``mem_len``;
- through the window: each character predicted from exactly the ``tgt_len`` before it,
  recomputed, no memory (the fair baseline: the same attention length, no cache);
- segments alone: segments of ``tgt_len``, each read with nothing before it.

Within the window all three can see the name; beyond it only memory can.

    python -m txl.evaluate --model weights/shakespeare-char --data tinyshakespeare.txt \\
        --recall ZANTHOR [--recall-before-at 20000]
"""

from __future__ import annotations

import random
import string
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from .cached import KVMemory, cached_forward
from .model import TransformerXL
from .scoring import LN2, memory_nll, sliding_nll

CUE = 3  # letters of the name given back as the cue; the rest is scored
SPEECH = "Stand, and unfold yourself; the hour grows late."
DISTANCES = (32, 64, 128, 256, 512, 1024, 2048)
MAX_NAME_CHARS = 40  # a speaker's name, not a text: every probe scores all but its cue


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


def probe_head(name: str, speech: str = SPEECH) -> str:
    """What every probe starts with: the speaker and its line, then a blank line. The
    filler follows it."""
    return f"{name}:\n{speech}\n\n"


def name_back(distance: int, speech: str = SPEECH) -> int:
    """How far back the planted name's last letter lies from the first scored character of
    the probe of ``distance``: past the speech, the filler, the blank line and the cue,
    wherever the speaker enters. The window reaches the name when this is at most tgt_len."""
    return len(probe_head("", speech)) + distance + len("\n\n") + CUE + 1


def probe_text(
    name: str, filler: str, distance: int, speech: str = SPEECH, before: str = ""
) -> tuple[str, int]:
    """The probe for one distance: (text, start), the speaker entering after ``before``
    (empty: the name opens the text). The filler is repeated when it is shorter than
    ``distance`` and cut at ``distance`` characters."""
    check_probe(name, filler)
    body = (filler * (distance // len(filler) + 1))[:distance]
    text = f"{before}{probe_head(name, speech)}{body}\n\n{name}"
    return text, len(text) - (len(name) - CUE)


def check_probe(name: str, filler: str) -> None:
    """A clear message for a probe that cannot be made."""
    if not name.strip():
        raise ValueError("type a name: a made-up speaker, such as ZANTHOR")
    if len(name) <= CUE:
        raise ValueError(f"the name needs more than {CUE} letters (the first {CUE} are the cue)")
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"the name is {len(name)} characters; at most {MAX_NAME_CHARS}")
    if "\n" in name or ":" in name:
        raise ValueError("the name is one line without ':' (it is written as 'NAME:')")
    if not filler:
        raise ValueError("the filler is empty")


def check_recall(
    model: TransformerXL, name: str, filler: str, distances, mem_len: int, before: str = ""
) -> None:
    """Everything ``recall_probe`` refuses, checked before any work: a clear message."""
    check_probe(name, filler)
    if model.tokenizer is None or model.tokenizer.unit != "character":
        raise ValueError("the recall probe reads characters: it needs a character-level model")
    unknown = model.tokenizer.unknown_symbols(name + filler)
    if unknown:
        raise ValueError(f"characters the model does not know: {''.join(unknown)!r}")
    unknown = model.tokenizer.unknown_symbols(before)
    if unknown:
        raise ValueError(
            f"characters the model does not know before the speaker enters: {''.join(unknown)!r}"
        )
    if not distances or any(isinstance(k, bool) or int(k) != k or k < 1 for k in distances):
        raise ValueError(f"distances must be whole numbers >= 1, got {list(distances)!r}")
    if isinstance(mem_len, bool) or int(mem_len) != mem_len or mem_len < 0:
        raise ValueError(f"mem_len must be a whole number >= 0, got {mem_len!r}")


def _bits(nll: Tensor) -> float:
    """Mean of a nats tensor, in bits."""
    return nll.double().mean().item() / LN2


class _SharedRead:
    """The longest probe read once with memory, segment by segment. Every probe is the
    same text up to the end of its filler (``before + probe_head + filler[:k]``: the
    filler is cut, never rearranged), so the memory at a segment boundary
    b <= len(before) + len(head) + k is the memory a read of probe k from its start has
    at b, and probe k's read with memory continues from a copy of it, with the very
    arithmetic of ``memory_nll`` on probe k alone (the same numbers, bit for bit). The
    seven probes of ZANTHOR (2,048 the longest, segments of 64, nothing before) then read
    32 + 13 segments with memory instead of 77."""

    def __init__(self, model: TransformerXL, ids: Tensor, seg_len: int, mem_len: int):
        self.model, self.ids, self.seg_len, self.mem_len = model, ids, seg_len, mem_len
        self.boundary = 0  # ids[:boundary] are read
        self.memory: KVMemory | None = None

    def advance(self, boundary: int, pace) -> KVMemory | None:
        """Read on to ``boundary`` (a multiple of seg_len), one segment per ``pace()``;
        a copy of the memory there (None: no memory, at the start or with mem_len 0)."""
        if self.mem_len == 0:  # nothing is carried: nothing to share
            return None
        while self.boundary < boundary:
            a, b = self.boundary, self.boundary + self.seg_len
            with pace():
                out = cached_forward(
                    self.model,
                    self.ids[a:b].view(1, -1),  # [1, seg_len]
                    self.memory,
                    mem_len=self.mem_len,
                    last_only=True,  # only the memory is wanted: no logits but the last
                )
            self.memory, self.boundary = out.memory, b
        return None if self.memory is None else self.memory.clone()


@torch.no_grad()
def _read_from(
    model: TransformerXL,
    ids: Tensor,
    a: int,
    memory: KVMemory | None,
    seg_len: int,
    mem_len: int,
    start: int,
) -> Tensor:
    """-log p(ids[t] | ...) in nats for t = start .. L-1, ids [L] read from position ``a``
    (a multiple of seg_len) in segments of seg_len over ``memory`` (what a read from the
    start had at ``a``; None: none), as ``stream_nll`` reads: memory ``mem_len``."""
    losses = []
    for s in range(a, len(ids) - 1, seg_len):
        e = min(s + seg_len, len(ids) - 1)
        out = cached_forward(
            model,
            ids[s:e].view(1, -1),  # [1, T]
            memory if mem_len > 0 else None,
            mem_len=mem_len,
            targets=ids[s + 1 : e + 1].view(1, -1),
        )
        memory = out.memory
        losses.append(out.nll[0].float())
    return torch.cat(losses)[start - 1 - a :]


@torch.no_grad()
def recall_probe(
    model: TransformerXL,
    name: str,
    filler: str,
    distances=DISTANCES,
    mem_len: int | None = None,
    pace=None,
    before: str = "",
):
    """Yield a RecallRow per distance, shortest first (memory ``mem_len``; default the
    config's), the speaker entering after ``before`` (empty: the name opens the text). A
    generator, so that a caller can show each row as soon as it is read.

    ``pace``: a context-manager factory around each chunk of work, a segment or one read
    of a probe's end (webapp.longwork's ``job.turn``: a server runs the probe beside other
    visitors' Steps, and cancels it there); None runs straight through.

    Each row is what ``memory_nll`` / ``sliding_nll`` give on that probe alone (the
    module docstring), computed with less work: the reads with memory share the longest
    probe's read (``_SharedRead``); segments read alone need only the segment(s) that
    hold the scored characters; the window, only their windows.
    """
    mem_len = model.config.mem_len if mem_len is None else mem_len
    check_recall(model, name, filler, distances, mem_len, before)
    pace = pace or nullcontext
    distances = sorted({int(k) for k in distances})
    seg = model.config.tgt_len
    was_training = model.training
    model.eval()
    try:
        longest, _ = probe_text(name, filler, distances[-1], before=before)
        encode = model.tokenizer.encode
        shared = _SharedRead(model, torch.tensor(encode(longest), dtype=torch.long), seg, mem_len)
        head = len(before) + len(probe_head(name))
        for k in distances:
            text, start = probe_text(name, filler, k, before=before)
            ids = torch.tensor(encode(text), dtype=torch.long)  # [L]
            # The memory at the last segment boundary within the text all probes share.
            b = (head + k) // seg * seg
            memory = shared.advance(b, pace)
            with pace():
                bits_memory = _bits(_read_from(model, ids, b, memory, seg, mem_len, start))
            # Segments alone: from the boundary of the segment that predicts ids[start].
            first = (start - 1) // seg * seg
            with pace():
                bits_segments = _bits(_read_from(model, ids, first, None, seg, 0, start))
            with pace():
                bits_window = _bits(sliding_nll(model, ids, seg, start=start))
            yield RecallRow(k, text, start, bits_memory, bits_window, bits_segments)
    finally:
        model.train(was_training)


def recall_row(
    model: TransformerXL, name: str, filler: str, distance: int, mem_len: int, before: str = ""
) -> RecallRow:
    """One distance, each way read plainly on the whole probe (``memory_nll`` from its
    start; ``sliding_nll``): what ``recall_probe``'s rows equal, with more work."""
    check_recall(model, name, filler, [distance], mem_len, before)
    text, start = probe_text(name, filler, distance, before=before)
    ids = torch.tensor(model.tokenizer.encode(text), dtype=torch.long)
    seg = model.config.tgt_len
    return RecallRow(
        distance=distance,
        text=text,
        start=start,
        bits_memory=_bits(memory_nll(model, ids, seg, mem_len, start=start)),
        bits_window=_bits(sliding_nll(model, ids, seg, start=start)),
        bits_segments=_bits(memory_nll(model, ids, seg, 0, start=start)),
    )


RECALLED_BITS = 2.0  # under this many bits per character, the rest of the name was recalled


def reach(rows: list[RecallRow], key: str, threshold: float = RECALLED_BITS) -> int | None:
    """The longest distance up to which every row (shortest first) was recalled by
    ``key`` ("bits_memory", "bits_window", "bits_segments"); None when the shortest was
    not. A lucky guess far out, after misses nearer, does not count as reach."""
    longest = None
    for r in sorted(rows, key=lambda r: r.distance):
        if not getattr(r, key) < threshold:
            break
        longest = r.distance
    return longest


def recall_summary(
    rows: list[RecallRow], window: int, threshold: float = RECALLED_BITS, mem_len=None
) -> str:
    """One sentence: how far back the name was recalled (under ``threshold`` bits/char at
    that distance and every shorter one) with memory and through the window alone."""
    mem, win = reach(rows, "bits_memory", threshold), reach(rows, "bits_window", threshold)
    memory = "with memory" if mem_len is None else f"with memory ({mem_len:,})"
    said_mem = (
        f"recalled up to {mem:,} characters back {memory}"
        if mem
        else f"not recalled {memory} at any distance tried"
    )
    said_win = (
        f"through the window ({window}) only within {win:,}"
        if win
        else f"not recalled through the window ({window}) at any distance tried"
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


# ---- the copy drill: does the model copy at all? --------------------------------------

DRILL_SPEECH = "ROMEO:\nI will go.\n\n"  # what each drill's line follows
DRILL_FILLER = "abcdefghij klmnop\n"  # the gap's characters: random, nothing to copy


def copy_drill(rng: random.Random) -> str:
    """A line of 2-5 made-up words (lower case, or capitals as names are), then the same
    line again: the purest copying signal there is (``scripts/recall_data.py`` mixes it
    into training text)."""
    letters = string.ascii_uppercase if rng.random() < 0.3 else string.ascii_lowercase
    words = [
        "".join(rng.choice(letters) for _ in range(rng.randint(2, 7)))
        for _ in range(rng.randint(2, 5))
    ]
    line = " ".join(words)
    return f"{line}\n{line}\n\n"


@torch.no_grad()
def drill_bits(
    model: TransformerXL, gap: int, drills: int = 20, seed: int = 5, mem_len: int = 512
) -> tuple[float, float]:
    """(bits/char of a made-up line the first time, the second time), over ``drills``
    drills read with memory ``mem_len``: the line, ``gap`` characters of random filler,
    the line again. A model that copies pays nearly nothing for the second time; past a
    gap longer than the segment only memory holds the line (docs/recall-training.md)."""
    rng = random.Random(seed)
    first = second = 0.0
    chars = 0
    for _ in range(drills):
        line = copy_drill(rng).split("\n")[0]
        filler = "".join(rng.choice(DRILL_FILLER) for _ in range(gap))
        before = DRILL_SPEECH + line + "\n" + (filler + "\n" if gap else "")
        ids = torch.tensor(model.tokenizer.encode(before + line + "\n"))
        bits = memory_nll(model, ids, model.config.tgt_len, mem_len) / LN2
        a, b, n = len(DRILL_SPEECH), len(before), len(line)
        # bits[j] is the cost of token j + 1: bits[a : a + n] is the line after its first
        # character, and the newline that ends it. The first is left out: nothing in the
        # text says that a copy comes, so no model can foresee it.
        first += bits[a : a + n].sum().item()
        second += bits[b : b + n].sum().item()
        chars += n
    return first / chars, second / chars


# ---- watching the skill form during training ----------------------------------------

PROGRESS_NAMES = ("ZANTHOR", "QUIBLEY", "MORVATH", "Belisande")
PROGRESS_FILLERS_AT = (1000, 50000)  # validation positions where the fillers start
PROGRESS_GAPS = (0, 32, 100, 400)
PROGRESS_DISTANCES = (100, 200, 400)
PROGRESS_PLANTED_AT = 20000  # the whole speeches from here (150+ characters) come first


def progress_filler(val_text: str, at: int) -> str:
    """The filler that starts at validation position ``at`` (earlier in a text too short)."""
    n = max(PROGRESS_DISTANCES)
    at = min(at, max(0, len(val_text) - n))
    return val_text[at : at + n]


def progress_before(val_text: str, at: int = PROGRESS_PLANTED_AT) -> str:
    """Whole speeches of the validation text, 150 characters or more, from about ``at``
    (half the text when it is shorter): what a planted probe is written after."""
    at = min(at, len(val_text) // 2)
    start = val_text.find("\n\n", at) + 2
    end = val_text.find("\n\n", start + 150) + 2
    return val_text[start:end] if start >= 2 and end > start else ""


def planted_bits(
    model: TransformerXL, before: str, name: str, filler: str, distance: int, mem_len: int
) -> tuple[float, float]:
    """The probe of ``probe_text`` written after ``before``, as a speaker planted inside a
    text is: (bits/char of the name after its cue with memory ``mem_len``, through the
    window). A name that opens the text is read from states computed without any context,
    which a model trained on one long stream may never have seen (docs/recall-training.md,
    r1's phase 2c); this reads the other case."""
    text, start = probe_text(name, filler, distance, before=before)
    ids = torch.tensor(model.tokenizer.encode(text), dtype=torch.long)
    seg = model.config.tgt_len
    memory = _bits(memory_nll(model, ids, seg, mem_len, start=start))
    return memory, _bits(sliding_nll(model, ids, seg, start=start))


def progress_symbols(val_text: str) -> str:
    """Every character ``recall_progress`` feeds the model (its vocabulary must hold them)."""
    fillers = "".join(progress_filler(val_text, at) for at in PROGRESS_FILLERS_AT)
    return (
        "".join(PROGRESS_NAMES)
        + probe_head("", SPEECH)
        + DRILL_SPEECH
        + DRILL_FILLER
        + string.ascii_letters
        + fillers
        + progress_before(val_text)
    )


def _per_distance(readings) -> dict:
    """{"k": mean bits} over (distance k, bits) pairs, for each of PROGRESS_DISTANCES."""
    readings = list(readings)
    return {
        str(k): round(
            sum(bits for d, bits in readings if d == k) / sum(d == k for d, _ in readings), 4
        )
        for k in PROGRESS_DISTANCES
    }


def recall_progress(model: TransformerXL, val_text: str, mem_len: int = 512) -> dict:
    """What ``txl.train --probe-every`` logs: the copy drill at gaps 0 (in the segment),
    100 and 400 (memory only), and the recall probe's mean bits per character of the
    name at each distance, with memory ``mem_len`` and through the window (tgt_len, no
    memory), over the names of docs/recall-training.md and two validation fillers. When
    copying forms, ``copy`` at gap 0 drops; when it reaches memory, gaps 100 and 400
    and ``recall_memory`` drop while ``recall_window`` stays high. ``planted_memory`` and
    ``planted_window``: the same probes written after whole speeches (``planted_bits``)."""
    was_training = model.training
    model.eval()
    try:
        drill = {}
        for gap in PROGRESS_GAPS:
            line, copy = drill_bits(model, gap, mem_len=mem_len)
            drill[str(gap)] = {"line": round(line, 4), "copy": round(copy, 4)}
        rows = [
            row
            for name in PROGRESS_NAMES
            for at in PROGRESS_FILLERS_AT
            for row in recall_probe(
                model, name, progress_filler(val_text, at), PROGRESS_DISTANCES, mem_len
            )
        ]

        before = progress_before(val_text)
        planted = [
            (k, *planted_bits(model, before, name, progress_filler(val_text, at), k, mem_len))
            for name in PROGRESS_NAMES
            for at in PROGRESS_FILLERS_AT
            for k in PROGRESS_DISTANCES
        ]
        return {
            "copy_drill": drill,
            "recall_memory": _per_distance((r.distance, r.bits_memory) for r in rows),
            "recall_window": _per_distance((r.distance, r.bits_window) for r in rows),
            "planted_memory": _per_distance((k, memory) for k, memory, _ in planted),
            "planted_window": _per_distance((k, window) for k, _, window in planted),
        }
    finally:
        model.train(was_training)
