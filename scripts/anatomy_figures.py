"""The Figures 5 and 7 of docs/figures.md for the shipped model on the validation text.

    .venv/bin/python scripts/anatomy_figures.py --data ../shared/data/tinyshakespeare.txt

Reads the validation text (the last 10 % of Tiny Shakespeare, as ``python -m txl.evaluate``
splits it) in segments of the model's tgt_len from an empty memory, once per memory length,
and writes docs/images/anatomy-fig5-memN.png and docs/images/anatomy-fig7-memN.png, the same figures
the "Inside the attention" tab draws (webapp.anatomy_viz), and prints what they say.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from txl import TransformerXL, anatomy  # noqa: E402  (after the path set-up)
from txl.data import load_text, train_val_split  # noqa: E402
from webapp import anatomy_viz  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="tinyshakespeare.txt")
    p.add_argument("--model", default=str(ROOT / "weights" / "shakespeare-char"))
    p.add_argument("--mem-lens", default="128,512", help="comma-separated memory lengths")
    p.add_argument("--chars", type=int, default=20_000, help="the validation text's first N")
    p.add_argument("--order", default="mean", choices=sorted(anatomy_viz.ORDERS))
    p.add_argument("--out", default=str(ROOT / "docs" / "images"))
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    model = TransformerXL.from_pretrained(args.model)
    _, val_text = train_val_split(load_text(args.data))
    text = val_text[: args.chars]
    ids = model.tokenizer.encode(text, errors="ignore")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for mem_len in (int(m) for m in args.mem_lens.split(",")):
        started = time.perf_counter()
        result = anatomy.profiles(model, ids, mem_len)
        title = (
            f"shakespeare-char, {len(ids):,} validation characters, segments of "
            f"{result.seg_len}, memory {mem_len}"
        )
        seg_len, attention = result.seg_len, result.attention
        figures = {
            "fig5": anatomy_viz.distance_figure(attention, seg_len, args.order, title),
            "fig7": anatomy_viz.terms_figure(
                result.terms, attention, seg_len, args.order, None, title
            ),
        }
        for name, figure in figures.items():
            (out / f"anatomy-{name}-mem{mem_len}.png").write_bytes(anatomy_viz.figure_png(figure))
        print(f"## mem_len {mem_len}: {time.perf_counter() - started:.1f} s\n")
        print(anatomy_viz.reading_sentence(result), "\n")
        print(anatomy_viz.anatomy_markdown(result), "\n")


if __name__ == "__main__":
    main()
