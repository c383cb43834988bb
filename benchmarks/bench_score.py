"""The Score tab's waits, as a visitor has them: /score through gradio_client, and the
prompt feed of a long prompt through /step; two checkouts side by side in one run.

    python benchmarks/bench_score.py                             # this checkout's app
    python benchmarks/bench_score.py --before /tmp/before21      # another checkout beside it
    python benchmarks/bench_score.py --before /tmp/before21 --steppers 16 --steps 20
    python benchmarks/bench_score.py --text scene.txt --repeats 3 --json out.json
    python benchmarks/bench_score.py --allocator --repeats 5     # the allocator's speed side
    python benchmarks/bench_score.py --sliding-batches --repeats 3   # SLIDING_BATCH's choice

For each app (``python app.py`` of the checkout, started here on a free port, one at a
time, the apps alternating ``--repeats`` times so that both see the same machine):

- /score of ``--text`` (default: the Score tab's balcony scene, 2,044 characters): the time
  to the first stage (memory and segments alone), to the sweep, to the end; the number
  of stages streamed; the sliding window's bpc (the same in both apps, to 1e-3);
- the prompt feed: /step with a new ``--prompt-chars`` prompt (memory on) each time: the
  handler's own time per character, from the step summary's handler_ms (median of 5);
- ``--allocator``: instead of the apps, segment forwards in fresh processes, one per
  allocator setting (glibc's default; the fixed 256 KB mmap threshold of de52c5a; this
  checkout's tune_allocator), alternating: a 3,000-character prompt fed with memory
  (Session.start) and 640 characters of the sliding window, ms per character. The RSS
  side of the same settings is ``bench_soak.py --per-session`` (run it on both checkouts);
- with ``--steppers N``: N gradio_client sessions Stepping (--steps each, after a fill,
  as in bench_app.py), alone and then while one /score runs: steps served per second (and
  beside the Score, their share of the rate alone), round trip p50/p95, and the Score's
  own total beside them.

Medians over the repeats are printed with the machine's load (``uptime``) before and after,
and the after/before ratios. The benchmark leaves the CPU shares alone: an autogroup's nice
is the whole terminal session's, not this process's (run it on a quiet machine instead).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_app import api_client, percentile, run_session, start_app, stop_app  # noqa: E402
from bench_soak import balcony  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "weights" / "shakespeare-char"
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"  # ../shared


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def client_for(url: str):
    return api_client(url, timeout=600)


def kind_of(numbers) -> str:
    """Which stage a /score output is, from its numbers (the third output)."""
    if not isinstance(numbers, dict) or "bpc" not in numbers:
        return "progress"
    if numbers["bpc"]["sliding_window"] is not None or numbers["seconds"]["sliding_window"]:
        return "done"
    return "sweep" if "context_sweep" in numbers else "reads"


def time_score(url: str, text: str, mem_len: int) -> dict:
    """One /score: seconds to each kind of stage (its first arrival), total, bpc."""
    client = client_for(url)
    try:
        t0 = time.perf_counter()
        job = client.submit(text=text, mem_len=mem_len, api_name="/score")
        seen, first = 0, {}
        while not job.done() or seen < len(job.outputs()):
            outputs = job.outputs()
            for out in outputs[seen:]:
                first.setdefault(kind_of(out[2]), time.perf_counter() - t0)
            seen = len(outputs)
            time.sleep(0.01)
        final = job.result()
        total = time.perf_counter() - t0
    finally:
        client.close()
    numbers = final[2]
    return dict(
        first_stage_s=round(min(first.values(), default=total), 3),
        reads_s=round(first.get("reads", total), 3),
        sweep_s=round(first.get("sweep", total), 3),
        total_s=round(total, 3),
        stages=seen,
        bpc=numbers["bpc"],
        server_seconds=numbers["seconds"],
    )


def time_prompt_feed(url: str, text: str, chars: int, times: int = 5) -> dict:
    """/step with a new prompt of ``chars`` characters (memory on) each time: the handler's
    time (feed + one step + the views) per character."""
    client = client_for(url)
    settings = dict(memory=True, mem_len=128, temperature=0.8, top_k=0, top_p=1.0, seed=0)
    per_char = []
    try:
        for i in range(times + 1):
            prompt = text[i * 97 : i * 97 + chars]  # a new prompt: the app feeds it again
            out = client.predict(prompt=prompt, **settings, api_name="/step")
            if i:  # the first warms the session up
                per_char.append(out[5]["handler_ms"] / len(prompt))
    finally:
        client.close()
    return dict(ms_per_char=round(statistics.median(per_char), 4), prompt_chars=chars)


def steps_of_many(url: str, text: str, clients: int, steps: int, fill: int, score: bool) -> dict:
    """``clients`` sessions Step (after a fill), with one /score running from the moment
    they start (``score``) or alone: steps served per second over their run, their round
    trips, and the Score's total."""
    results = {k: [] for k in ("server", "round_trip", "model", "keys")}
    barrier = threading.Barrier(clients + 1)
    texts: dict = {}
    threads = [
        threading.Thread(target=run_session, args=(url, steps, fill, i, results, barrier, texts))
        for i in range(clients)
    ]
    for t in threads:
        t.start()
    timed: dict = {}
    scorer = threading.Thread(target=lambda: timed.update(time_score(url, text, 128)))
    barrier.wait()  # every session has filled its memory
    t0 = time.perf_counter()
    if score:
        scorer.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if score:
        scorer.join()
    served = len(results["round_trip"])
    return dict(
        steps=served,
        steps_per_s=round(served / wall, 2),
        round_trip_p50_ms=round(percentile(results["round_trip"], 50), 1),
        round_trip_p95_ms=round(percentile(results["round_trip"], 95), 1),
        score_total_s=timed.get("total_s"),
    )


def measure(app_dir: Path, model: str, text: str, args) -> dict:
    proc, url = start_app(model, app_dir=app_dir, extra_env=dict(args.env))
    try:
        out = {"load_before": load()}
        time_score(url, text[:300], 128)  # warm: the first request's imports and threads
        out["score"] = time_score(url, text, 128)
        out["prompt_feed"] = time_prompt_feed(url, SOURCE_TEXT, args.prompt_chars)
        if args.steppers:
            many = (url, text, args.steppers, args.steps, args.fill)
            out["steps_alone"] = steps_of_many(*many, score=False)
            out["steps_beside_score"] = steps_of_many(*many, score=True)
            out["steps_beside_score"]["share_of_alone"] = round(
                out["steps_beside_score"]["steps_per_s"] / out["steps_alone"]["steps_per_s"], 3
            )
        out["load_after"] = load()
        return out
    finally:
        stop_app(proc)


SOURCE_TEXT = ""


def median_of(runs: list[dict], *path) -> float:
    values = []
    for run in runs:
        value = run
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)) and math.isfinite(value):
            values.append(value)
    return statistics.median(values) if values else math.nan


ROWS = [
    ("/score: first stage (s)", ("score", "first_stage_s")),
    ("/score: sweep shown (s)", ("score", "sweep_s")),
    ("/score: total (s)", ("score", "total_s")),
    ("/score: stages streamed", ("score", "stages")),
    ("/score: sliding window (server s)", ("score", "server_seconds", "sliding_window")),
    ("/score: sliding-window bpc", ("score", "bpc", "sliding_window")),
    ("/step prompt feed (ms/char)", ("prompt_feed", "ms_per_char")),
    ("Steps served alone (/s)", ("steps_alone", "steps_per_s")),
    ("  their round trip p50 (ms)", ("steps_alone", "round_trip_p50_ms")),
    ("Steps served beside a Score (/s)", ("steps_beside_score", "steps_per_s")),
    ("  their share of the Steps served alone", ("steps_beside_score", "share_of_alone")),
    ("  their round trip p50 (ms)", ("steps_beside_score", "round_trip_p50_ms")),
    ("  their round trip p95 (ms)", ("steps_beside_score", "round_trip_p95_ms")),
    ("  the Score's total beside them (s)", ("steps_beside_score", "score_total_s")),
]


# ---- the allocator: the speed of segment forwards under each setting -------------------

ALLOCATORS = ("glibc default", "256 KB threshold (de52c5a)", "tune_allocator (this checkout)")


def allocator_child(setting: str, text: str) -> dict:
    """In a fresh process: apply one allocator setting, then time segment forwards."""
    import torch

    sys.path.insert(0, str(ROOT))
    from txl import TransformerXL, budget
    from txl.scoring import SLIDING_BATCH, sliding_nll
    from txl.session import Session

    if setting == ALLOCATORS[1]:
        budget.tune_allocator(mmap_threshold=256 * 1024, trim_threshold=128 * 1024)
    elif setting == ALLOCATORS[2]:
        budget.tune_allocator()
    torch.set_num_threads(1)
    model = TransformerXL.from_pretrained(str(BUNDLED)).eval()
    s = Session(model, mem_len=128)
    s.start(text[:200])  # warm-up
    feed = []
    for i in range(3):
        t0 = time.perf_counter()
        s.start(text[i * 101 : i * 101 + 3000])
        feed.append((time.perf_counter() - t0) * 1e3 / 3000)
    ids = torch.tensor(model.tokenizer.encode(text[:705]))
    t0 = time.perf_counter()
    sliding_nll(model, ids, 64, start=64, batch_size=SLIDING_BATCH)
    sliding = (time.perf_counter() - t0) * 1e3 / (len(ids) - 64)
    return dict(feed_ms_per_char=statistics.median(feed), sliding_ms_per_char=sliding)


def compare_sliding_batches(repeats: int, chars: int = 400) -> dict:
    """sliding_nll's ms per character for each batch size, with 1 and 2 threads, in this
    process (the app's allocator settings), alternating ``repeats`` times."""
    import torch

    sys.path.insert(0, str(ROOT))
    from txl import TransformerXL, budget
    from txl.scoring import sliding_nll, window_batch_size

    budget.tune_allocator()
    model = TransformerXL.from_pretrained(str(BUNDLED)).eval()
    ids = torch.tensor(model.tokenizer.encode(SOURCE_TEXT[: chars + 64]))
    batches = (4, 8, 16, 32, 64, window_batch_size(model, 64))
    times: dict[tuple[int, int], list[float]] = {}
    for _ in range(repeats):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for batch in batches:
                t0 = time.perf_counter()
                sliding_nll(model, ids, 64, start=64, batch_size=batch)
                ms = (time.perf_counter() - t0) * 1e3 / (len(ids) - 64)
                times.setdefault((threads, batch), []).append(ms)
    torch.set_num_threads(1)
    print(f"sliding window of 64, ms per character (median of {repeats}); load {load()}")
    for threads in (1, 2):
        row = "  ".join(f"{b}: {statistics.median(times[threads, b]):6.2f}" for b in batches)
        print(f"  {threads} thread(s)  batch {row}")
    return {f"{t} threads, batch {b}": v for (t, b), v in times.items()}


def compare_allocators(repeats: int) -> dict:
    import subprocess

    runs: dict[str, list[dict]] = {name: [] for name in ALLOCATORS}
    for r in range(repeats):
        for name in ALLOCATORS:
            out = subprocess.run(
                [sys.executable, __file__, "--allocator-child", name],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"[{r + 1}/{repeats}] {name}: {runs[name][-1]}", flush=True)
    print(f"\nmedians of {repeats} run(s) each, ms per character; load {load()}")
    base = None
    for name in ALLOCATORS:
        feed = statistics.median(run["feed_ms_per_char"] for run in runs[name])
        sliding = statistics.median(run["sliding_ms_per_char"] for run in runs[name])
        base = base or (feed, sliding)
        print(
            f"  {name:32s} prompt feed {feed:7.3f} ({feed / base[0]:.2f}x)"
            f"   sliding window {sliding:7.2f} ({sliding / base[1]:.2f}x)"
        )
    return runs


def main() -> None:
    global SOURCE_TEXT
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--text", help="a text file to score (default: the balcony scene)")
    parser.add_argument("--before", type=Path, help="another checkout, measured beside")
    parser.add_argument("--after", type=Path, default=ROOT, help="default: this checkout")
    parser.add_argument("--model", default=str(BUNDLED))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--prompt-chars", type=int, default=3000)
    parser.add_argument("--steppers", type=int, default=0, help="Stepping clients beside")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fill", type=int, default=130)
    parser.add_argument("--env", action="append", default=[], type=lambda kv: kv.split("=", 1))
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--allocator", action="store_true", help="compare allocator settings")
    parser.add_argument("--allocator-child", help=argparse.SUPPRESS)
    parser.add_argument("--sliding-batches", action="store_true", help="batch sizes' speed")
    args = parser.parse_args()
    text = Path(args.text).read_text() if args.text else balcony()
    SOURCE_TEXT = SHAKESPEARE.read_text()[:20_000] if SHAKESPEARE.exists() else text * 10
    if args.allocator_child:
        print(json.dumps(allocator_child(args.allocator_child, SOURCE_TEXT)))
        return
    print(f"load {load()}; scoring {len(text):,} chars")
    if args.allocator or args.sliding_batches:
        compare = compare_allocators if args.allocator else compare_sliding_batches
        runs = compare(args.repeats)
        if args.json:
            Path(args.json).write_text(json.dumps(runs, indent=2) + "\n")
        return
    apps = {"after": args.after.resolve()}
    if args.before:
        apps = {"before": args.before.resolve(), **apps}
    runs: dict[str, list[dict]] = {name: [] for name in apps}
    for r in range(args.repeats):
        for name, app_dir in apps.items():
            run = measure(app_dir, args.model, text, args)
            runs[name].append(run)
            print(f"[{r + 1}/{args.repeats}] {name}: {json.dumps(run)}", flush=True)
    names = list(apps)
    print(f"\nmedians of {args.repeats} run(s) each; load {load()}")
    header = f"{'':38s}" + "".join(f"{n:>12s}" for n in names)
    print(header + ("       ratio" if len(names) == 2 else ""))
    table = {}
    for label, path in ROWS:
        values = [median_of(runs[n], *path) for n in names]
        if all(math.isnan(v) for v in values):
            continue
        table[label] = values
        line = f"{label:38s}" + "".join(f"{v:12.4g}" for v in values)
        if len(values) == 2 and values[0] and math.isfinite(values[0] / values[1]):
            line += f"{values[1] / values[0]:12.2f}"
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "medians": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()
