"""Figures and text views of what Transformer-XL's memory does, from plain arrays.

Everything here works on numpy arrays, strings and (duck-typed) ``txl.session.StepTrace`` /
``ScoreResult`` objects; nothing imports Gradio, so the figures can be tested and reused
outside the app.

- :func:`text_roles`: each character's role for the next prediction: fallen out of memory,
  in memory, in the current segment, the newest token.
- :func:`text_view` / :func:`attention_view`: the two views a Step redraws, as small dicts
  that the browser draws (webapp/web/views.js): the text shaded by the newest token's
  attention, and that attention over its keys [memory | current], rows = layers (or
  heads), keys beyond ``max_cols`` summed into buckets.
- :func:`surprisal_figure` / :func:`context_figure` (Plotly: drawn once per Score): the
  text read three ways (segments alone, a sliding window, memory), and bits per character
  against the memory length.
- :func:`attention_export` / :func:`step_summary` / :func:`score_numbers`: plain JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

# ---- roles of the characters ---------------------------------------------------------

GONE, FAR, MEMORY, CURRENT, NEWEST = "gone", "far", "memory", "current", "newest"
ROLES = (GONE, FAR, MEMORY, CURRENT, NEWEST)
# FAR: in memory, but beyond the window of a model without memory (the last seg_len tokens
# up to the newest one): only memory reaches it. Memory off, nothing is FAR.
ROLE_LABELS = {
    GONE: "fell out of memory",
    FAR: "beyond the window: only memory reaches it",
    MEMORY: "in memory",
    CURRENT: "current segment",
    NEWEST: "newest token",
}
ROLE_LABELS_NO_MEMORY = {
    GONE: "outside the window",
    FAR: "beyond the window",
    MEMORY: "in memory",
    CURRENT: "in the window",
    NEWEST: "newest token",
}
# The role colours of webapp/web/views.css, for the charts drawn here.
MEMORY_COLOR = "#3b82f6"
CURRENT_COLOR = "#f59e0b"

# What each character turns into on an axis label or in a hover box.
_VISIBLE = {"\n": "↵", " ": "␣", "\t": "⇥", "\r": "␍"}


def visible_char(c: str) -> str:
    """A printable stand-in for whitespace (newline -> ↵, space -> ␣)."""
    return _VISIBLE.get(c, c)


def visible_text(s: str) -> str:
    return "".join(visible_char(c) for c in s)


def token_label(piece: str) -> str:
    """A token's text as an axis label: a character made visible, a word without its
    leading space."""
    return visible_char(piece) if len(piece) == 1 else (piece.strip() or visible_text(piece))


def text_roles(
    n_chars: int,
    first_key: int,
    memory_end: int,
    newest: int | None = None,
    window_start: int | None = None,
) -> np.ndarray:
    """Role of each of ``n_chars`` text positions (an array of role names).

    ``[0, first_key)`` fell out of memory (or out of the window); ``[first_key,
    memory_end)`` is in memory; ``[memory_end, n_chars)`` is the current segment; position
    ``newest`` (the token just generated, when there is one) is the newest token. With
    ``window_start`` (the first position of the window a model without memory would see),
    the memory before it is FAR: reachable only through memory.
    """
    first_key = int(np.clip(first_key, 0, n_chars))
    memory_end = int(np.clip(memory_end, first_key, n_chars))
    roles = np.full(n_chars, CURRENT, dtype=object)
    roles[:first_key] = GONE
    roles[first_key:memory_end] = MEMORY
    if window_start is not None:
        roles[first_key : int(np.clip(window_start, first_key, memory_end))] = FAR
    if newest is not None and 0 <= newest < n_chars:
        roles[newest] = NEWEST
    return roles


def window_start(newest: int, window: int | None) -> int | None:
    """The first text position of the window of ``window`` tokens that ends at ``newest``
    (the tokens a model without memory sees: the newest and the window - 1 before it);
    None without a window. Keys before it are ``window`` or more back: beyond the window."""
    return None if window is None else newest - int(window) + 1


def roles_from_trace(n_chars: int, trace, window: int | None = None) -> np.ndarray:
    """Roles as the keys of ``trace`` (a StepTrace) cover the text: its first n_memory keys
    are memory, the others the current segment, its query the newest token; with
    ``window`` (the session's seg_len), memory keys ``window`` or more back are FAR."""
    keys = np.asarray(trace.key_positions)
    first = int(keys[0]) if keys.size else trace.position
    memory_end = int(keys[trace.n_memory]) if trace.n_memory < keys.size else trace.position
    start = window_start(trace.position, window)
    return text_roles(n_chars, first, memory_end, trace.position, start)


def roles_from_info(n_chars: int, info: dict, window: int | None = None) -> np.ndarray:
    """Roles from ``Session.memory_info()`` when there is no fresh trace (after a prompt,
    a reset or a settings change): memory on, ``span`` is the memory; memory off, the last
    ``context`` characters are the window. ``window``: as in roles_from_trace, ending at
    the last token."""
    if info["memory"]:
        start, end = info["span"]
        return text_roles(n_chars, start, end, window_start=window_start(n_chars - 1, window))
    first = n_chars - int(info["context"])
    return text_roles(n_chars, first, first)


# ---- status --------------------------------------------------------------------------


def format_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def status_markdown(
    info: dict,
    n_chars: int,
    latency_ms: float | None = None,
    unit: str = "character",
    saved: tuple[float, int] | None = None,
    beyond: tuple[float, int, str] | None = None,
) -> str:
    """One line: memory on/off, tokens in memory, bytes, visible context, last latency;
    ``saved``: (bits, tokens) memory saved over the tokens produced with memory on
    (``MemoryEffect.bits_saved``), as a running total. ``beyond``: (share, window, which
    layer and head) of the newest token's attention beyond the window
    (``beyond_window_share``), leading the line: what only memory gave it."""
    if info["memory"]:
        memory = (
            f"Memory **on** · {info['tokens']}/{info['mem_len']} tokens in memory "
            f"({format_bytes(info['bytes'])} of keys and values)"
        )
    else:
        memory = "Memory **off** · each prediction sees only the current window"
    parts = []
    if beyond is not None:
        share, window, which = beyond
        parts.append(
            f"attention beyond the window: **{100 * share:.1f} %** ({which}; the window: "
            f"the last {window} {unit}s, all a model without memory sees)"
        )
    parts += [
        memory,
        f"the model sees **{info['context']}** previous tokens",
        f"{n_chars:,} {unit}s",
    ]
    if latency_ms is not None:
        parts.append(f"last step {latency_ms:.1f} ms")
    if saved is not None and saved[1] > 0:
        bits, k = saved
        parts.append(
            f"memory saved **{bits:,.1f} bits** over the last {k:,} {unit}{'s' if k > 1 else ''} "
            f"({bits / k:+.3f} bits/{'char' if unit == 'character' else unit})"
        )
    return " · ".join(parts)


# ---- attention heatmap ---------------------------------------------------------------


def bucket_keys(
    n_keys: int, n_memory: int, max_cols: int = 128, n_far: int = 0
) -> list[tuple[int, int]]:
    """Split key indices [0, n_keys) into at most ``max_cols`` contiguous ranges (a, b).

    With ``n_keys <= max_cols`` each key is its own range. Otherwise keys are summed into
    buckets of equal width; no bucket straddles a boundary: the memory/current one
    (``n_memory``) nor the window's edge (``n_far``: the keys beyond the window). The keys
    are cut at the boundaries into parts; the oldest part is laid out from its right end
    (so its oldest bucket may be narrower), the others from their left ends (so their last
    bucket may be narrower).
    """
    if n_keys <= 0:
        return []
    n_memory = int(np.clip(n_memory, 0, n_keys))
    n_far = int(np.clip(n_far, 0, n_keys))
    max_cols = max(2, int(max_cols))
    if n_keys <= max_cols:
        return [(k, k + 1) for k in range(n_keys)]
    edges = [0, *sorted({n_far, n_memory} - {0, n_keys}), n_keys]
    parts = list(zip(edges, edges[1:]))  # contiguous, none empty
    max_cols = max(max_cols, len(parts))
    width = math.ceil(n_keys / max_cols)
    while sum(math.ceil((b - a) / width) for a, b in parts) > max_cols:
        width += 1
    buckets = []
    if n_memory > 0:  # memory comes first: its oldest part is laid out from its right end
        (a0, b0), parts = parts[0], parts[1:]
        buckets = [(max(a0, b - width), b) for b in range(b0, a0, -width)][::-1]
    for a1, b1 in parts:
        buckets += [(a, min(b1, a + width)) for a in range(a1, b1, width)]
    return buckets


def _layer_head_rows(
    attentions: np.ndarray, layer: int | None, head: int | None
) -> tuple[np.ndarray, list[str]]:
    """The rows of the heatmap: [rows, K] weights and their labels.

    layer None: one row per layer (head ``head``, or the mean over heads when None);
    layer l: one row per head of layer l plus their mean (head None), or head ``head``.
    """
    n_layer, n_head, _ = attentions.shape
    if layer is None:
        rows = attentions.mean(axis=1) if head is None else attentions[:, head]
        suffix = "" if head is None else f" h{head}"
        return rows, [f"layer {i}{suffix}" for i in range(n_layer)]
    if not 0 <= layer < n_layer:
        raise ValueError(f"layer must be in 0..{n_layer - 1}, got {layer}")
    if head is None:
        rows = np.concatenate([attentions[layer], attentions[layer].mean(axis=0, keepdims=True)])
        return rows, [f"L{layer} head {h}" for h in range(n_head)] + [f"L{layer} mean"]
    return attentions[layer, head][None], [f"L{layer} head {head}"]


def _key_label(text: str | Sequence[str] | None, pos: int) -> str:
    if text is None or not 0 <= pos < len(text):
        return f"#{pos}"
    return token_label(text[pos])


def _snippet(text: str | None, a: int, b: int, limit: int = 24) -> str:
    """The characters of text positions [a, b), shortened in the middle when long."""
    if text is None:
        return f"#{a}–#{b - 1}"
    s = visible_text("".join(text[a:b]))
    if len(s) > limit:
        s = s[: limit // 2 - 1] + "…" + s[-(limit // 2 - 1) :]
    return s


_TRANSPARENT = {"paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)"}


def figure(spec: dict) -> go.Figure:
    """A plotly Figure from a {"data": [...], "layout": {...}} spec.

    The figures here are built as plain dicts and wrapped once, without plotly's
    per-property validation: that keeps a figure at a few milliseconds instead of tens
    (tests/test_viz.py validates every spec with plotly instead).
    """
    try:
        return go.Figure(spec, _validate=False)
    except TypeError:  # a plotly without the private switch
        return go.Figure(spec)


# ---- the per-step views: compact data, drawn in the browser ------------------------
#
# A Step must be painted in tens of milliseconds, so the two views it redraws (the text
# shaded by attention, and the attention of the newest token over its keys) go to the
# browser as small JSON dicts that webapp/web/views.js draws: a <canvas> for the attention,
# spans for the text. No Plotly: drawing its heatmap cost ~400 ms of script per step.


def memory_mass(attentions: np.ndarray, n_memory: int) -> np.ndarray:
    """[n_layer, n_head] share of each head's attention that goes to the memory keys."""
    attentions = np.asarray(attentions, dtype=np.float64)
    return attentions[..., : max(0, int(n_memory))].sum(axis=-1)


def _rounded(x: np.ndarray, decimals: int = 4) -> list:
    return np.round(np.asarray(x, dtype=np.float64), decimals).tolist()


def packed(view: dict | None) -> dict | None:
    """A view's dict as one JSON string, ``{"packed": "..."}``, for the page's own Step
    (webapp/web/views.js TXL.unpack reads it back). Gradio's page copies every output
    component's whole value (Svelte's $state.snapshot, one structuredClone per number) on
    each loading-status change, several times per Step: for the attention and text views'
    ~1,500 numbers and strings that was most of a Step's main-thread time; one string is
    copied at once. API clients get the plain dicts from /step."""
    return None if view is None else {"packed": json.dumps(view, separators=(",", ":"))}


def attention_view(
    trace,
    text: str | Sequence[str] | None,
    layer: int | None = None,
    head: int | None = None,
    max_cols: int = 160,
    unit: str = "character",
    history: tuple[int, int] | None = None,
    terms: dict | None = None,
    window: int | None = None,
) -> dict:
    """The newest token's attention over its keys, as the browser's attention view draws it.

    Rows are layers (``layer=None``; each the mean over heads, or head ``head``) or the
    heads of one layer and their mean; columns the keys in text order, [memory | current],
    summed into buckets beyond ``max_cols`` keys. ``w[r][c]`` is the weight of row r on
    column c; ``mass[r]`` the row's share on memory. Key columns carry the text position
    of their first and last key (distance = pos - position) and a label.
    ``window`` (the session's seg_len: what a model without memory sees, the newest token
    included): the keys ``window`` or more back are beyond it, reachable only through
    memory. They are the first ``n_far`` keys and the first ``n_far_cols`` columns (no
    bucket straddles the window's edge), and ``far[r]`` is row r's share on them: the sum
    of ``w[r][:n_far_cols]`` (what the step summary's ``far_mass_per_layer`` holds for the
    rows of all layers). No window: all three are 0.
    ``history``: (steps back, steps kept), when the view shows an earlier step.
    ``terms``: the chosen head's four score terms (webapp.anatomy_viz.step_terms), drawn as
    strips under the view by webapp/web/terms.js.
    """
    if trace.attentions is None:
        raise ValueError("this step did not capture its attention")
    attentions = np.asarray(trace.attentions, dtype=np.float32)  # [L, H, K]
    keys = np.asarray(trace.key_positions, dtype=np.int64)
    if attentions.ndim != 3 or attentions.shape[-1] != keys.size:
        raise ValueError(f"attentions {attentions.shape} do not match {keys.size} keys")
    rows, labels = _layer_head_rows(attentions, layer, head)  # [R, K]
    n_far = far_keys(keys, trace.position, window) if window else 0
    buckets = bucket_keys(keys.size, trace.n_memory, max_cols, n_far)
    sums = np.add.reduceat(rows, [a for a, _ in buckets], axis=1) if buckets else rows[:, :0]
    first = [int(keys[a]) for a, _ in buckets]
    last = [int(keys[b - 1]) for _, b in buckets]
    if all(b - a == 1 for a, b in buckets):
        col_labels = [_key_label(text, p) for p in first]
    else:
        col_labels = [_snippet(text, p, q + 1) for p, q in zip(first, last)]
    return {
        "pos": int(trace.position),
        "query": _key_label(text, int(trace.position)),
        "memory": bool(trace.memory),
        "unit": unit,
        "rows": labels,
        # 5 decimals: a row's weights summed over the columns beyond the window stay within
        # ~1e-4 of its exact share (4 decimals: up to 3e-3 over 64 columns)
        "w": _rounded(sums, 5),
        "mass": _rounded(rows[:, : trace.n_memory].sum(axis=1)),
        "far": _rounded(rows[:, :n_far].sum(axis=1)),
        "window": int(window or 0),
        "n_far": n_far,
        "n_far_cols": sum(1 for a, _ in buckets if a < n_far),
        "first": first,
        "last": last,
        "labels": col_labels,
        "n_mem_cols": sum(1 for a, _ in buckets if a < trace.n_memory),
        "n_keys": int(keys.size),
        "history": list(history) if history else None,
        "terms": terms,
    }


def beyond_window_share(
    trace, window: int, layer: int | None = None, head: int | None = None
) -> float | None:
    """The newest token's attention on keys ``window`` or more back (beyond the window of
    a model without memory), for one layer (or the mean over layers) and one head (or the
    mean over heads): the sum of the text's shading (``text_weights``) before the window.
    None when the step has no attention."""
    if trace is None or trace.attentions is None:
        return None
    n_far = far_keys(trace.key_positions, trace.position, window)
    return float(text_weights(trace, layer, head)[:n_far].astype(np.float64).sum())


def choice_words(layer: int | None, head: int | None) -> str:
    """Which layer and head a view shows, in words."""
    if layer is None:
        return "mean over layers and heads" if head is None else f"head {head}, mean over layers"
    return f"layer {layer}, " + ("mean over heads" if head is None else f"head {head}")


def text_weights(trace, layer: int | None = None, head: int | None = None) -> np.ndarray:
    """[K] the newest token's attention on each key, as the text is shaded: one layer (or
    the mean over layers), one head (or the mean over heads)."""
    a = np.asarray(trace.attentions, dtype=np.float32)  # [L, H, K]
    a = a.mean(axis=0) if layer is None else a[layer]
    return a.mean(axis=0) if head is None else a[head]


def text_view(
    text: str | Sequence[str],
    roles: Sequence[str],
    trace=None,
    layer: int | None = None,
    head: int | None = None,
    memory: bool = True,
    max_chars: int = 6000,
    unit: str = "character",
    effect=None,
    window: int | None = None,
) -> dict:
    """The text as the browser's text view draws it: runs of equal role, and with a fresh
    ``trace`` (one that captured attention) the newest token's weight on each key, so that
    each character is shaded by how much the newest one reads it.

    ``runs`` is a list of [role, first position, text]; a run inside the attention window
    carries a list of tokens (one span each), others one string (the browser reads only its
    text, never its length: a word model's string is longer than its token count). Only the last
    ``max_chars`` tokens are sent; ``earlier`` counts the rest.

    ``effect`` (a ``txl.predictions.MemoryEffect``): the second shading mode, memory's
    effect on each token produced with memory on: ``effect`` in the dict is its
    ``view(...)`` of the shown tokens; for a word model, runs from its first token on are
    lists too (a character model's string runs are split by character in the browser).

    ``window`` (the session's seg_len): ``window_start`` is the first position of the
    window a model without memory sees, the last ``window`` tokens of the text (the text
    ends at the newest token); the browser draws the window's edge before it (None: no
    window, or the whole text is inside it). The roles (``roles_from_trace`` /
    ``roles_from_info`` with the same window) mark the memory before it FAR.
    """
    if len(roles) != len(text):
        raise ValueError(f"{len(roles)} roles for {len(text)} characters")
    weights, w0 = None, 0
    if trace is not None and trace.attentions is not None and len(trace.key_positions):
        w0 = int(trace.key_positions[0])
        weights = _rounded(text_weights(trace, layer, head), 5)
    start = max(0, len(text) - max_chars)
    w_end = w0 + len(weights) if weights is not None else w0
    shading = effect.view(start, len(text)) if effect is not None else None
    # Tokens the browser may shade one by one: those in the attention window, and (a word
    # model's: a character model's strings split by character) those from the first one
    # memory's effect was recorded for.
    e0 = shading["start"] if shading is not None and unit != "character" else len(text)

    def one_by_one(k: int) -> bool:
        return (weights is not None and w0 <= k < w_end) or k >= e0

    edge = len(text) - int(window) if window else 0  # a run starts at the window's edge

    runs, i = [], start
    while i < len(text):
        j = i + 1
        while (
            j < len(text)
            and roles[j] == roles[i]
            and (j < w0 or j >= w_end) == (i < w0 or i >= w_end)
            and (j < e0) == (i < e0)
            and (j < edge) == (i < edge)
        ):
            j += 1
        pieces = text[i:j]
        runs.append([str(roles[i]), i, list(pieces) if one_by_one(i) else "".join(pieces)])
        i = j
    labels = ROLE_LABELS if memory else ROLE_LABELS_NO_MEMORY
    if window and memory:
        labels = {**labels, FAR: f"beyond the window of {window}: only memory reaches it"}
    return {
        "earlier": start,
        "unit": unit,
        "memory": bool(memory),
        "labels": labels,
        "window": int(window or 0),
        "window_start": edge if edge > 0 else None,
        "runs": runs,
        "w0": w0,
        "w": weights,
        "layer": "mean over layers" if layer is None else f"layer {layer}",
        "head": "mean over heads" if head is None else f"head {head}",
        "pos": int(trace.position) if trace is not None else -1,
        "effect": shading,
    }


def far_keys(key_positions: np.ndarray, query_position: int, far: int) -> int:
    """How many keys lie ``far`` or more positions before the query (keys ascending)."""
    distances = query_position - np.asarray(key_positions)
    return int((distances >= far).sum())


# ---- does memory help? ---------------------------------------------------------------


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
    window (``bits_sliding``, when given), and segments with memory. Faint raw values, bold
    rolling means over ``window`` characters, the bpc and time of each in the legend;
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
    data = []
    for key, bits, color, bpc, seconds in curves:
        name = names[key]
        data.append(
            {
                "type": "scatter",
                "x": x,
                "y": np.round(bits, 4),
                "mode": "lines",
                "name": f"{name} (per char)",
                "line": {"color": color, "width": 1},
                "opacity": 0.3,
                "text": labels,
                "legendgroup": key,
                "showlegend": False,
                "hovertemplate": f"{name}<br>char '%{{text}}' at %{{x}}: %{{y:.2f}} bits"
                "<extra></extra>",
            }
        )
        data.append(
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
    return figure(
        {
            "data": data,
            "layout": {
                "title": {"text": title, "font": {"size": 13}},
                "xaxis": {"title": {"text": "character position in the text"}},
                "yaxis": {"title": {"text": "surprisal (bits)"}, "rangemode": "tozero"},
                "shapes": shapes,
                "height": 400,
                "margin": {"l": 10, "r": 10, "t": 64, "b": 40},
                "legend": {"orientation": "h", "y": -0.2},
                "hovermode": "closest",
                **_TRANSPARENT,
            },
        }
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


def sliding_progress_markdown(
    done: int, total: int, seconds_left: float, window: int, unit: str = "character"
) -> str:
    """The sliding window's progress while a Score streams: a bar, the {unit}s done of
    ``total``, and the time left (unknown before the first chunk)."""
    head = f"⏳ **The sliding window of {window}**, recomputed for every {unit}: "
    if done <= 0:
        return head + f"starting ({total:,} {unit}s, one forward pass each)."
    left = f", about {_seconds(seconds_left).strip(' ()')} left" if seconds_left > 0 else ""
    return (
        head + f"{done:,} of {total:,} {unit}s{left}.\n\n"
        f'<progress value="{done}" max="{max(total, 1)}" style="width: 100%"></progress>'
    )


# Shown under the sweep's chart while the sweep runs (the chart keeps the last text's).
SWEEP_PENDING = "⏳ **How far back does it read?** Scoring the text with memories of 0 to 1,024…"


# ---- plain data ----------------------------------------------------------------------


def step_summary(
    trace, info: dict | None = None, far: int | None = None, terms: dict | None = None
) -> dict:
    """A small JSON-able summary of a step: what the newest token could see (and, with
    ``far``, the share of attention on keys ``far`` or more tokens back). ``terms``: the
    chosen head's four score terms (webapp.anatomy_viz.step_terms; None unless one layer and
    one head are chosen)."""
    keys = np.asarray(trace.key_positions)
    out = {
        "position": int(trace.position),
        "char": trace.char,
        "token_id": int(trace.token_id),
        "memory": bool(trace.memory),
        "n_keys": int(keys.size),
        "n_memory": int(trace.n_memory),
        "key_range": [int(keys[0]), int(keys[-1])] if keys.size else [],
        "memory_tokens": int(trace.memory_tokens),
        "memory_bytes": int(trace.memory_bytes),
        "latency_ms": round(float(trace.latency_ms), 3),
        "terms": terms,
    }
    if trace.attentions is not None:
        mass = memory_mass(trace.attentions, trace.n_memory).mean(axis=1)
        out["memory_mass_per_layer"] = [round(float(m), 4) for m in mass]
        if far is not None:
            n_far = far_keys(keys, trace.position, far)
            far_mass = memory_mass(trace.attentions, n_far).mean(axis=1)
            out["far"] = int(far)
            out["far_mass_per_layer"] = [round(float(m), 4) for m in far_mass]
    if info is not None:
        out["context"] = int(info["context"])
    predictions = getattr(trace, "predictions", None)  # txl.predictions.Predictions
    if predictions is not None:
        out["predictions"] = predictions.as_dict()
        out["counterfactual_ms"] = round(float(predictions.counterfactual_ms), 3)
    return out


def predictions_view(
    trace, seg_len: int, unit: str = "character", history: tuple[int, int] | None = None
) -> dict | None:
    """The two bar lists' data, as webapp/web/predictions.js draws them: the step's
    prediction with memory and without (``trace.predictions.as_dict()``, the API's
    summary["predictions"]), the position it was drawn for, whether memory was on, and the
    memory-off model's window (``seg_len``). None when the step has no predictions.
    ``history``: (steps back, steps kept), when it shows an earlier step."""
    predictions = getattr(trace, "predictions", None) if trace is not None else None
    if predictions is None:
        return None
    return {
        "pos": int(trace.position),
        "unit": unit,
        "memory": bool(trace.memory),
        "window": int(seg_len),
        "history": list(history) if history else None,
        **predictions.as_dict(),
    }


def attention_export(trace, text: str | None = None, decimals: int = 6) -> dict:
    """The step's full attention as JSON-able data (for download)."""
    keys = np.asarray(trace.key_positions)
    out = step_summary(trace)
    out["key_positions"] = [int(p) for p in keys]
    if text is not None:
        out["key_chars"] = [text[p] if 0 <= p < len(text) else None for p in keys]
    out["shape"] = "[n_layer, n_head, n_keys]"
    out["attentions"] = (
        None
        if trace.attentions is None
        else np.round(np.asarray(trace.attentions, dtype=np.float64), decimals).tolist()
    )
    return out


# ---- three ways of reading a text, and how far back the model reads ----------------

SEGMENTS_COLOR = CURRENT_COLOR  # segments read alone: the colour of "current segment"
SLIDING_COLOR = "#10b981"


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
    return figure(
        {
            "data": data,
            "layout": {
                "title": {"text": "How far back does it read?", "font": {"size": 13}},
                "xaxis": {
                    "title": {"text": f"memory length ({unit}s, log scale)"},
                    "tickvals": x,
                    "ticktext": [f"{n:,}" for n in lengths],
                },
                "yaxis": {"title": {"text": f"bits per {unit}"}},
                "shapes": shapes,
                "annotations": annotations,
                "height": 340,
                "margin": {"l": 10, "r": 10, "t": 50, "b": 40},
                "legend": {"orientation": "h", "y": -0.25},
                "hovermode": "closest",
                **_TRANSPARENT,
            },
        }
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


SCORE_HELP = """\
**Three ways to read a long text with a model trained on segments of a fixed length**
(64 characters for the bundled Shakespeare model).

- **Segments read alone** (orange): cut the text into segments and read each one with
  nothing before it. Cheap, but the first characters of every segment are guessed blind:
  see the curve jump up after each dotted line. The paper calls this *context
  fragmentation*.
- **Sliding window** (green): for every character, run the model again on exactly the
  segment length of characters before it. The best a model without memory can do, but
  every character costs a whole forward pass over the window.
- **Memory** (blue, Transformer-XL): read the segments in order, and let each one also look
  at the hidden states the model already computed for the text before it, without
  recomputing them.

Memory beats the segments read alone (the fragmentation is gone) *and* does about as well
as the sliding window, or better (it sees further back than one segment), at a fraction
of the time: the time of each way is in the legend.
"""

CONTEXT_HELP = """\
**How far back does it read?** The same text scored with memories of different lengths
(0 = segments read alone). The curve falls while the extra memory still holds something
useful and flattens once it does not. The red line marks the **effective context**: the
shortest memory whose bits per character are within 1 % of the best. Memory costs time and
space in proportion to its length, so there is no point keeping more than the model uses.
The paper measures the same idea as *relative effective context length* (its Section 4.2).
"""


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


MOMENTS_HELP = """\
**Where memory mattered.** When the sliding window is done, the text is shaded {unit} by
{unit} by the bits memory saved over the window of the last {window} {unit}s (blue: memory
made the {unit} likelier; red: less likely; hover for both probabilities), and the five
{unit}s it saved the most on are listed in their context. Pick one and press **Watch it**:
the Watch tab opens on the text up to that {unit} as the prompt, memory on at this
mem_len, and shows where the model looked to predict it (the attention of the prompt's
last {unit}); one **Step** then writes that very {unit}, with its prediction with memory
and without: the numbers listed here.
"""
