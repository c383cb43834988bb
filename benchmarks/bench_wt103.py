"""Per-token step latency of a WikiText-103-sized Transformer-XL on this CPU.

    .venv/bin/python benchmarks/bench_wt103.py [--quick] [--threads N] [--mem 1600]

The paper's model in shape (18 layers, d_model 1024, 16 heads x 64, d_inner 4096, adaptive
softmax over 267,735 words, cutoffs 20k/40k/200k, div_val 4, same_length, clamp_len 1000)
with random weights: a step is one new token over a full memory of --mem positions, its
log-probabilities over the whole vocabulary (what sampling needs), as Session.step runs
it. Side by side, in alternating rounds, medians of torch.utils.benchmark blocks:

    fp32 cached   our step: keys and values of the memory kept (KVMemory), fp32
    bf16 cached   the same in bfloat16 (half the weights' and the memory's bytes)
    fp32 recompute  the reference's way: the memory kept as hidden states, so every step
                  projects all M cached states to keys and values again (forward() with mems)

Ratios are against fp32 recompute. The machine is shared: compare columns of one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils import benchmark

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from txl import TransformerXL, TXLConfig  # noqa: E402
from txl.cached import KVMemory, cached_forward  # noqa: E402
from txl.session import memory_bytes_per_position  # noqa: E402

WT103 = dict(
    vocab_size=267735,
    cutoffs=[20000, 40000, 200000],
    div_val=4,
    d_model=1024,
    d_embed=1024,
    n_head=16,
    d_head=64,
    d_inner=4096,
    n_layer=18,
    tgt_len=128,
    mem_len=1600,
    clamp_len=1000,
    same_length=True,
    untie_r=True,
    tie_projs=[False, True, True, True],
    dropout=0.0,
)


def build(dtype: torch.dtype) -> TransformerXL:
    torch.manual_seed(0)
    return TransformerXL(TXLConfig(**WT103)).to(dtype).eval()


@torch.no_grad()
def cached_stepper(model: TransformerXL, mem: int):
    """A step over a full KV memory of mem positions (random keys and values: a step's
    cost does not depend on their values, and filling it by running 1,600 tokens through
    the model takes minutes on a CPU)."""
    c, dtype = model.config, next(model.parameters()).dtype
    memory = KVMemory()
    memory.reserve((c.n_layer, 1, c.n_head, c.d_head), mem, dtype, "cpu")
    for buffer in memory.k + memory.v:
        buffer.normal_(0.0, 1.0)
    memory.end = mem
    state = {"token": torch.tensor([[2]])}

    def step():
        out = cached_forward(model, state["token"], memory, mem_len=mem, last_only=True)
        state["token"] = out.logits[:, -1:].argmax(-1)

    return step


@torch.no_grad()
def recompute_stepper(model: TransformerXL, mem: int):
    """A step over hidden-state memory (random, as above): forward() re-projects every
    memory state to keys and values, as the reference does."""
    c = model.config
    state = {"token": torch.tensor([[2]]), "mems": [torch.randn(1, mem, c.d_model)] * c.n_layer}

    def step():
        out = model(state["token"], mems=state["mems"], mem_len=mem)
        state["token"], state["mems"] = out.logits[:, -1:].argmax(-1), out.mems

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the app uses 1)")
    parser.add_argument("--mem", type=int, default=1600, help="memory positions (WT103: 1600)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rounds, min_run_time = (3, 1.0) if args.quick else (7, 3.0)

    t0 = time.perf_counter()
    fp32, bf16 = build(torch.float32), build(torch.bfloat16)
    n_params = sum(p.numel() for p in fp32.parameters())
    steppers = {
        "fp32 cached": cached_stepper(fp32, args.mem),
        "bf16 cached": cached_stepper(bf16, args.mem),
        "fp32 recompute": recompute_stepper(fp32, args.mem),
    }
    print(
        f"WT103-sized model: {n_params / 1e6:.0f}M parameters, memory {args.mem}, "
        f"{args.threads} thread(s); set up in {time.perf_counter() - t0:.0f} s"
    )
    per_position = {
        name: memory_bytes_per_position(m) for name, m in (("fp32", fp32), ("bf16", bf16))
    }
    print(
        "memory per session: "
        + ", ".join(
            f"{name} {args.mem * size / 2**20:.0f} MiB" for name, size in per_position.items()
        )
    )

    times: dict[str, list[float]] = {name: [] for name in steppers}
    for r in range(rounds):
        for name, step in steppers.items():
            timer = benchmark.Timer(stmt="step()", globals={"step": step}, num_threads=args.threads)
            times[name].append(timer.blocked_autorange(min_run_time=min_run_time).median)
        print(
            f"round {r + 1}/{rounds}: "
            + ", ".join(f"{name} {times[name][-1] * 1e3:.0f} ms" for name in steppers)
        )

    base = statistics.median(times["fp32 recompute"])
    print(
        f"\n{'step (one token, memory full)':32s} {'median ms':>10s} {'tokens/s':>9s} "
        f"{'speed vs recompute':>19s}"
    )
    for name in steppers:
        median = statistics.median(times[name])
        print(f"{name:32s} {median * 1e3:10.1f} {1 / median:9.1f} {base / median:18.2f}x")


if __name__ == "__main__":
    main()
