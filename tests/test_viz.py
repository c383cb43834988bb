"""txl.viz on synthetic arrays: roles, boundary, bucketing, hover data, exports."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import plotly.graph_objects as go
import pytest

from txl import viz


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


def heatmap(fig):
    validated(fig)
    return next(t for t in fig.data if t.type == "heatmap")


def validated(fig: go.Figure) -> go.Figure:
    """viz builds figures without plotly's validation: check every property here."""
    go.Figure(fig.to_dict())  # raises on a misspelt property or a bad value
    return fig


def test_text_roles_partition():
    roles = viz.text_roles(10, first_key=2, memory_end=6, newest=9)
    assert list(roles) == ["gone"] * 2 + ["memory"] * 4 + ["current"] * 3 + ["newest"]
    assert list(viz.text_roles(3, first_key=-5, memory_end=99)) == ["memory"] * 3


def test_roles_from_trace_and_info():
    t = make_trace(n_keys=6, n_memory=4, position=9)  # keys 4..9, memory 4..7
    roles = viz.roles_from_trace(10, t)
    assert list(roles) == ["gone"] * 4 + ["memory"] * 4 + ["current", "newest"]
    on = {"memory": True, "span": (3, 10), "context": 7}
    assert list(viz.roles_from_info(10, on)) == ["gone"] * 3 + ["memory"] * 7
    off = {"memory": False, "span": (10, 10), "context": 4}
    assert list(viz.roles_from_info(10, off)) == ["gone"] * 6 + ["current"] * 4


def test_text_html_escapes_and_marks_roles():
    text = "<b>${x}</b>\n"
    roles = viz.text_roles(len(text), 2, 6, newest=len(text) - 1)
    html = viz.text_html(text, roles)
    assert "<b>" not in html and "</b>" not in html
    assert "&lt;b" in html and "&lt;/b&gt;" in html
    assert "${" not in html and "{x}" not in html  # no template syntax survives
    for role in ("gone", "memory", "current", "newest"):
        assert f'class="txl-{role}"' in html
    assert "↵" in html  # a newest newline stays visible
    assert "fell out of memory" in html and "newest token" in html  # the legend
    long = viz.text_html("a" * 100, ["memory"] * 100, max_chars=10)
    assert "90 earlier characters" in long
    with pytest.raises(ValueError):
        viz.text_html("abc", ["memory"])


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
    buckets = viz.bucket_keys(n_keys, n_memory, max_cols)
    assert len(buckets) <= max_cols
    assert buckets[0][0] == 0 and buckets[-1][1] == n_keys
    assert all(a < b for a, b in buckets)
    assert all(b1 == a2 for (_, b1), (a2, _) in zip(buckets, buckets[1:]))  # contiguous
    assert all(not (a < n_memory < b) for a, b in buckets)  # none straddles the boundary
    if n_keys <= max_cols:
        assert all(b - a == 1 for a, b in buckets)


def test_heatmap_has_boundary_and_hover():
    t = make_trace(n_keys=40, n_memory=30, position=100)
    text = "x" * 95 + "hello!"
    fig = viz.heatmap_from_trace(t, text)
    h = heatmap(fig)
    assert np.asarray(h.z).shape == (2, 40)  # layers as rows, one column per key
    assert list(h.y) == ["layer 0", "layer 1"]
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(lines) == 1 and lines[0].x0 == pytest.approx(29.5)
    assert any(viz.BOUNDARY_TEXT in a.text for a in fig.layout.annotations)
    hover = h.text[0][0]
    assert "query '!' (position 100)" in hover
    assert "key 'x' (position 61, memory)" in hover and "distance 39" in hover
    assert "weight" in hover
    last = h.text[1][-1]
    assert "position 100, current" in last and "distance 0" in last
    # colour is sqrt(weight); the hover shows the weight itself (customdata)
    assert "%{customdata" in h.hovertemplate and "%{text}" in h.hovertemplate
    w = np.asarray(h.customdata)[1, -1]
    assert w == pytest.approx(float(t.attentions[1].mean(0)[-1]), abs=1e-4)
    assert np.asarray(h.z)[1, -1] == pytest.approx(np.sqrt(t.attentions[1].mean(0)[-1]), abs=1e-5)


def test_heatmap_buckets_long_memory():
    n_keys = 2049
    t = make_trace(n_keys=n_keys, n_memory=2048, position=3000)
    fig = viz.heatmap_from_trace(t, "ab" * 1600, max_cols=128)
    h = heatmap(fig)
    z = np.asarray(h.customdata)  # the weights (colour is their square root)
    assert z.shape[1] <= 128
    np.testing.assert_allclose(z.sum(1), 1.0, atol=1e-3)  # buckets sum the weights
    width = viz.bucket_keys(n_keys, 2048, 128)[1]
    width = width[1] - width[0]
    assert width == 17 and f"({width} keys, memory)" in h.text[0][1]
    assert "'ab" in h.text[0][1] or "'ba" in h.text[0][1]  # the bucket's text
    assert "keys per column" in fig.layout.xaxis.title.text
    boundary = [s for s in fig.layout.shapes if s.type == "line"][0].x0
    assert boundary == pytest.approx(z.shape[1] - 1.5)  # the newest key keeps its column


def test_heatmap_layer_and_head_views():
    a = attention(3, 4, 20)
    keys = np.arange(20)
    one_layer = viz.attention_heatmap(a, keys, 10, layer=1)
    assert list(heatmap(one_layer).y) == [f"L1 head {h}" for h in range(4)] + ["L1 mean"]
    one_head = viz.attention_heatmap(a, keys, 10, layer=2, head=3)
    np.testing.assert_allclose(np.asarray(heatmap(one_head).customdata)[0], a[2, 3], atol=1e-5)
    head_all_layers = viz.attention_heatmap(a, keys, 10, head=0)
    assert list(heatmap(head_all_layers).y) == ["layer 0 h0", "layer 1 h0", "layer 2 h0"]
    with pytest.raises(ValueError):
        viz.attention_heatmap(a, keys, 10, layer=3)
    with pytest.raises(ValueError):
        viz.attention_heatmap(a[0], keys, 10)


def test_heatmap_without_memory_has_no_boundary():
    t = make_trace(n_keys=16, n_memory=0, memory=False)
    fig = validated(viz.heatmap_from_trace(t, "z" * 30))
    assert not [s for s in fig.layout.shapes if s.type == "line"]
    assert any("memory off" in a.text for a in fig.layout.annotations)
    with pytest.raises(ValueError):
        viz.heatmap_from_trace(make_trace(attentions=False), "z" * 60)


def test_memory_mass():
    a = np.zeros((2, 2, 4))
    a[0, :, :3] = 1 / 3  # layer 0: all on memory
    a[1, :, 3] = 1.0  # layer 1: all on the newest key
    np.testing.assert_allclose(viz.memory_mass(a, 3), [[1, 1], [0, 0]])
    fig = validated(viz.memory_mass_figure(a, 3))
    np.testing.assert_allclose(fig.data[0].y, [1.0, 0.0])
    assert "on memory" in fig.data[0].hovertemplate
    assert [t.type for t in fig.data] == ["bar", "scatter"]  # no far bar without n_far
    # keys 10..13 for a query at 13: keys 10 and 11 are 2 or more back
    assert viz.far_keys(np.arange(10, 14), 13, far=2) == 2
    fig = validated(viz.memory_mass_figure(a, 3, n_far=2, far=2))
    np.testing.assert_allclose(fig.data[1].y, [2 / 3, 0.0], atol=1e-5)
    assert "2+ tokens back" in fig.data[1].name


def test_surprisal_figure_and_rolling_mean():
    np.testing.assert_allclose(viz.rolling_mean(np.array([1, 3, 5, 7.0]), 2), [1, 2, 4, 6])
    bits_with, bits_without = np.full(100, 1.0), np.full(100, 2.0)
    fig = validated(
        viz.surprisal_figure(["a"] * 100, bits_with, bits_without, 1.0, 2.0, seg_len=32)
    )
    names = [t.name for t in fig.data]
    # The old positional call (no sliding window, no times): two curves, baselines named.
    assert "with memory: 1.000 bpc" in names and "segments of 32 read alone: 2.000 bpc" in names
    assert len([s for s in fig.layout.shapes if s.type == "line"]) == 3  # segment starts
    assert "+1.000 vs segments of 32 read alone" in fig.layout.title.text
    with pytest.raises(ValueError):
        viz.surprisal_figure(["a"], bits_with, bits_without, 1.0, 2.0)


def test_placeholder_and_json():
    fig = validated(viz.placeholder_figure("nothing yet"))
    assert fig.layout.annotations[0].text == "nothing yet"
    t = make_trace(n_keys=300, n_memory=299)
    assert json.loads(viz.heatmap_from_trace(t, None).to_json())["data"][0]["type"] == "heatmap"


def test_exports_are_json():
    t = make_trace(n_keys=8, n_memory=7, position=20)
    text = "abcdefghijklmnopqrstu"
    data = json.loads(json.dumps(viz.attention_export(t, text)))
    assert data["key_positions"] == list(range(13, 21))
    assert data["key_chars"] == list(text[13:21])
    assert np.asarray(data["attentions"]).shape == (2, 3, 8)
    assert data["n_memory"] == 7 and data["char"] == "e"
    summary = viz.step_summary(t, {"context": 8}, far=4)
    assert summary["key_range"] == [13, 20] and summary["context"] == 8
    assert len(summary["memory_mass_per_layer"]) == 2
    far = t.attentions[:, :, :4].sum(-1).mean(-1)  # keys 13..16 are 4 or more back from 20
    np.testing.assert_allclose(summary["far_mass_per_layer"], far, atol=1e-4)


def test_status_markdown():
    on = {"memory": True, "tokens": 64, "mem_len": 128, "bytes": 3 * 2**20, "context": 65}
    line = viz.status_markdown(on, 200, latency_ms=2.345)
    assert "Memory **on**" in line and "64/128" in line and "3.0 MB" in line
    assert "**65**" in line and "2.3 ms" in line
    off = {"memory": False, "tokens": 0, "mem_len": 128, "bytes": 0, "context": 64}
    assert "Memory **off**" in viz.status_markdown(off, 200)


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
    fig = validated(viz.surprisal_figure_from_result(score_result()))
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert names == [
        "segments of 32 read alone: 2.000 bpc (40 ms)",
        "sliding window of 32: 1.250 bpc (2.5 s)",
        "segments of 32 + memory of 64: 1.000 bpc (50 ms)",
    ]
    assert len(fig.data) == 6  # raw and rolling mean of each
    assert "+1.000 vs segments of 32 read alone" in fig.layout.title.text
    assert "+0.250 vs the sliding window of 32" in fig.layout.title.text
    two = validated(viz.surprisal_figure_from_result(score_result(sliding=False)))
    assert len([t for t in two.data if t.showlegend is not False]) == 2
    with pytest.raises(ValueError):
        viz.surprisal_figure(["a"] * 3, np.ones(3), np.ones(3), 1, 1, bits_sliding=np.ones(2))


def test_score_markdown_names_every_baseline():
    text = viz.score_markdown(score_result(), 32, 64)
    assert "**100 characters** scored in bits per character" in text
    assert "segments of 32 read alone" in text and "sliding window of 32" in text
    assert "Memory vs segments read alone: saves 1.000 bpc" in text
    assert "Memory vs the sliding window of 32: saves 0.250 bpc, 50x faster" in text
    r = score_result()
    r.bpc_sliding = 1.005
    assert "about the same" in viz.score_markdown(r, 32, 64)
    r.bpc_sliding = 0.9
    assert "costs 0.100 bpc more" in viz.score_markdown(r, 32, 64)
    old = viz.score_markdown(score_result(sliding=False), 32, 64)  # a result without one
    assert "sliding" not in old and "saves 1.000 bpc" in old


def test_context_figure_marks_the_effective_context():
    sweep = SimpleNamespace(mem_lens=[0, 16, 32, 64, 1024], bpc=[3.0, 2.5, 2.01, 2.0, 2.0],
                            seconds=[0.1] * 5, seg_len=64, effective=32, tolerance=0.01)
    fig = validated(viz.context_figure(sweep, sliding_bpc=2.2))
    x = viz.context_axis(sweep.mem_lens)
    np.testing.assert_allclose(x, [3, 4, 5, 6, 10])  # log2, and 0 one step left of 16
    assert list(fig.layout.xaxis.ticktext) == ["0", "16", "32", "64", "1,024"]
    line = [s for s in fig.layout.shapes if s.type == "line"][0]
    assert line.x0 == 5  # at memory 32
    assert any("effective context: 32" in a.text for a in fig.layout.annotations)
    assert len(fig.data) == 2 and "sliding window of 64" in fig.data[1].name
    assert "Effective context: 32" in viz.context_markdown(sweep)
    assert isinstance(viz.SCORE_HELP, str) and "sliding window" in viz.SCORE_HELP.lower()
    assert "effective context" in viz.CONTEXT_HELP.lower()
