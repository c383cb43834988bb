"""The Watch tab's views, from plain arrays and a Session's traces.

Everything here works on numpy arrays, strings and (duck-typed) ``txl.session.StepTrace``
objects; nothing imports Gradio, so the views can be tested and reused outside the app.

- :func:`text_roles`: each character's role for the next prediction: fallen out of memory,
  in memory, in the current segment, the newest token.
- :func:`text_view` / :func:`attention_view`: the two views a Step redraws, as small dicts
  that the browser draws (webapp/web/views.js): the text shaded by the newest token's
  attention, and that attention over its keys [memory | current], rows = layers (or
  heads), keys beyond ``max_cols`` summed into buckets.
- :func:`status_markdown`: the status line; :func:`predictions_view`: the next-token bars.
- :func:`attention_export` / :func:`step_summary`: plain JSON.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .figures import format_bytes, rounded, token_label, visible_text

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
    (``beyond_window_share``), leading the line: what only memory gave it. Memory off,
    the line speaks of neither: nothing lies beyond the window, and memory saves nothing."""
    if not info["memory"]:
        beyond = saved = None
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
        "w": rounded(sums, 5),
        "mass": rounded(rows[:, : trace.n_memory].sum(axis=1)),
        "far": rounded(rows[:, :n_far].sum(axis=1)),
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
        weights = rounded(text_weights(trace, layer, head), 5)
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
    trace,
    seg_len: int,
    unit: str = "character",
    history: tuple[int, int] | None = None,
    given: bool = False,
) -> dict | None:
    """The two bar lists' data, as webapp/web/predictions.js draws them: the step's
    prediction with memory and without (``trace.predictions.as_dict()``, the API's
    summary["predictions"]), the position it was drawn for, whether memory was on, and the
    memory-off model's window (``seg_len``). None when the step has no predictions.
    ``history``: (steps back, steps kept), when it shows an earlier step. ``given``: the
    step wrote the text's own token (``chosen``) rather than a sample."""
    predictions = getattr(trace, "predictions", None) if trace is not None else None
    if predictions is None:
        return None
    return {
        "pos": int(trace.position),
        "unit": unit,
        "memory": bool(trace.memory),
        "window": int(seg_len),
        "history": list(history) if history else None,
        "given": bool(given),
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
    out["attentions"] = None if trace.attentions is None else rounded(trace.attentions, decimals)
    return out
