"""The reference side of bench_model.py; runs in the PEER virtual environment.

    PEER_PYTHON benchmarks/_peer.py --out DIR --spec JSON

Builds transformers' TransfoXLLMHeadModel from the spec, saves it to DIR/model (for
txl.convert) and the benchmark inputs to DIR/inputs.safetensors, prints {"ready": true},
then answers one JSON request per stdin line, {"task": "forward" | "train",
"min_run_time": seconds}, with {"times": [seconds per call, ...]} measured by
torch.utils.benchmark, until {"task": "quit"}. The parent measures our model between
requests, so the two never compete for the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.utils import benchmark
from transformers import TransfoXLConfig, TransfoXLLMHeadModel


def build(spec: dict, out: Path):
    torch.manual_seed(spec["seed"])
    config = TransfoXLConfig(**spec["config"])
    model = TransfoXLLMHeadModel(config)
    model.save_pretrained(out / "model", safe_serialization=True)

    B, T, M = spec["batch"], spec["seg_len"], spec["mem_len"]
    input_ids = torch.randint(0, config.vocab_size, (B, T))
    # The memory: the layer inputs of M real tokens before the segment.
    model.eval()
    with torch.no_grad():
        empty = [torch.zeros(0, B, config.d_model)] * config.n_layer
        mems = model(torch.randint(0, config.vocab_size, (B, M)), mems=empty).mems
    tensors = {"input_ids": input_ids}
    tensors.update({f"mems.{i}": m.contiguous() for i, m in enumerate(mems)})
    save_file(tensors, out / "inputs.safetensors")
    return model, input_ids, mems


def tasks(model, input_ids, mems, lr: float) -> dict:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def forward():
        model.eval()
        with torch.no_grad():
            model(input_ids, mems=mems)

    def train():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        # labels: transformers shifts them inside and scores T - 1 positions.
        model(input_ids, mems=mems, labels=input_ids).loss.backward()
        optimizer.step()

    return {"forward": forward, "train": train}


def measure(fn, min_run_time: float, threads: int) -> list[float]:
    fn()  # warm-up (allocations, first-call dispatch)
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    return list(timer.blocked_autorange(min_run_time=min_run_time).times)


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--spec", required=True, help="JSON: config, seed, batch, seg_len, ...")
    args = parser.parse_args()
    spec = json.loads(args.spec)
    torch.set_num_threads(spec["threads"])

    model, input_ids, mems = build(spec, Path(args.out))
    fns = tasks(model, input_ids, mems, spec["lr"])
    print(json.dumps({"ready": True, "torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["task"] == "quit":
            break
        times = measure(fns[request["task"]], request["min_run_time"], spec["threads"])
        print(json.dumps({"times": times}), flush=True)


if __name__ == "__main__":
    main()
