"""Does a model copy? The copy drill of docs/recall-training.md, on a model or a run.

    .venv/bin/python scripts/copy_drill.py weights/shakespeare-char
    .venv/bin/python scripts/copy_drill.py runs/e1 --gaps 0,100     # a run's last checkpoint

A drill is a line of made-up words (scripts/recall_data.py's ``copy_drill``) after a short
speech, then ``gap`` characters of random filler, then the same line again. Printed: the
bits per character of the line (after its first character) the first time (nothing to
copy: about log2 26 = 4.7 for a model that knows the letters) and the second time. A model
that copies pays nearly nothing for the second; past a gap of more than the segment (64),
only memory holds the line.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

import torch
from recall_data import copy_drill  # scripts/, beside this file
from safetensors.torch import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from txl import TransformerXL, TXLConfig  # noqa: E402
from txl.scoring import memory_nll  # noqa: E402

SPEECH = "ROMEO:\nI will go.\n\n"
FILLER = "abcdefghij klmnop\n"


def load(source: Path) -> TransformerXL:
    """A model folder, or a txl.train run folder (its checkpoint: the run may go on)."""
    if (source / "run.json").exists():
        config = json.loads((source / "run.json").read_text())["config"]
        model = TransformerXL(TXLConfig.from_dict(config))
        load_model(model, str(source / "checkpoint" / "model.safetensors"))
        return model
    return TransformerXL.from_pretrained(source)


def drill_bits(model: TransformerXL, gap: int, drills: int, seed: int, mem_len: int):
    """(bits/char of the line the first time, the second time), over ``drills`` drills."""
    rng = random.Random(seed)
    first = second = 0.0
    chars = 0
    for _ in range(drills):
        line = copy_drill(rng).split("\n")[0]
        filler = "".join(rng.choice(FILLER) for _ in range(gap))
        before = SPEECH + line + "\n" + (filler + "\n" if gap else "")
        ids = torch.tensor(model.tokenizer.encode(before + line + "\n"))
        with torch.no_grad():
            bits = memory_nll(model, ids, model.config.tgt_len, mem_len) / math.log(2)
        a, b, n = len(SPEECH), len(before), len(line)
        # bits[j] is the cost of token j + 1: bits[a : a + n] is the line after its first
        # character, and the newline that ends it. The first is left out: nothing in the
        # text says that a copy comes, so no model can foresee it.
        first += bits[a : a + n].sum().item()
        second += bits[b : b + n].sum().item()
        chars += n
    return first / chars, second / chars


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("source", type=Path, help="a model folder or a txl.train run folder")
    p.add_argument("--gaps", default="0", help="filler lengths, comma-separated")
    p.add_argument("--drills", type=int, default=20)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--mem-len", type=int, default=512)
    args = p.parse_args()
    torch.set_num_threads(1)
    model = load(args.source).eval()
    for gap in (int(g) for g in args.gaps.split(",")):
        once, again = drill_bits(model, gap, args.drills, args.seed, args.mem_len)
        print(f"{args.source} gap {gap}: the line {once:.2f} bits/char, its copy {again:.2f}")


if __name__ == "__main__":
    main()
