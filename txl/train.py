"""Train a character-level Transformer-XL.

    python -m txl.train --data tinyshakespeare.txt --out runs/shakespeare
    torchrun --nproc_per_node 2 -m txl.train --data ... --out ...      # DDP (gloo / nccl)
    python -m txl.train --out runs/shakespeare --resume                 # continue exactly

Batches are consecutive segments of contiguous parallel streams, so the memory carried
from one step to the next (without gradient) is the text that really came before.
Every run writes to --out: run.json (the full configuration), log.jsonl (one line per
logged step and per validation), checkpoint/ (safetensors + JSON, resumable) and, at the
end, model/ (save_pretrained: config.json, model.safetensors, README.md model card),
loss_curve.png and eval.json.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import platform
import random
import shlex
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file, load_model, save_file, save_model
from tqdm.auto import tqdm

from .config import TXLConfig
from .data import StreamBatcher, load_text, train_val_split
from .evaluate import LN2, evaluate_loss, evaluate_model, format_table
from .model import TransformerXL
from .recall import progress_symbols, recall_progress
from .sampling import sample_next
from .tokenizer import CharTokenizer

MODEL_FIELDS = (
    "d_model",
    "n_layer",
    "n_head",
    "d_head",
    "d_inner",
    "dropout",
    "dropatt",
    "tgt_len",
    "mem_len",
    "clamp_len",
    "same_length",
    "pre_lnorm",
    "untie_r",
)


SLICE_SEGMENTS = 25  # the validation slice recorded for a fast re-check


@dataclasses.dataclass
class TrainArgs:
    data: str = ""
    out: str = ""
    download: bool = False
    batch: int = 32  # parallel streams (global, split across DDP ranks)
    steps: int = 5000
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup: int = 200
    weight_decay: float = 0.1
    beta2: float = 0.99
    grad_clip: float = 1.0
    seed: int = 1337
    eval_every: int = 500
    eval_segments: int = 60  # validation segments per stream at each periodic check
    sample_every: int = 1000
    ckpt_every: int = 250
    log_every: int = 10
    device: str = "auto"
    threads: int = 0
    half: bool = False  # store the final weights in float16
    time_budget: float = 0.0  # minutes of training; > 0: the schedule runs on time, then stops
    stop_after: int = 0  # > 0: stop after this step as if interrupted (resume continues it)
    mem_min: int = 0  # with mem_max: each step attends over a memory of random length in
    mem_max: int = 0  # [mem_min, mem_max] (0: always the config's mem_len), see memory_length
    mem_reset: float = 0.0  # this share of steps attend over no memory: a text starts afresh
    init_std: float = 0.02
    init_from: str = ""  # a model folder (save_pretrained) to start from: fine-tuning
    train_data: str = ""  # train on this text instead of --data's first 90 % (a recipe's
    # altered text, scripts/recall_data.py); validation stays --data's unaltered last 10 %
    bf16: bool = False  # bfloat16 autocast on the CPU too (fast where it has AMX/AVX-512 BF16)
    probe_every: int = 0  # > 0: every n steps, log the copy drill and the recall probe
    # (txl.recall.recall_progress), so the log shows when copying forms and reaches memory
    heading_weight: float = 1.0  # the loss on a character after a blank line (in a play,
    # a speaker heading's first letter: who speaks next) counts this many times, see
    # heading_weights
    heading_line: bool = False  # weight the whole line after a blank line (the speaker's
    # name, its colon and newline: the copy of a returning name), not its first letter alone


# What a resumed run may change: how long it goes on, and what it logs along the way.
RESUME_MAY_CHANGE = ("steps", "probe_every", "eval_every", "log_every", "ckpt_every", "threads")


# ---- the pieces ------------------------------------------------------------------------


def lr_at(step: int, a: TrainArgs, elapsed: float = 0.0) -> float:
    """Linear warmup, then cosine decay from lr to lr * min_lr_ratio at the end of the run.

    The end is the last step, or, with a time budget, when the budget is spent (whichever
    comes first), so a run on a slow or busy machine still anneals fully."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    progress = min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))
    if a.time_budget > 0:
        progress = max(progress, min(1.0, elapsed / (60 * a.time_budget)))
    return a.lr * (a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def memory_length(step: int, a: TrainArgs, mem_len: int) -> int:
    """How much of the carried memory step ``step`` attends over.

    Memory-length augmentation: a model that only ever saw mem_len cached positions has
    never had to spread attention over more keys than that. Drawing the length per step
    from [mem_min, mem_max] shows it memories both shorter and longer than the default.
    Deterministic per step, so --resume stays exact.

    With ``mem_reset``, that share of steps attends over none, so the memory after it holds
    only states computed without context, as at the start of a text. Carried memory never
    starts afresh otherwise (one stream runs through the whole text), and a model trained
    so does not copy a name written at the very start of a text, where the recall probe
    writes it (docs/recall-training.md, r1's phase 2c)."""
    if a.mem_max <= 0:
        return mem_len
    rng = random.Random(a.seed * 1_000_003 + step)
    if a.mem_reset > 0 and rng.random() < a.mem_reset:
        return 0
    return rng.randint(a.mem_min, a.mem_max)


def heading_weights(inputs: torch.Tensor, newline: int, weight: float,
                    line: bool = False) -> torch.Tensor:  # fmt: skip
    """Loss weights [B, T] for the targets of ``inputs`` [B, T]: ``weight`` where the
    target follows a blank line (inputs t-1 and t are both newlines), 1 elsewhere; with
    ``line``, for every target of that line too, through the newline that ends it.

    In a play the character after a blank line is a speaker heading's first letter: the
    choice of who speaks next, which memory should make (the scene's cast is in it): one
    target in ~146 of the recall recipes' text, 0.7 % of the mean loss. Weighting it asks
    the model to spend more of itself on that choice (issue 43). The rest of the heading
    is the copy of a returning speaker's name, which the model, writing, finishes exactly
    in under half of the headings whose first letter it took from the cast (the text: 91
    %): ``line`` weights that copy too. A segment's first target has its character before
    in the last segment and is never weighted, nor (``line``) the rest of a heading that
    began in the last segment."""
    is_newline = inputs == newline  # [B, T]
    first = torch.zeros_like(is_newline)  # the target after t is a heading's first letter
    first[:, 1:] = is_newline[:, 1:] & is_newline[:, :-1]
    weighted = first
    if line:  # ... and every target on to the newline that ends its line
        weighted = torch.zeros_like(is_newline)
        inside = torch.zeros(inputs.size(0), dtype=torch.bool)  # [B]: in a heading line
        for t in range(inputs.size(1)):  # a newline starts one (after a blank) or ends it
            inside = torch.where(is_newline[:, t], first[:, t], inside)
            weighted[:, t] = inside
    weights = torch.ones(inputs.shape, dtype=torch.float32)
    weights[weighted] = weight
    return weights


def make_optimizer(model: torch.nn.Module, a: TrainArgs) -> torch.optim.AdamW:
    """AdamW; matrices decay, while biases, LayerNorms and the u/v biases do not."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        is_bias_vector = name.split(".")[-1] in ("u", "v") or p.dim() < 2
        (no_decay if is_bias_vector else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": a.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, a.beta2))


@torch.no_grad()
def sample(
    model: TransformerXL, prompt: str, n: int, temperature: float = 0.8, seed: int = 0
) -> str:
    """A short sample with memory: feed the prompt, then one token per forward."""
    was_training = model.training
    model.eval()
    tok = model.tokenizer
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.tensor([tok.encode(prompt, errors="ignore") or [0]], device=device)
    out = model(ids)
    new = []
    for _ in range(n):
        nxt = sample_next(out.logits[0, -1].cpu(), temperature, generator=gen)
        new.append(int(nxt))
        out = model(nxt.view(1, 1).to(device), mems=out.mems)
    model.train(was_training)
    return prompt + tok.decode(new)


# ---- checkpoints: safetensors + JSON, never pickle --------------------------------------


def save_checkpoint(ckpt: Path, model, optimizer, mems, state: dict, rank: int) -> None:
    ckpt.mkdir(parents=True, exist_ok=True)
    if mems is not None:
        save_file(
            {f"mems.{i}": m.contiguous() for i, m in enumerate(mems)},
            ckpt / f"mems.rank{rank}.safetensors",
        )
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    save_file(rng, ckpt / f"rng.rank{rank}.safetensors")
    if rank != 0:
        return
    save_model(model, str(ckpt / "model.safetensors"))
    opt = optimizer.state_dict()
    tensors = {f"{i}.{k}": v for i, s in opt["state"].items() for k, v in s.items()}
    save_file(tensors, ckpt / "optimizer.safetensors")
    state = dict(state, param_groups=opt["param_groups"])
    tmp = ckpt / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(ckpt / "state.json")  # state.json last: a checkpoint is complete when it exists


def load_checkpoint(ckpt: Path, model, optimizer, rank: int):
    """Restore a checkpoint. Without optimizer.safetensors (a checkpoint kept small to be
    committed: scripts/train_recall.py --save), AdamW's moments start afresh; without the
    memory file, the next segment starts with empty memory."""
    state = json.loads((ckpt / "state.json").read_text())
    load_model(model, str(ckpt / "model.safetensors"))
    if (ckpt / "optimizer.safetensors").exists():
        tensors = load_file(ckpt / "optimizer.safetensors")
        opt_state: dict[int, dict] = {}
        for key, value in tensors.items():
            idx, name = key.split(".", 1)
            opt_state.setdefault(int(idx), {})[name] = value
        optimizer.load_state_dict({"state": opt_state, "param_groups": state["param_groups"]})
    else:
        print(f"{ckpt}: no optimizer state; AdamW's moments start afresh at step {state['step']}")
    mems_file = ckpt / f"mems.rank{rank}.safetensors"
    mems = None
    if mems_file.exists():
        t = load_file(mems_file)
        mems = [t[f"mems.{i}"] for i in range(len(t))]
    rng = load_file(ckpt / f"rng.rank{rank}.safetensors")
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return state, mems


# ---- the model card ---------------------------------------------------------------------


def write_model_card(path: Path, info: dict) -> None:
    cfg = info["config"]
    ev = info["eval"]
    w, wo = ev["with_memory"], ev["without_memory"]
    card = f"""---
library_name: txl
license: mit
pipeline_tag: text-generation
tags:
- transformer-xl
- character-level
- text-generation
datasets:
- tiny_shakespeare
metrics:
- bpc
model-index:
- name: {info["name"]}
  results:
  - task:
      type: text-generation
    dataset:
      name: Tiny Shakespeare (last 10 %)
      type: tiny_shakespeare
    metrics:
    - type: loss
      value: {w["loss"]:.4f}
      name: validation loss with memory (nats/char)
    - type: bpc
      value: {w["bpc"]:.4f}
      name: validation bits per character with memory
---

# {info["name"]}: a character-level Transformer-XL on Tiny Shakespeare

A {info["n_params"] / 1e6:.2f}M-parameter Transformer-XL (Dai et al., 2019) trained with
[txl](https://github.com/txl-project/txl): relative positional attention with the u and v
biases, and a memory of {cfg["mem_len"]} cached hidden states per layer carried across
segments of {cfg["tgt_len"]} characters.

## Results (validation: the last 10 % of Tiny Shakespeare, {ev["tokens"]:,} characters)

| reading | loss (nats/char) | bits/char |
|---|---:|---:|
| with memory (mem_len {cfg["mem_len"]}) | {w["loss"]:.4f} | {w["bpc"]:.4f} |
| without memory (each {cfg["tgt_len"]}-char segment alone) | {wo["loss"]:.4f} | {wo["bpc"]:.4f} |

Against segments read alone (the first characters of each guessed with nothing before
them), memory saves {wo["loss"] - w["loss"]:.4f} nats per character. The fair baseline is a
sliding window recomputed for every character: compare with
`python -m txl.evaluate --model <this folder> --data tinyshakespeare.txt --positions 2000:12000
--sliding {cfg["tgt_len"]},{cfg["tgt_len"] + cfg["mem_len"]}`.

Memory-length sweep (`python -m txl.evaluate --model <this folder> --data tinyshakespeare.txt`):

{format_table(ev)}

## Training

- data: Tiny Shakespeare ({info["n_chars"]:,} characters); train = first 90 %, validation =
  last 10 % (nanoGPT's split); vocabulary = the {cfg["vocab_size"]} characters of the text
- model: d_model {cfg["d_model"]}, {cfg["n_layer"]} layers, {cfg["n_head"]} heads x {cfg["d_head"]},
  d_inner {cfg["d_inner"]}, dropout {cfg["dropout"]}, dropatt {cfg["dropatt"]},
  pre_lnorm {cfg["pre_lnorm"]}, clamp_len {cfg["clamp_len"]}, same_length {cfg["same_length"]}
- steps: {info["steps"]:,} of {info["batch"]} streams x {cfg["tgt_len"]} characters
  ({info["tokens_seen"]:,} tokens seen); AdamW, lr {info["lr"]}, warmup {info["warmup"]},
  cosine decay, weight decay {info["weight_decay"]}, gradient clip {info["grad_clip"]}
- wall time: {info["wall_minutes"]:.1f} minutes on {info["hardware"]}
- weights stored as {info["dtype"]}
- command: `{info["command"]}`

{"![loss curve](loss_curve.png)" if info.get("loss_curve", True) else ""}

## Sample (temperature 0.8, with memory)

```
{info["sample"]}
```

## Use

```python
from txl import TransformerXL
model = TransformerXL.from_pretrained("weights/shakespeare-char")
ids = model.tokenizer.encode("ROMEO:")
```
"""
    path.write_text(card)


def plot_loss_curve(log_file: Path, png: Path) -> bool:
    """The losses of log.jsonl as a PNG; False, and nothing written, without matplotlib (the
    app's extra, ``pip install .[app]``: the model package itself does not need it)."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), lw=0.8, alpha=0.7, label="train (with memory)")
    if val:
        ax.plot(*zip(*val), "o-", label="validation (with memory)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/char)")
    ax.set_ylim(top=min(3.0, ax.get_ylim()[1]))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


class RunLog:
    """log.jsonl: one JSON object per line. On resume, lines past the checkpoint go."""

    def __init__(self, path: Path, keep_until: int):
        lines = path.read_text().splitlines() if path.exists() else []
        kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= keep_until]
        path.write_text("".join(line + "\n" for line in kept))
        self.file = path.open("a")

    def write(self, **fields) -> None:
        self.file.write(json.dumps(fields) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def cpu_has_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX), read from
    /proc/cpuinfo's flags; None where they cannot be read (not Linux). Without them,
    bfloat16 autocast is emulated: a training step ran ~10x slower than in float32 on a
    2-core AMD EPYC with AVX2 (12-05), where an AVX-512 BF16 Xeon ran it faster."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    if not flags:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def hardware_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


# ---- the run ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m txl.train", description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, help="JSON file of model and training settings")
    p.add_argument("--resume", action="store_true", help="continue from --out/checkpoint")
    for f in dataclasses.fields(TrainArgs):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            p.add_argument(flag, action="store_true", default=None)
        else:
            kind = {"int": int, "float": float, "str": str}[str(f.type)]
            p.add_argument(flag, type=kind, default=None)
    for name in MODEL_FIELDS:
        f = next(x for x in dataclasses.fields(TXLConfig) if x.name == name)
        flag = "--" + name.replace("_", "-")
        if str(f.type) == "bool":
            p.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=None)
        else:
            p.add_argument(flag, type=int if str(f.type) == "int" else float, default=None)
    return p


def resolve_settings(ns: argparse.Namespace) -> tuple[TrainArgs, dict]:
    """Defaults < --config JSON < command-line flags."""
    from_file = json.loads(ns.config.read_text()) if ns.config else {}
    train_kw = {
        f.name: from_file[f.name] for f in dataclasses.fields(TrainArgs) if f.name in from_file
    }
    model_kw = {k: from_file[k] for k in MODEL_FIELDS if k in from_file}
    unknown = set(from_file) - set(train_kw) - set(model_kw)
    if unknown:
        raise SystemExit(f"unknown settings in {ns.config}: {', '.join(sorted(unknown))}")
    for f in dataclasses.fields(TrainArgs):
        if getattr(ns, f.name) is not None:
            train_kw[f.name] = getattr(ns, f.name)
    for k in MODEL_FIELDS:
        if getattr(ns, k) is not None:
            model_kw[k] = getattr(ns, k)
    args = TrainArgs(**train_kw)
    if not args.out:
        raise SystemExit("--out is required")
    return args, model_kw


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    out = Path(ns.out) if ns.out else None
    if ns.resume and out and (out / "run.json").exists():
        saved = json.loads((out / "run.json").read_text())
        args, model_kw = TrainArgs(**saved["train"]), saved["model"]
        args.out = ns.out  # the run is where it is now, also when its folder was moved
        for name in RESUME_MAY_CHANGE:
            if getattr(ns, name) is not None:
                setattr(args, name, getattr(ns, name))
    else:
        args, model_kw = resolve_settings(ns)
        if not args.data:
            raise SystemExit("--data is required")
    command = shlex.join([sys.executable, "-m", "txl.train", *(argv or sys.argv[1:])])
    train(args, model_kw, resume=ns.resume, command=command)
    return 0


def train(
    args: TrainArgs, model_kw: dict, resume: bool = False, command: str = ""
) -> TransformerXL:
    """Run (or resume) training as configured; returns this process's trained model."""
    if args.heading_line and args.heading_weight == 1.0:  # else it would quietly do nothing
        raise SystemExit("--heading-line weights the heading's line by --heading-weight: give one")
    out = Path(args.out)

    # Processes: one, or DDP under torchrun (each rank its own share of the streams).
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if world > 1:
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    if args.threads:
        torch.set_num_threads(args.threads)
    main_proc = rank == 0
    if main_proc and args.bf16 and device == "cpu" and cpu_has_bf16() is False:
        print(
            "--bf16: this CPU has neither AVX-512 BF16 nor AMX, so bfloat16 autocast is "
            "emulated and runs several times slower than float32 here (bf16: false)"
        )

    text = load_text(args.data, download=args.download)
    train_text, val_text = train_val_split(text)
    tokenizer = CharTokenizer.from_text(text)
    cfg = TXLConfig(vocab=tokenizer.vocab, **model_kw)
    if args.train_data:
        train_text = load_text(args.train_data)
    train_ids = torch.tensor(tokenizer.encode(train_text), dtype=torch.long)
    val_ids = torch.tensor(tokenizer.encode(val_text), dtype=torch.long)
    batcher = StreamBatcher(train_ids, args.batch, cfg.tgt_len, rank, world)
    newline = tokenizer.stoi.get("\n")
    if args.heading_weight != 1.0 and newline is None:
        raise SystemExit("--heading-weight: the text has no newlines, so no headings to weight")
    missing = args.probe_every and "".join(tokenizer.unknown_symbols(progress_symbols(val_text)))
    if missing:
        raise SystemExit(f"--probe-every: the text lacks characters the probes use: {missing!r}")

    torch.manual_seed(args.seed)
    model = TransformerXL(cfg)
    model.reset_parameters(args.init_std)
    if args.init_from and not resume:  # a checkpoint holds the weights; its start may be gone
        start_from = TransformerXL.from_pretrained(args.init_from)
        if start_from.config.vocab != cfg.vocab:
            raise SystemExit(f"--init-from {args.init_from}: its vocabulary differs from --data's")
        model.load_state_dict(start_from.state_dict())
    model.to(device)
    optimizer = make_optimizer(model, args)
    n_params = sum(p.numel() for p in model.parameters())

    ckpt = out / "checkpoint"
    start, mems, elapsed, tokens_seen = 0, None, 0.0, 0
    if resume:
        if not (ckpt / "state.json").exists():
            raise SystemExit(f"--resume: no checkpoint at {ckpt}")
        state, mems = load_checkpoint(ckpt, model, optimizer, rank)
        start, elapsed, tokens_seen = state["step"], state["elapsed"], state["tokens_seen"]
        mems = None if mems is None else [m.to(device) for m in mems]
    elif main_proc:
        out.mkdir(parents=True, exist_ok=True)
        run = {
            "train": dataclasses.asdict(args),
            "model": model_kw,
            "config": cfg.to_dict(),
            "command": command,
            "world_size": world,
            "n_params": n_params,
        }
        (out / "run.json").write_text(json.dumps(run, indent=2))

    ddp = model
    if world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
    on_cuda = device.startswith("cuda")
    autocast = torch.autocast(
        "cuda" if on_cuda else "cpu", dtype=torch.bfloat16, enabled=on_cuda or args.bf16
    )
    log = RunLog(out / "log.jsonl", keep_until=start) if main_proc else None
    tokens_per_step = args.batch * cfg.tgt_len
    bar = tqdm(total=args.steps, initial=start, disable=not main_proc, dynamic_ncols=True)

    def checkpoint(step: int) -> None:
        state = {"step": step, "elapsed": elapsed, "tokens_seen": tokens_seen}
        save_checkpoint(ckpt, model, optimizer, mems, state, rank)

    model.train()
    t_last = time.perf_counter()
    done = start
    for step in range(start, args.steps):
        batch = batcher.segment(step)
        if batch.first:
            mems = None  # a new pass over the streams starts from empty memory
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args, elapsed)
        if mems is not None:  # attend over the newest memory_length positions only
            use = memory_length(step, args, cfg.mem_len)
            mems = [m[:, m.size(1) - min(use, m.size(1)) :] for m in mems]
        with autocast:
            out_ = ddp(batch.inputs.to(device), mems=mems, mem_len=max(cfg.mem_len, args.mem_max))
            nll = F.cross_entropy(  # [B * T]
                out_.logits.float().flatten(0, 1),
                batch.targets.to(device).flatten(),
                reduction="none",
            )
            loss = nll.mean()  # what the log shows: the plain mean, whatever the weights
            trained = loss
            if args.heading_weight != 1.0:
                w = heading_weights(batch.inputs, newline, args.heading_weight,
                                    args.heading_line).to(device)  # fmt: skip
                trained = (w.flatten() * nll).sum() / w.sum()
        optimizer.zero_grad(set_to_none=True)
        trained.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        mems = out_.mems
        tokens_seen += tokens_per_step

        now = time.perf_counter()
        elapsed += now - t_last
        tok_s = tokens_per_step / max(1e-9, now - t_last)
        t_last = now
        done = step + 1
        if main_proc:
            bar.update(1)
            if done % args.log_every == 0 or done == args.steps:
                bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tok_s:,.0f}")
                log.write(
                    step=done,
                    loss=round(loss.item(), 5),
                    lr=lr_at(step, args, elapsed),
                    tokens=tokens_seen,
                    elapsed=round(elapsed, 2),
                    tok_s=round(tok_s, 1),
                )
            if done % args.eval_every == 0 or done == args.steps:
                vl = evaluate_loss(model, val_ids, cfg.tgt_len, cfg.mem_len, 8, args.eval_segments)
                log.write(step=done, val_loss=round(vl, 5), val_bpc=round(vl / LN2, 5))
                bar.write(f"step {done}: val loss {vl:.4f} nats, {vl / LN2:.4f} bpc")
            if args.probe_every and done % args.probe_every == 0:
                # On the CPU: the probes read one short text at a time.
                probe_model = model if device == "cpu" else copy.deepcopy(model).cpu()
                log.write(step=done, tokens=tokens_seen, **recall_progress(probe_model, val_text))
            if done % args.sample_every == 0:
                bar.write("---- sample ----\n" + sample(model, "\n", 200, seed=done) + "\n----")
            t_last = time.perf_counter()  # validation and samples do not count as training time
        out_of_time = args.time_budget > 0 and elapsed >= 60 * args.time_budget
        if world > 1:  # every rank stops at the same step
            flag = torch.tensor([float(out_of_time)], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            out_of_time = bool(flag.item())
        if done % args.ckpt_every == 0 or done == args.steps or out_of_time:
            checkpoint(done)
        if out_of_time:
            args.steps = done
            break
        if done == args.stop_after:
            checkpoint(done)
            break  # as if interrupted: no final model; --resume continues from here
    bar.close()

    interrupted = done == args.stop_after and done < args.steps  # --stop-after: no model yet
    if main_proc and not interrupted:
        finish(model, out, args, cfg, val_text, text, n_params, tokens_seen, elapsed, log)
    elif main_proc:
        log.close()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return model


def finish(model, out, args, cfg, val_text, text, n_params, tokens_seen, elapsed, log) -> None:
    """Final evaluation, save_pretrained, model card, loss curve and log beside it."""
    log.close()
    run = json.loads((out / "run.json").read_text())
    model = model.cpu().eval()
    if args.half:
        model = model.half().float()  # evaluate exactly what float16 storage will give back
    result = evaluate_model(model, val_text)
    # A quick reading that CI can repeat: the first SLICE_SEGMENTS segments of 8 streams.
    val_ids = torch.tensor(model.tokenizer.encode(val_text), dtype=torch.long)
    result["slice"] = {
        "n_streams": 8,
        "max_segments": SLICE_SEGMENTS,
        "mem_len": cfg.mem_len,
        "loss": evaluate_loss(model, val_ids, cfg.tgt_len, cfg.mem_len, 8, SLICE_SEGMENTS),
    }
    (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    model_dir = out / "model"
    if args.half:
        model.half()
    model.save_pretrained(model_dir)
    model.float()
    loss_curve = plot_loss_curve(out / "log.jsonl", model_dir / "loss_curve.png")
    if not loss_curve:
        print("loss_curve.png: not drawn, matplotlib is not installed (pip install matplotlib)")
    shutil.copy(out / "log.jsonl", model_dir / "log.jsonl")
    shutil.copy(out / "eval.json", model_dir / "eval.json")
    info = {
        "name": "shakespeare-char",
        "config": cfg.to_dict(),
        "eval": result,
        "n_params": n_params,
        "n_chars": len(text),
        "steps": args.steps,
        "batch": args.batch,
        "tokens_seen": tokens_seen,
        "lr": args.lr,
        "warmup": args.warmup,
        "weight_decay": args.weight_decay,
        "grad_clip": args.grad_clip,
        "wall_minutes": elapsed / 60,
        "hardware": hardware_name(),
        "loss_curve": loss_curve,
        "dtype": "float16" if args.half else "float32",
        "command": run["command"],
        "sample": sample(model, "\n", 400, seed=0),
    }
    write_model_card(model_dir / "README.md", info)
    print(f"saved {model_dir}")


if __name__ == "__main__":
    sys.exit(main())
