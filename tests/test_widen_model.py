"""scripts/widen_model.py: a model widened (twin heads, twin FF units) computes the same."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from txl import TransformerXL, TXLConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def widen_model(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import widen_model

    return widen_model


def tiny(**overrides) -> TransformerXL:
    fields = dict(vocab=list("ab\n :"), d_model=16, n_layer=2, n_head=2, d_head=8,
                  d_inner=32, tgt_len=8, mem_len=8)  # fmt: skip
    torch.manual_seed(0)
    model = TransformerXL(TXLConfig(**{**fields, **overrides}))
    with torch.no_grad():  # biases and norms away from their init: every tensor matters
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize(
    "overrides", [{}, {"pre_lnorm": True}, {"untie_r": False}, {"same_length": True}]
)
def test_the_wider_model_computes_what_the_model_does(widen_model, overrides):
    model = tiny(**overrides)
    wide = widen_model.widen(model, heads=2, inner=3)
    assert (wide.config.n_head, wide.config.d_inner) == (4, 96)
    ids = torch.randint(5, (40,), generator=torch.Generator().manual_seed(1))
    assert widen_model.largest_change(model, wide, ids, segments=5) < 1e-5
    # and its attention is each head's, twice
    with torch.no_grad():
        a = model(ids[:8].view(1, -1), output_attentions=True).attentions[0]
        b = wide(ids[:8].view(1, -1), output_attentions=True).attentions[0]
    torch.testing.assert_close(b[:, :2], a, rtol=0, atol=1e-6)
    torch.testing.assert_close(b[:, 2:], a, rtol=0, atol=1e-6)


def test_noise_sets_the_twins_apart_and_moves_the_function_a_little(widen_model):
    model = tiny()
    wide = widen_model.widen(model, noise=1e-2, seed=3)
    qkv = wide.layers[0].attn.qkv.weight  # q rows: head 0, head 1, then their twins
    assert not torch.equal(qkv[:16], qkv[16:32])
    torch.testing.assert_close(qkv[:16], model.layers[0].attn.qkv.weight[:16], rtol=0, atol=0)
    ids = torch.randint(5, (40,), generator=torch.Generator().manual_seed(1))
    change = widen_model.largest_change(model, wide, ids, segments=5)
    assert 1e-6 < change < 0.05
    again = widen_model.widen(model, noise=1e-2, seed=3)  # seeded: the same model again
    torch.testing.assert_close(again.state_dict(), wide.state_dict(), rtol=0, atol=0)


def test_the_cli_writes_a_model_that_loads(widen_model, tmp_path, capsys):
    tiny().save_pretrained(tmp_path / "small")
    widen_model.main([str(tmp_path / "small"), "--out", str(tmp_path / "wide")])
    wide = TransformerXL.from_pretrained(str(tmp_path / "wide"))
    assert (wide.config.n_head, wide.config.d_inner) == (4, 64)
    assert "heads 2 -> 4, d_inner 32 -> 64" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="heads and inner must be >= 1"):
        widen_model.main([str(tmp_path / "small"), "--out", str(tmp_path / "x"), "--heads", "0"])


def test_twins_apart_reads_how_far_the_twins_are_from_their_originals(widen_model):
    model = tiny()
    same = widen_model.twins_apart(widen_model.widen(model, noise=0.0))
    # twins: identical, and each as loud as its original (half a column each)
    twins = {"heads": 0.0, "ff": 0.0, "heads_out": 1.0, "ff_out": 1.0}
    assert same == [pytest.approx(twins, abs=1e-6)] * len(model.layers)
    # the noise is that share of each weight's std, so about that share of its norm
    apart = widen_model.twins_apart(widen_model.widen(model, noise=1e-2, seed=3))
    for layer in apart:
        assert 3e-3 < layer["heads"] < 3e-2 and 3e-3 < layer["ff"] < 3e-2
    # a model widened in the heads alone has no feed-forward twins to read
    heads_only = widen_model.widen(model, heads=2, inner=1, noise=1e-2)
    assert all(layer["ff"] == 0.0 for layer in widen_model.twins_apart(heads_only, inner=1))


def test_the_cli_reads_a_widened_model_and_says_what_it_needs(widen_model, tmp_path, capsys):
    tiny().save_pretrained(tmp_path / "small")
    widen_model.main([str(tmp_path / "small"), "--out", str(tmp_path / "wide"), "--noise", "0"])
    capsys.readouterr()
    widen_model.main([str(tmp_path / "wide"), "--apart"])
    read = capsys.readouterr().out
    assert "layer 0: heads' twins 0.0000 apart, feed-forward twins 0.0000; " in read
    assert "output weights 1.0000 (heads) and 1.0000 (feed-forward) of the originals'" in read
    with pytest.raises(SystemExit, match="not --heads 3"):
        widen_model.main([str(tmp_path / "wide"), "--apart", "--heads", "3"])
    with pytest.raises(SystemExit):  # neither where to write nor --apart
        widen_model.main([str(tmp_path / "small")])
    assert "--out is required" in capsys.readouterr().err


@pytest.mark.parametrize("overrides", [{}, {"pre_lnorm": True}, {"untie_r": False}])
def test_fresh_units_compute_the_same_and_learn_their_own_way(widen_model, overrides):
    """--fresh: new heads and units of their own (not twins), silent at the start (their
    output columns zero, so the model computes what it did), and a gradient reaches their
    output columns from the first step, where a twin's would equal its original's."""
    model = tiny(**overrides)
    wide = widen_model.widen(model, heads=2, inner=2, fresh=True, seed=3)
    ids = torch.randint(5, (40,), generator=torch.Generator().manual_seed(1))
    assert widen_model.largest_change(model, wide, ids, segments=5) < 1e-5
    assert [(r["heads_out"], r["ff_out"]) for r in widen_model.twins_apart(wide)] == [
        (0.0, 0.0)
    ] * 2
    with torch.no_grad():  # the new heads attend their own way
        a = wide(ids[:8].view(1, -1), output_attentions=True).attentions[0]
    assert (a[:, 2:] - a[:, :2]).abs().max() > 1e-3
    wide.train()
    logits = wide(ids[:8].view(1, -1)).logits
    torch.nn.functional.cross_entropy(logits[0, :-1], ids[1:8]).backward()
    for layer in wide.layers:
        assert layer.attn.out.weight.grad[:, 16:].abs().max() > 0  # the new heads' columns
        assert layer.ff.fc2.weight.grad[:, 32:].abs().max() > 0  # the new units' columns
    with pytest.raises(ValueError, match="fresh units start apart"):
        widen_model.widen(model, noise=1e-3, fresh=True)
