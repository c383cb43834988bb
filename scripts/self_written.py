"""Speeches the model wrote itself, spliced into a training text (issue 43).

Teacher-forced, the model reads a real scene and picks the next speaker from the scene's
cast well enough; when it writes, it picks that speaker after speeches *it* wrote, and
there it writes the cast in ~20 % of its headings where the text does in ~75 %
(scripts/generation_check.py). Scheduled sampling (Bengio et al., 2015) trains on the
model's own samples so that what it learns holds where it is used. Here it is done once,
offline: ``share`` of the text's speeches are replaced by the speech the start model
writes after the same heading, with memory, at the page's temperature; the heading that
follows stays the text's own, so the next choice of speaker is learned after the model's
own speech.

    .venv/bin/python scripts/self_written.py runs/recall/data/phase25-second-pass.txt \\
        runs/recall/phase22-control-to-the-end/model --out /tmp/self.txt

Only a speech that opens after a blank line, has ``mem_len + tgt_len`` characters before
it, and whose words occur nowhere else near it (``alone``) is replaced: a drill's line
that is copied later (a made-up speaker who speaks the same line twice) keeps its copy.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from copy_drill import load  # noqa: E402  (scripts/, beside this file)
from generation_check import write  # noqa: E402
from recall_data import SPEECH  # noqa: E402


def speeches_after_a_blank_line(text: str, reach: int) -> list[tuple[int, int]]:
    """(start, end) of the body of each speech that opens after a blank line at least
    ``reach`` characters in, its last newline included."""
    return [
        (m.start(2), m.start(2) + len(m.group(2).rstrip("\n")) + 1)
        for m in SPEECH.finditer(text)
        if m.start() >= reach and text[m.start() - 2 : m.start()] == "\n\n"
    ]


# How far around a speech its words are looked for: past a recipe's copy drills (copy_gap
# up to 2,000 characters), short of the next pass over the same plays (repeat: a pass is
# ~1.1M characters, and every speech's words come back in it).
COPY_REACH = 2500


def alone(text: str, a: int, b: int) -> bool:
    """Whether the speech text[a:b] is said nowhere else within COPY_REACH characters: a
    drill's line spoken twice (a made-up speaker returns) keeps its copy."""
    return text.count(text[a : b - 1], max(0, a - COPY_REACH), b + COPY_REACH) == 1


def speech_of(written: str) -> str | None:
    """The first speech of ``written`` (the model's characters after a heading), ending
    with its own newline: up to its first blank line, or its last whole line when it wrote
    on past them all; None when it wrote no line, or began with an empty one."""
    if written.startswith("\n"):  # an empty first line: a blank line after the heading
        return None
    end = written.find("\n\n")
    if end == -1:
        end = written.rfind("\n")
    return written[: end + 1] if end > 0 else None  # None: no line ended


def with_self_written(text: str, model, share: float, temperature: float, mem_len: int,
                      max_chars: int, seed: int, batch: int = 64) -> str:  # fmt: skip
    """``text`` with ``share`` of its speeches (``speeches_after_a_blank_line``, those
    ``alone``) written by ``model`` after the same ``mem_len + tgt_len``
    characters, at ``temperature``, at most ``max_chars`` each; seeded."""
    reach = mem_len + model.config.tgt_len
    rng = random.Random(seed)
    drawn = [s for s in speeches_after_a_blank_line(text, reach) if rng.random() < share]
    picked = [(a, b) for a, b in drawn if alone(text, a, b)]
    out, last = [], 0
    for i in tqdm(range(0, len(picked), batch), desc="self-written", unit="batch"):
        spans = picked[i : i + batch]
        prompts = [text[a - reach : a] for a, _ in spans]
        written, _ = write(model, prompts, max_chars, temperature, seed + i, mem_len,
                           until="\n\n")  # fmt: skip
        for (a, b), speech in zip(spans, written):
            speech = speech_of(speech)
            if speech is not None:
                out += [text[last:a], speech]
                last = b
    return "".join(out + [text[last:]])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("text", type=Path)
    p.add_argument("model", type=Path, help="a model folder or a txl.train run folder")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--share", type=float, default=0.2)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--mem-len", type=int, default=512)
    p.add_argument("--max-chars", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load(args.model).eval()
    text = with_self_written(args.text.read_text(), model, args.share, args.temperature,
                             args.mem_len, args.max_chars, args.seed)  # fmt: skip
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
