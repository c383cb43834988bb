"""Validation loss with memory, without memory, and over a sweep of memory lengths.

    python -m txl.evaluate --model weights/shakespeare-char --data tinyshakespeare.txt

The validation text (the last 10 %) is cut into ``--streams`` contiguous rows and read
segment by segment, memory carried, as in training. "Without memory" reads every segment
alone: the vanilla fixed-context model the paper compares against.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from .data import load_text, train_val_split
from .model import TransformerXL
from .scoring import split_streams, stream_nll

LN2 = math.log(2)


def evaluate_loss(
    model: TransformerXL,
    ids: torch.Tensor,
    seg_len: int,
    mem_len: int,
    n_streams: int = 8,
    max_segments: int | None = None,
    progress: bool = False,
    desc: str = "eval",
) -> float:
    """Mean cross-entropy (nats per token) of ``ids`` cut into ``n_streams`` contiguous rows,
    each read in segments of ``seg_len`` with ``mem_len`` positions of memory."""
    streams = split_streams(ids, n_streams)
    return stream_nll(model, streams, seg_len, mem_len, max_segments, progress, desc).mean().item()


def memory_sweep_lengths(tgt_len: int, mem_len: int) -> list[int]:
    """0, the segment length, and 1x, 2x, 4x, 8x the training memory length."""
    return sorted({0, tgt_len, mem_len, 2 * mem_len, 4 * mem_len, 8 * mem_len})


def evaluate_model(
    model: TransformerXL,
    val_text: str,
    n_streams: int = 8,
    max_segments: int | None = None,
    sweep: bool = True,
    progress: bool = True,
) -> dict:
    """Loss with and without memory at the trained lengths, and the memory-length sweep."""
    cfg = model.config
    ids = torch.tensor(model.tokenizer.encode(val_text), dtype=torch.long)
    lengths = memory_sweep_lengths(cfg.tgt_len, cfg.mem_len) if sweep else [0, cfg.mem_len]
    rows = []
    for mem_len in lengths:
        t0 = time.perf_counter()
        loss = evaluate_loss(
            model,
            ids,
            cfg.tgt_len,
            mem_len,
            n_streams,
            max_segments,
            progress,
            desc=f"mem_len={mem_len}",
        )
        rows.append(
            {
                "mem_len": mem_len,
                "loss": loss,
                "bpc": loss / LN2,
                "seconds": time.perf_counter() - t0,
            }
        )
    by_len = {r["mem_len"]: r for r in rows}
    return {
        "tgt_len": cfg.tgt_len,
        "train_mem_len": cfg.mem_len,
        "n_streams": n_streams,
        "tokens": n_streams * (len(ids) // n_streams - 1)
        if max_segments is None
        else n_streams * min(len(ids) // n_streams - 1, max_segments * cfg.tgt_len),
        "with_memory": by_len[cfg.mem_len],
        "without_memory": by_len[0],
        "sweep": rows,
    }


def format_table(result: dict) -> str:
    lines = [
        f"segment length {result['tgt_len']}, trained memory {result['train_mem_len']}, "
        f"{result['tokens']} tokens in {result['n_streams']} streams",
        "| mem_len | loss (nats) | bpc |",
        "|--------:|------------:|----:|",
    ]
    for r in result["sweep"]:
        lines.append(f"| {r['mem_len']} | {r['loss']:.4f} | {r['bpc']:.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m txl.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a local folder or a Hub repo id")
    p.add_argument("--data", required=True, help="the full text; the last 10%% is evaluated")
    p.add_argument("--streams", type=int, default=8, help="parallel streams (default 8)")
    p.add_argument("--max-segments", type=int, default=None, help="evaluate only a prefix")
    p.add_argument("--no-sweep", action="store_true", help="only with and without memory")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    model = TransformerXL.from_pretrained(args.model)
    _, val_text = train_val_split(load_text(args.data))
    result = evaluate_model(model, val_text, args.streams, args.max_segments, not args.no_sweep)
    print(format_table(result))
    w, wo = result["with_memory"]["loss"], result["without_memory"]["loss"]
    print(f"with memory {w:.4f} nats, without {wo:.4f}: memory saves {wo - w:.4f} nats/char")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
