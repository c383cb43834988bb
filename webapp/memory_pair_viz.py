"""The "Memory on | off" tab's views, from a ``txl.counterfactual.MemoryPair`` (duck-typed:
its two sessions, prompt length, differing positions and parting) and plain strings.

- :func:`speaker_headings`: the speaker headings of a play's text ("ROMEO:" on a line of
  its own, after a blank line), and :func:`pair_counts`: how many each side wrote, how many
  of them are speakers of the prompt, how many characters differ.
- :func:`attention_strip`: where the memory side's token looked, one row (the mean over
  layers and heads) over its keys, the window's edge on it.
- :func:`pair_view`: the dict webapp/web/pair.js draws (both texts, where they differ, the
  parting point, the counts); :func:`status_markdown`: the line above it.

Nothing here imports Gradio: the views are tested without a page (tests/test_viz.py).
"""

from __future__ import annotations

import re

import numpy as np

from . import watch_viz
from .figures import rounded

# A heading: a capitalised name of at most four words alone on its line, ended by a colon,
# at the text's start or after a blank line (speeches never start after a blank line).
HEADING = re.compile(r"(?:\A|(?<=\n\n))([A-Z][A-Za-z']*(?: [A-Za-z']+){0,3}):(?=\n)")
STRIP_COLUMNS = 200  # keys beyond this are summed into buckets (mem_len 128 + 1 fits)


def speaker_headings(text: str, written_from: int = 0) -> list[tuple[int, str]]:
    """(position of the name, name) of each speaker heading whose line is complete and
    whose colon lies at or after ``written_from`` (the prompt's length: the headings a
    generation wrote, the heading's end at least)."""
    return [(m.start(1), m.group(1)) for m in HEADING.finditer(text) if m.end(1) >= written_from]


def pair_counts(prompt_chars: int, memory_text: str, window_text: str, differing: int) -> dict:
    """What each side wrote after the prompt: its speaker headings in order, how many of
    them name a speaker of the prompt; and how many characters differ."""
    prompt_speakers = {name for _, name in speaker_headings(memory_text[:prompt_chars])}

    def side(text: str) -> dict:
        names = [name for _, name in speaker_headings(text, prompt_chars)]
        known = sum(name in prompt_speakers for name in names)
        return {"headings": names, "of_prompt": known}

    return {
        "differ": int(differing),
        "prompt_speakers": sorted(prompt_speakers),
        "memory": side(memory_text),
        "window": side(window_text),
    }


def attention_strip(trace, window: int, pieces) -> dict | None:
    """The attention of ``trace``'s token (a StepTrace of the memory side) over its keys,
    averaged over layers and heads, as pair.js draws it: ``w`` per column (keys summed into
    buckets beyond STRIP_COLUMNS), each column's first and last text position and label;
    the first ``n_far_cols`` columns lie ``window`` or more back (only memory reaches
    them), ``far`` their share. None without attention."""
    if trace is None or trace.attentions is None:
        return None
    weights = watch_viz.text_weights(trace).astype(np.float64)  # [K]
    keys = np.asarray(trace.key_positions, dtype=np.int64)
    n_far = watch_viz.far_keys(keys, trace.position, window)
    buckets = watch_viz.bucket_keys(keys.size, trace.n_memory, STRIP_COLUMNS, n_far)
    sums = np.add.reduceat(weights, [a for a, _ in buckets]) if buckets else weights[:0]
    first = [int(keys[a]) for a, _ in buckets]
    last = [int(keys[b - 1]) for _, b in buckets]
    labels = ["".join(pieces[p : q + 1]) for p, q in zip(first, last)]
    return {
        "pos": int(trace.position),
        "query": pieces[trace.position],
        "w": rounded(sums, 5),
        "first": first,
        "last": last,
        "labels": labels,
        "window": int(window),
        "n_far_cols": sum(1 for a, _ in buckets if a < n_far),
        "far": round(float(weights[:n_far].sum()), 5),
        "n_keys": int(keys.size),
    }


def differing_runs(positions: list[int]) -> list[list[int]]:
    """Ascending positions as runs [first, end): [3, 4, 5, 9] -> [[3, 6], [9, 10]]."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and runs[-1][1] == p:
            runs[-1][1] = p + 1
        else:
            runs.append([p, p + 1])
    return runs


def pair_view(pair, settings: dict | None = None) -> dict | None:
    """The tab's view of a pair, as webapp/web/pair.js draws it and the API returns it:
    both texts (a character model's as strings, a word model's as lists of tokens), the
    prompt's length in tokens, the runs where the texts differ, the parting point (its
    two predictions, ``Parting.as_dict``, and where the memory side looked), the counts,
    and the settings the pair runs with. None before the first Step."""
    left, right = pair.with_memory, pair.without_memory
    if not left.ids:
        return None
    character = left.tokenizer.unit == "character"
    prompt_chars = len("".join(left.pieces[: pair.prompt_tokens]))
    parting = None
    if pair.parting is not None:
        parting = pair.parting.as_dict()
        parting["looked"] = attention_strip(pair.parting.looked, left.seg_len, left.pieces)
    return {
        "unit": left.tokenizer.unit,
        "memory_text": left.text if character else list(left.pieces),
        "window_text": right.text if character else list(right.pieces),
        "prompt_tokens": int(pair.prompt_tokens),
        "steps": int(pair.steps),
        "differ": differing_runs(pair.differing),
        "parting": parting,
        "counts": pair_counts(prompt_chars, left.text, right.text, len(pair.differing)),
        "mem_len": int(left.mem_len),
        "memory": bool(left.memory),
        "window": int(left.seg_len),
        "settings": settings or {},
    }


def status_markdown(view: dict | None) -> str:
    """One line over the texts: the steps and settings, what differs, the headings."""
    if view is None:
        return "Nothing generated yet: **Step**, **Play** or **Generate** from the prompt."
    unit, c = view["unit"], view["counts"]
    s = view["settings"]
    sampling = ", ".join(f"{k} {v}" for k, v in s.items()) if s else ""
    memory = f"memory {view['mem_len']}" if view["memory"] else "memory off"
    head = (
        f"**{view['steps']:,} steps** from the same draws ({sampling}) · left: {memory}, "
        f"right: the window of {view['window']} {unit}s"
    )
    if view["parting"] is None:
        return f"{head} · the texts are **identical** so far"
    p = view["parting"]

    def side(name: str, key: str) -> str:
        n, known = len(c[key]["headings"]), c[key]["of_prompt"]
        return f"{name} wrote {n} speaker heading{'s' * (n != 1)} ({known} of the prompt's)"

    return (
        f"{head} · they part at step {p['step'] + 1} · **{c['differ']:,} {unit}s differ** · "
        f"{side('memory', 'memory')}, {side('the window', 'window')}"
    )
