"""Does a model recall speakers it has never seen? The issue's check, with names, places and
distances drawn afresh (none of them the training probe's).

    .venv/bin/python scripts/recall_check.py weights/shakespeare-char
    .venv/bin/python scripts/recall_check.py runs/recall/phase4-names --probes 96 --seed 2

Each probe plants a made-up speaker in the validation text (Tiny Shakespeare's last 10 %)
as a play would: whole speeches of the text first (200-1,000 characters), then the speaker
(``NAME:`` and one line of a validation speech), then the ``k`` characters of text that
follow there (k drawn in 50..400), then the speaker returns (``\\n\\nNAME``). Scored: the
name after its first letter, and after its first three (the recall probe's cue), in bits
per character, read with memory (one stream in segments of tgt_len, as ``txl.evaluate``
reads) and through the sliding window of tgt_len (no memory, recomputed). A name beyond
the window (k > tgt_len) can only come back through memory.

The names are pronounceable (``ZANTHOR``, ``Quibelline``), syllables drawn at random, in
capitals or title case, from an inventory no training text used. Training's made-up
speakers were random capitals (phases 1-4), then also syllables of another inventory
(``recall_data.spoken_name``, phase 5) and word-like names (``recall_data.word_namer`` of
the training text, phase 6), so read more than one kind: ``--names english`` draws words
that sound like the validation text's English but are none of its words (a chain of its
words' letter triples: ``APAIRINTIL``, ``Growelise``), and ``--names compound`` joins two
of its short words (``SHORESAID``, ``Sireharm``), a kind no phase trained on.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from copy_drill import load  # noqa: E402  (scripts/, beside this file)
from recall_data import syllable_name, word_namer  # noqa: E402

from txl.data import load_text, tiny_shakespeare_path, train_val_split  # noqa: E402
from txl.recall import CUE, LN2, probe_text  # noqa: E402
from txl.scoring import memory_nll, sliding_nll  # noqa: E402

ONSETS = ("B", "C", "D", "F", "G", "K", "L", "M", "N", "P", "QU", "R", "S", "T", "V", "Z",
          "TH", "DR", "GR", "BR", "ST", "CH", "X", "Y")  # fmt: skip
VOWELS = ("A", "E", "I", "O", "U", "AE", "IO", "Y")
CODAS = ("", "", "N", "R", "TH", "S", "L", "X", "M", "ND", "RK")
BINS = ((50, 100), (101, 200), (201, 400))
COLUMNS = {
    "memory_after_1": "memory, after 1 letter",
    "window_after_1": "window, after 1",
    "memory_after_3": "memory, after 3",
    "window_after_3": "window, after 3",
}


def speaker_case(rng: random.Random, name: str) -> str:
    """In capitals, as Tiny Shakespeare writes its speakers, or a quarter of the time in
    title case (Belisande): every kind of name is cased the same way."""
    return name.title() if rng.random() < 0.25 else name.upper()


def made_up_name(rng: random.Random) -> str:
    """Two or three syllables no play uses, 5-10 letters (as ZANTHOR, Belisande), from an
    inventory of its own (not training's ``spoken_name``'s); a quarter in title case."""
    return speaker_case(rng, syllable_name(rng, ONSETS, VOWELS, CODAS, 5, 10))


def english_namer(val: str):
    """Names that sound like the validation text's English but are none of its words, a
    quarter in title case (as ``made_up_name``'s)."""
    word_like = word_namer(val)
    return lambda rng: speaker_case(rng, word_like(rng))


def compound_namer(val: str):
    """Names made of two words of the validation text, 3-5 letters each, as place names
    and surnames are (SHORESAID, Sireharm): a kind no training text used. None is a word
    of the text; a quarter in title case."""
    words = {w.lower() for w in re.findall(r"[A-Za-z]+", val)}
    parts = sorted(w for w in words if 3 <= len(w) <= 5)

    def name(rng: random.Random) -> str:
        while True:
            word = rng.choice(parts) + rng.choice(parts)
            if word not in words:
                return speaker_case(rng, word)

    return name


NAMERS = {
    "syllables": lambda val: made_up_name,
    "english": english_namer,
    "compound": compound_namer,
}


def speech_starts(val: str) -> list[int]:
    """Where each speech of the text starts (after a blank line)."""
    return [i + 2 for i in range(len(val) - 2) if val[i : i + 2] == "\n\n"]


def planted(
    val: str, starts: list[int], rng: random.Random, name: str, k: int, opening: bool = False
) -> tuple[str, int]:
    """(text, at): whole speeches, the speaker and its line, k characters of the text that
    follows, the speaker again. ``text[at]`` is the name's first returning letter. With
    ``opening`` the speeches before are left out: the name opens the text, as a visitor's
    prompt "NAME:\n..." does, and only memory that started empty holds it."""
    i = rng.randrange(len(starts) // 20, len(starts) - 40)
    a = starts[i]
    b = next((s for s in starts[i + 1 :] if s - a >= rng.randint(200, 1000)), None)
    if b is None:
        raise ValueError("the validation text is too short")
    line = rng.choice([ln for ln in val[b : b + 2000].splitlines()[1:] if len(ln) > 20][:20])
    # the recall probe's text (txl.recall.probe_text), its speech and filler the play's own
    before = "" if opening else val[a:b]
    text, start = probe_text(name, val[b : b + k], k, speech=line, before=before)
    return text, start - CUE


@torch.no_grad()
def read_probes(
    model, val: str, probes: int, seed: int, mem_len: int, names: str = "syllables",
    distances: tuple[int, ...] = (), opening: bool = False,
) -> list[dict]:  # fmt: skip
    """``probes`` planted speakers (names of the kind ``names``, places and k drawn from
    ``seed``: k in 50..400, or each of ``distances`` in turn), each name's bits per
    character with memory ``mem_len`` and through the window of tgt_len; with ``opening``
    the name opens its text."""
    starts, rng, seg = speech_starts(val), random.Random(seed), model.config.tgt_len
    made_up = NAMERS[names](val)
    rows = []
    for i in range(probes):
        name = made_up(rng)
        k = distances[i % len(distances)] if distances else rng.randint(50, 400)
        text, at = planted(val, starts, rng, name, k, opening)
        ids = torch.tensor(model.tokenizer.encode(text), dtype=torch.long)
        # bits of name[1:], [len(name) - 1]; name[3:] is what is left after the cue "ZAN"
        memory = memory_nll(model, ids, seg, mem_len, start=at + 1).double() / LN2
        window = sliding_nll(model, ids, seg, start=at + 1).double() / LN2
        rows.append({
            "name": name, "k": k,
            "memory_after_1": memory.mean().item(), "window_after_1": window.mean().item(),
            "memory_after_3": memory[2:].mean().item(), "window_after_3": window[2:].mean().item(),
        })  # fmt: skip
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("source", type=Path, help="a model folder or a txl.train run folder")
    p.add_argument("--data", type=Path, default=tiny_shakespeare_path(ROOT))
    p.add_argument("--probes", type=int, default=48)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mem-len", type=int, default=512)
    p.add_argument("--names", choices=sorted(NAMERS), default="syllables", help="their kind")
    p.add_argument(
        "--distances",
        default="",
        help="comma-separated k, taken in turn (default: drawn in 50..400), e.g. 1000,2000 "
        "with --mem-len 2048: how far back memory reaches",
    )
    p.add_argument("--opening", action="store_true", help="the name opens its text")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, help="write the readings here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load(args.source).eval()
    _, val = train_val_split(load_text(args.data, download=True))
    distances = tuple(int(k) for k in args.distances.split(",") if k)
    rows = read_probes(
        model, val, args.probes, args.seed, args.mem_len, args.names, distances, args.opening
    )
    seg, where = model.config.tgt_len, "opening" if args.opening else "planted in"
    print(f"{args.source}: {len(rows)} made-up speakers ({args.names}) {where} validation text, "
          f"memory {args.mem_len}, window {seg} (bits per character of the name)")  # fmt: skip
    print("| k | probes | " + " | ".join(COLUMNS.values()) + " |")
    print("|---|---:|" + "---:|" * len(COLUMNS))
    for lo, hi in [(k, k) for k in distances] if distances else (*BINS, (50, 400)):
        sel = [r for r in rows if lo <= r["k"] <= hi]
        if not sel:
            continue
        cells = [f"{statistics.fmean(r[key] for r in sel):.2f}" for key in COLUMNS]
        print(f"| {lo if lo == hi else f'{lo}-{hi}'} | {len(sel)} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
