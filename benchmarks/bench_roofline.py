"""How far each path is from this machine's limit: a roofline line for every speed figure,
this checkout against a baseline checkout, side by side in one run.

    .venv/bin/python benchmarks/bench_roofline.py --baseline-dir /tmp/base-44 [--rounds 3]

The machine's limits, measured in each run (torch, this process's threads):

- fp32 and bf16 matmul rate: a 1024 x 1024 x 1024 product, best of 5 (GFLOP/s);
- memory bandwidth: a 256 MB copy (read + write), best of 3 (GB/s).

Each path's achieved rate against them:

- the window's arithmetic (``sliding_nll``: every token from the 64 before it, alone):
  FLOPs of the windows (``window_flops``, counted from the config) / seconds, against the
  fp32 matmul rate, with 1 and 2 torch threads;
- the cached step (one token over a memory of 512): bound by bandwidth, not arithmetic:
  the bytes it reads (every weight once, the memory's keys and values, the position keys)
  / seconds, against the bandwidth;
- a Score of 2,000 characters, all stages (reads, sweep, sliding window): seconds;
- Generate 400 characters at memory 512: seconds until the text is out, seconds until its
  counterfactual is done, and the cached step alone (the counterfactual off);
- ``--api``: the same Generate and Score through each checkout's app (``python app.py``,
  gradio_client's ``/generate`` and ``/score``, to the last output), the two apps up at
  once and asked in turn.

Every measure runs in a fresh subprocess that imports ``txl`` from the checkout it times
(this one, or ``--baseline-dir``: an older commit's ``git worktree``), the two in turn,
``--rounds`` times; the figures are medians. The machine is shared: compare the columns of
one run, not runs with each other.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "weights" / "shakespeare-char"
WINDOW = 64
GEN_CHARS, GEN_MEM = 400, 512
SCORE_CHARS, SCORE_MEM = 2000, 128

# ---- the arithmetic and the bytes, counted from the config --------------------------------


def window_flops(c: dict, W: int, first_layer_lookup: bool = False) -> int:
    """Multiply-adds x 2 of one window of W tokens read alone, the top layer for its last
    query alone (txl.scoring.window_forward): per layer, each token's projections (q, k, v:
    3 H Dh x d; out: d x H Dh), its feed-forward (2 d x d_inner) and its attention over the
    W keys (content, position, values: 3 H Dh W: the masked half is computed too); the top
    layer makes every token's keys and values and one query's rest; then the output layer.
    first_layer_lookup: layer 0's q, k, v looked up per token (``first_layer_qkv``, from
    issue 44's last lever), not products (the table's own few rows are not counted)."""
    d, hd, di, V = c["d_model"], c["n_head"] * c["d_head"], c["d_inner"], c["vocab_size"]
    token = 3 * hd * d + hd * d + 2 * d * di + 3 * hd * W  # one position of one layer
    lower = (c["n_layer"] - 1) * W * token
    top = W * 2 * hd * d + token - 2 * hd * d  # keys and values of all, one query's rest
    looked_up = W * 3 * hd * d if first_layer_lookup and c["n_layer"] > 1 else 0
    return 2 * (lower + top - looked_up + d * V)


def step_bytes(c: dict, n_params: int, mem: int, element: int = 4) -> int:
    """Bytes one cached step reads at least: every weight once (the output layer's too),
    the memory's keys and values in every layer, the position keys for mem + 1 distances."""
    kv = 2 * c["n_layer"] * c["n_head"] * c["d_head"] * mem
    positions = c["n_layer"] * c["n_head"] * c["d_head"] * (mem + 1)
    return element * (n_params + kv + positions)


# ---- one measure in a subprocess: txl imported from the checkout it times -----------------

WORKER = r"""
import json, sys, time, statistics
checkout, measure, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, checkout)
import torch
torch.set_num_threads(threads)
from txl import TransformerXL
from txl.scoring import sliding_nll
from txl.session import Session
model = TransformerXL.from_pretrained(sys.argv[4]).eval()
text = sys.argv[5]
ids = torch.tensor(model.tokenizer.encode(text), dtype=torch.long)

def machine():
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
        a @ b
        best = min(_timed(lambda: a @ b) for _ in range(5))
        out[f"matmul_{name}_gflops"] = 2 * 1024**3 / best / 1e9
    x = torch.empty(64 << 20)
    y = torch.empty_like(x)
    y.copy_(x)
    out["bandwidth_gbs"] = 2 * x.nbytes / min(_timed(lambda: y.copy_(x)) for _ in range(3)) / 1e9
    return out

def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0

result = machine()
if measure == "window":
    n = int(sys.argv[6])
    sliding_nll(model, ids[: WINDOW + 33], WINDOW, WINDOW, WINDOW + 33)  # warm up
    text_ids = ids[: WINDOW + n]
    result["seconds"] = _timed(lambda: sliding_nll(model, text_ids, WINDOW, WINDOW, WINDOW + n))
    result["windows"] = n
    result["first_layer_lookup"] = hasattr(model, "first_layer_qkv")
elif measure == "step":
    s = Session(model, mem_len=GEN_MEM, seed=0)
    s.counterfactual = False
    s.start(text[: GEN_MEM + 64])
    for _ in range(20):
        s.step(capture=False)
    result["seconds"] = _timed(lambda: [s.step(capture=False) for _ in range(200)]) / 200
elif measure == "generate":
    s = Session(model, mem_len=GEN_MEM, seed=0)
    s.start(text[:200])
    list(s.generate(8))  # warm up
    alone = Session(model, mem_len=GEN_MEM, seed=0)
    alone.counterfactual = False
    alone.start(text[:200])
    result["alone_seconds"] = _timed(lambda: list(alone.generate(GEN_CHARS)))
    s.start(text[:200])
    t0 = time.perf_counter()
    steps = s.generate(GEN_CHARS)
    for i, trace in enumerate(steps):
        if i == GEN_CHARS - 1:
            result["text_seconds"] = time.perf_counter() - t0
            assert trace.predictions.without_memory is not None  # the last one's is there
    result["done_seconds"] = time.perf_counter() - t0
    assert len(s.memory_effect) == GEN_CHARS
elif measure == "score":
    try:
        from txl.scoring import score_stages
        stages = lambda: score_stages(model, text, mem_len=SCORE_MEM)
    except ImportError:  # before issue 44: a method of Session
        stages = lambda: Session(model, mem_len=SCORE_MEM).score_stages(text)
    result["seconds"] = _timed(lambda: list(stages()))
print(json.dumps(result))
"""


def run_worker(checkout: Path, measure: str, threads: int, text: str, *extra) -> dict:
    names = "WINDOW, GEN_CHARS, GEN_MEM, SCORE_MEM"
    constants = f"{names} = {WINDOW}, {GEN_CHARS}, {GEN_MEM}, {SCORE_MEM}\n"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONHASHSEED": "0"}
    out = subprocess.run(
        [sys.executable, "-c", constants + WORKER, str(checkout), measure, str(threads),
         str(MODEL), text, *map(str, extra)],
        capture_output=True, text=True, env=env, cwd=str(checkout), check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"{checkout} {measure}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def score_text() -> str:
    """2,000 characters of Shakespeare (the app's examples, repeated)."""
    sys.path.insert(0, str(ROOT))
    from webapp.tabs.examples import REPEATED, ROMEO_AND_JULIET

    text = ROMEO_AND_JULIET + "\n" + REPEATED
    return (text * (SCORE_CHARS // len(text) + 1))[:SCORE_CHARS]


def api_rounds(checkouts: dict, text: str, rounds: int) -> dict:
    """Seconds to the last output of /generate (400 characters, memory 512) and /score
    (the 2,000 characters, memory 128) of each checkout's app, ``rounds`` times in turn."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_app import api_client, start_app, stop_app

    apps = {name: start_app(str(MODEL), app_dir=checkout) for name, checkout in checkouts.items()}
    times: dict = {}
    settings = dict(memory=True, temperature=0.8, top_k=0, top_p=1.0, seed=0)
    try:
        clients = {name: api_client(url, timeout=600) for name, (_, url) in apps.items()}
        for r in range(rounds):
            for name in list(clients) if r % 2 == 0 else reversed(list(clients)):
                client = clients[name]
                t0 = time.perf_counter()
                client.predict(prompt="ROMEO:\n", n_tokens=GEN_CHARS, mem_len=GEN_MEM,
                               **settings, api_name="/generate")  # fmt: skip
                times.setdefault((name, "generate"), []).append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                client.predict(text, SCORE_MEM, api_name="/score")
                times.setdefault((name, "score"), []).append(time.perf_counter() - t0)
                print(f"round {r + 1} api {name}: generate {times[(name, 'generate')][-1]:.2f} s,"
                      f" score {times[(name, 'score')][-1]:.2f} s", flush=True)  # fmt: skip
    finally:
        for proc, _ in apps.values():
            stop_app(proc)
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-dir", type=Path, required=True, help="an older checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--windows", type=int, default=512, help="windows timed per measure")
    parser.add_argument("--only", nargs="*", default=["window", "step", "generate", "score"])
    parser.add_argument("--api", action="store_true", help="also through each checkout's app")
    parser.add_argument("--json", type=Path, help="write the medians here")
    args = parser.parse_args()
    text = score_text()
    config = json.loads((MODEL / "config.json").read_text())
    sys.path.insert(0, str(ROOT))
    from txl import TransformerXL

    n_params = sum(p.numel() for p in TransformerXL.from_pretrained(MODEL).parameters())
    checkouts = {"this": ROOT, "baseline": args.baseline_dir.resolve()}
    plan = []  # (label, measure, threads, extra)
    if "window" in args.only:
        plan += [("window", "window", t, (args.windows,)) for t in (1, 2)]
    if "step" in args.only:
        plan.append(("step", "step", 1, ()))
    if "generate" in args.only:
        plan.append(("generate", "generate", 1, ()))
    if "score" in args.only:
        plan.append(("score", "score", 1, ()))
    runs: dict = {}
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for label, measure, threads, extra in plan:
            order = checkouts.items() if r % 2 == 0 else reversed(checkouts.items())
            for name, checkout in order:
                got = run_worker(checkout, measure, threads, text, *extra)
                runs.setdefault((label, threads, name), []).append(got)
                print(f"round {r + 1} {label} {threads}t {name}: {json.dumps(got)}", flush=True)
    api = api_rounds(checkouts, text, args.rounds) if args.api else {}
    load.append(os.getloadavg()[0])

    def median(label, threads, name, key):
        return statistics.median(run[key] for run in runs[(label, threads, name)])

    rows, out = [], {}
    for label, measure, threads, _ in plan:
        for name in checkouts:
            fp32 = median(label, threads, name, "matmul_fp32_gflops")
            bf16 = median(label, threads, name, "matmul_bf16_gflops")
            bw = median(label, threads, name, "bandwidth_gbs")
            entry = dict(matmul_fp32_gflops=fp32, matmul_bf16_gflops=bf16, bandwidth_gbs=bw)
            if measure == "window":
                s = median(label, threads, name, "seconds")
                lookup = runs[(label, threads, name)][0]["first_layer_lookup"]
                flops = window_flops(config, WINDOW, lookup)  # what this checkout computes
                rate = flops * args.windows / s / 1e9
                entry.update(ms_per_window=1e3 * s / args.windows, gflops=rate, of_fp32=rate / fp32)
                what = (f"{entry['ms_per_window']:.2f} ms/window, {rate:.1f} GFLOP/s = "
                        f"{rate / fp32:.0%} of fp32 matmul")  # fmt: skip
            elif measure == "step":
                s = median(label, threads, name, "seconds")
                rate = step_bytes(config, n_params, GEN_MEM) / s / 1e9
                entry.update(ms_per_step=1e3 * s, gbs=rate, of_bandwidth=rate / bw)
                what = f"{1e3 * s:.2f} ms/step, {rate:.2f} GB/s = {rate / bw:.0%} of bandwidth"
            elif measure == "generate":
                keys = ("alone_seconds", "text_seconds", "done_seconds")
                entry.update({k: median(label, threads, name, k) for k in keys})
                what = (f"text {entry['text_seconds']:.2f} s, counterfactual done "
                        f"{entry['done_seconds']:.2f} s, cached step alone "
                        f"{entry['alone_seconds']:.2f} s")  # fmt: skip
            else:
                entry["seconds"] = median(label, threads, name, "seconds")
                what = f"{entry['seconds']:.2f} s"
            out[f"{label} {threads}t {name}"] = entry
            title = f"{label} ({threads} thread{'s' if threads > 1 else ''})"
            rows.append((title, name, what, fp32, bw))

    print(f"\nmedians of {args.rounds} rounds, load average {load[0]:.1f} -> {load[1]:.1f}")
    flops = window_flops(config, WINDOW), window_flops(config, WINDOW, True)
    print(f"the window: {flops[0] / 1e9:.3f} GFLOP each ({flops[1] / 1e9:.3f} with layer 0's "
          f"projections looked up); a cached step at memory {GEN_MEM}: "
          f"{step_bytes(config, n_params, GEN_MEM) / 1e6:.1f} MB read")  # fmt: skip
    for what, name, figures, fp32, bw in rows:
        print(f"  {what:<22} {name:<9} {figures}   [fp32 {fp32:.0f} GFLOP/s, {bw:.1f} GB/s]")
    print("\nthis / baseline (below 1: faster, or a smaller share for rates)")
    for label, _, threads, _ in plan:
        new, old = out[f"{label} {threads}t this"], out[f"{label} {threads}t baseline"]
        for key in ("ms_per_window", "of_fp32", "ms_per_step", "of_bandwidth", "text_seconds",
                    "done_seconds", "alone_seconds", "seconds"):  # fmt: skip
            if key in new:
                print(f"  {label} {threads}t {key}: {new[key] / old[key]:.2f}x")
        if label == "generate":
            pace = new["text_seconds"] / new["alone_seconds"]
            print(f"  generate: text / cached step alone {pace:.2f}x")
    for what in ("generate", "score"):
        if api:
            new, old = api[("this", what)], api[("baseline", what)]
            print(f"  api {what}: {new:.2f} s against {old:.2f} s: {new / old:.2f}x")
            out[f"api {what}"] = {"this": new, "baseline": old}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
