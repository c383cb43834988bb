"""Does a model copy? The copy drill of docs/recall-training.md, on a model or a run.

    .venv/bin/python scripts/copy_drill.py weights/shakespeare-char
    .venv/bin/python scripts/copy_drill.py runs/e1 --gaps 0,100     # a run's last checkpoint

A drill (txl/recall.py's ``drill_bits``) is a line of made-up words after a short
speech, then ``gap`` characters of random filler, then the same line again. Printed: the
bits per character of the line (after its first character) the first time (nothing to
copy: about log2 26 = 4.7 for a model that knows the letters) and the second time. A model
that copies pays nearly nothing for the second; past a gap of more than the segment (64),
only memory holds the line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from txl import TransformerXL, TXLConfig  # noqa: E402
from txl.recall import drill_bits  # noqa: E402


def load(source: Path) -> TransformerXL:
    """A model folder, or a txl.train run folder (its checkpoint: the run may go on)."""
    if (source / "run.json").exists():
        config = json.loads((source / "run.json").read_text())["config"]
        model = TransformerXL(TXLConfig.from_dict(config))
        load_model(model, str(source / "checkpoint" / "model.safetensors"))
        return model
    return TransformerXL.from_pretrained(source)


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
