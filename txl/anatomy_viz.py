"""Views of the inside of the attention (txl.anatomy), from plain arrays: no Gradio, no torch.

- :func:`step_terms`: the newest token's four score terms for one layer and head, as JSON
  (the /step summary's ``"terms"``, and the strips under the attention view that
  txl/web/terms.js draws), with a sentence on which term varies most.
- :func:`distance_figure` / :func:`terms_figure`: the paper's Figures 5 and 7 on a text
  (matplotlib, so that the page shows and the README ships the same PNG).
- :func:`anatomy_numbers` / :func:`anatomy_markdown`: what the profiles say, as JSON and
  in words beside what the paper found.
"""

from __future__ import annotations

import numpy as np

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
