"""Widen a model without changing what it computes: more heads and more feed-forward units,
each a copy of one of the model's, the copies' outputs shared out (Net2WiderNet: Chen,
Goodfellow and Shlens 2016, "Net2Net", arXiv 1511.05641).

    .venv/bin/python scripts/widen_model.py weights/shakespeare-char --out runs/wide/start \\
        --heads 2 --inner 2 --noise 1e-3

A larger model for issue 43 without training one from scratch: every recipe of the recall
plan since phase 22 writes 21-28 % of the cast (docs/recall-training.md), and a larger
model is the lever left. With ``--heads 2`` each head gets a twin with the same q, k, v,
position keys W_r and biases u, v, so it attends exactly as its original, and the two
columns of W_o that read the pair are each half the original's: their sum is what the head
gave. With ``--inner 2`` each feed-forward unit gets a twin (the same row of W_1 and b_1,
so the same ReLU) and W_2's two columns are halved. d_model and d_head are kept, so every
LayerNorm sees the same vector and every position key keeps its meaning.

Twins must drift apart in training to be worth their cost, and they would not by
themselves: they receive the same gradient, and Adam's update does not depend on its
scale. ``--noise`` adds N(0, (noise * std)^2) to the twins' incoming weights (their rows of
q, k, v, W_r and W_1; std that weight's own), which moves the function a little; the script
prints how much (the largest change of a next-character probability over a text's first
segments) and the parameter counts.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from txl import TransformerXL  # noqa: E402


def _twin_rows(w: torch.Tensor, groups: int, copies: int) -> torch.Tensor:
    """[groups * g, ...] -> [copies * groups * g, ...]: the groups (heads, or single
    units) repeated whole, copy c of group i at row block c * groups + i."""
    return w.view(groups, -1, *w.shape[1:]).repeat(copies, *[1] * w.dim()).flatten(0, 1)


def widen(
    model: TransformerXL, heads: int = 2, inner: int = 2, noise: float = 0.0, seed: int = 0
) -> TransformerXL:
    """A model with ``heads`` times the heads and ``inner`` times the feed-forward units,
    computing what ``model`` computes (exactly when ``noise`` is 0; float32)."""
    if heads < 1 or inner < 1:
        raise ValueError(f"heads and inner must be >= 1, got {heads} and {inner}")
    c = model.config
    H, Dh = c.n_head, c.d_head
    wide = TransformerXL(replace(c, n_head=H * heads, d_inner=c.d_inner * inner))
    gen = torch.Generator().manual_seed(seed)

    def jitter(w: torch.Tensor, original_rows: int) -> torch.Tensor:
        """Noise on the twins' rows (every row after the first ``original_rows``)."""
        if noise:
            twins = w[original_rows:]
            std = float(w[:original_rows].float().std())
            twins += noise * std * torch.randn(twins.shape, generator=gen, dtype=w.dtype)
        return w

    state = {}
    for name, w in model.state_dict().items():
        w = w.float()
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("attn.qkv.weight"):  # [3 H Dh, d]: q, k, v, each head's Dh rows
            q, k, v = w.chunk(3)
            twins = [jitter(_twin_rows(t, H, heads), H * Dh) for t in (q, k, v)]
            state[name] = torch.cat(twins)
        elif name.endswith("attn.r_proj.weight"):  # W_r: [H Dh, d]
            state[name] = jitter(_twin_rows(w, H, heads), H * Dh)
        elif name.endswith("attn.out.weight"):  # W_o: [d, H Dh], each pair's columns halved
            state[name] = _twin_rows(w.T, H, heads).T / heads
        elif leaf in ("u", "v"):  # [H, Dh]: a twin's biases are its original's
            state[name] = _twin_rows(w, H, heads)
        elif name.endswith("ff.fc1.weight"):  # W_1: [d_inner, d]
            state[name] = jitter(_twin_rows(w, c.d_inner, inner), c.d_inner)
        elif name.endswith("ff.fc1.bias"):  # b_1: [d_inner]
            state[name] = _twin_rows(w, c.d_inner, inner)
        elif name.endswith("ff.fc2.weight"):  # W_2: [d, d_inner], each pair's columns halved
            state[name] = _twin_rows(w.T, c.d_inner, inner).T / inner
        else:  # embedding, norms, output bias, fc2's bias: d_model is kept
            state[name] = w
    wide.load_state_dict(state)
    return wide.eval()


@torch.no_grad()
def largest_change(a: TransformerXL, b: TransformerXL, ids: torch.Tensor, segments: int) -> float:
    """The largest change of a next-token probability between a and b reading ``ids`` [L]
    in segments of tgt_len with memory (model.mem_len), over the first ``segments``."""
    worst, mems_a, mems_b, T = 0.0, None, None, a.config.tgt_len
    for s in range(segments):
        x = ids[s * T : (s + 1) * T].view(1, -1)
        if x.numel() == 0:
            break
        out_a, out_b = a(x, mems=mems_a), b(x, mems=mems_b)
        mems_a, mems_b = out_a.mems, out_b.mems
        diff = out_a.logits.softmax(-1) - out_b.logits.softmax(-1)
        worst = max(worst, float(diff.abs().max()))
    return worst


@torch.no_grad()
def twins_apart(wide: TransformerXL, heads: int = 2, inner: int = 2) -> list[dict]:
    """How far training set each layer's twins apart: ||original - twin|| / ||original||
    over the queries of the heads (``heads``: the times ``widen`` multiplied them) and over
    W_1's rows of the feed-forward units, per layer. 0 for twins still identical (so the
    wider model is still the narrow one); ``--noise`` is where they start."""
    c = wide.config
    if heads < 1 or inner < 1 or c.n_head % heads or c.d_inner % inner:
        raise ValueError(
            f"{c.n_head} heads and d_inner {c.d_inner}: not --heads {heads} / --inner {inner} "
            "times a narrower model"
        )
    H, Dh, F = c.n_head // heads, c.d_head, c.d_inner // inner

    def apart(w: torch.Tensor, originals: int) -> float:  # rows: originals, then twins
        w = w.float()
        first = w[:originals]
        twins = w[originals:].view(-1, *first.shape)  # [copies - 1, originals, ...]
        return float((twins - first).norm() / (first.norm() * len(twins) ** 0.5))

    out = []
    for layer in wide.layers:
        q = layer.attn.qkv.weight.chunk(3)[0]  # [heads H Dh, d]
        out.append({
            "heads": apart(q, H * Dh) if heads > 1 else 0.0,
            "ff": apart(layer.ff.fc1.weight, F) if inner > 1 else 0.0,
        })  # fmt: skip
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path, help="a model folder (config + safetensors)")
    p.add_argument("--out", type=Path, help="where the wider model goes")
    p.add_argument(
        "--apart", action="store_true", help="read how far a widened MODEL's twins are apart"
    )
    p.add_argument("--heads", type=int, default=2, help="times the heads (default 2)")
    p.add_argument("--inner", type=int, default=2, help="times the FF units (default 2)")
    p.add_argument("--noise", type=float, default=1e-3, help="on the twins, x each std")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text", type=Path, help="read the change on this text (default: random)")
    args = p.parse_args(argv)
    if not args.apart and args.out is None:
        p.error("--out is required (or --apart to read a widened model)")
    model = TransformerXL.from_pretrained(str(args.model)).float().eval()
    if args.apart:
        try:
            apart = twins_apart(model, args.heads, args.inner)
        except ValueError as e:
            raise SystemExit(f"widen_model: {args.model}: {e}") from None
        for i, layer in enumerate(apart):
            print(f"layer {i}: heads' twins {layer['heads']:.4f} apart, "
                  f"feed-forward twins {layer['ff']:.4f}")  # fmt: skip
        return 0
    try:
        wide = widen(model, args.heads, args.inner, args.noise, args.seed)
    except ValueError as e:
        raise SystemExit(f"widen_model: {e}") from None
    if args.text:
        ids = torch.tensor(model.tokenizer.encode(args.text.read_text()[:4096], errors="ignore"))
    else:
        ids = torch.randint(
            model.config.vocab_size, (512,), generator=torch.Generator().manual_seed(0)
        )
    change = largest_change(model, wide, ids, segments=8)
    wide.save_pretrained(args.out)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    print(f"{args.out}: {count(model):,} -> {count(wide):,} parameters "
          f"(heads {model.config.n_head} -> {wide.config.n_head}, d_inner "
          f"{model.config.d_inner} -> {wide.config.d_inner}); largest change of a "
          f"next-character probability over 8 segments: {change:.2e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
