"""The Watch and Score tabs' views (webapp.watch_viz, webapp.score_viz) on synthetic arrays:
roles, boundary, bucketing, hover data, exports."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import plotly.graph_objects as go
import pytest

from webapp import score_viz, watch_viz
from webapp.tabs import score as score_tab


def attention(n_layer: int, n_head: int, n_keys: int, seed: int = 0) -> np.ndarray:
    a = np.random.default_rng(seed).random((n_layer, n_head, n_keys))
    return (a / a.sum(-1, keepdims=True)).astype(np.float32)


def make_trace(n_keys=40, n_memory=39, position=None, memory=True, attentions=True):
    position = n_keys - 1 + 5 if position is None else position
    return SimpleNamespace(
        token_id=3,
        char="e",
        position=position,
        attentions=attention(2, 3, n_keys) if attentions else None,
        key_positions=np.arange(position - n_keys + 1, position + 1),
        n_memory=n_memory,
        memory_tokens=n_memory + 1,
        memory_bytes=1234,
        latency_ms=1.5,
        memory=memory,
    )


def validated(fig: go.Figure) -> go.Figure:
    """viz builds figures without plotly's validation: check every property here."""
    go.Figure(fig.to_dict())  # raises on a misspelt property or a bad value
    return fig


def test_text_roles_partition():
    roles = watch_viz.text_roles(10, first_key=2, memory_end=6, newest=9)
    assert list(roles) == ["gone"] * 2 + ["memory"] * 4 + ["current"] * 3 + ["newest"]
    assert list(watch_viz.text_roles(3, first_key=-5, memory_end=99)) == ["memory"] * 3


def test_roles_from_trace_and_info():
    t = make_trace(n_keys=6, n_memory=4, position=9)  # keys 4..9, memory 4..7
    roles = watch_viz.roles_from_trace(10, t)
    assert list(roles) == ["gone"] * 4 + ["memory"] * 4 + ["current", "newest"]
    on = {"memory": True, "span": (3, 10), "context": 7}
    assert list(watch_viz.roles_from_info(10, on)) == ["gone"] * 3 + ["memory"] * 7
    off = {"memory": False, "span": (10, 10), "context": 4}
    assert list(watch_viz.roles_from_info(10, off)) == ["gone"] * 6 + ["current"] * 4


def runs_positions(view: dict) -> list[int]:
    """The text positions the runs of a text view cover, in order."""
    return [first + i for _, first, piece in view["runs"] for i in range(len(piece))]


def test_text_view_runs_cover_the_text_by_role():
    text = "<b>${x}</b>\n"
    roles = watch_viz.text_roles(len(text), 2, 6, newest=len(text) - 1)
    view = json.loads(json.dumps(watch_viz.text_view(text, roles)))  # plain JSON
    assert runs_positions(view) == list(range(len(text)))  # contiguous, in order
    assert "".join("".join(piece) for _, _, piece in view["runs"]) == text  # raw: JS escapes
    assert [role for role, _, _ in view["runs"]] == ["gone", "memory", "current", "newest"]
    for role, first, piece in view["runs"]:
        assert all(roles[first + i] == role for i in range(len(piece)))
    assert view["earlier"] == 0 and view["w"] is None and view["pos"] == -1
    assert view["labels"] == watch_viz.ROLE_LABELS and view["memory"]
    off = watch_viz.text_view(text, roles, memory=False)
    assert off["labels"] == watch_viz.ROLE_LABELS_NO_MEMORY and not off["memory"]
    long = watch_viz.text_view("a" * 100, ["memory"] * 100, max_chars=10)
    assert long["earlier"] == 90 and runs_positions(long) == list(range(90, 100))
    with pytest.raises(ValueError):
        watch_viz.text_view("abc", ["memory"])


def test_text_view_weights_line_up_with_the_keys():
    t = make_trace(n_keys=8, n_memory=7, position=20)  # keys 13..20
    text = "abcdefghijklmnopqrstu"
    roles = watch_viz.roles_from_trace(len(text), t)
    view = watch_viz.text_view(text, roles, t)
    assert view["w0"] == 13 and len(view["w"]) == 8 and view["pos"] == 20
    np.testing.assert_allclose(view["w"], t.attentions.mean(axis=(0, 1)), atol=1e-5)
    assert runs_positions(view) == list(range(len(text)))
    for _, first, piece in view["runs"]:  # one span per key inside the window only
        inside = 13 <= first < 21
        assert isinstance(piece, list) == inside
        if inside:
            assert first + len(piece) <= 21
        else:
            assert first + len(piece) <= 13
    assert view["layer"] == "mean over layers" and view["head"] == "mean over heads"
    one = watch_viz.text_view(text, roles, t, layer=1, head=2)
    np.testing.assert_allclose(one["w"], watch_viz.text_weights(t, 1, 2), atol=1e-5)
    np.testing.assert_allclose(one["w"], t.attentions[1, 2], atol=1e-5)
    assert one["layer"] == "layer 1" and one["head"] == "head 2"
    np.testing.assert_allclose(watch_viz.text_weights(t, 0), t.attentions[0].mean(0), atol=1e-6)
    np.testing.assert_allclose(watch_viz.text_weights(t, None, 1), t.attentions[:, 1].mean(0))
    # a step without attention shades nothing
    bare = watch_viz.text_view(text, roles, make_trace(n_keys=8, n_memory=7, position=20,
                                                 attentions=False))
    assert bare["w"] is None and all(isinstance(p, str) for _, _, p in bare["runs"])


@pytest.mark.parametrize(
    "n_keys, n_memory, max_cols",
    [
        (10, 5, 128),
        (129, 128, 128),
        (2049, 2048, 128),
        (300, 0, 128),
        (1000, 937, 100),
        (77, 13, 8),
    ],
)
def test_bucket_keys_cover_keys_and_respect_boundary(n_keys, n_memory, max_cols):
    buckets = watch_viz.bucket_keys(n_keys, n_memory, max_cols)
    assert len(buckets) <= max_cols
    assert buckets[0][0] == 0 and buckets[-1][1] == n_keys
    assert all(a < b for a, b in buckets)
    assert all(b1 == a2 for (_, b1), (a2, _) in zip(buckets, buckets[1:]))  # contiguous
    assert all(not (a < n_memory < b) for a, b in buckets)  # none straddles the boundary
    if n_keys <= max_cols:
        assert all(b - a == 1 for a, b in buckets)


def test_attention_view_columns_and_hover_data():
    t = make_trace(n_keys=40, n_memory=30, position=100)  # keys 61..100
    text = "x" * 95 + "hello!"
    view = json.loads(json.dumps(watch_viz.attention_view(t, text)))  # plain JSON
    assert view["rows"] == ["layer 0", "layer 1"]  # layers as rows
    assert np.asarray(view["w"]).shape == (2, 40)  # one column per key
    np.testing.assert_allclose(view["w"], t.attentions.mean(axis=1), atol=1e-4)
    np.testing.assert_allclose(np.asarray(view["w"]).sum(1), 1.0, atol=1e-3)
    assert view["first"] == view["last"] == list(range(61, 101))
    assert view["labels"][0] == "x" and view["labels"][-1] == "!"
    assert view["pos"] == 100 and view["query"] == "!" and view["memory"]
    assert view["n_mem_cols"] == 30 and view["n_keys"] == 40 and view["history"] is None
    mass = t.attentions.mean(axis=1)[:, :30].sum(-1)
    np.testing.assert_allclose(view["mass"], mass, atol=1e-4)
    spaced = watch_viz.attention_view(make_trace(n_keys=3, n_memory=2, position=2), "a \n")
    assert spaced["labels"] == ["a", "␣", "↵"]  # whitespace made visible
    assert watch_viz.attention_view(t, None)["labels"][0] == "#61"  # no text: positions
    assert watch_viz.attention_view(t, text, history=(3, 10))["history"] == [3, 10]


def test_attention_view_buckets_long_memory():
    n_keys, n_memory = 2049, 2048
    t = make_trace(n_keys=n_keys, n_memory=n_memory, position=3000)  # keys 952..3000
    view = watch_viz.attention_view(t, "ab" * 1600, max_cols=128)
    w = np.asarray(view["w"])
    assert w.shape == (2, len(view["first"])) and w.shape[1] <= 128
    np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-3)  # buckets sum the weights
    buckets = watch_viz.bucket_keys(n_keys, n_memory, 128)
    keys = t.key_positions
    assert view["first"] == [int(keys[a]) for a, _ in buckets]
    assert view["last"] == [int(keys[b - 1]) for _, b in buckets]
    a, b = buckets[1]
    np.testing.assert_allclose(w[:, 1], t.attentions.mean(1)[:, a:b].sum(-1), atol=1e-4)
    # no bucket straddles the boundary: the memory columns end at the last memory key
    boundary = int(keys[n_memory])  # the first current key
    assert view["n_mem_cols"] == w.shape[1] - 1  # the newest key keeps its own column
    assert view["last"][view["n_mem_cols"] - 1] == boundary - 1
    assert view["first"][view["n_mem_cols"]] == boundary
    assert set(view["labels"][1].replace("…", "")) == {"a", "b"}  # a bucket shows its text
    np.testing.assert_allclose(view["mass"], t.attentions.mean(1)[:, :n_memory].sum(-1),
                               atol=1e-4)


def test_attention_view_layer_and_head_rows():
    t = make_trace(n_keys=20, n_memory=10, position=30)
    a = t.attentions  # [2 layers, 3 heads, 20]
    one_layer = watch_viz.attention_view(t, None, layer=1)
    assert one_layer["rows"] == [f"L1 head {h}" for h in range(3)] + ["L1 mean"]
    np.testing.assert_allclose(one_layer["w"][:3], a[1], atol=1e-4)
    np.testing.assert_allclose(one_layer["w"][3], a[1].mean(0), atol=1e-4)
    one_head = watch_viz.attention_view(t, None, layer=0, head=2)
    assert one_head["rows"] == ["L0 head 2"]
    np.testing.assert_allclose(one_head["w"][0], a[0, 2], atol=1e-4)
    head_all_layers = watch_viz.attention_view(t, None, head=0)
    assert head_all_layers["rows"] == ["layer 0 h0", "layer 1 h0"]
    np.testing.assert_allclose(head_all_layers["w"], a[:, 0], atol=1e-4)
    for view in (one_layer, one_head, head_all_layers):  # every row sums to 1
        np.testing.assert_allclose(np.asarray(view["w"]).sum(1), 1.0, atol=1e-3)
    with pytest.raises(ValueError):
        watch_viz.attention_view(t, None, layer=2)
    bad = make_trace(n_keys=20, n_memory=10, position=30)
    bad.attentions = bad.attentions[0]  # [H, K]: not [L, H, K]
    with pytest.raises(ValueError):
        watch_viz.attention_view(bad, None)


def test_attention_view_without_memory():
    t = make_trace(n_keys=16, n_memory=0, memory=False)
    view = watch_viz.attention_view(t, "z" * 30)
    assert view["n_mem_cols"] == 0 and not view["memory"]
    assert view["mass"] == [0.0, 0.0]
    np.testing.assert_allclose(np.asarray(view["w"]).sum(1), 1.0, atol=1e-3)
    with pytest.raises(ValueError):
        watch_viz.attention_view(make_trace(attentions=False), "z" * 60)


def test_memory_mass():
    a = np.zeros((2, 2, 4))
    a[0, :, :3] = 1 / 3  # layer 0: all on memory
    a[1, :, 3] = 1.0  # layer 1: all on the newest key
    np.testing.assert_allclose(watch_viz.memory_mass(a, 3), [[1, 1], [0, 0]])
    np.testing.assert_allclose(watch_viz.memory_mass(a, 0), 0.0)
    # keys 10..13 for a query at 13: keys 10 and 11 are 2 or more back
    assert watch_viz.far_keys(np.arange(10, 14), 13, far=2) == 2


def test_surprisal_figure_and_rolling_mean():
    np.testing.assert_allclose(score_viz.rolling_mean(np.array([1, 3, 5, 7.0]), 2), [1, 2, 4, 6])
    bits_with, bits_without = np.full(100, 1.0), np.full(100, 2.0)
    fig = validated(
        score_viz.surprisal_figure(["a"] * 100, bits_with, bits_without, 1.0, 2.0, seg_len=32)
    )
    names = [t.name for t in fig.data]
    # The old positional call (no sliding window, no times): two curves, baselines named.
    assert "with memory: 1.000 bpc" in names and "segments of 32 read alone: 2.000 bpc" in names
    assert len([s for s in fig.layout.shapes if s.type == "line"]) == 3  # segment starts
    assert "+1.000 vs segments of 32 read alone" in fig.layout.title.text
    with pytest.raises(ValueError):
        score_viz.surprisal_figure(["a"], bits_with, bits_without, 1.0, 2.0)


def test_exports_are_json():
    t = make_trace(n_keys=8, n_memory=7, position=20)
    text = "abcdefghijklmnopqrstu"
    data = json.loads(json.dumps(watch_viz.attention_export(t, text)))
    assert data["key_positions"] == list(range(13, 21))
    assert data["key_chars"] == list(text[13:21])
    assert np.asarray(data["attentions"]).shape == (2, 3, 8)
    assert data["n_memory"] == 7 and data["char"] == "e"
    summary = watch_viz.step_summary(t, {"context": 8}, far=4)
    assert summary["key_range"] == [13, 20] and summary["context"] == 8
    assert len(summary["memory_mass_per_layer"]) == 2
    far = t.attentions[:, :, :4].sum(-1).mean(-1)  # keys 13..16 are 4 or more back from 20
    np.testing.assert_allclose(summary["far_mass_per_layer"], far, atol=1e-4)


def test_status_markdown():
    on = {"memory": True, "tokens": 64, "mem_len": 128, "bytes": 3 * 2**20, "context": 65}
    line = watch_viz.status_markdown(on, 200, latency_ms=2.345)
    assert "Memory **on**" in line and "64/128" in line and "3.0 MB" in line
    assert "**65**" in line and "2.3 ms" in line
    off = {"memory": False, "tokens": 0, "mem_len": 128, "bytes": 0, "context": 64}
    assert "Memory **off**" in watch_viz.status_markdown(off, 200)
    # Memory off speaks of no memory: not what it saved on earlier steps (memory on then),
    # nor a share beyond the window (nothing lies there).
    line = watch_viz.status_markdown(off, 200, saved=(1.7, 130), beyond=(0.0, 64, "layer 0"))
    assert line.startswith("Memory **off**")
    assert "saved" not in line and "beyond the window" not in line
    assert "memory saved **1.7 bits**" in watch_viz.status_markdown(on, 200, saved=(1.7, 130))


def score_result(n=100, sliding=True):
    return SimpleNamespace(
        chars=["a"] * n, bits_with=np.full(n, 1.0), bits_without=np.full(n, 2.0),
        bpc_with=1.0, bpc_without=2.0, dropped=[],
        bits_sliding=np.full(n, 1.25) if sliding else None, bpc_sliding=1.25 if sliding else
        float("nan"), window=32, seg_len=32, mem_len=64,
        seconds_with=0.05, seconds_without=0.04, seconds_sliding=2.5 if sliding else
        float("nan"),
    )


def test_surprisal_figure_three_curves_with_times():
    fig = validated(score_viz.surprisal_figure_from_result(score_result()))
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert names == [
        "segments of 32 read alone: 2.000 bpc (40 ms)",
        "sliding window of 32: 1.250 bpc (2.5 s)",
        "segments of 32 + memory of 64: 1.000 bpc (50 ms)",
    ]
    assert len(fig.data) == 6  # raw and rolling mean of each
    # every raw curve drawn first, faint, under every mean: the window's hides none
    assert [t.showlegend is False for t in fig.data] == [True] * 3 + [False] * 3
    assert all(t.opacity == score_viz.RAW_OPACITY < 0.5 for t in fig.data[:3])
    assert "+1.000 vs segments of 32 read alone" in fig.layout.title.text
    assert "+0.250 vs the sliding window of 32" in fig.layout.title.text
    two = validated(score_viz.surprisal_figure_from_result(score_result(sliding=False)))
    assert len([t for t in two.data if t.showlegend is not False]) == 2
    with pytest.raises(ValueError):
        score_viz.surprisal_figure(["a"] * 3, np.ones(3), np.ones(3), 1, 1, bits_sliding=np.ones(2))


def test_score_markdown_names_every_baseline():
    text = score_viz.score_markdown(score_result(), 32, 64)
    assert "**100 characters** scored in bits per character" in text
    assert "segments of 32 read alone" in text and "sliding window of 32" in text
    assert "Memory vs segments read alone: saves 1.000 bpc" in text
    assert "Memory vs the sliding window of 32: saves 0.250 bpc, 50x faster" in text
    r = score_result()
    r.bpc_sliding = 1.005
    assert "about the same" in score_viz.score_markdown(r, 32, 64)
    r.bpc_sliding = 0.9
    assert "costs 0.100 bpc more" in score_viz.score_markdown(r, 32, 64)
    old = score_viz.score_markdown(score_result(sliding=False), 32, 64)  # a result without one
    assert "sliding" not in old and "saves 1.000 bpc" in old


def test_context_figure_marks_the_effective_context():
    sweep = SimpleNamespace(mem_lens=[0, 16, 32, 64, 1024], bpc=[3.0, 2.5, 2.01, 2.0, 2.0],
                            seconds=[0.1] * 5, seg_len=64, effective=32, tolerance=0.01)
    fig = validated(score_viz.context_figure(sweep, sliding_bpc=2.2))
    x = score_viz.context_axis(sweep.mem_lens)
    np.testing.assert_allclose(x, [3, 4, 5, 6, 10])  # log2, and 0 one step left of 16
    assert list(fig.layout.xaxis.ticktext) == ["0", "16", "32", "64", "1,024"]
    line = [s for s in fig.layout.shapes if s.type == "line"][0]
    assert line.x0 == 5  # at memory 32
    assert any("effective context: 32" in a.text for a in fig.layout.annotations)
    assert len(fig.data) == 2 and "sliding window of 64" in fig.data[1].name
    assert "Effective context: 32" in score_viz.context_markdown(sweep)
    help_text = score_tab.SCORE_HELP
    assert isinstance(help_text, str) and "sliding window" in help_text.lower()
    assert "effective context" in score_tab.CONTEXT_HELP.lower()


def test_score_numbers_are_plain_json():
    sweep = SimpleNamespace(mem_lens=[0, 16, 32], bpc=[3.0, 2.5, float("nan")],
                            seconds=[0.1] * 3, seg_len=32, effective=16, tolerance=0.01)
    numbers = score_viz.score_numbers(score_result(), sweep)
    numbers = json.loads(json.dumps(numbers, allow_nan=False))
    r = score_result()
    assert numbers["tokens"] == len(r.chars) and numbers["sliding_window"] == r.window
    assert numbers["seg_len"] == r.seg_len and numbers["mem_len"] == r.mem_len
    assert numbers["bpc"] == {"segments_alone": r.bpc_without, "sliding_window": r.bpc_sliding,
                              "memory": r.bpc_with}
    assert numbers["seconds"]["sliding_window"] == r.seconds_sliding
    assert numbers["context_sweep"] == {"mem_len": [0, 16, 32], "bpc": [3.0, 2.5, None],
                                        "effective_context": 16}
    alone = score_viz.score_numbers(score_result(sliding=False))  # NaN -> null, no sweep
    assert alone["bpc"]["sliding_window"] is None and alone["seconds"]["sliding_window"] is None
    assert "context_sweep" not in alone


# ---- the window line: what only memory reaches --------------------------------------


def test_roles_mark_the_memory_beyond_the_window():
    # keys 4..19 for the newest token at 19; memory 4..18; a window of 6: positions 14..19
    t = make_trace(n_keys=16, n_memory=15, position=19)
    roles = watch_viz.roles_from_trace(20, t, window=6)
    assert list(roles) == ["gone"] * 4 + ["far"] * 10 + ["memory"] * 5 + ["newest"]
    assert list(watch_viz.roles_from_trace(20, t)) == ["gone"] * 4 + ["memory"] * 15 + ["newest"]
    # A window longer than the memory reaches: nothing is beyond it.
    assert "far" not in watch_viz.roles_from_trace(20, t, window=40)
    # No fresh step: the window is the last 6 tokens of the text.
    on = {"memory": True, "span": (3, 20), "context": 17}
    roles = list(watch_viz.roles_from_info(20, on, 6))
    assert roles == ["gone"] * 3 + ["far"] * 11 + ["memory"] * 6
    off = {"memory": False, "span": (20, 20), "context": 6}
    assert list(watch_viz.roles_from_info(20, off, 6)) == ["gone"] * 14 + ["current"] * 6


def test_text_view_starts_a_run_at_the_windows_edge():
    t = make_trace(n_keys=16, n_memory=15, position=19)
    text = "abcdefghijklmnopqrst"
    view = watch_viz.text_view(text, watch_viz.roles_from_trace(20, t, 6), t, window=6)
    assert view["window"] == 6 and view["window_start"] == 14
    assert [first for _, first, _ in view["runs"]].count(14) == 1
    assert [role for role, first, _ in view["runs"] if first == 14] == ["memory"]
    assert "window of 6" in view["labels"]["far"]
    # Memory too short to reach back past the window: the edge falls in "gone", a run starts
    # there all the same (the browser marks the run that starts at window_start).
    short = make_trace(n_keys=3, n_memory=2, position=19)
    view = watch_viz.text_view(text, watch_viz.roles_from_trace(20, short, 6), short, window=6)
    assert 14 in [first for _, first, _ in view["runs"]]
    assert runs_positions(view) == list(range(20))
    whole = watch_viz.text_view(text[:5], ["memory"] * 5, window=6)  # all of it inside the window
    assert whole["window_start"] is None
    assert watch_viz.text_view(text, ["memory"] * 20)["window_start"] is None  # no window given


@pytest.mark.parametrize(
    "n_keys, n_memory, n_far, max_cols",
    [
        (129, 128, 65, 160),
        (2049, 2048, 1985, 160),
        (2049, 2048, 1985, 128),
        (1000, 937, 900, 100),
        (300, 250, 0, 128),
        (77, 76, 13, 8),
    ],
)
def test_bucket_keys_respect_the_windows_edge(n_keys, n_memory, n_far, max_cols):
    buckets = watch_viz.bucket_keys(n_keys, n_memory, max_cols, n_far)
    assert len(buckets) <= max_cols
    assert buckets[0][0] == 0 and buckets[-1][1] == n_keys
    assert all(b1 == a2 for (_, b1), (a2, _) in zip(buckets, buckets[1:]))  # contiguous
    for edge in (n_memory, n_far):
        assert all(not (a < edge < b) for a, b in buckets)  # none straddles an edge


@pytest.mark.parametrize("n_keys, n_memory, max_cols", [(40, 39, 160), (2049, 2048, 128)])
def test_attention_view_share_beyond_the_window_is_its_columns_summed(n_keys, n_memory, max_cols):
    """The bar of each row (``far``) is the row's weights summed over the columns left of
    the window's edge, is the step summary's far_mass_per_layer, and is the attention on
    the keys ``window`` or more back, summed directly."""
    window = 16
    t = make_trace(n_keys=n_keys, n_memory=n_memory, position=5000)
    view = watch_viz.attention_view(t, None, max_cols=max_cols, window=window)
    view = json.loads(json.dumps(view))
    direct = t.attentions.astype(np.float64)[..., : n_keys - window].sum(-1).mean(-1)  # [L]
    assert view["n_far"] == n_keys - window and view["window"] == window
    cols = view["n_far_cols"]
    assert view["last"][cols - 1] == 5000 - window  # the newest key beyond: `window` back
    assert view["first"][cols] == 5000 - window + 1
    w = np.asarray(view["w"])
    np.testing.assert_allclose(w[:, :cols].sum(1), direct, atol=2e-4)
    np.testing.assert_allclose(view["far"], direct, atol=1e-4)
    summary = watch_viz.step_summary(t, far=window)
    np.testing.assert_allclose(summary["far_mass_per_layer"], view["far"], atol=1e-4)
    # Columns whose newest key is `window` or more back: the same ones, by position.
    beyond = [c for c, last in enumerate(view["last"]) if 5000 - last >= window]
    assert beyond == list(range(cols))
    # One layer: its heads and their mean.
    heads = watch_viz.attention_view(t, None, layer=1, max_cols=max_cols, window=window)
    far = t.attentions[1].astype(np.float64)[:, : n_keys - window].sum(-1)
    np.testing.assert_allclose(heads["far"], [*far, far.mean()], atol=1e-4)
    none = watch_viz.attention_view(t, None, max_cols=max_cols)  # no window: no edge
    assert none["n_far_cols"] == 0 and none["far"] == [0.0, 0.0]


def test_beyond_window_share_is_the_text_shading_summed_before_the_window():
    t = make_trace(n_keys=40, n_memory=39, position=100)  # keys 61..100
    for layer, head in ((None, None), (1, None), (None, 2), (0, 1)):
        share = watch_viz.beyond_window_share(t, 16, layer, head)
        weights = watch_viz.text_weights(t, layer, head)
        assert share == pytest.approx(float(weights[:24].sum()), abs=1e-6)  # keys 61..84
    assert watch_viz.beyond_window_share(make_trace(attentions=False), 16) is None
    assert watch_viz.beyond_window_share(t, 64) == 0.0  # every key within the window
    assert watch_viz.choice_words(None, None) == "mean over layers and heads"
    assert watch_viz.choice_words(2, 1) == "layer 2, head 1"


def test_status_leads_with_the_attention_beyond_the_window():
    on = {"memory": True, "tokens": 64, "mem_len": 128, "bytes": 3 * 2**20, "context": 65}
    line = watch_viz.status_markdown(on, 200, beyond=(0.1234, 64, "layer 2, head 1"))
    assert line.startswith("attention beyond the window: **12.3 %** (layer 2, head 1;")
    assert "last 64 characters" in line and "Memory **on**" in line


# ---- where memory mattered: the Score's moments ------------------------------------


def test_top_moments_rank_the_savings_and_carry_their_context():
    from txl.scoring import top_moments

    text = "abcdefghijklmnopqrstuvwxyz"
    bits_memory = np.full(25, 2.0)
    bits_window = np.full(25, 2.0)
    bits_window[[3, 10, 20]] = [5.0, 7.0, 5.0]  # tokens 4, 11, 21: a tie at 3 bits
    bits_memory[7] = np.nan  # not finite: left out
    bits_memory[0] = 3.0  # memory cost 1 bit on token 1
    moments = top_moments(text, bits_memory, bits_window, k=4, context=3)
    assert [m.position for m in moments] == [11, 4, 21, 2]  # the tie: the earlier first
    m = moments[0]
    assert (m.char, m.bits_memory, m.bits_window, m.bits_saved) == ("l", 2.0, 7.0, 5.0)
    assert m.context == "ijklmno" and m.context_start == 8
    assert moments[1].context == "bcdefgh" and moments[1].context_start == 1
    assert top_moments(text, bits_memory, bits_window, k=1, context=5)[0].context == "ghijklmnopq"
    assert top_moments(text, bits_memory, bits_window, context=40)[0].context == text
    assert m.as_dict() == {"position": 11, "char": "l", "bits_memory": 2.0, "bits_window": 7.0,
                           "bits_saved": 5.0, "context": "ijklmno"}
    words = ["w0", " w1", " w2", " w3"]  # a word model: a list of tokens
    assert top_moments(words, [1, 1, 1], [1, 4, 1], k=1)[0].char == " w2"
    with pytest.raises(ValueError, match="need"):
        top_moments(text, bits_memory[:-1], bits_window)


def test_moments_view_shades_by_the_bits_saved_and_lists_the_moments():
    from txl.scoring import top_moments

    r = score_result(n=30)
    r.first = "X"
    r.pieces = [r.first, *r.chars]
    r.bits_sliding = np.linspace(1, 4, 30)
    moments = top_moments(r.pieces, r.bits_with, r.bits_sliding, k=5)
    view = json.loads(json.dumps(score_viz.moments_view(r, moments)))
    assert view["text"] == "X" + "a" * 30 and view["effect"]["start"] == 1
    assert view["effect"]["with"] == [100] * 30  # 1 bit each, in centibits
    assert view["effect"]["without"] == [round(100 * b) for b in r.bits_sliding]
    assert [m["position"] for m in view["moments"]] == [30, 29, 28, 27, 26]
    assert view["moments"][0]["context_start"] == 0  # 40 back is before the text's start
    assert view["bits_saved"] == pytest.approx(float((r.bits_sliding - 1).sum()), abs=1e-4)
    assert (view["window"], view["mem_len"], view["context"]) == (32, 64, 40)
    assert score_viz.moments_view(score_result(sliding=False), None) is None
    choices = score_viz.moment_choices(moments)
    assert choices[0] == ("1. 'a' at 30: memory saved 3.00 bits (4.00 -> 1.00)", 30)
    numbers = score_viz.score_numbers(r, None, moments)
    assert [m["position"] for m in numbers["moments"]] == [30, 29, 28, 27, 26]
    assert set(numbers["moments"][0]) == {
        "position", "char", "bits_memory", "bits_window", "bits_saved", "context"
    }
    assert score_viz.score_numbers(r)["moments"] is None  # before the sliding window is done


def test_the_score_says_its_stage_what_it_did_and_what_is_left():
    read = SimpleNamespace(mem_len=128, seconds_without=1.0, seconds_with=2.0, chars=["a"] * 99)
    line = score_viz.sweep_progress_markdown(read, (0, 16, 32, 64, 128, 256), 3)
    # four reads left (16, 32, 64, 256), each taken as 1 s + n/128 s: 6.875 s in all
    assert line.startswith("⏳ **Stage 2 of 3**: how far back does it read?")
    assert "memories of 0 to 256: 4 more reads of 100 characters, about 6.9 s" in line
    assert line.endswith("then the sliding window.")
    assert "sliding" not in score_viz.sweep_progress_markdown(read, (0, 128, 256), 2)
    line = score_viz.sliding_progress_markdown(50, 200, 12.0, 64, stages=3)
    assert line.startswith("⏳ **Stage 3 of 3**: **the sliding window of 64**")
    assert "50 of 200 characters, about 12.0 s left" in line
    assert "Stage 1 of 2" in score_viz.reading_progress_markdown(300, 2)
