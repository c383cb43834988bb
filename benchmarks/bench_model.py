"""Speed of our TransformerXL against the reference (transformers' TransfoXL), same weights.

    .venv/bin/python benchmarks/bench_model.py            # demo size, a few minutes
    .venv/bin/python benchmarks/bench_model.py --quick    # small shapes, checks it runs

The reference is built in its own virtual environment (transformers 4.37.2; see
tests/conftest.py), saved, and converted with txl.convert, so both models hold the same
weights and see the same tokens and the same memory. It runs in a child process
(benchmarks/_peer.py) that measures on request: the rounds interleave reference and ours,
one at a time, so a noisy neighbour slows both alike and the two never share the CPU.

Measured with torch.utils.benchmark (blocked_autorange), medians of all blocks:
- forward: eval mode, no gradient, batch 16 x segment 128 with 128 memory positions;
- train: forward + backward + AdamW step, dropout 0.1, same shapes.
Throughput is tokens (batch x segment) per second; the ratio is ours / reference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.utils import benchmark

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from txl.convert import convert_folder  # noqa: E402  (after the path set-up above)

DEMO = dict(vocab_size=65, d_model=256, d_embed=256, n_layer=6, n_head=8, d_head=32,
            d_inner=1024, cutoffs=[], div_val=1, dropout=0.1, dropatt=0.0, clamp_len=-1,
            same_length=False, pre_lnorm=False, untie_r=True, attn_type=0)
TASKS = ("forward", "train")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="batch 2, segment 32, memory 32, one short round")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seg-len", type=int, default=128)
    parser.add_argument("--mem-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--min-run-time", type=float, default=3.0,
                        help="seconds per measurement (torch.utils.benchmark)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--peer-python", default=os.environ.get(
        "TXL_PEER_PYTHON", str(ROOT / ".venv-peer" / "bin" / "python")))
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.seg_len, args.mem_len = 2, 32, 32
        args.rounds, args.min_run_time = 1, 0.3
    return args


class Peer:
    """The reference model in its own process, measuring one task per request."""

    def __init__(self, args: argparse.Namespace, workdir: Path):
        if not Path(args.peer_python).exists():
            sys.exit(f"no reference python at {args.peer_python}: run the tests once "
                     "(tests/conftest.py creates .venv-peer) or pass --peer-python")
        spec = dict(config={**DEMO, "mem_len": args.mem_len}, seed=0, batch=args.batch,
                    seg_len=args.seg_len, mem_len=args.mem_len, threads=args.threads,
                    lr=args.lr)
        self.proc = subprocess.Popen(
            [args.peer_python, str(ROOT / "benchmarks" / "_peer.py"), "--out", str(workdir),
             "--spec", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self.info = self._reply()

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"the reference process died (exit code {self.proc.wait()})")
        return json.loads(line)

    def measure(self, task: str, min_run_time: float) -> list[float]:
        self.proc.stdin.write(json.dumps({"task": task, "min_run_time": min_run_time}) + "\n")
        self.proc.stdin.flush()
        return self._reply()["times"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"task": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def our_tasks(model, input_ids, mems, lr: float) -> dict:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def forward():
        model.eval()
        with torch.no_grad():
            model(input_ids, mems=mems)

    def train():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids, mems=mems).logits
        # Score T - 1 positions, as the reference does with labels=input_ids.
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()

    return {"forward": forward, "train": train}


def measure(fn, min_run_time: float, threads: int) -> list[float]:
    fn()  # warm-up, as the peer does
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    return list(timer.blocked_autorange(min_run_time=min_run_time).times)


def load_inputs(workdir: Path):
    """The peer's tokens and memory; its memory is time-major [M, B, d], ours [B, M, d]."""
    tensors = load_file(workdir / "inputs.safetensors")
    n_layer = sum(k.startswith("mems.") for k in tensors)
    mems = [tensors[f"mems.{i}"].transpose(0, 1).contiguous() for i in range(n_layer)]
    return tensors["input_ids"], mems


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    times = {(side, task): [] for side in ("ours", "reference") for task in TASKS}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        peer = Peer(args, workdir)
        try:
            model = convert_folder(workdir / "model", workdir / "ours")  # the same weights
            input_ids, mems = load_inputs(workdir)
            ours = our_tasks(model, input_ids, mems, args.lr)
            for r in range(args.rounds):
                for task in TASKS:
                    # Alternate who goes first, so neither always runs on a warmer cache.
                    order = ("reference", "ours") if r % 2 == 0 else ("ours", "reference")
                    for side in order:
                        if side == "reference":
                            t = peer.measure(task, args.min_run_time)
                        else:
                            t = measure(ours[task], args.min_run_time, args.threads)
                        times[side, task] += t
                        print(f"round {r + 1}/{args.rounds} {task:7s} {side:9s} "
                              f"median {statistics.median(t) * 1e3:8.1f} ms", flush=True)
        finally:
            peer.close()
    tokens = args.batch * args.seg_len
    results = {}
    for task in TASKS:
        ours_s = statistics.median(times["ours", task])
        ref_s = statistics.median(times["reference", task])
        results[task] = {"ours_tok_s": tokens / ours_s, "reference_tok_s": tokens / ref_s,
                         "ours_ms": ours_s * 1e3, "reference_ms": ref_s * 1e3,
                         "ratio": ref_s / ours_s, "samples": len(times["ours", task])}
    return {"settings": {k: v for k, v in vars(args).items() if k != "peer_python"},
            "reference_torch": peer.info.get("torch"), "torch": torch.__version__,
            "results": results}


def print_table(report: dict) -> None:
    s = report["settings"]
    print(f"\nTransformerXL vs transformers TransfoXL: {DEMO['n_layer']} layers, d_model "
          f"{DEMO['d_model']}, {DEMO['n_head']} heads x {DEMO['d_head']}, d_inner "
          f"{DEMO['d_inner']}; batch {s['batch']}, segment {s['seg_len']}, memory "
          f"{s['mem_len']}; {s['threads']} threads; medians of {s['rounds']} interleaved "
          f"rounds")
    print(f"{'task':<9}{'ours tok/s':>12}{'reference tok/s':>17}{'ours/reference':>16}")
    for task, r in report["results"].items():
        print(f"{task:<9}{r['ours_tok_s']:>12,.0f}{r['reference_tok_s']:>17,.0f}"
              f"{r['ratio']:>15.2f}x")


def main(argv=None) -> None:
    args = parse_args(argv)
    report = run(args)
    print_table(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
