"""Find the passages of the validation text where memory matters most, for the Watch tab.

    nice -n 10 python scripts/find_memory_moments.py                 # the bundled model
    nice -n 10 python scripts/find_memory_moments.py --positions 40000:60000 --k 3

Over a range of the validation text (Tiny Shakespeare's last 10 %, nanoGPT's split), every
character's surprisal with memory (the text read as one stream in segments of the model's
tgt_len, memory its mem_len) and through the sliding window of tgt_len; the characters where
memory saves the most bits are then read again as the Watch tab reads a prompt (their
~600-character passage alone) and the best ``--k``, their passages disjoint, are written to
``webapp/tabs/memory_moments.json``, which the app reads (txl/moments.py says how). Rerun it
whenever the weights change: tests/test_memory_moments.py checks the file against them.

Cost: the sliding window runs the model once per character (~10-25 ms each on one core of a
busy 2-core machine), so the default 20,000 characters take a few minutes; the memory read
is ~20x cheaper. One torch thread, and the process lowers its own priority (``--nice``): a
training run may need the cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from txl import TransformerXL  # noqa: E402
from txl.data import load_text, tiny_shakespeare_path, train_val_split  # noqa: E402
from txl.moments import LINE_SEARCH, find_moments, passage_record  # noqa: E402

DEFAULT_MODEL = ROOT / "weights" / "shakespeare-char"
DEFAULT_OUT = ROOT / "webapp" / "tabs" / "memory_moments.json"
AFTER_CHARS = 40  # the play from the character on, for the words that say what to watch


def what_follows(text: str, position: int) -> str:
    """The text from ``position`` to the end of its line (of the next line when the
    character is a newline), at most AFTER_CHARS: the words that say what comes."""
    after = text[position : position + AFTER_CHARS]
    end = after.find("\n", 1)
    return after if end == -1 else after[:end]


def parse_positions(value: str) -> tuple[int, int]:
    """'A:B' -> (A, B): validation positions A (inclusive) to B (exclusive)."""
    try:
        a, b = (int(x.replace(",", "").replace("_", "")) for x in value.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A:B (two integers), got {value!r}") from None
    if not 0 <= a < b:
        raise argparse.ArgumentTypeError(f"need 0 <= A < B, got {value!r}")
    return a, b


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def shown_path(path: Path) -> str:
    """A path inside the repository relative to it (the JSON travels with the repository)."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def validation_text(parser: argparse.ArgumentParser, data: Path | None) -> tuple[Path, str]:
    """(the file, Tiny Shakespeare's validation text): ``data`` (--data) or the repository's
    copy (downloaded when missing); the parser's error when it cannot be read."""
    path = data or tiny_shakespeare_path(ROOT)
    try:
        _, val = train_val_split(load_text(path, download=data is None))
    except OSError as e:
        parser.error(f"could not read Tiny Shakespeare ({e}): pass --data or set TXL_DATA")
    return path, val


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="a model folder")
    parser.add_argument("--data", type=Path, default=None, help="tinyshakespeare.txt")
    parser.add_argument(
        "--positions",
        type=parse_positions,
        default=(0, 20_000),
        help="validation positions A:B to scan (default 0:20000)",
    )
    parser.add_argument("--k", type=int, default=4, help="passages to keep (default 4)")
    parser.add_argument(
        "--context",
        type=int,
        default=None,
        help="characters of passage before each (default: a line more than the segment and "
        "the memory: 720 for the bundled model, whose memory is 512)",
    )
    parser.add_argument(
        "--shortlist",
        type=int,
        default=12,
        help="the scan's best (passages disjoint) re-read as the Watch tab reads (default 12)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--nice", type=int, default=10, help="lower priority by this much")
    args = parser.parse_args(argv)

    os.nice(args.nice)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    data, val = validation_text(parser, args.data)
    weights = args.model / "model.safetensors"
    if not weights.is_file():
        parser.error(f"{args.model} is not a model folder (it has no model.safetensors)")
    model = TransformerXL.from_pretrained(args.model)
    if args.context is None:  # the passage fills the segment and the memory, from a line start
        args.context = model.config.tgt_len + model.config.mem_len + LINE_SEARCH + 64
    a, b = args.positions
    b = min(b, len(val))
    print(
        f"{shown_path(args.model)}: scanning validation positions {a:,}:{b:,} of {len(val):,}",
        flush=True,
    )
    try:
        moments = find_moments(
            model,
            val,
            a,
            b,
            k=args.k,
            context=args.context,
            shortlist=args.shortlist,
            progress=lambda message: print(message, flush=True),
        )
    except ValueError as e:
        parser.error(str(e))
    seconds = time.perf_counter() - t0

    c = model.config
    report = {
        "about": (
            "Passages of Tiny Shakespeare's validation text (its last 10 %, nanoGPT's split; "
            "positions index it) that end just before a character the model predicts far "
            "better with memory than through the window of seg_len characters. bits_memory: "
            "-log2 p(char) after the passage read alone as the Watch tab reads a prompt "
            "(segments of seg_len, memory mem_len); bits_window: from the seg_len characters "
            "before it alone. rank: 1 + how many characters are likelier. after: the text from "
            "the character to the end of its line. Written by scripts/find_memory_moments.py."
        ),
        "model": shown_path(args.model),
        "model_sha256": sha256(weights),
        "data": data.name,
        "seg_len": c.tgt_len,
        "mem_len": c.mem_len,
        "context": args.context,
        "positions": [max(a, args.context), b],
        "seconds": round(seconds, 1),
        "moments": [{**passage_record(m), "after": what_follows(val, m.position)} for m in moments],
    }
    args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    for m in moments:
        print(
            f"  position {m.position:>7,}  {m.char!r:>5}  "
            f"memory {m.bits_memory:6.3f} bits (rank {m.rank_memory:>2})  "
            f"window {m.bits_window:6.3f} bits (rank {m.rank_window:>2})  "
            f"saved {m.bits_saved:6.3f}   ...{m.context[-30:]!r} + "
            f"{val[m.position : m.position + 20]!r}"
        )
    print(f"wrote {shown_path(args.out)} in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
