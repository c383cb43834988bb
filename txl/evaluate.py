"""Validation loss three ways: segments alone, a sliding window, and memory.

    python -m txl.evaluate --model weights/shakespeare-char --data tinyshakespeare.txt
    python -m txl.evaluate --model weights/shakespeare-char --data tinyshakespeare.txt \
        --positions 2000:12000 --sliding 64,192

The rows, each timed (seconds, and milliseconds per token predicted):

- "segments of 64 read alone (no memory)" (mem_len 0): the text cut into segments, each
  read with nothing before it. The first token of a segment sees nothing, the last sees
  63 tokens: the context fragmentation the paper fixes.
- "sliding window of W, recomputed for every token" (``--sliding W``): the paper's vanilla
  baseline (its Figure 1b). Every token is predicted from exactly the W tokens before it,
  recomputed from scratch, no memory: the best a W-token model can do, at W times the work.
- "segments of 64 + memory of M": Transformer-XL. Segments read in order, each attending
  over the cached hidden states of the M positions before it.

Without ``--positions`` and ``--sliding`` the memory rows read the whole validation text
(the last 10 %) cut into ``--streams`` contiguous rows, as in training.

With ``--positions A:B`` (or with ``--sliding``, which defaults to all of the validation
text) every row scores the same tokens: validation positions A .. B-1, one stream. The
memory rows read the stream from its first token in segments aligned to position 0 and
score only A .. B-1 (so a scored token has the memory it would have in a long read; the
tokens before A are read too, and counted in ms_per_token as the predictions they are);
the sliding-window rows predict each token t in A .. B-1 from ids[t-W : t]. Tokens t < W
see the whole shorter prefix ids[0:t].
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from .data import load_text, train_val_split
from .model import TransformerXL
from .recall import DISTANCES, format_recall, progress_before, recall_probe, recall_summary
from .scoring import LN2, memory_nll, sliding_nll, split_streams, stream_nll


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


def _row(loss: float, seconds: float, predicted: int, **fields) -> dict:
    return {
        **fields,
        "loss": loss,
        "bpc": loss / LN2,
        "seconds": seconds,
        "ms_per_token": 1e3 * seconds / max(predicted, 1),
    }


def parse_positions(spec: str, n_tokens: int) -> tuple[int, int]:
    """ "A:B" -> (A, B), validation positions A .. B-1 (either end may be left out: 1, N)."""
    a, sep, b = spec.partition(":")
    if not sep:
        raise ValueError(f"--positions must be A:B, got {spec!r}")
    start, stop = int(a) if a.strip() else 1, int(b) if b.strip() else n_tokens
    if not 1 <= start < stop <= n_tokens:
        raise ValueError(
            f"--positions {spec}: need 1 <= A < B <= {n_tokens} (the validation tokens)"
        )
    return start, stop


def evaluate_positions(
    model: TransformerXL,
    ids: torch.Tensor,
    start: int,
    stop: int,
    mem_lens: list[int],
    windows: list[int],
    seg_len: int | None = None,
    progress: bool = True,
) -> dict:
    """Every row on the same tokens ids[start:stop] of one stream (see the module doc).

    mem_lens: memory rows (0 = segments read alone); windows: sliding-window rows.
    Returns {"memory": {mem_len: row}, "sliding": {window: row}}; a row holds loss (nats
    per token), bpc, seconds, and ms_per_token (seconds per token predicted)."""
    seg_len = seg_len or model.config.tgt_len
    # Warm up first (thread pool, allocator, the position table): else the first row timed
    # pays for them.
    memory_nll(model, ids[: 2 * seg_len + 1], seg_len, seg_len)
    memory, sliding = {}, {}
    for mem_len in mem_lens:
        t0 = time.perf_counter()
        nll = memory_nll(model, ids, seg_len, mem_len, start, stop, progress, f"mem_len={mem_len}")
        # Reading from token 0 predicts stop - 1 tokens, start - 1 of them unscored.
        memory[mem_len] = _row(
            nll.mean().item(),
            time.perf_counter() - t0,
            stop - 1,
            mem_len=mem_len,
            tokens_read=stop,
        )
    for window in windows:
        t0 = time.perf_counter()
        nll = sliding_nll(
            model, ids, window, start, stop, progress=progress, desc=f"window={window}"
        )
        sliding[window] = _row(
            nll.mean().item(), time.perf_counter() - t0, stop - start, window=window
        )
    return {"memory": memory, "sliding": sliding}


def row_label(seg_len: int, mem_len: int | None = None, window: int | None = None) -> str:
    """What a row is, in words."""
    if window is not None:
        return f"sliding window of {window}, recomputed for every token"
    if mem_len == 0:
        return f"segments of {seg_len} read alone (no memory)"
    return f"segments of {seg_len} + memory of {mem_len}"


def evaluate_model(
    model: TransformerXL,
    val_text: str,
    n_streams: int = 8,
    max_segments: int | None = None,
    sweep: bool = True,
    progress: bool = True,
    windows: list[int] | None = None,
    positions: tuple[int, int] | None = None,
) -> dict:
    """Loss with and without memory at the trained lengths, the memory-length sweep, and
    (``windows``) the sliding-window baseline.

    With ``windows`` or ``positions`` every row scores the same tokens, positions
    [A, B) of the validation text read as one stream (default: all of it), and the result
    gains "positions" and "sliding" ({str(window): row}). Otherwise the memory rows read
    ``n_streams`` rows of the text, as before."""
    cfg = model.config
    ids = torch.tensor(model.tokenizer.encode(val_text), dtype=torch.long)
    lengths = memory_sweep_lengths(cfg.tgt_len, cfg.mem_len) if sweep else [0, cfg.mem_len]
    same_tokens = bool(windows) or positions is not None
    if same_tokens:
        start, stop = positions or (1, len(ids))
        rows = evaluate_positions(
            model, ids, start, stop, lengths, windows or [], progress=progress
        )
        by_len = rows["memory"]
        extra = {
            "positions": [start, stop],
            "sliding": {str(w): r for w, r in rows["sliding"].items()},
        }
        n_streams, tokens = 1, stop - start
    else:
        tokens = n_streams * (len(ids) // n_streams - 1)
        if max_segments is not None:
            tokens = n_streams * min(len(ids) // n_streams - 1, max_segments * cfg.tgt_len)
        by_len, extra = {}, {}
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
            by_len[mem_len] = _row(loss, time.perf_counter() - t0, tokens, mem_len=mem_len)
    return {
        "tgt_len": cfg.tgt_len,
        "train_mem_len": cfg.mem_len,
        "n_streams": n_streams,
        "tokens": tokens,
        "with_memory": by_len[cfg.mem_len],
        "without_memory": by_len[0],
        "sweep": [by_len[n] for n in lengths],
        **extra,
    }


def format_table(result: dict) -> str:
    """The rows in words: segments alone, the sliding windows, then memory by length."""
    seg = result["tgt_len"]
    where = (
        f"validation positions {result['positions'][0]:,}-{result['positions'][1] - 1:,} "
        f"({result['tokens']:,} tokens, one stream)"
        if "positions" in result
        else f"{result['tokens']:,} tokens in {result['n_streams']} streams"
    )
    rows = [(row_label(seg, mem_len=0), result["without_memory"])]
    rows += [(row_label(seg, window=int(w)), r) for w, r in result.get("sliding", {}).items()]
    rows += [(row_label(seg, mem_len=r["mem_len"]), r) for r in result["sweep"] if r["mem_len"]]
    lines = [
        f"segment length {seg}, trained memory {result['train_mem_len']}, {where}",
        "| how each token is predicted | loss (nats) | bpc | seconds | ms/token |",
        "|:--|--:|--:|--:|--:|",
    ]
    for label, r in rows:
        # Results recorded before the rows were timed (an old eval.json) have no times.
        seconds = f"{r['seconds']:.1f}" if "seconds" in r else "-"
        ms = f"{r['ms_per_token']:.3f}" if "ms_per_token" in r else "-"
        lines.append(f"| {label} | {r['loss']:.4f} | {r['bpc']:.4f} | {seconds} | {ms} |")
    return "\n".join(lines)


def summary(result: dict) -> str:
    """Both halves of the claim, each "saves" with its baseline named."""
    seg, mem = result["tgt_len"], result["train_mem_len"]
    w, alone = result["with_memory"], result["without_memory"]
    lines = [
        f"memory of {mem} vs segments of {seg} read alone: saves "
        f"{alone['loss'] - w['loss']:.4f} nats/token (the context fragmentation fixed)"
    ]
    for window, r in result.get("sliding", {}).items():
        lines.append(
            f"sliding window of {window}: {r['loss']:.4f} nats/token, memory of {mem}: "
            f"{w['loss']:.4f} ({r['loss'] - w['loss']:+.4f} in memory's favour); memory is "
            f"{r['ms_per_token'] / w['ms_per_token']:.0f}x faster per token"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m txl.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a local folder or a Hub repo id")
    p.add_argument("--data", required=True, help="the full text; the last 10%% is evaluated")
    p.add_argument("--streams", type=int, default=8, help="parallel streams (default 8)")
    p.add_argument("--max-segments", type=int, default=None, help="evaluate only a prefix")
    p.add_argument("--no-sweep", action="store_true", help="only with and without memory")
    p.add_argument(
        "--sliding",
        default=None,
        metavar="W1,W2",
        help="also the sliding-window baseline of these lengths (e.g. 64,192): slow",
    )
    p.add_argument(
        "--positions",
        default=None,
        metavar="A:B",
        help="score validation tokens A..B-1 only, every row the same tokens, one stream",
    )
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--threads", type=int, default=None)
    recall = p.add_argument_group("recall probe (txl/recall.py) instead of the loss")
    recall.add_argument("--recall", metavar="NAME[,NAME...]", help="made-up speakers to plant")
    recall.add_argument(
        "--distances", default=",".join(map(str, DISTANCES)), help="k, comma-separated"
    )
    recall.add_argument("--mem-len", type=int, default=None, help="default: the config's")
    recall.add_argument(
        "--filler-at",
        default="0",
        metavar="P[,P...]",
        help="validation positions where fillers start (one probe per name and filler)",
    )
    recall.add_argument(
        "--recall-before-at",
        type=int,
        default=None,
        metavar="P",
        help="plant each speaker after whole speeches of the validation text from about "
        "position P (default: the name opens the text)",
    )
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    model = TransformerXL.from_pretrained(args.model)
    _, val_text = train_val_split(load_text(args.data))
    if args.recall:
        return recall_main(model, val_text, args)
    windows = [int(w) for w in args.sliding.split(",")] if args.sliding else None
    if windows and min(windows) < 1:
        p.error("--sliding: window lengths must be >= 1")
    positions = None
    if args.positions:
        n_tokens = len(model.tokenizer.encode(val_text))
        try:
            positions = parse_positions(args.positions, n_tokens)
        except ValueError as e:
            p.error(str(e))
    result = evaluate_model(
        model,
        val_text,
        args.streams,
        args.max_segments,
        not args.no_sweep,
        windows=windows,
        positions=positions,
    )
    print(format_table(result))
    print(summary(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def recall_main(model: TransformerXL, val_text: str, args) -> int:
    """Print the recall table of each name and filler, then the mean of every probe. With
    ``--recall-before-at P`` each speaker enters after whole speeches of the validation
    text from about P (txl.recall.progress_before), as inside a scene under way."""
    distances = [int(k) for k in args.distances.split(",")]
    mem_len = model.config.mem_len if args.mem_len is None else args.mem_len
    window = model.config.tgt_len
    before = ""
    if args.recall_before_at is not None:
        before = progress_before(val_text, args.recall_before_at)
        if not before:
            print("--recall-before-at: no whole speeches in the validation text", file=sys.stderr)
            return 2
        print(f"each speaker enters after {len(before):,} characters of validation text:")
        print(before)
    every = []
    for name in args.recall.split(","):
        for at in (int(x) for x in args.filler_at.split(",")):
            filler = val_text[at : at + max(distances)]
            rows = list(recall_probe(model, name, filler, distances, mem_len, before=before))
            print(f"{name}, filler from validation position {at}:")
            print(format_recall(rows, mem_len, window))
            every.append(rows)
    mean = [  # per distance, the mean of its rows over the probes (the text: the first's)
        dataclasses.replace(
            same_k[0], **{f: sum(getattr(r, f) for r in same_k) / len(same_k) for f in BITS}
        )
        for same_k in zip(*every)
    ]
    print(f"mean of {len(every)} probes:")
    print(format_recall(mean, mem_len, window))
    print(recall_summary(mean, window))
    if args.json:
        args.json.write_text(json.dumps([r.to_dict() for r in mean], indent=2) + "\n")
    return 0


BITS = ("bits_memory", "bits_window", "bits_segments")


if __name__ == "__main__":
    sys.exit(main())
