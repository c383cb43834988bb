"""Views of the inside of the attention (txl.anatomy), from plain arrays: no Gradio.

- :func:`step_terms`: the newest token's four score terms for one layer and head, as JSON
  (the /step summary's ``"terms"``, and the strips under the attention view that
  webapp/web/terms.js draws), with a sentence on which term varies most.
- :func:`distance_figure` / :func:`terms_figure`: the paper's Figures 5 and 7 on a text
  (matplotlib, so that the page shows and docs/figures.md ships the same PNG).
- :func:`anatomy_numbers` / :func:`anatomy_markdown`: what the profiles say, as JSON and
  in words beside what the paper found.
"""

from __future__ import annotations

import io
import math

import numpy as np

from txl.anatomy import TERMS, mean_distance, share_beyond

# ---- the newest token's four terms ---------------------------------------------------

TERM_LABELS = {
    "a": "(a) content: q·k",
    "b": "(b) content-position: q·W_R R(i−j)",
    "c": "(c) global content bias: u·k",
    "d": "(d) global position bias: v·W_R R(i−j)",
}


def _span(x: np.ndarray) -> float:
    return float(x.max() - x.min()) if x.size else 0.0


def step_terms(trace, layer: int | None, head: int | None, scale: float, decimals: int = 5):
    """The terms (a), (b), (c), (d) that head ``head`` of layer ``layer`` added up for the
    newest token of ``trace`` (a StepTrace with ``terms``), over the keys it sees; None
    unless one layer and one head are chosen and the step kept its terms.

    softmax(scale · (a + b + c + d)) over ``key_positions`` is that head's attention row
    (keys that same_length hides are left out: their weight is 0). ``spread`` is each
    term's span (max - min over the keys) after scaling, in the units of the softmax's
    input: a term that is the same for every key changes no weight, however large.
    """
    terms = getattr(trace, "terms", None)
    if terms is None or layer is None or head is None:
        return None
    row = np.asarray(terms[layer, :, head], dtype=np.float64)  # [4, K]
    visible = np.isfinite(row[0])
    a, b, c, d = row[:, visible]
    keys = np.asarray(trace.key_positions)[visible]
    spread = {
        "a": _span(scale * a),
        "b": _span(scale * b),
        "c": _span(scale * c),
        "d": _span(scale * d),
        "content (a)+(c)": _span(scale * (a + c)),
        "position (b)+(d)": _span(scale * (b + d)),
    }

    def rounded(x):
        return np.round(x, decimals).tolist()

    return {
        "layer": int(layer),
        "head": int(head),
        "key_positions": [int(p) for p in keys],
        "a": rounded(a),
        "b": rounded(b),
        "c": rounded(c),
        "d": rounded(d),
        "scale": float(scale),
        "spread": {k: round(v, 3) for k, v in spread.items()},
        "words": terms_sentence(spread, layer, head),
    }


def terms_sentence(spread: dict, layer: int, head: int) -> str:
    """Which terms move the weights most: "this head reads by distance: (b)+(d) span 9.1,
    (a)+(c) 2.3; of the four, (b) varies most (8.7)"."""
    position, content = spread["position (b)+(d)"], spread["content (a)+(c)"]
    how = "by distance" if position > content else "by content"
    most = max("abcd", key=lambda t: spread[t])
    return (
        f"Layer {layer} head {head} reads {how}: (b)+(d) span {_number(position)}, "
        f"(a)+(c) {_number(content)} (scaled scores, max − min over the keys); of the four, "
        f"({most}) varies most ({_number(spread[most])})."
    )


def _number(x: float) -> str:
    """9.1, 0.42, 0.0031: one decimal from 1 up, two significant digits below."""
    return f"{x:.1f}" if abs(x) >= 1 else f"{x:.2g}"


# ---- the paper's Figures 5 and 7 on a text ------------------------------------------

PAPER_FIGURE_5 = (
    "**The paper** (Appendix D, Fig. 5: the WikiText-103 base model, 16 layers × 10 heads, "
    "averaged over a 640-token memory): the overall trend is to attend to nearby tokens, "
    "but a few heads (one in layer 1, one in layer 8, one in the last layer) spread their "
    "attention over the whole memory."
)
PAPER_FIGURE_7 = (
    "**The paper** (Fig. 7, each term softmaxed alone): (a), content alone, is close to "
    "uniform over distance; (b), content-dependent position, follows the overall "
    "attention's trend (near); (d), the global position bias, is flatter and gives "
    "relatively more weight to far positions."
)
# Why Figure 7 has three panels for four terms (said in the figure and in the words).
WHY_NOT_C = (
    "(c) u·k, a global bias on what each key is, is not drawn: it carries no distance (it "
    "scores a key the same wherever it lies), and the paper's Figure 7 leaves it out too."
)
ORDERS = {
    "layer": "layer, then head",
    "mean": "mean distance, farthest first",
    "beyond": "share beyond the segment, largest first",
}


def distance_buckets(D: int) -> list[tuple[int, int]]:
    """Ranges [a, b) of distances 0 ... D - 1 on a log-like axis: 0, 1, 2, 3, then 4-5,
    6-7, 8-11, 12-15, 16-23, ... (two per doubling), so that the few near keys and the
    many far ones are both readable."""
    edges = [0, 1, 2, 3]
    k = 2
    while edges[-1] < D:
        edges += [2**k, 3 * 2 ** (k - 1)]
        k += 1
    edges = sorted({e for e in edges if e < D} | {D})
    return list(zip(edges[:-1], edges[1:]))


def bucket_means(profile: np.ndarray, buckets) -> np.ndarray:
    """[..., D] -> [..., len(buckets)]: the average weight per key in each range (as the
    paper's per-distance average; a sum would make the wide far ranges look heavy)."""
    sums = np.add.reduceat(profile, [a for a, _ in buckets], axis=-1)
    return sums / np.array([b - a for a, b in buckets], dtype=np.float64)


def head_order(profile: np.ndarray, order: str, seg_len: int) -> list[tuple[int, int]]:
    """(layer, head) pairs in the order of ORDERS[order]."""
    n_layer, n_head, _ = profile.shape
    heads = [(layer, h) for layer in range(n_layer) for h in range(n_head)]
    if order == "mean":
        key = mean_distance(profile)
    elif order == "beyond":
        key = share_beyond(profile, seg_len)
    elif order == "layer":
        return heads
    else:
        raise ValueError(f"order must be one of {sorted(ORDERS)}, got {order!r}")
    return sorted(heads, key=lambda lh: -key[lh])


def _distance_axis(ax, buckets, seg_len: int) -> None:
    """x ticks at the bucket starts that are 0 or powers of 2; the segment length marked:
    keys that far back or more are reachable only through the memory."""
    ticks = [i for i, (a, _) in enumerate(buckets) if a == 0 or a & (a - 1) == 0]
    ax.set_xticks([i - 0.5 for i in ticks], [str(buckets[i][0]) for i in ticks], fontsize=8)
    ax.set_xlim(-0.5, len(buckets) - 0.5)
    for i, (a, b) in enumerate(buckets):
        if a <= seg_len < b:
            ax.axvline(i - 0.5 + (seg_len - a) / (b - a), color="#ef4444", lw=1.2, ls="--")
    ax.set_xlabel("distance back (keys, log-like buckets)", fontsize=8)


def _row_labels(ax, heads, n_rows: int) -> None:
    every = max(1, math.ceil(n_rows / 60))  # at most ~60 labels: a 288-head model stays legible
    shown = range(0, n_rows, every)
    ax.set_yticks(list(shown), [f"L{heads[i][0]}.{heads[i][1]}" for i in shown], fontsize=7)


def _figure(width: float, rows: int, seg_len: int):
    """A Figure with fixed margins, in inches (a layout engine took half the drawing time),
    and the note on the red line at the bottom. Returns (figure, the margins as
    fractions, for subplots)."""
    from matplotlib.figure import Figure  # the object API: no pyplot state, thread-safe

    height = max(3.4, min(15.0, 0.15 * rows + 2.0))
    fig = Figure(figsize=(width, height), dpi=100)
    fig.text(
        0.5,
        0.1 / height,
        f"red line: keys {seg_len} or more back, which a segment of {seg_len} reaches only "
        "through the memory",
        ha="center",
        va="bottom",
        fontsize=8,
        color="#b91c1c",
    )
    margins = dict(left=0.6 / width, right=1 - 0.15 / width, top=1 - 0.75 / height)
    margins["bottom"] = 0.75 / height
    return fig, margins


def _heatmap(ax, values: np.ndarray, title: str, vmax: float | None = None):
    from matplotlib.colors import PowerNorm

    # sqrt colour scale, as in the Step view: the small shares most cells hold stay visible
    vmax = float(values.max()) if vmax is None else vmax
    norm = PowerNorm(0.5, vmin=0.0, vmax=max(vmax, 1e-9))
    image = ax.imshow(values, aspect="auto", cmap="viridis", norm=norm, interpolation="nearest")
    ax.set_title(title, fontsize=10)
    return image


def distance_figure(profile: np.ndarray, seg_len: int, order: str = "layer", title: str = ""):
    """The paper's Figure 5: each head's average attention by distance (rows: heads in
    ``order``; columns: ranges of distance, the average weight per key in each), and each
    head's share of attention beyond the segment."""
    n_layer, n_head, D = profile.shape
    heads = head_order(profile, order, seg_len)
    buckets = distance_buckets(D)
    rows = np.stack([profile[lh] for lh in heads])  # [L·H, D]
    fig, margins = _figure(10.5, len(heads), seg_len)
    grid = fig.add_gridspec(1, 2, width_ratios=[5, 1], wspace=0.12, **margins)
    ax = fig.add_subplot(grid[0])
    image = _heatmap(ax, bucket_means(rows, buckets), title or "Average attention by distance")
    _distance_axis(ax, buckets, seg_len)
    _row_labels(ax, heads, len(heads))
    ax.set_ylabel("layer.head", fontsize=8)
    fig.colorbar(image, ax=ax, label="average weight per key", shrink=0.6, pad=0.01)
    side = fig.add_subplot(grid[1], sharey=ax)
    beyond = share_beyond(rows, seg_len)
    side.barh(range(len(heads)), beyond, color="#3b82f6", height=0.8)
    side.set_xlim(0, max(0.05, float(beyond.max()) * 1.1))
    side.set_title(f"share {seg_len}+ back", fontsize=9)
    side.tick_params(labelleft=False, labelsize=7)
    return fig


TERM_TITLES = {
    "a": "(a) content q·k alone",
    "b": "(b) content-position q·W R alone",
    "d": "(d) position bias v·W R alone",
}


def terms_figure(
    terms: np.ndarray,
    profile: np.ndarray,
    seg_len: int,
    order: str = "layer",
    head: tuple[int, int] | None = None,
    title: str = "",
):
    """The paper's Figure 7: terms (a), (b), (d), each softmaxed alone, averaged by
    distance: three heatmaps with the rows of distance_figure (all heads), or for one
    ``head`` (layer, head) three curves beside the head's real attention (dashed); a line
    under the title says why (c) is not drawn (``WHY_NOT_C``)."""
    D = profile.shape[-1]
    buckets = distance_buckets(D)
    if head is None:
        heads = head_order(profile, order, seg_len)
        fig, margins = _figure(14, len(heads), seg_len)
        axes = fig.subplots(1, 3, sharey=True, gridspec_kw=dict(wspace=0.05, **margins))
        panels = [bucket_means(np.stack([t[lh] for lh in heads]), buckets) for t in terms]
        vmax = max(float(p.max()) for p in panels)  # one colour scale: the panels compare
        for ax, name, values in zip(axes, TERMS, panels):
            image = _heatmap(ax, values, TERM_TITLES[name], vmax)
            _distance_axis(ax, buckets, seg_len)
        _row_labels(axes[0], heads, len(heads))
        fig.colorbar(image, ax=axes, label="average weight per key", shrink=0.6, pad=0.01)
    else:
        fig, margins = _figure(14, 0, seg_len)
        margins["left"] = 0.8 / 14  # room for the y label
        axes = fig.subplots(1, 3, sharey=True, gridspec_kw=dict(wspace=0.05, **margins))
        attention = bucket_means(profile[head], buckets)
        for ax, name, per_term in zip(axes, TERMS, terms):
            x = np.arange(len(buckets))
            ax.plot(x, bucket_means(per_term[head], buckets), "o-", color="#7c3aed", ms=3)
            ax.plot(x, attention, "--", color="#6b7280", lw=1, label="the head's attention")
            ax.set_title(f"L{head[0]}.{head[1]} {TERM_TITLES[name]}", fontsize=10)
            _distance_axis(ax, buckets, seg_len)
        axes[0].set_ylabel("average weight per key", fontsize=8)
        axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    height = fig.get_figheight()  # under the title, above the panels' titles
    fig.text(0.5, 1 - 0.36 / height, WHY_NOT_C, ha="center", va="top", fontsize=8, color="#444")
    return fig


def load_matplotlib() -> None:
    """Import what the figures use now (about a second), not at a visitor's first click."""
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.colors  # noqa: F401
    import matplotlib.figure  # noqa: F401


def figure_png(fig) -> bytes:
    """The figure as PNG bytes (Agg, no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buffer = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buffer)
    return buffer.getvalue()


# ---- what the profiles say: numbers and words -----------------------------------------


def head_table(profile: np.ndarray, seg_len: int) -> list[dict]:
    """Per head: its mean distance and its share of attention seg_len or more back."""
    mean, beyond = mean_distance(profile), share_beyond(profile, seg_len)
    n_layer, n_head, _ = profile.shape
    return [
        {
            "layer": layer,
            "head": h,
            "mean_distance": round(float(mean[layer, h]), 3),
            "share_beyond_segment": round(float(beyond[layer, h]), 4),
        }
        for layer in range(n_layer)
        for h in range(n_head)
    ]


def anatomy_numbers(result, decimals: int = 6) -> dict:
    """The /anatomy endpoint's JSON: the setting, the profiles (``attention[l][h][Δ]``,
    ``terms[name][l][h][Δ]``) and each head's mean distance and share beyond the segment.
    ``result``: a txl.anatomy.Profiles."""

    def rounded(x):
        return np.round(x, decimals).tolist()

    return {
        "tokens": int(result.n_tokens),
        "mem_len": int(result.mem_len),
        "seg_len": int(result.seg_len),
        "seconds": round(float(result.seconds), 3),
        "distance": "index Δ = keys back, 0 (the query itself) ... mem_len + seg_len - 1",
        "attention": rounded(result.attention),
        "terms": None
        if result.terms is None
        else {name: rounded(t) for name, t in zip(TERMS, result.terms)},
        "heads": head_table(result.attention, result.seg_len),
    }


def _heads_in_words(table: list[dict], seg_len: int) -> str:
    return ", ".join(
        f"L{t['layer']}.{t['head']} (mean distance {t['mean_distance']:.0f}, "
        f"{t['share_beyond_segment']:.0%} {seg_len}+ back)"
        for t in table
    )


def reading_sentence(result, unit: str = "character") -> str:
    """How the text was read: "Read **2,044 characters** in 32 segments of 64 over a memory
    of 128, from an empty memory, in **2.9 s**." (the tab's status line says it; the
    words under it do not say it again)."""
    n_segments = math.ceil(result.n_tokens / result.seg_len)
    return (
        f"Read **{result.n_tokens:,} {unit}s** in {n_segments:,} segments of {result.seg_len} "
        f"over a memory of {result.mem_len:,}, from an empty memory, in "
        f"**{result.seconds:.1f} s**."
    )


def anatomy_markdown(result, unit: str = "character", top: int = 3) -> str:
    """Figures 5 and 7 in words: the farthest- and nearest-reading heads, and what each
    term alone reads, beside what the paper found (how the text was read:
    ``reading_sentence``)."""
    seg_len, profile = result.seg_len, result.attention
    table = sorted(head_table(profile, seg_len), key=lambda t: -t["mean_distance"])
    beyond = np.array([t["share_beyond_segment"] for t in table])
    overall = float(share_beyond(profile, seg_len).mean())
    lines = [
        f"**Farthest-reading heads**: {_heads_in_words(table[:top], seg_len)}. "
        f"**Most local**: {_heads_in_words(table[::-1][:top], seg_len)}.",
        "",
        f"Over all {len(table)} heads, {overall:.0%} of the attention goes {seg_len} or more "
        f"{unit}s back (keys only the memory holds); {int((beyond > 0.25).sum())} heads put "
        "more than a quarter of theirs there.",
        "",
        PAPER_FIGURE_5,
    ]
    if result.terms is not None:
        means = {name: float(mean_distance(t).mean()) for name, t in zip(TERMS, result.terms)}
        far = {name: float(share_beyond(t, seg_len).mean()) for name, t in zip(TERMS, result.terms)}
        lines += [
            "",
            "**Each term alone** (Figure 7), mean distance and share "
            f"{seg_len}+ back averaged over the heads: "
            + ", ".join(f"({n}) {means[n]:.0f}, {far[n]:.0%}" for n in TERMS)
            + f"; the real attention {float(mean_distance(profile).mean()):.0f}, {overall:.0%}. "
            + WHY_NOT_C,
            "",
            PAPER_FIGURE_7,
        ]
    return "\n".join(lines)
