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
segments) and the parameter counts. In training the heads' twins kept the distance the
noise gave them (phases 50 and 51 of docs/recall-training.md). ``--fresh`` gives new units
instead of twins: their incoming weights drawn anew, their output columns zero, so that
the model computes exactly what it did and the new units learn their own way.
``--apart`` reads a widened model: how far its twins are apart, and how loud its new units.
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
    model: TransformerXL,
    heads: int = 2,
    inner: int = 2,
    noise: float = 0.0,
    seed: int = 0,
    fresh: bool = False,
) -> TransformerXL:
    """A model with ``heads`` times the heads and ``inner`` times the feed-forward units,
    computing what ``model`` computes (exactly when ``noise`` is 0; float32).

    The new units are twins of the originals (Net2WiderNet), or with ``fresh`` units of
    their own: incoming weights (and the heads' u, v) drawn N(0, std^2), std that tensor's
    own over the originals, b_1 zero, and their columns of W_o and W_2 zero, so that the
    model still computes exactly what it did while the new units' gradients differ from
    the first step (a zero column's gradient is the unit's output times the error)."""
    if heads < 1 or inner < 1:
        raise ValueError(f"heads and inner must be >= 1, got {heads} and {inner}")
    if fresh and noise:
        raise ValueError("noise sets twins apart; fresh units start apart (use one)")
    c = model.config
    H = c.n_head
    wide = TransformerXL(replace(c, n_head=H * heads, d_inner=c.d_inner * inner))
    gen = torch.Generator().manual_seed(seed)

    def jitter(w: torch.Tensor, original_rows: int) -> torch.Tensor:
        """Noise on the twins' rows (every row after the first ``original_rows``)."""
        if noise:
            twins = w[original_rows:]
            std = float(w[:original_rows].float().std())
            twins += noise * std * torch.randn(twins.shape, generator=gen, dtype=w.dtype)
        return w

    def grown(w: torch.Tensor, groups: int, copies: int, jittered: bool = True) -> torch.Tensor:
        """The originals' rows w [groups * g, ...], then the new units' rows: twins of
        the originals' (with noise when ``jittered``), or with ``fresh`` drawn anew (at
        the originals' std when ``jittered``, else zero)."""
        if not fresh:
            twins = _twin_rows(w, groups, copies)
            return jitter(twins, len(w)) if jittered else twins
        shape = (len(w) * (copies - 1), *w.shape[1:])
        std = float(w.std()) if jittered else 0.0  # b_1: zero, as a model's init
        return torch.cat([w, std * torch.randn(shape, generator=gen)])

    def shared_out(w: torch.Tensor, groups: int, copies: int) -> torch.Tensor:
        """W_o or W_2 [d, groups * g]: each original's column and its twins' each 1/copies
        of it (their sum is what it gave), or with ``fresh`` the new units' columns zero."""
        if not fresh:
            return _twin_rows(w.T, groups, copies).T / copies
        return torch.cat([w, w.new_zeros(w.shape[0], w.shape[1] * (copies - 1))], dim=1)

    state = {}
    for name, w in model.state_dict().items():
        w = w.float()
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("attn.qkv.weight"):  # [3 H Dh, d]: q, k, v, each head's Dh rows
            state[name] = torch.cat([grown(t, H, heads) for t in w.chunk(3)])
        elif name.endswith("attn.r_proj.weight"):  # W_r: [H Dh, d]
            state[name] = grown(w, H, heads)
        elif name.endswith("attn.out.weight"):  # W_o: [d, H Dh]
            state[name] = shared_out(w, H, heads)
        elif leaf in ("u", "v"):  # [H, Dh]: a twin's biases are its original's; fresh: drawn
            state[name] = grown(w, H, heads, jittered=fresh)
        elif name.endswith("ff.fc1.weight"):  # W_1: [d_inner, d]
            state[name] = grown(w, c.d_inner, inner)
        elif name.endswith("ff.fc1.bias"):  # b_1: [d_inner]
            state[name] = grown(w, c.d_inner, inner, jittered=False)
        elif name.endswith("ff.fc2.weight"):  # W_2: [d, d_inner]
            state[name] = shared_out(w, c.d_inner, inner)
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
    wider model is still the narrow one); ``--noise`` is where they start. And how loud
    the new units are: ||their columns of W_o (W_2)|| / ||the originals'|| ("heads_out",
    "ff_out"): 1 for twins (each half of a column), 0 for ``fresh`` units at the start."""
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

    def new_out(w: torch.Tensor, originals: int) -> float:  # columns: originals, then new
        w = w.float()
        return float(w[:, originals:].norm() / w[:, :originals].norm())

    out = []
    for layer in wide.layers:
        q = layer.attn.qkv.weight.chunk(3)[0]  # [heads H Dh, d]
        out.append({
            "heads": apart(q, H * Dh) if heads > 1 else 0.0,
            "ff": apart(layer.ff.fc1.weight, F) if inner > 1 else 0.0,
            "heads_out": new_out(layer.attn.out.weight, H * Dh) if heads > 1 else 0.0,
            "ff_out": new_out(layer.ff.fc2.weight, F) if inner > 1 else 0.0,
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
    p.add_argument("--noise", type=float, help="on the twins, x each std (default 1e-3)")
    p.add_argument(
        "--fresh", action="store_true", help="new units drawn anew, their outputs zero: no twins"
    )
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
                  f"feed-forward twins {layer['ff']:.4f}; the new units' output weights "
                  f"{layer['heads_out']:.4f} (heads) and {layer['ff_out']:.4f} "
                  "(feed-forward) of the originals'")  # fmt: skip
        return 0
    try:
        noise = (0.0 if args.fresh else 1e-3) if args.noise is None else args.noise
        wide = widen(model, args.heads, args.inner, noise, args.seed, args.fresh)
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
