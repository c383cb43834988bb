"""The relative attention score's four terms, against the reference, and attention averaged
by distance (txl.anatomy) against a direct computation from model.forward.

The reference (transformers 4.37.2, in .venv-peer) hands out its own AC = (q + u)·k and
BD = rel_shift((q + v)·W_R R) from inside its attention (tests/peer_terms.py), in float64,
over segments that start from an empty memory, fill it part way, then overflow it.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.tolerance import ROW_SUM, SAME_SUMS, assert_ulps_close
from txl import TransformerXL, TXLConfig
from txl.anatomy import (
    Profiles,
    distance_profile,
    iter_profiles,
    mean_distance,
    profiles,
    share_beyond,
    term_profiles,
)
from txl.cached import KVMemory, cached_forward
from txl.convert import convert_folder
from txl.session import Session
from webapp import anatomy_viz

ROOT = Path(__file__).resolve().parents[1]
TOL64 = 1e-10

BASE = dict(vocab_size=65, cutoffs=[], div_val=1, d_inner=64, attn_type=0, dropout=0.0, dropatt=0.0)
# mem_len 10; segments: empty memory, part full, overflowing, then one token (the step path)
CASES = {
    "post_ln_untied": (
        dict(
            d_model=32,
            d_embed=32,
            n_head=4,
            d_head=8,
            n_layer=2,
            pre_lnorm=False,
            same_length=False,
            clamp_len=-1,
            untie_r=True,
            mem_len=10,
        ),
        [6, 7, 12, 1],
    ),
    "pre_ln_same_length_clamp_shared": (
        dict(
            d_model=32,
            d_embed=32,
            n_head=2,
            d_head=8,
            n_layer=3,
            pre_lnorm=True,
            same_length=True,
            clamp_len=4,
            untie_r=False,
            mem_len=10,
        ),
        [1, 8, 12, 1],
    ),
    "post_ln_same_length_clamp": (
        dict(
            d_model=48,
            d_embed=48,
            n_head=3,
            d_head=12,
            n_layer=2,
            pre_lnorm=False,
            same_length=True,
            clamp_len=6,
            untie_r=True,
            mem_len=10,
        ),
        [9, 9, 9, 1],
    ),
    # the WikiText-103 model's shape in miniature: adaptive input and softmax over words
    "wt103_shaped": (
        dict(
            d_model=64,
            d_embed=64,
            n_head=4,
            d_head=16,
            n_layer=2,
            pre_lnorm=False,
            same_length=True,
            clamp_len=10,
            untie_r=True,
            mem_len=12,
            cutoffs=[20, 40, 55],
            div_val=4,
        ),
        [7, 12, 5, 1],
    ),
}


@pytest.fixture(scope="module")
def reference(peer_python, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("terms")
    cases = [
        dict(
            out=str(out / name),
            config={**BASE, **cfg},
            seed=seed,
            init_std=0.3,
            segments=segments,
            batch=2,
        )
        for seed, (name, (cfg, segments)) in enumerate(CASES.items())
    ]
    (out / "spec.json").write_text(json.dumps({"cases": cases}))
    result = subprocess.run(
        [peer_python, str(ROOT / "tests" / "peer_terms.py"), str(out / "spec.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"reference run failed:\n{result.stderr[-4000:]}"
    return out


def _ours(reference: Path, name: str, tmp_path: Path) -> TransformerXL:
    return convert_folder(reference / name / "model", tmp_path / name).double().eval()


def _segments_forward(model, ids, segments):
    """(M, out) per segment through model.forward, the memory as hidden states."""
    mems, start = None, 0
    for length in segments:
        out = model(
            ids[:, start : start + length], mems=mems, output_attentions=True, output_terms=True
        )
        M = 0 if mems is None else mems[0].size(1)
        yield M, out
        mems, start = out.mems, start + length


def _segments_cached(model, ids, segments):
    """(M, out) per segment through cached_forward (a one-token segment takes _step)."""
    memory, start = KVMemory(), 0
    for length in segments:
        M = len(memory)
        out = cached_forward(
            model, ids[:, start : start + length], memory, output_attentions=True, output_terms=True
        )
        yield M, out
        start += length


def _max_visible(x, y, visible) -> float:
    return (x - y).abs().masked_fill(~visible, 0).max().item()


@pytest.mark.parametrize("path", ["forward", "cached_forward"])
@pytest.mark.parametrize("name", CASES)
def test_terms_match_the_reference(reference, tmp_path, name, path):
    """(a)+(c) = AC, (b)+(d) = BD, (a) = q·k, (c) = u·k on every key the query sees, and
    softmax(scale · Σ) = the attention both the reference and our model return."""
    model = _ours(reference, name, tmp_path)
    ref = load_file(reference / name / "terms.safetensors")
    segments = CASES[name][1]
    run = _segments_forward if path == "forward" else _segments_cached
    scale = 1.0 / math.sqrt(model.config.d_head)
    Ms = []
    with torch.no_grad():
        for s, (M, out) in enumerate(run(model, ref["input_ids"], segments)):
            Ms.append(M)
            T = segments[s]
            mask = model.attention_mask(T, M, model.mem_len)
            visible = torch.ones(T, M + T, dtype=torch.bool) if mask is None else ~mask
            for layer, terms in enumerate(out.terms):
                a, b, c, d = terms
                key = f"{s}.{layer}"
                where = f"{name} {path} segment {s} (memory {M}) layer {layer}"
                assert _max_visible(a + c, ref[f"AC.{key}"], visible) < TOL64, where
                assert _max_visible(b + d, ref[f"BD.{key}"], visible) < TOL64, where
                assert _max_visible(a, ref[f"A.{key}"], visible) < TOL64, where
                assert _max_visible(c, ref[f"C.{key}"], visible) < TOL64, where
                assert torch.isneginf(terms[:, :, :, ~visible]).all()  # hidden keys
                weights = (scale * terms.sum(0)).softmax(-1)
                assert (weights - ref[f"attn.{key}"]).abs().max().item() < TOL64, where
                assert (weights - out.attentions[layer]).abs().max().item() < 1e-12, where
    # the memory was empty, part full, full (and a one-token segment went through _step)
    mem_len = model.mem_len
    assert Ms[0] == 0 and 0 < Ms[1] < mem_len and Ms[-1] == mem_len and segments[-1] == 1


def test_terms_are_sensitive_to_the_shift(reference, tmp_path):
    """The weights are peaky enough that (b)+(d) one position off would fail the test."""
    name = "post_ln_untied"
    model = _ours(reference, name, tmp_path)
    ref = load_file(reference / name / "terms.safetensors")
    (M, out), *_ = list(_segments_forward(model, ref["input_ids"], CASES[name][1]))[1:]
    _, b, _, d = out.terms[0]
    shifted = torch.roll(b + d, 1, dims=-1)
    assert (shifted - ref["BD.1.0"])[..., :, 1:M].abs().max().item() > 1e-2


# ---- distance profiles against a direct computation --------------------------------


def _model(seed=0, **overrides) -> TransformerXL:
    torch.manual_seed(seed)
    config = dict(
        vocab_size=40,
        d_model=32,
        n_layer=2,
        n_head=4,
        d_head=8,
        d_inner=64,
        tgt_len=8,
        mem_len=12,
        dropout=0.0,
    )
    config.update(overrides)
    model = TransformerXL(TXLConfig(**config)).eval()
    model.reset_parameters(0.3)  # peaky: the heads differ
    return model


def _direct(model, ids, mem_len, what="attention"):
    """Profiles by plain loops over queries and keys of model.forward's output."""
    cfg, n = model.config, len(ids)
    T, D = cfg.tgt_len, mem_len + cfg.tgt_len
    scale = 1.0 / math.sqrt(cfg.d_head)
    total = np.zeros((3, cfg.n_layer, cfg.n_head, D))
    mems = None
    with torch.no_grad():
        for start in range(0, n, T):
            x = torch.tensor([ids[start : start + T]])
            out = model(x, mems=mems, output_attentions=True, output_terms=True, mem_len=mem_len)
            M = 0 if mems is None else mems[0].size(1)
            mems = out.mems
            for layer in range(cfg.n_layer):
                if what == "attention":
                    rows = [out.attentions[layer][0].double().numpy()]  # [H, t, K]
                else:  # (a), (b), (d) each softmaxed alone
                    rows = [
                        (scale * out.terms[layer][t, 0]).softmax(-1).double().numpy()
                        for t in (0, 1, 3)
                    ]
                for r, p in enumerate(rows):
                    for i in range(x.size(1)):
                        for j in range(M + i + 1):
                            total[r, layer, :, M + i - j] += p[:, i, j]
    total /= n
    return total[0] if what == "attention" else total


@pytest.mark.parametrize(
    "overrides, n, mem_len",
    [
        ({"dropout": 0.3}, 37, 12),  # the last segment short; dropout off while reading
        ({"same_length": True, "clamp_len": 5}, 40, 12),
        ({}, 20, 0),  # no memory: segments read alone
        ({"pre_lnorm": True, "untie_r": False}, 50, 20),  # a memory longer than trained
        ({"cutoffs": [10, 20], "div_val": 2, "d_embed": 32, "same_length": True}, 33, 12),
    ],
)
def test_distance_profile_equals_a_direct_computation(overrides, n, mem_len):
    model = _model(**overrides).train()  # read in eval mode, and left in its own mode
    generator = torch.Generator().manual_seed(n)
    ids = torch.randint(0, model.config.vocab_size, (n,), generator=generator).tolist()
    profile = distance_profile(model, ids, mem_len)
    assert model.training
    model.eval()
    cfg = model.config
    assert profile.shape == (cfg.n_layer, cfg.n_head, mem_len + cfg.tgt_len)
    # float64 sums of a float32 model's weights: float32's ulps
    f32 = dict(dtype=torch.float32)
    assert_ulps_close(profile, _direct(model, ids, mem_len), SAME_SUMS, **f32)
    assert_ulps_close(profile.sum(-1), 1.0, ROW_SUM, **f32)
    terms = term_profiles(model, ids, mem_len)
    assert terms.shape == (3, *profile.shape)
    assert_ulps_close(terms, _direct(model, ids, mem_len, "terms"), SAME_SUMS, **f32)
    assert_ulps_close(terms.sum(-1), 1.0, ROW_SUM, **f32)
    # far keys exist only with a memory: nothing at distances a query cannot reach
    if mem_len == 0:
        assert np.all(profile[..., cfg.tgt_len :] == 0)


def test_profiles_stream_and_say_how_far_heads_read():
    model = _model()
    ids = list(range(30))
    stages = list(iter_profiles(model, ids, 12))
    assert [p.n_queries for p in stages] == [8, 16, 24, 30] and stages[-1].done
    final = profiles(model, ids, 12)
    np.testing.assert_allclose(stages[-1].attention, final.attention)
    # a head that reads only the query itself, and one that reads 10 back
    near, far = np.zeros(20), np.zeros(20)
    near[0], far[10] = 1.0, 1.0
    assert mean_distance(np.stack([near, far])).tolist() == [0.0, 10.0]
    assert share_beyond(np.stack([near, far]), 8).tolist() == [0.0, 1.0]


@pytest.mark.parametrize("bad", [[], [[1, 2]], [99]])
def test_profiles_refuse_bad_ids(bad):
    with pytest.raises(ValueError):
        distance_profile(_model(), bad, 4)


# ---- the newest token's terms in a Session step -----------------------------------


@pytest.mark.parametrize("memory", [True, False])
@pytest.mark.parametrize("overrides", [{}, {"same_length": True, "clamp_len": 5}])
def test_step_trace_terms_give_its_attention(memory, overrides):
    model = _model(
        vocab=[chr(c) for c in range(97, 123)] + list(" .,\n"), vocab_size=30, **overrides
    )
    s = Session(model, memory=memory, mem_len=6, temperature=1.0)
    s.start("hello world.\n")
    scale = 1.0 / math.sqrt(model.config.d_head)
    for _ in range(12):  # the memory fills past mem_len (same_length hides keys then)
        t = s.step()
        assert t.terms.shape == (model.config.n_layer, 4, model.config.n_head, len(t.key_positions))
        weights = torch.from_numpy(t.terms).double().mul(scale).sum(1).softmax(-1).numpy()
        assert_ulps_close(weights, t.attentions, SAME_SUMS)  # float32's ulps (t.attentions')
    assert all(h.terms is None for h in s.history)  # the history keeps attention only
    traces = list(s.generate(3, capture_last_only=False))  # terms of its last step only
    assert [t.terms is None for t in traces] == [True, True, False]
    assert s.step(terms=False).terms is None and s.step(capture=False).terms is None


def test_profiles_of_a_bfloat16_model_are_summed_in_float32():
    model = _model().to(torch.bfloat16)  # the app's dtype for big models
    ids = list(range(30))
    result = profiles(model, ids, 12)
    np.testing.assert_allclose(result.attention.sum(-1), 1.0, atol=2e-3)  # bf16 weights
    np.testing.assert_allclose(result.terms.sum(-1), 1.0, atol=1e-4)
    close = profiles(_model(), ids, 12).attention  # float32: the same up to bfloat16's rounding
    np.testing.assert_allclose(result.attention, close, atol=0.05)


# ---- the views: webapp.anatomy_viz ------------------------------------------------------


def test_distance_buckets_cover_every_distance_once():
    buckets = anatomy_viz.distance_buckets(192)
    assert buckets[0] == (0, 1) and buckets[-1][1] == 192
    assert all(a1 == b0 for (_, a1), (b0, _) in zip(buckets, buckets[1:]))
    assert [a for a, _ in buckets][:10] == [0, 1, 2, 3, 4, 6, 8, 12, 16, 24]
    uniform = np.full((2, 192), 1 / 192)
    np.testing.assert_allclose(anatomy_viz.bucket_means(uniform, buckets), 1 / 192)


def test_head_order_and_words():
    profile = np.zeros((2, 2, 20))
    for (layer, head), distance in {(0, 0): 1, (0, 1): 15, (1, 0): 3, (1, 1): 9}.items():
        profile[layer, head, distance] = 1.0
    assert anatomy_viz.head_order(profile, "mean", 8) == [(0, 1), (1, 1), (1, 0), (0, 0)]
    assert anatomy_viz.head_order(profile, "layer", 8)[0] == (0, 0)
    with pytest.raises(ValueError, match="order"):
        anatomy_viz.head_order(profile, "nope", 8)
    result = Profiles(profile, None, 40, 40, 12, 8, 0.5)
    words = anatomy_viz.anatomy_markdown(result)
    assert "L0.1 (mean distance 15, 100% 8+ back)" in words and "The paper" in words


def test_step_terms_json_leaves_out_hidden_keys():
    terms = np.zeros((1, 4, 1, 5), dtype=np.float32)
    terms[0, :, 0, :2] = -np.inf  # same_length hid the two oldest keys
    terms[0, 1, 0, 2:] = [0.0, 4.0, 8.0]  # (b) grows towards the newest key: by distance
    trace = SimpleNamespace(terms=terms, key_positions=np.arange(10, 15))
    out = anatomy_viz.step_terms(trace, 0, 0, scale=0.5)
    assert out["key_positions"] == [12, 13, 14] and out["b"] == [0.0, 4.0, 8.0]
    assert out["spread"]["position (b)+(d)"] == 4.0 and "reads by distance" in out["words"]
    assert anatomy_viz.step_terms(trace, None, 0, 0.5) is None
    assert anatomy_viz.step_terms(SimpleNamespace(terms=None), 0, 0, 0.5) is None


def test_figures_of_a_wt103_sized_model_render():
    rng = np.random.default_rng(0)
    profile = rng.random((18, 16, 1664))  # 288 heads, memory 1,600 + segments of 64
    profile /= profile.sum(-1, keepdims=True)
    terms = np.stack([profile] * 3)
    for figure in (
        anatomy_viz.distance_figure(profile, 64, "beyond", "wt103"),
        anatomy_viz.terms_figure(terms, profile, 64, "layer"),
        anatomy_viz.terms_figure(terms, profile, 64, head=(17, 15)),
    ):
        assert anatomy_viz.figure_png(figure)[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unloaded_session_hands_over_the_last_steps_terms():
    model = _model(vocab=[chr(c) for c in range(97, 123)] + list(" .,\n"), vocab_size=30)
    s = Session(model, mem_len=6)
    s.start("hello world.\n")
    terms = s.step().terms.copy()
    tensors = s.export_state()
    assert s.last_trace.terms is None and "last_trace.terms" in tensors
    s.import_state(tensors)
    np.testing.assert_array_equal(s.last_trace.terms, terms)


def test_the_docs_figures_script_writes_both_figures_per_memory_length(
    tmp_path, capsys, monkeypatch
):
    """scripts/anatomy_figures.py, which draws docs/figures.md's pictures: one Figure 5
    and one Figure 7 per memory length, and its words, on any model and text."""
    from tests.test_app import tiny_model

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    import anatomy_figures

    data = tmp_path / "plays.txt"
    data.write_text("ROMEO:\nIt is the east, and Juliet is the sun.\n\n" * 100)
    out = tmp_path / "images"
    model = tiny_model(tmp_path / "model")
    anatomy_figures.main(
        [
            "--data",
            str(data),
            "--model",
            model,
            "--mem-lens",
            "16,32",
            "--chars",
            "300",
            "--out",
            str(out),
        ]  # fmt: skip
    )
    for mem_len in (16, 32):
        for fig in ("fig5", "fig7"):
            png = (out / f"anatomy-{fig}-mem{mem_len}.png").read_bytes()
            assert png[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "## mem_len 16" in printed and "## mem_len 32" in printed
    assert "Read **300 characters**" in printed
