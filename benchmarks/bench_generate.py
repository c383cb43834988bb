"""How fast does a Session generate? Three questions, answered side by side in one run.

    .venv/bin/python benchmarks/bench_generate.py [--quick] [--profile]

a. A cached step (memory on: one new token over a KV memory of L - 1 positions) against
   recomputing the whole window of L tokens at every step (memory off), L = 128, 512, 2048.
b. Step generation against the reference, Hugging Face's TransfoXLLMHeadModel
   (transformers 4.37.2 in .venv-peer, or $TXL_PEER_PYTHON), with the same weights
   (converted by txl.convert): one token per call, memory full, greedy, mem_len 256 and 512.
   The reference runs in a subprocess of its python that times itself the same way
   (torch.utils.benchmark) and answers JSON; its rounds alternate with ours.
c. What capturing the attention costs: a step with capture on against one with it off.
--profile: instead, where a step's time goes (torch.profiler): aten calls per token and
   the top ops by self time, for Session.step and for cached_forward alone.

Demo size (6 layers, d_model 256, 8 heads x 32, d_inner 1024, vocab 65), random weights,
fp32, 2 threads (--threads). Every figure is a median of torch.utils.benchmark blocks,
the columns measured in alternating rounds. The machine is shared: compare the columns
of one run, not runs with each other.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils import benchmark

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from txl import TransformerXL, TXLConfig  # noqa: E402
from txl.cached import cached_forward  # noqa: E402
from txl.session import Session  # noqa: E402

THREADS = 2
VOCAB = list("\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")  # 65
DEMO = dict(d_model=256, n_layer=6, n_head=8, d_head=32, d_inner=1024, tgt_len=64,
            mem_len=256, dropout=0.0)
HF_CONFIG = dict(vocab_size=len(VOCAB), cutoffs=[], div_val=1, d_model=256, d_embed=256,
                 n_head=8, d_head=32, d_inner=1024, n_layer=6, mem_len=256, clamp_len=-1,
                 same_length=False, attn_type=0, pre_lnorm=False, untie_r=True, dropout=0.0,
                 dropatt=0.0)

# Runs under the reference's python as a small server, so that its timings and ours can
# alternate (the machine's load drifts): builds the model, saves it for us to convert,
# then for each line "MEM_LEN MIN_RUN_TIME" times one greedy token per call with a full
# memory of MEM_LEN and answers one line of JSON.
PEER_SCRIPT = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
from torch.utils import benchmark
from transformers import TransfoXLConfig, TransfoXLLMHeadModel

spec = json.loads(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(spec["threads"])
model = TransfoXLLMHeadModel(TransfoXLConfig(**spec["config"])).eval()
model.save_pretrained(spec["out"], safe_serialization=True)
ids = torch.tensor([spec["ids"]])
empty = [torch.zeros(0, 1, spec["config"]["d_model"])] * spec["config"]["n_layer"]


@torch.no_grad()
def time_steps(mem_len, min_run_time):
    model.transformer.mem_len = mem_len  # how many positions the new mems keep
    out = model(ids[:, :mem_len], mems=empty)  # fill the memory: mem_len positions
    state = {"mems": out.mems, "token": out.prediction_scores[:, -1:].argmax(-1)}

    def step():
        out = model(state["token"], mems=state["mems"])
        state["mems"] = out.mems
        state["token"] = out.prediction_scores[:, -1:].argmax(-1)

    timer = benchmark.Timer("step()", globals={"step": step}, num_threads=spec["threads"])
    return timer.blocked_autorange(min_run_time=min_run_time).median


with torch.no_grad():  # log-probabilities after the whole prefix, to check the weights
    check = model(ids, mems=empty).prediction_scores[0, -1].tolist()
print(json.dumps({"check": check}), flush=True)
for line in sys.stdin:
    mem_len, min_run_time = line.split()
    median = time_steps(int(mem_len), float(min_run_time))
    print(json.dumps({"median_s": median}), flush=True)
"""


class Reference:
    """The reference model in a subprocess of its own python; see PEER_SCRIPT."""

    def __init__(self, python: str, out: Path, ids: list[int], threads: int):
        spec = dict(config=HF_CONFIG, out=str(out), ids=ids, threads=threads)
        self.proc = subprocess.Popen(
            [python, "-c", PEER_SCRIPT, json.dumps(spec)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.check = self._answer()["check"]

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise RuntimeError(f"the reference failed:\n{self.proc.stderr.read()[-3000:]}")
        return json.loads(line)

    def time_step(self, mem_len: int, min_run_time: float) -> float:
        self.proc.stdin.write(f"{mem_len} {min_run_time}\n")
        self.proc.stdin.flush()
        return self._answer()["median_s"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def timed(fn, min_run_time: float) -> float:
    """Median seconds per call of fn, over torch.utils.benchmark blocks."""
    timer = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median


def side_by_side(measures: dict, rounds: int) -> dict[str, float]:
    """Run each measure (a function returning seconds) once per round, alternating, and
    return the median per measure: a drift in the machine's load hits all of them alike."""
    times = {name: [] for name in measures}
    for _ in range(rounds):
        for name, measure in measures.items():
            times[name].append(measure())
    return {name: statistics.median(t) for name, t in times.items()}


def random_text(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(VOCAB) for _ in range(n))


def session(model: TransformerXL, memory: bool, context: int, text: str | None = None) -> Session:
    """A greedy session whose next step attends over `context` keys: memory on, a full
    memory of context - 1 positions plus the new token; off, a window of context tokens."""
    if memory:
        s = Session(model, memory=True, mem_len=context - 1, seg_len=64, temperature=0)
    else:
        s = Session(model, memory=False, seg_len=context, temperature=0)
    s.start((text or random_text(context))[: context - 1 if memory else context])
    # The cached step alone: not the memory-off counterfactual the app shows beside it
    # (txl/predictions.py; benchmarks/bench_predictions.py measures that).
    s.counterfactual = False
    return s


def step_timer(s: Session, min_run_time: float, capture: bool = False):
    return lambda: timed(lambda: s.step(capture=capture), min_run_time)


# ---- a. cached step vs recomputing the window ---------------------------------------------


def bench_cached_vs_recompute(model, lengths: list[int], min_run_time: float, rounds: int):
    print("\na. one token: cached step (KV memory of L-1) vs recomputing the window of L")
    print(f"{'L':>6} {'cached ms':>10} {'recompute ms':>13} {'ratio':>8}")
    for L in lengths:
        cached = session(model, memory=True, context=L)
        recompute = session(model, memory=False, context=L)
        t = side_by_side({"cached": step_timer(cached, min_run_time),
                          "recompute": step_timer(recompute, min_run_time)}, rounds)
        assert cached.last_trace.n_memory == L - 1 and len(recompute.last_trace.key_positions) == L
        print(f"{L:>6} {t['cached'] * 1e3:>10.3f} {t['recompute'] * 1e3:>13.2f} "
              f"{t['recompute'] / t['cached']:>7.1f}x")


# ---- b. against the reference ---------------------------------------------------------


def peer_python() -> str | None:
    python = os.environ.get("TXL_PEER_PYTHON", str(ROOT / ".venv-peer" / "bin" / "python"))
    return python if Path(python).exists() else None


def with_vocab(model: TransformerXL) -> TransformerXL:
    """The converted model (ids only) with the demo's character vocabulary on top."""
    config = TXLConfig.from_dict({**model.config.to_dict(), "vocab": VOCAB, "vocab_size": 0})
    ours = TransformerXL(config)
    ours.load_state_dict(model.state_dict())
    return ours.eval()


def bench_reference(mem_lens: list[int], min_run_time: float, rounds: int):
    """Prints the comparison; returns our model with the reference's weights (or None)."""
    print("\nb. greedy generation, one token per call, memory full: ours vs the reference")
    python = peer_python()
    if python is None:
        print("   skipped: no reference python (.venv-peer or $TXL_PEER_PYTHON)")
        return None
    from txl.convert import convert_folder

    prefix = random_text(max(mem_lens), seed=1)
    ids = [VOCAB.index(c) for c in prefix]
    with tempfile.TemporaryDirectory() as tmp:
        reference = Reference(python, Path(tmp) / "hf", ids, torch.get_num_threads())
        try:
            model = with_vocab(convert_folder(Path(tmp) / "hf", Path(tmp) / "txl"))
            # Same weights, same numbers: log-probabilities after the prefix, in one forward.
            s = session(model, memory=True, context=len(ids) + 1, text=prefix)
            diff = (s.next_logits.log_softmax(-1) - torch.tensor(reference.check)).abs().max()
            print(f"   same weights: max |log p ours - log p reference| = {diff.item():.1e}")
            print(f"{'mem_len':>8} {'ours ms':>9} {'ours tok/s':>11} {'ref ms':>8} "
                  f"{'ref tok/s':>10} {'ours/ref':>9}")
            for mem_len in mem_lens:
                s = session(model, memory=True, context=mem_len + 1, text=prefix)
                t = side_by_side({
                    "ours": step_timer(s, min_run_time),
                    "ref": lambda m=mem_len: reference.time_step(m, min_run_time),
                }, rounds)
                print(f"{mem_len:>8} {t['ours'] * 1e3:>9.3f} {1 / t['ours']:>11.0f} "
                      f"{t['ref'] * 1e3:>8.3f} {1 / t['ref']:>10.0f} "
                      f"{t['ref'] / t['ours']:>8.1f}x")
        finally:
            reference.close()
    return model


# ---- c. the cost of capturing attention ---------------------------------------------------


def bench_capture(model: TransformerXL, mem_len: int, min_run_time: float, rounds: int):
    print(f"\nc. attention capture, memory on, mem_len {mem_len} full")
    s = session(model, memory=True, context=mem_len + 1)
    t = side_by_side({"off": step_timer(s, min_run_time, capture=False),
                      "on": step_timer(s, min_run_time, capture=True)}, rounds)
    print(f"   capture off {t['off'] * 1e3:.3f} ms, on {t['on'] * 1e3:.3f} ms: "
          f"{(t['on'] / t['off'] - 1) * 100:+.1f} %")


# ---- --profile: where a step's time goes ----------------------------------------------------


def bench_profile(model: TransformerXL, mem_len: int, steps: int, top: int = 12):
    """aten calls per token and the top ops by self CPU time, memory of mem_len full."""
    from torch.profiler import ProfilerActivity, profile

    s = session(model, memory=True, context=mem_len + 1)
    memory, token = s.kv.clone(), torch.tensor([[s.ids[-1]]])

    def model_step():  # the model alone: one token over a full memory, which stays full
        cached_forward(model, token, memory, mem_len=mem_len, last_only=True)

    for name, fn in (("Session.step()", s.step), ("cached_forward(model, 1 token)", model_step)):
        for _ in range(20):  # warm-up: caches, allocator
            fn()
        ms = timed(fn, 1.0) * 1e3
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                fn()
        events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
        calls = sum(e.count for e in events) / steps
        total = sum(e.self_cpu_time_total for e in events)
        print(f"\n{name}, mem_len {mem_len} full: {ms:.3f} ms/token (unprofiled), "
              f"{calls:.0f} aten calls/token, aten self time {total / steps / 1e3:.3f} ms/token")
        print(f"{'op':36s} {'calls/token':>11s} {'self us/token':>14s} {'share':>6s}")
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
            print(f"{e.key:36s} {e.count / steps:11.1f} {e.self_cpu_time_total / steps:14.1f} "
                  f"{e.self_cpu_time_total / total:6.1%}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one short round (noisy): a smoke test")
    p.add_argument("--threads", type=int, default=THREADS, help=f"default {THREADS}")
    p.add_argument("--profile", action="store_true",
                   help="only profile a step at mem_len 512 (aten calls, top ops)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.profile:
        torch.manual_seed(0)
        model = TransformerXL(TXLConfig(vocab=VOCAB, **DEMO)).eval()
        print(f"torch {torch.__version__}, {args.threads} threads, fp32, demo size")
        bench_profile(model, 512, steps=50)
        return 0
    min_run_time, rounds = (0.3, 1) if args.quick else (1.0, 5)
    print(f"torch {torch.__version__}, {args.threads} threads, fp32; each figure: the median "
          f"of {rounds} round(s) of {min_run_time} s, the columns alternating")

    # b first: it also gives us the reference's weights for a and c.
    model = bench_reference([256, 512], min_run_time, rounds)
    if model is None:
        torch.manual_seed(0)
        model = TransformerXL(TXLConfig(vocab=VOCAB, **DEMO)).eval()
    bench_cached_vs_recompute(model, [128, 512, 2048], min_run_time, rounds)
    bench_capture(model, 256, min_run_time, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
