"""Views of the recall probe (txl.recall), from its rows: no Gradio, no torch.

- :func:`recall_figure`: bits per character of the rest of the name against the distance
  k (log axis), read with memory, through the window and in segments alone, the window
  and ``mem_len`` marked;
- :func:`recall_markdown`: the sentence (``txl.recall.recall_summary``), and the progress
  while the rows stream in;
- :func:`recall_numbers`: the rows as JSON (the /recall endpoint's numbers).
"""

from __future__ import annotations

import math

from txl.recall import CUE, DISTANCES, RECALLED_BITS, RecallRow, name_back, recall_summary

from .figures import MEMORY_COLOR, SEGMENTS_COLOR, SLIDING_COLOR, chart


def recall_numbers(
    rows: list[RecallRow], mem_len: int, window: int, seconds: float | None = None
) -> dict:
    """{"rows": [{"distance", "text", "start", "bits_memory", "bits_window",
    "bits_segments"}, ...], ...}: each row's scored characters are text[start:], each
    bits value their mean surprisal in bits (recomputable from text and start alone)."""
    return {
        "rows": [r.to_dict() for r in rows],
        "mem_len": mem_len,
        "window": window,  # tgt_len: the sliding window and the segments' length
        "cue": CUE,
        "recalled_below_bits": RECALLED_BITS,
        "seconds": None if seconds is None else round(seconds, 3),
    }


def recall_markdown(
    rows: list[RecallRow], mem_len: int, window: int, total: int, seconds: float
) -> str:
    """The sentence, and while rows are still coming, how many are read."""
    if not rows:
        return f"Reading {total} distances…"
    sentence = recall_summary(rows, window, mem_len=mem_len)
    sentence = sentence[0].upper() + sentence[1:]
    if len(rows) < total:
        return (
            f"{sentence}\n\n*Read {len(rows)} of {total} distances (up to k = "
            f"{rows[-1].distance:,}) in {seconds:.1f} s…*"
        )
    return f"**{sentence}**\n\n{total} distances read in {seconds:.1f} s."


def recall_figure(rows: list[RecallRow], mem_len: int, window: int, distances=DISTANCES) -> object:
    """Bits per character of the name's rest over k (log axis) for the three reads, the
    window (tgt_len) and mem_len as vertical lines, the recall threshold as a dotted
    line. The axis spans all ``distances`` (and the two lines) from the first row on, so
    streaming rows do not move it."""
    ks = [r.distance for r in rows]
    names = {
        "bits_memory": (f"with memory ({mem_len:,})", MEMORY_COLOR, "solid"),
        "bits_window": (f"through the window ({window})", SLIDING_COLOR, "solid"),
        "bits_segments": (f"segments of {window} alone", SEGMENTS_COLOR, "dot"),
    }
    # How far back the planted name's last letter lies (with text before the speaker or
    # without): the window reaches it when this is at most tgt_len.
    back = [f"{name_back(r.distance):,}" for r in rows]
    data = [
        {
            "type": "scatter",
            "x": ks,
            "y": [round(getattr(r, key), 4) for r in rows],
            "mode": "lines+markers",
            "name": label,
            "line": {"color": color, "width": 2.5, "dash": dash},
            "marker": {"size": 8},
            "customdata": back,
            "hovertemplate": f"k = %{{x:,}}: %{{y:.3f}} bits/char {label}<br>"
            f"(the planted name's last letter is %{{customdata}} characters back; the "
            f"window reaches {window})"
            "<extra></extra>",
        }
        for key, (label, color, dash) in names.items()
    ]
    marks = [x for x in (window, mem_len) if x > 0]  # drawn as lines: inside the range
    lo, hi = min([*distances, *ks, *marks]), max([*distances, *ks, *marks])
    shapes, annotations = [], []
    for x, label, color in ((window, "window", SLIDING_COLOR), (mem_len, "mem_len", MEMORY_COLOR)):
        if x <= 0:  # no line at 0 on a log axis (mem_len 0: memory is off)
            continue
        shapes.append(
            {
                "type": "line",
                "x0": x,
                "x1": x,
                "y0": 0,
                "y1": 1,
                "yref": "paper",
                "line": {"color": color, "width": 1.5, "dash": "dash"},
            }
        )
        annotations.append(
            {
                "x": math.log10(x),
                "y": 1,
                "yref": "paper",
                "text": f"{label} {x:,}",
                "showarrow": False,
                "xanchor": "left",
                "yanchor": "bottom",
                "font": {"size": 11, "color": color},
            }
        )
    shapes.append(
        {
            "type": "line",
            "xref": "paper",
            "x0": 0,
            "x1": 1,
            "y0": RECALLED_BITS,
            "y1": RECALLED_BITS,
            "line": {"color": "#6b7280", "width": 1, "dash": "dot"},
        }
    )
    annotations.append(
        {
            "x": 0,
            "xref": "paper",
            "y": RECALLED_BITS,
            "text": "recalled below this",
            "showarrow": False,
            "xanchor": "left",
            "yanchor": "top",
            "font": {"size": 10, "color": "#6b7280"},
        }
    )
    return chart(
        "How far back can it recall?",
        data,
        xaxis={
            "type": "log",
            "title": {"text": "k: characters of filler between the name and its return"},
            "tickvals": sorted({*distances, *ks}),
            "ticktext": [f"{k:,}" for k in sorted({*distances, *ks})],
            # log axis: the range is in log10 units, a little beyond the ends
            "range": [math.log10(lo) - 0.1, math.log10(hi) + 0.1],
        },
        yaxis={"title": {"text": "bits per character of the name's rest"}, "rangemode": "tozero"},
        height=360,
        shapes=shapes,
        annotations=annotations,
    )
