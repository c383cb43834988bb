"""What "How far back can it recall?" costs: the probe of seven distances (32 .. 2,048) on
the bundled model, computed two ways side by side, and through the app. The name opens the
text (nothing before the speaker: the probe docs/performance.md measures); text before it
adds its own segments, once, to the shared read.

    python benchmarks/bench_recall.py                  # 5 repeats, one torch thread
    python benchmarks/bench_recall.py --repeats 9 --threads 2 --app

- **shared** (``txl.recall.recall_probe``, what the app runs): the reads with memory share
  the longest probe's read up to each filler's end; segments alone read only the
  segments that hold the scored letters; the window, only their windows;
- **plain** (``txl.recall.recall_row`` per distance, the baseline): each probe read from
  its start three whole ways (``memory_nll`` with memory and alone, ``sliding_nll``).

The two alternate ``--repeats`` times so that both see the same machine; their rows must
agree to 1e-9 bits. Printed: the medians of the whole probe and of its first row, the
plain/shared ratio, and each distance's share (shared). ``--app``: also the visitor's wait,
/recall through gradio_client on the app started in this process (first row, last row,
paced as beside other visitors: alone here, so it never pauses).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from txl import TransformerXL  # noqa: E402
from txl.recall import DISTANCES, recall_probe, recall_row  # noqa: E402
from webapp.tabs.examples import RECALL_FILLER  # noqa: E402

BUNDLED = ROOT / "weights" / "shakespeare-char"
NAME = "ZANTHOR"


def timed_rows(rows) -> tuple[list, list[float]]:
    """The rows of an iterable, and the seconds from the start to each."""
    t0, out, at = time.perf_counter(), [], []
    for row in rows:
        out.append(row)
        at.append(time.perf_counter() - t0)
    return out, at


def shared(model, mem_len):
    return timed_rows(recall_probe(model, NAME, RECALL_FILLER, DISTANCES, mem_len))


def plain(model, mem_len):
    return timed_rows(recall_row(model, NAME, RECALL_FILLER, k, mem_len) for k in DISTANCES)


def through_app(repeats: int) -> list[tuple[float, float]]:
    """(first row, last row) seconds of /recall, as a gradio_client visitor waits."""
    import app
    from benchmarks.bench_app import api_client

    txl_app = app.Demo.serving(str(BUNDLED))
    demo = txl_app.build()
    _, url, _ = app.launch(
        demo, server_port=None, prevent_thread_lock=True, quiet=True, ssr_mode=False
    )
    client = api_client(url, timeout=600)
    waits = []
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            job = client.submit(
                name=NAME, filler=RECALL_FILLER, before="", mem_len=128, api_name="/recall"
            )
            first = None
            for _ in job:  # each streamed row
                first = first or time.perf_counter() - t0
            job.result()
            waits.append((first, time.perf_counter() - t0))
    finally:
        demo.close()
    return waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the app: 1)")
    parser.add_argument("--mem-len", type=int, default=None, help="default: the model's")
    parser.add_argument("--app", action="store_true", help="also /recall through the app")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = TransformerXL.from_pretrained(str(BUNDLED)).eval()
    mem_len = model.config.mem_len if args.mem_len is None else args.mem_len
    print(
        f"load {os.getloadavg()}; {args.threads} thread(s); mem_len {mem_len}; "
        f"distances {DISTANCES}; filler {len(RECALL_FILLER):,} characters"
    )
    shared(model, mem_len)  # warm up both (the position table, the allocator)
    plain(model, mem_len)
    runs = {"shared": [], "plain": []}
    for i in range(args.repeats):
        for way, fn in (("shared", shared), ("plain", plain))[:: 1 if i % 2 == 0 else -1]:
            runs[way].append(fn(model, mem_len))
    # The same numbers both ways.
    a, b = runs["shared"][0][0], runs["plain"][0][0]
    for x, y in zip(a, b):
        for key in ("bits_memory", "bits_window", "bits_segments"):
            assert abs(getattr(x, key) - getattr(y, key)) < 1e-9, (x.distance, key)
    med = {
        way: (
            statistics.median(at[-1] for _, at in rs),
            statistics.median(at[0] for _, at in rs),
        )
        for way, rs in runs.items()
    }
    for way, (total, first) in med.items():
        print(
            f"{way:>7}: whole probe {total:.3f} s, first row {first:.3f} s (medians of "
            f"{args.repeats})"
        )
    print(f"plain / shared: {med['plain'][0] / med['shared'][0]:.2f}x")
    per_k = [
        statistics.median(at[i] - (at[i - 1] if i else 0.0) for _, at in runs["shared"])
        for i in range(len(DISTANCES))
    ]
    print(
        "shared, seconds per distance: "
        + ", ".join(f"{k}: {s:.3f}" for k, s in zip(DISTANCES, per_k))
    )
    if args.app:
        waits = through_app(args.repeats)
        print(
            f"/recall through the app: first row {statistics.median(w[0] for w in waits):.3f}"
            f" s, whole probe {statistics.median(w[1] for w in waits):.3f} s (medians of "
            f"{args.repeats})"
        )
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
