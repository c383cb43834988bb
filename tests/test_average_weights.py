"""scripts/average_weights.py: the uniform soup of models fine-tuned from one start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from txl import TransformerXL, TXLConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def soup(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import average_weights

    return average_weights


def tiny(seed: int, **overrides) -> TransformerXL:
    fields = dict(vocab=list("ab\n :"), d_model=16, n_layer=2, n_head=2, d_head=8,
                  d_inner=32, tgt_len=8, mem_len=8)  # fmt: skip
    torch.manual_seed(seed)
    model = TransformerXL(TXLConfig(**{**fields, **overrides}))
    with torch.no_grad():  # biases and norms away from their init, so every tensor differs
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    return model.eval()


def test_the_soup_is_the_mean_of_every_tensor(soup):
    a, b, c = tiny(1), tiny(2), tiny(3)
    mixed = soup.uniform_soup([a, b, c])
    for name, value in mixed.state_dict().items():
        want = (a.state_dict()[name] + b.state_dict()[name] + c.state_dict()[name]) / 3
        torch.testing.assert_close(value, want, rtol=0, atol=1e-6, msg=name)
    ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])
    assert not torch.allclose(mixed(ids).logits, a(ids).logits)  # a new model, not a copy


def test_models_of_other_configs_or_one_model_are_refused(soup):
    with pytest.raises(ValueError, match="configs differ"):
        soup.uniform_soup([tiny(1), tiny(2, d_inner=16)])
    with pytest.raises(ValueError, match="at least two"):
        soup.uniform_soup([tiny(1)])


def test_a_memory_length_apart_is_no_obstacle_and_the_first_models_is_kept(soup):
    # the shipped folder's config says mem_len 512 where its training run's says 128
    a, b = tiny(1, mem_len=32), tiny(2, mem_len=8)
    mixed = soup.uniform_soup([a, b])
    assert mixed.config == a.config
    for name, value in mixed.state_dict().items():
        want = (a.state_dict()[name] + b.state_dict()[name]) / 2
        torch.testing.assert_close(value, want, rtol=0, atol=1e-6, msg=name)


def test_the_script_writes_a_folder_from_pretrained_reads(soup, tmp_path):
    folders = []
    for seed in (1, 2):
        folder = tmp_path / f"m{seed}"
        tiny(seed).save_pretrained(folder)
        folders.append(folder)
    out = tmp_path / "soup"
    assert soup.main([*map(str, folders), "--out", str(out)]) == 0
    loaded = TransformerXL.from_pretrained(str(out))
    want = soup.uniform_soup([TransformerXL.from_pretrained(str(f)) for f in folders])
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, want.state_dict()[name]), name
    assert json.loads((out / "soup.json").read_text())["uniform_soup_of"] == list(map(str, folders))
    with pytest.raises(SystemExit, match="configs differ"):
        other = tmp_path / "other"
        tiny(3, d_inner=16).save_pretrained(other)
        soup.main([str(folders[0]), str(other), "--out", str(tmp_path / "no")])
    assert not (tmp_path / "no").exists()
