"""The Score tab's views ("Does memory help?"), from a ``txl.session.ScoreResult`` and its
memory-length sweep: the text read three ways (segments alone, a sliding window, memory)
as a Plotly chart and in words, how far back the model reads, where memory mattered (the
text shaded by the bits it saved, the five moments), and the numbers as plain JSON.
Nothing here imports Gradio.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from .figures import (
    MEMORY_COLOR,
    SEGMENTS_COLOR,
    SLIDING_COLOR,
    chart,
    visible_char,
    visible_text,
)

# ---- does memory help? ---------------------------------------------------------------


RAW_OPACITY = 0.2  # the per-character curves: faint, drawn under the means


def rolling_mean(x: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to ``window`` values (shorter at the start)."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0 or window <= 1:
        return x.copy()
    c = np.concatenate([[0.0], np.cumsum(x)])
    idx = np.arange(1, x.size + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def surprisal_figure(
    chars: Sequence[str],
    bits_with: np.ndarray,
    bits_without: np.ndarray,
    bpc_with: float,
    bpc_without: float,
    seg_len: int | None = None,
    window: int = 32,
    *,
    bits_sliding: np.ndarray | None = None,
    bpc_sliding: float = math.nan,
    sliding_window: int | None = None,
    mem_len: int | None = None,
    seconds_with: float | None = None,
    seconds_without: float | None = None,
    seconds_sliding: float | None = None,
) -> go.Figure:
    """Per-character surprisal (bits), up to three curves: segments read alone, a sliding
    window (``bits_sliding``, when given), and segments with memory. Faint raw values under
    all the bold rolling means over ``window`` characters, the bpc and time of each in the legend;
    dotted lines at segment starts (where the segments read alone start from nothing).
    ``surprisal_figure_from_result`` takes a ScoreResult instead."""
    bits_with, bits_without = np.asarray(bits_with, float), np.asarray(bits_without, float)
    if not len(chars) == bits_with.size == bits_without.size:
        raise ValueError("chars, bits_with and bits_without must have the same length")
    if bits_sliding is not None:
        bits_sliding = np.asarray(bits_sliding, float)
        if bits_sliding.size != bits_with.size:
            raise ValueError("bits_sliding must have the length of bits_with")
    x = np.arange(1, bits_with.size + 1)
    labels = [visible_char(c) for c in chars]
    names = _names(seg_len, mem_len, sliding_window)
    curves = [("without", bits_without, SEGMENTS_COLOR, bpc_without, seconds_without)]
    if bits_sliding is not None:
        curves.append(("sliding", bits_sliding, SLIDING_COLOR, bpc_sliding, seconds_sliding))
    curves.append(("with", bits_with, MEMORY_COLOR, bpc_with, seconds_with))
    raw, smooth = [], []  # every raw curve under every rolling mean: none hides a mean
    for key, bits, color, bpc, seconds in curves:
        name = names[key]
        raw.append(
            {
                "type": "scatter",
                "x": x,
                "y": np.round(bits, 4),
                "mode": "lines",
                "name": f"{name} (per char)",
                "line": {"color": color, "width": 1},
                "opacity": RAW_OPACITY,
                "text": labels,
                "legendgroup": key,
                "showlegend": False,
                "hovertemplate": f"{name}<br>char '%{{text}}' at %{{x}}: %{{y:.2f}} bits"
                "<extra></extra>",
            }
        )
        smooth.append(
            {
                "type": "scatter",
                "x": x,
                "y": np.round(rolling_mean(bits, window), 4),
                "mode": "lines",
                "legendgroup": key,
                "name": f"{name}: {bpc:.3f} bpc{_seconds(seconds)}",
                "line": {"color": color, "width": 2.5},
                "hovertemplate": f"{name}, mean of last {window}: %{{y:.2f}} bits<extra></extra>",
            }
        )
    data = raw + smooth
    shapes = []
    if seg_len and bits_with.size > seg_len:
        shapes = [
            {
                "type": "line",
                "x0": s + 0.5,
                "x1": s + 0.5,
                "y0": 0,
                "y1": 1,
                "yref": "paper",
                "line": {"color": "rgba(120,120,120,0.35)", "width": 1, "dash": "dot"},
            }
            for s in range(seg_len, bits_with.size + 1, seg_len)
        ]
    # Every "saved" names what it is saved against.
    gains = [f"{bpc_without - bpc_with:+.3f} vs {names['without']}"]
    if bits_sliding is not None:
        gains.append(f"{bpc_sliding - bpc_with:+.3f} vs the {names['sliding']}")
    title = (
        f"Surprisal per character: {bpc_with:.3f} bpc with memory<br>"
        "bits saved per char by memory: " + ", ".join(gains)
        if np.isfinite(bpc_with)
        else "Surprisal per character"
    )
    return chart(
        title,
        data,
        xaxis={"title": {"text": "character position in the text"}},
        yaxis={"title": {"text": "surprisal (bits)"}, "rangemode": "tozero"},
        height=400,
        shapes=shapes,
        margin={"l": 10, "r": 10, "t": 64, "b": 40},
        legend={"orientation": "h", "y": -0.2},
    )


def score_markdown(result, seg_len: int, mem_len: int, unit: str = "character") -> str:
    """A ScoreResult in a learner's words (unit: "character" or "word"): the three ways of
    reading with bits per unit and time, then both halves of the story, each comparison
    naming its baseline."""
    n = len(result.chars)
    if n == 0:
        return f"Nothing to score: the text needs at least two {unit}s the model knows."
    short = "bpc" if unit == "character" else f"bits/{unit}"
    sliding = getattr(result, "bits_sliding", None) is not None
    window = getattr(result, "window", 0) or seg_len
    t = {k: _seconds(getattr(result, f"seconds_{k}", None)) for k in ("with", "without", "sliding")}
    lines = [
        f"**{n:,} {unit}s** scored in bits per {unit} ({short}: lower is better), three "
        f"ways of predicting each {unit} from the ones before it:",
        f"- **segments of {seg_len} read alone** (no memory): "
        f"**{result.bpc_without:.3f}** {short}{t['without']}. The first {unit} of every "
        f"segment starts from nothing.",
    ]
    if sliding:
        lines.append(
            f"- **a sliding window of {window}**, recomputed for every {unit}: "
            f"**{result.bpc_sliding:.3f}** {short}{t['sliding']}. Always the full "
            f"{window} {unit}s before, but all {window} are read again at every step."
        )
    lines.append(
        f"- **segments of {seg_len} + memory of {mem_len}** (Transformer-XL): "
        f"**{result.bpc_with:.3f}** {short}{t['with']}. Each segment also sees what the "
        "model computed for the text before it, without recomputing it."
    )
    lines.append("")
    lines.append(
        f"Memory vs segments read alone: {_versus(result.bpc_without - result.bpc_with, short)}"
        " (the segment boundaries stop hurting)."
    )
    if sliding:
        speed = ""
        if getattr(result, "seconds_with", 0) and np.isfinite(result.seconds_sliding):
            speed = f", {result.seconds_sliding / result.seconds_with:.0f}x faster"
        lines.append(
            f"Memory vs the sliding window of {window}: "
            f"{_versus(result.bpc_sliding - result.bpc_with, short)}{speed} (as good as "
            "recomputing a long window, at a fraction of the cost)."
        )
    text = "\n".join(lines)
    if result.dropped:
        text += f"\n\n{unit.title()}s outside the vocabulary: " + ", ".join(
            repr(c) for c in result.dropped[:10]
        )
    return text


# ---- where the Score is, while it streams ---------------------------------------------
#
# A Score has up to three stages (txl's score stages): the text read with memory and in
# segments alone, the memory-length sweep, and the slow sliding window (for texts of up to
# the tab's limit). Each line says which stage runs, what it has done and what is left.


def stage_head(stage: int, stages: int) -> str:
    return f"⏳ **Stage {stage} of {stages}**"


def reading_progress_markdown(n: int, stages: int, unit: str = "character") -> str:
    """Before the first stage is done: what it reads."""
    return (
        f"{stage_head(1, stages)}: reading the {n:,} {unit}s with memory and in segments "
        "alone…"
    )


def sweep_progress_markdown(
    result, mem_lens: Sequence[int], stages: int, unit: str = "character"
) -> str:
    """After the first stage: the sweep's reads still to do (those of ``mem_lens`` the
    first stage has not read), and about how long they take, estimated from the first
    stage's two reads (a read's time taken as linear in its memory length)."""
    mem_len = result.mem_len
    left = sorted(set(mem_lens) - {0, mem_len})
    s0, s1 = result.seconds_without, result.seconds_with
    per_position = (s1 - s0) / mem_len if mem_len > 0 else 0.0
    seconds = sum(s0 + max(0.0, per_position) * n for n in left)
    after = ", then the sliding window" if stages == 3 else ""
    return (
        f"{stage_head(2, stages)}: how far back does it read? The text read again with "
        f"memories of {min(mem_lens):,} to {max(mem_lens):,}: {len(left)} more reads of "
        f"{len(result.chars) + 1:,} {unit}s, about {_seconds(seconds).strip(' ()')} "
        f"(from the first two reads' times){after}."
    )


def sliding_progress_markdown(
    done: int, total: int, seconds_left: float, window: int, unit: str = "character", stages=3
) -> str:
    """The sliding window's progress, the last stage: a bar, the {unit}s done of
    ``total``, and the time left (unknown before the first chunk)."""
    head = (
        f"{stage_head(stages, stages)}: **the sliding window of {window}**, recomputed for "
        f"every {unit}: "
    )
    if done <= 0:
        return head + f"starting ({total:,} {unit}s, one forward pass each)."
    left = f", about {_seconds(seconds_left).strip(' ()')} left" if seconds_left > 0 else ""
    return (
        head + f"{done:,} of {total:,} {unit}s{left}.\n\n"
        f'<progress value="{done}" max="{max(total, 1)}" style="width: 100%"></progress>'
    )


# Shown under the sweep's chart while the sweep runs (the chart keeps the last text's).
SWEEP_PENDING = "⏳ **How far back does it read?** Scoring the text with memories of 0 to 1,024…"


# ---- three ways of reading a text, and how far back the model reads ----------------


def _seconds(seconds: float | None) -> str:
    """The time as " (120 ms)" or " (3.4 s)"; "" when unknown."""
    if seconds is None or not np.isfinite(seconds):
        return ""
    return f" ({seconds * 1e3:.0f} ms)" if seconds < 1 else f" ({seconds:.1f} s)"


def _names(seg_len: int | None, mem_len: int | None, sliding_window: int | None) -> dict:
    """The three ways of reading, named the same in every figure and summary."""
    seg = f"segments of {seg_len}" if seg_len else "segments"
    return {
        "without": f"{seg} read alone",
        "sliding": f"sliding window of {sliding_window or seg_len or '?'}",
        "with": f"{seg} + memory of {mem_len}" if mem_len is not None else "with memory",
    }


# Differences smaller than this (bits per token) are "about the same": a few hundred
# characters cannot tell them apart.
SAME_BITS = 0.01


def _versus(gain: float, short: str) -> str:
    """A difference in words: "saves 0.170 bpc", "costs 0.020 bpc", "about the same"."""
    if abs(gain) < SAME_BITS:
        return f"about the same ({gain:+.3f} {short})"
    return f"saves {gain:.3f} {short}" if gain > 0 else f"costs {-gain:.3f} {short} more"


def surprisal_figure_from_result(result, window: int = 32) -> go.Figure:
    """surprisal_figure of a ``txl.session.ScoreResult``: all three curves, with times."""
    return surprisal_figure(
        result.chars,
        result.bits_with,
        result.bits_without,
        result.bpc_with,
        result.bpc_without,
        seg_len=result.seg_len or None,
        window=window,
        bits_sliding=result.bits_sliding,
        bpc_sliding=result.bpc_sliding,
        sliding_window=result.window or None,
        mem_len=result.mem_len,
        seconds_with=result.seconds_with,
        seconds_without=result.seconds_without,
        seconds_sliding=result.seconds_sliding,
    )


def context_axis(mem_lens: Sequence[int]) -> np.ndarray:
    """x positions of memory lengths on a log2 axis: log2(n) for n > 0, and memory 0 one
    step left of the shortest positive length (log2(0) would be -infinity)."""
    n = np.asarray(mem_lens, dtype=float)
    positive = n[n > 0]
    zero_at = (np.log2(positive.min()) - 1) if positive.size else 0.0
    return np.where(n > 0, np.log2(np.where(n > 0, n, 1)), zero_at)


def context_figure(sweep, unit: str = "character", sliding_bpc: float | None = None) -> go.Figure:
    """ "How far back does it read?": bits per token against memory length (log2 axis) of a
    ``txl.scoring.ContextSweep`` (mem_lens, bpc, seconds, seg_len, effective, tolerance),
    the effective context marked. sliding_bpc: also a reference line at that bpc (the
    sliding window of seg_len, from a ScoreResult of the same text)."""
    lengths, bpc = list(sweep.mem_lens), np.asarray(sweep.bpc, dtype=float)
    if len(lengths) != bpc.size:
        raise ValueError("mem_lens and bpc must have the same length")
    x = context_axis(lengths)
    short = "bpc" if unit == "character" else f"bits/{unit}"
    seconds = list(getattr(sweep, "seconds", None) or [math.nan] * len(lengths))
    data = [
        {
            "type": "scatter",
            "x": x,
            "y": np.round(bpc, 4),
            "mode": "lines+markers",
            "name": f"segments of {sweep.seg_len} + memory",
            "line": {"color": MEMORY_COLOR, "width": 2.5},
            "marker": {"size": 8},
            "text": [f"{n:,}" for n in lengths],
            "customdata": [_seconds(s).strip(" ()") or "?" for s in seconds],
            "hovertemplate": f"memory %{{text}}: %{{y:.3f}} {short} (%{{customdata}})"
            "<extra></extra>",
        }
    ]
    shapes, annotations = [], []
    best = np.nanmin(bpc) if np.isfinite(bpc).any() else math.nan
    if np.isfinite(best):
        # The band within tolerance of the best: a memory inside it is "long enough".
        shapes.append(
            {
                "type": "rect",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": best,
                "y1": best * (1 + sweep.tolerance),
                "fillcolor": "rgba(59,130,246,0.12)",
                "line": {"width": 0},
            }
        )
        annotations.append(
            {
                "x": 1,
                "xref": "paper",
                "y": best * (1 + sweep.tolerance),
                "text": f"within {sweep.tolerance:.0%} of the best",
                "showarrow": False,
                "xanchor": "right",
                "yanchor": "bottom",
                "font": {"size": 10, "color": MEMORY_COLOR},
            }
        )
    if sweep.effective is not None:
        xe = float(x[lengths.index(sweep.effective)])
        shapes.append(
            {
                "type": "line",
                "x0": xe,
                "x1": xe,
                "y0": 0,
                "y1": 1,
                "yref": "paper",
                "line": {"color": "#dc2626", "width": 2, "dash": "dash"},
            }
        )
        annotations.append(
            {
                "x": xe,
                "y": 1,
                "yref": "paper",
                "text": f"effective context: {sweep.effective:,}",
                "showarrow": False,
                "xanchor": "left",
                "yanchor": "bottom",
                "font": {"color": "#dc2626"},
            }
        )
    if sliding_bpc is not None and np.isfinite(sliding_bpc):
        data.append(
            {
                "type": "scatter",
                "x": [x.min(), x.max()],
                "y": [sliding_bpc, sliding_bpc],
                "mode": "lines",
                "name": f"sliding window of {sweep.seg_len}: {sliding_bpc:.3f} {short}",
                "line": {"color": SLIDING_COLOR, "width": 1.5, "dash": "dot"},
                "hoverinfo": "skip",
            }
        )
    return chart(
        "How far back does it read?",
        data,
        xaxis={
            "title": {"text": f"memory length ({unit}s, log scale)"},
            "tickvals": x,
            "ticktext": [f"{n:,}" for n in lengths],
        },
        yaxis={"title": {"text": f"bits per {unit}"}},
        height=340,
        shapes=shapes,
        annotations=annotations,
    )


def context_markdown(sweep, unit: str = "character") -> str:
    """One line on a ContextSweep: the best bpc, and the effective context in words."""
    bpc = np.asarray(sweep.bpc, dtype=float)
    if sweep.effective is None:
        return f"Nothing to score: the text needs at least two {unit}s the model knows."
    short = "bpc" if unit == "character" else f"bits/{unit}"
    i_best = int(np.nanargmax(-bpc))
    alone = dict(zip(sweep.mem_lens, bpc)).get(0)
    text = (
        f"Best: **{bpc[i_best]:.3f} {short}** with a memory of {sweep.mem_lens[i_best]:,}. "
        f"**Effective context: {sweep.effective:,} {unit}s of memory**: the shortest memory "
        f"within {sweep.tolerance:.0%} of the best; a longer one buys almost nothing on this "
        "text."
    )
    if alone is not None and np.isfinite(alone):
        text += f" With no memory (segments of {sweep.seg_len} read alone): {alone:.3f}."
    return text


def score_numbers(result, sweep=None, moments=None) -> dict:
    """The score tab's numbers as plain JSON (the /score endpoint's third output): bits
    per token and seconds of each way of reading, the memory-length sweep, and
    ``moments`` (``ScoreResult.moments()``: the tokens memory saved the most bits on over
    the sliding window, ``Moment.as_dict`` each; null until the sliding window is done,
    and for texts too long for it)."""

    def number(x) -> float | None:
        return round(float(x), 4) if x is not None and np.isfinite(x) else None

    out = {
        "tokens": len(result.chars),
        "seg_len": int(result.seg_len),
        "mem_len": int(result.mem_len),
        "bpc": {
            "segments_alone": number(result.bpc_without),
            "sliding_window": number(result.bpc_sliding),
            "memory": number(result.bpc_with),
        },
        "seconds": {
            "segments_alone": number(result.seconds_without),
            "sliding_window": number(result.seconds_sliding),
            "memory": number(result.seconds_with),
        },
        "sliding_window": int(result.window),
        "moments": None if moments is None else [m.as_dict() for m in moments],
    }
    if sweep is not None:
        out["context_sweep"] = {
            "mem_len": [int(m) for m in sweep.mem_lens],
            "bpc": [number(b) for b in sweep.bpc],
            "effective_context": sweep.effective,
        }
    return out


def centibits(bits) -> list[int]:
    """Surprisals in bits as integer centibits (2^(-x/100) is p to 0.7 %): the compact form
    of the text views' memory's-effect shading (``MemoryEffect.view``)."""
    return np.rint(100 * np.asarray(bits, dtype=np.float64)).astype(np.int64).tolist()


def moments_view(result, moments, unit: str = "character", context: int = 40) -> dict | None:
    """The Score tab's "where memory mattered", as webapp/web/moments.js draws it: the scored
    text (``result.pieces``: one string for a character model, else a list of tokens),
    each token from position 1 on shaded by the bits memory saved over the sliding window
    on it, in the format of the Watch tab's memory's-effect shading (``effect``: start,
    surprisals with memory and through the window in centibits), and ``moments`` (the
    ``Moment`` list, its entries as in /score's numbers plus ``context_start``) shown with
    ``context`` tokens either side. None until the sliding window is done."""
    if moments is None or getattr(result, "bits_sliding", None) is None:
        return None
    pieces = result.pieces
    whole = unit == "character" and all(len(p) == 1 for p in pieces)
    saved = np.asarray(result.bits_sliding, np.float64) - np.asarray(result.bits_with, np.float64)
    return {
        "unit": unit,
        "text": "".join(pieces) if whole else list(pieces),
        "effect": {
            "start": 1,
            "with": centibits(result.bits_with),
            "without": centibits(result.bits_sliding),
        },
        "window": int(result.window),
        "mem_len": int(result.mem_len),
        "bits_saved": round(float(saved.sum()), 4),
        "context": int(context),
        "moments": [{**m.as_dict(), "context_start": m.context_start} for m in moments],
    }


def moment_choices(moments, unit: str = "character") -> list[tuple[str, int]]:
    """The Watch-it dropdown: (label, position) of each moment, in rank order."""
    return [
        (
            f"{r}. '{visible_text(m.char)}' at {m.position:,}: memory saved "
            f"{m.bits_saved:.2f} bits ({m.bits_window:.2f} -> {m.bits_memory:.2f})",
            m.position,
        )
        for r, m in enumerate(moments or [], start=1)
    ]
