"""What the tabs' views share: the role colours, characters made visible, byte counts in
words, Plotly figures built from plain dict specs (one place for the transparent
background and the unvalidated build), and numbers rounded and packed as JSON for the
page. ``watch_viz``, ``score_viz`` and ``recall_viz`` draw from these; nothing here
imports Gradio or txl.
"""

from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go

# The role colours of webapp/web/views.css, for the charts drawn here.
MEMORY_COLOR = "#3b82f6"
CURRENT_COLOR = "#f59e0b"
SEGMENTS_COLOR = CURRENT_COLOR  # segments read alone: the colour of "current segment"
SLIDING_COLOR = "#10b981"

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


def format_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


# Charts sit on the page's own background.
TRANSPARENT = {"paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)"}


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


def chart(title: str, data: list, xaxis: dict, yaxis: dict, height: int, **layout) -> go.Figure:
    """A chart of the tabs' one look: a small title, the legend in a row under the plot,
    hover on the nearest point, the page's background. ``layout``: the rest (shapes,
    annotations), or a key of these to replace (``margin``, ``legend``)."""
    base = {
        "title": {"text": title, "font": {"size": 13}},
        "xaxis": xaxis,
        "yaxis": yaxis,
        "height": height,
        "margin": {"l": 10, "r": 10, "t": 50, "b": 40},
        "legend": {"orientation": "h", "y": -0.25},
        "hovermode": "closest",
        **TRANSPARENT,
    }
    return figure({"data": data, "layout": {**base, **layout}})


def rounded(x, decimals: int = 4) -> list:
    """An array as nested lists of floats rounded to ``decimals``: JSON for the page."""
    return np.round(np.asarray(x, dtype=np.float64), decimals).tolist()


def packed(view: dict | None) -> dict | None:
    """A view's dict as one JSON string, ``{"packed": "..."}``, for the page's own Step
    (webapp/web/views.js TXL.unpack reads it back). Gradio's page copies every output
    component's whole value (Svelte's $state.snapshot, one structuredClone per number) on
    each loading-status change, several times per Step: for the attention and text views'
    ~1,500 numbers and strings that was most of a Step's main-thread time; one string is
    copied at once. API clients get the plain dicts from /step."""
    return None if view is None else {"packed": json.dumps(view, separators=(",", ":"))}
