"""Evaluation speed: memory against a sliding window of the same attention length (the
paper's Table 9, at our scale).

    .venv/bin/python benchmarks/bench_eval_speed.py            # 128 ... 2048 keys, minutes
    .venv/bin/python benchmarks/bench_eval_speed.py --quick    # fewer tokens, under a minute

Both read one stream of text and predict every token from the K = attention length keys
before it (the paper's "attention length"):

- memory: segments of ``seg_len`` (the model's, 64 for the bundled model) over a memory of
  K - seg_len positions, carried from segment to segment (``cached_forward``, keys and
  values kept). The memory is filled first (untimed); then every segment is timed.
- sliding window: every token predicted from the K tokens before it, recomputed from
  scratch with no memory (``txl.scoring.sliding_nll``'s forward call on a batch of
  windows [N, K], the last position's logits kept). Each batch is timed.

ms per token = a chunk's time / its tokens (a segment, or a batch of windows); the table
gives the median over chunks. Timing does not depend on what the text says, so the tokens
are random ids. The paper: 1,874x at 3,800 keys, 1,409x at 2,800, 773x at 1,800, 363x
at 800 (their GPU, their models).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from txl import TransformerXL  # noqa: E402  (after the path set-up above)
from txl.cached import KVMemory, cached_forward  # noqa: E402
from txl.scoring import window_batch_size  # noqa: E402

PAPER_TABLE_9 = {3800: 1874, 2800: 1409, 1800: 773, 800: 363}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / "weights" / "shakespeare-char"))
    p.add_argument("--lengths", default="128,256,512,1024,2048", help="attention lengths K")
    p.add_argument("--tokens", type=int, default=512, help="timed tokens, memory (per K)")
    p.add_argument("--window-tokens", type=int, default=16,
                   help="timed tokens, sliding window (per K): each costs a K-token forward")
    p.add_argument("--batch", type=int, default=4, help="at most this many windows per call")
    p.add_argument("--quick", action="store_true", help="128 and 8 timed tokens")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.tokens, args.window_tokens = 128, 8
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def memory_ms_per_token(model, ids: torch.Tensor, seg_len: int, mem_len: int, n: int) -> list:
    """ms per token of each timed segment: segments of seg_len over a full memory."""
    device = next(model.parameters()).device
    memory = KVMemory()
    fill = -(-mem_len // seg_len) * seg_len  # whole segments, at least mem_len tokens
    times = []
    for a in range(0, fill + n, seg_len):
        x = ids[a : a + seg_len].view(1, -1).to(device)  # [1, seg_len]
        targets = ids[a + 1 : a + seg_len + 1].view(1, -1).to(device)
        sync(device)
        t0 = time.perf_counter()
        cached_forward(model, x, memory, mem_len=mem_len, targets=targets)
        sync(device)
        if a >= fill:  # the memory is full: time it
            times.append(1e3 * (time.perf_counter() - t0) / seg_len)
    return times


@torch.no_grad()
def sliding_ms_per_token(model, ids: torch.Tensor, window: int, n: int, batch: int) -> list:
    """ms per token of each timed batch of windows [N, K] (the last position's logits)."""
    device = next(model.parameters()).device
    windows = ids[: window + n].unfold(0, window, 1)[:n]  # [n, K]: row i = ids[i : i+K]
    times = []
    for a in range(0, n, batch):
        x = windows[a : a + batch].to(device)
        sync(device)
        t0 = time.perf_counter()
        out = cached_forward(model, x, None, mem_len=window, last_only=True)
        torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        sync(device)
        times.append(1e3 * (time.perf_counter() - t0) / x.size(0))
    return times


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model = TransformerXL.from_pretrained(args.model).eval()
    seg_len = model.config.tgt_len
    lengths = [int(k) for k in args.lengths.split(",")]
    generator = torch.Generator().manual_seed(0)
    longest = max(lengths) + max(args.tokens, args.window_tokens) + seg_len + 1
    ids = torch.randint(0, model.config.vocab_size, (longest,), generator=generator)

    memory_ms_per_token(model, ids, seg_len, seg_len, seg_len)  # warm-up
    print(f"segment {seg_len}, {args.threads} thread(s), medians of ms per token; memory: "
          f"{args.tokens} tokens, sliding window: {args.window_tokens} tokens per length")
    print("| attention length | memory | memory ms/token | sliding window ms/token | "
          "sliding / memory |")
    print("|--:|--:|--:|--:|--:|")
    rows = []
    for k in lengths:
        if k <= seg_len:
            raise SystemExit(f"attention length {k} must exceed the segment length {seg_len}")
        mem = statistics.median(memory_ms_per_token(model, ids, seg_len, k - seg_len, args.tokens))
        batch = max(1, min(args.batch, window_batch_size(model, k)))
        slide = statistics.median(
            sliding_ms_per_token(model, ids, k, args.window_tokens, batch)
        )
        rows.append({"attention_length": k, "mem_len": k - seg_len, "seg_len": seg_len,
                     "memory_ms_per_token": mem, "sliding_ms_per_token": slide,
                     "ratio": slide / mem, "sliding_batch": batch})
        print(f"| {k:,} | {k - seg_len:,} | {mem:.3f} | {slide:.1f} | {slide / mem:,.0f}x |",
              flush=True)
    print("paper (Table 9, their GPU): " + ", ".join(
        f"{r:,}x at {k:,}" for k, r in sorted(PAPER_TABLE_9.items())))
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
