"""Find the scenes where memory brings a speaker back, for the "Memory on | off" tab.

    nice -n 19 python scripts/find_memory_pairs.py                   # the bundled model
    nice -n 19 python scripts/find_memory_pairs.py --positions 0:60000 --seeds 6

A candidate is a moment of the validation text (Tiny Shakespeare's last 10 %, nanoGPT's
split) where a speech has just ended (a blank line) and the next speaker is one who already
spoke in the scene, their heading more than tgt_len characters back (beyond the window) and
within mem_len (the reach of memory). Its prompt is the ~``--context``
characters before it. From each prompt and each of ``--seeds`` seeds, the two sides of a
``MemoryPair`` (txl/counterfactual.py: memory on | the recomputed window, the same Gumbel
draws) write until each has written its first speaker heading. An **example** is a run
where the memory side names the scene's next speaker and the window side names a speaker
who is not in the prompt at all: it invents one. The report (``memory_pairs.json`` beside
the tab, which offers the best ``--k`` as one-click examples, their scenes distinct) keeps
the counts over every run too: how often each side named the right speaker, and how often
each invented one. Rerun it whenever the weights change: nothing in it is written by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from scripts.find_memory_moments import (  # noqa: E402
    parse_positions,
    sha256,
    shown_path,
    validation_text,
)
from txl import TransformerXL  # noqa: E402
from txl.counterfactual import MemoryPair  # noqa: E402
from webapp.memory_pair_viz import HEADING, speaker_headings  # noqa: E402
from webapp.tabs.examples import TEMPERATURE, TOP_P  # noqa: E402  (the page's sampler)

DEFAULT_MODEL = ROOT / "weights" / "shakespeare-char"
DEFAULT_OUT = ROOT / "webapp" / "tabs" / "memory_pairs.json"
TOP_K = 0  # the tab's default (off)
MAX_HEADING_STEPS = 40  # a side that has not written a heading by then names nobody
GENERATE = 200  # characters an example's Generate writes


def candidates(val: str, a: int, b: int, context: int, min_back: int, max_back: int):
    """(prompt start, prompt end, next speaker, characters back) of each moment in
    val[a:b] after a blank line where the next heading names a speaker of the prompt whose
    last heading lies min_back..max_back characters before the prompt's end."""
    for m in HEADING.finditer(val, a, b):
        end, name = m.start(1), m.group(1)
        if end < context or val[end - 2 : end] != "\n\n":
            continue
        start = val.find("\n", end - context) + 1  # the prompt starts at a line
        while val[start] == "\n":  # not a blank one: a heading after it starts the prompt
            start += 1
        prompt = val[start:end]
        spoken = [(p, n) for p, n in speaker_headings(prompt) if n == name]
        if not spoken:
            continue
        back = len(prompt) - spoken[-1][0]
        if min_back <= back <= max_back:
            yield start, end, name, back


def first_heading(text: str, written_from: int) -> str | None:
    headings = speaker_headings(text, written_from)
    return headings[0][1] if headings else None


def run(model, prompt: str, seed: int, mem_len: int) -> tuple[str | None, str | None, int]:
    """(the memory side's first heading, the window side's, steps taken) from the prompt."""
    pair = MemoryPair(
        model, mem_len=mem_len, temperature=TEMPERATURE, top_k=TOP_K, top_p=TOP_P, seed=seed
    )
    pair.start(prompt)
    n = len(prompt)
    memory = window = None
    while pair.steps < MAX_HEADING_STEPS and (memory is None or window is None):
        pair.step()
        memory = memory or first_heading(pair.with_memory.text, n)
        window = window or first_heading(pair.without_memory.text, n)
    return memory, window, pair.steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="a model folder")
    parser.add_argument("--data", type=Path, default=None, help="tinyshakespeare.txt")
    parser.add_argument(
        "--positions", type=parse_positions, default=(0, 40_000), help="validation A:B"
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds per prompt (default 5)")
    parser.add_argument("--context", type=int, default=400, help="prompt characters (~400)")
    parser.add_argument("--k", type=int, default=4, help="examples to keep (default 4)")
    parser.add_argument("--max-prompts", type=int, default=80, help="prompts to try (default 80)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--nice", type=int, default=19, help="lower priority by this much")
    args = parser.parse_args(argv)

    os.nice(args.nice)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    data, val = validation_text(parser, args.data)
    model = TransformerXL.from_pretrained(args.model)
    c = model.config
    mem_len, seg_len = c.mem_len, c.tgt_len
    a, b = args.positions
    found = list(candidates(val, a, min(b, len(val)), args.context, seg_len, mem_len))
    found = found[: args.max_prompts]
    print(f"{shown_path(args.model)}: {len(found)} prompts x {args.seeds} seeds", flush=True)

    runs, examples = [], []
    for i, (start, end, name, back) in enumerate(found):
        prompt = val[start:end]
        speakers = {n for _, n in speaker_headings(prompt)}
        for seed in range(args.seeds):
            memory, window, steps = run(model, prompt, seed, mem_len)
            runs.append((name, speakers, memory, window))
            if memory == name and window is not None and window not in speakers:
                examples.append(
                    {
                        "position": end,
                        "start": start,
                        "prompt": prompt,
                        "seed": seed,
                        "n": GENERATE,
                        "next_speaker": name,
                        "back": back,
                        "memory_speaker": memory,
                        "window_speaker": window,
                        "steps": steps,
                    }
                )
        print(f"  {i + 1}/{len(found)} prompts, {len(examples)} examples", flush=True)

    def share(hit) -> dict:
        n = sum(1 for r in runs if hit(*r))
        return {"runs": n, "share": round(n / len(runs), 4) if runs else None}

    kept, scenes = [], set()  # the best k, one per scene: the farthest speakers first
    for e in sorted(examples, key=lambda e: e["back"], reverse=True):
        if e["position"] not in scenes and len(kept) < args.k:
            kept.append(e)
            scenes.add(e["position"])
    report = {
        "about": (
            "Prompts of Tiny Shakespeare's validation text (its last 10 %, nanoGPT's split; "
            "positions index it) that end after a speech, where the next speaker last spoke "
            "`back` characters before the end: beyond the window (seg_len), within memory "
            "(mem_len). From each, with each seed, the two sides of a MemoryPair (memory on "
            "| the recomputed window, the same Gumbel draws) wrote until each wrote a "
            "speaker heading. examples: runs where the memory side named the next speaker "
            "and the window side a speaker not in the prompt. counts: over all runs. "
            "Written by scripts/find_memory_pairs.py."
        ),
        "model": shown_path(args.model),
        "model_sha256": sha256(args.model / "model.safetensors"),
        "data": data.name,
        "positions": [a, b],
        "seg_len": seg_len,
        "mem_len": mem_len,
        "temperature": TEMPERATURE,
        "top_k": TOP_K,
        "top_p": TOP_P,
        "prompts": len(found),
        "seeds": args.seeds,
        "counts": {
            "runs": len(runs),
            "memory_names_the_next_speaker": share(lambda t, s, m, w: m == t),
            "window_names_the_next_speaker": share(lambda t, s, m, w: w == t),
            "memory_invents_a_speaker": share(lambda t, s, m, w: m is not None and m not in s),
            "window_invents_a_speaker": share(lambda t, s, m, w: w is not None and w not in s),
            "examples": len(examples),
        },
        "seconds": round(time.perf_counter() - t0, 1),
        "examples": kept,
    }
    args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(report["counts"], indent=1))
    print(f"wrote {shown_path(args.out)} ({len(kept)} examples) in {report['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
