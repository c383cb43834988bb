"""Our TransformerXL on its own: memory, relative shift, masks, shapes, config, tokenizer.

Models are tiny and their weights peaky (std 0.3 everywhere, biases and u, v included)
so that a wrong position or a leaked future key changes the output visibly. Properties
that compare two ways of computing the same thing run in float64, where a difference
above 1e-5 can only be a bug.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tolerance import FLOAT32_VS_64, assert_ulps_close
from txl.config import TXLConfig
from txl.model import TransformerXL, rel_shift
from txl.tokenizer import CharTokenizer, UnknownCharactersError

TOL = 1e-5  # float64 only: its rounding is ~1e-14, a bug moves things by 1e-2
VOCAB = 11
FAST = settings(max_examples=25, deadline=None)
THOROUGH = settings(max_examples=60, deadline=None)


def tiny_config(**overrides) -> TXLConfig:
    fields = dict(vocab_size=VOCAB, d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=32,
                  dropout=0.0, dropatt=0.0, tgt_len=8, mem_len=64, clamp_len=-1,
                  same_length=False)
    return TXLConfig(**{**fields, **overrides})


def peaky(model: TransformerXL, seed: int = 0, std: float = 0.3) -> TransformerXL:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(base + std * torch.randn(p.shape, generator=generator))
    return model.eval()


@functools.cache
def tiny_model(dtype=torch.float64, **overrides) -> TransformerXL:
    """One model per configuration, shared by the examples (none of them trains it)."""
    return peaky(TransformerXL(tiny_config(**overrides))).to(dtype)


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def run_segments(model, ids: torch.Tensor, lengths: list[int], mems=None):
    """Logits of consecutive segments with the memory carried; returns (logits, mems)."""
    pieces, start = [], 0
    with torch.no_grad():
        for length in lengths:
            out = model(ids[:, start : start + length], mems=mems)
            pieces.append(out.logits)
            mems, start = out.mems, start + length
    return torch.cat(pieces, dim=1), mems


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


@st.composite
def splits(draw, max_len: int = 24):
    """A sequence length and a random split of it into segment lengths."""
    length = draw(st.integers(1, max_len))
    cuts = draw(st.lists(st.integers(1, length - 1), unique=True)) if length > 1 else []
    bounds = [0, *sorted(cuts), length]
    return length, [b - a for a, b in zip(bounds, bounds[1:])]


# ---- memory: segments with memory == one pass ---------------------------------------


@THOROUGH
@given(split=splits(), pre_lnorm=st.booleans(), untie_r=st.booleans(),
       clamp_len=st.sampled_from([-1, 3]), seed=st.integers(0, 1000))
def test_segments_with_memory_equal_one_pass(split, pre_lnorm, untie_r, clamp_len, seed):
    length, lengths = split
    model = tiny_model(pre_lnorm=pre_lnorm, untie_r=untie_r, clamp_len=clamp_len)
    assert model.mem_len >= length  # the memory holds the whole sequence
    ids = random_ids(2, length, seed)
    one_pass, mems_one = run_segments(model, ids, [length])
    segmented, mems_seg = run_segments(model, ids, lengths)
    assert max_diff(segmented, one_pass) <= TOL
    for a, b in zip(mems_seg, mems_one):
        assert max_diff(a, b) <= TOL


@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_one_token_at_a_time_equals_one_pass(pre_lnorm):
    model = tiny_model(pre_lnorm=pre_lnorm)
    ids = random_ids(3, 20, seed=1)
    one_pass, _ = run_segments(model, ids, [20])
    stepwise, _ = run_segments(model, ids, [1] * 20)
    assert max_diff(stepwise, one_pass) <= TOL


def test_memory_matters():
    """Sanity check of the two tests above: without memory the predictions change."""
    model = tiny_model()
    ids = random_ids(2, 12, seed=2)
    with_memory, _ = run_segments(model, ids, [6, 6])
    with torch.no_grad():
        alone = model(ids[:, 6:]).logits
    assert max_diff(alone, with_memory[:, 6:]) > 1e-2


# ---- the relative shift -------------------------------------------------------------


def naive_rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Index each distance explicitly: out[..., i, j] = x[..., i, K-1-(M+i-j)] for j <= M+i."""
    *_, T, K = x.shape
    M = K - T
    out = torch.zeros_like(x)
    for i in range(T):
        for j in range(M + i + 1):
            out[..., i, j] = x[..., i, K - 1 - (M + i - j)]
    return out


@FAST
@given(B=st.integers(1, 2), H=st.integers(1, 3), T=st.integers(1, 7), M=st.integers(0, 7),
       seed=st.integers(0, 1000))
def test_rel_shift_matches_naive_indexing(B, H, T, M, seed):
    K = M + T
    x = torch.randn(B, H, T, K, generator=torch.Generator().manual_seed(seed))
    visible = ~torch.triu(torch.ones(T, K, dtype=torch.bool), diagonal=1 + M)
    assert torch.equal(rel_shift(x)[..., visible], naive_rel_shift(x)[..., visible])


# ---- attention ----------------------------------------------------------------------


@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("lengths", [[5, 4, 1], [1, 9, 3]])
def test_attention_rows_sum_to_one_and_hide_masked_keys(same_length, lengths):
    model = tiny_model(same_length=same_length, mem_len=6)
    ids = random_ids(2, sum(lengths), seed=3)
    mems, start = None, 0
    for length in lengths:
        M = 0 if mems is None else mems[0].size(1)
        with torch.no_grad():
            out = model(ids[:, start : start + length], mems=mems, output_attentions=True)
        mask = model.attention_mask(length, M, model.mem_len)
        future = torch.triu(torch.ones(length, M + length, dtype=torch.bool), diagonal=1 + M)
        assert mask is not None or not future.any()
        for probs in out.attentions:
            assert probs.shape == (2, 2, length, M + length)
            assert max_diff(probs.sum(-1), torch.ones_like(probs.sum(-1))) <= 1e-12
            assert (probs[..., future] == 0).all()
            if mask is not None:
                assert (probs[..., mask] == 0).all()
        mems, start = out.mems, start + length


def test_same_length_shows_every_query_the_same_number_of_keys():
    model = tiny_model(same_length=True, mem_len=6)
    mask = model.attention_mask(T=4, M=6, mem_len=6)  # K = 10 keys, 6 + 4
    assert mask.logical_not().sum(-1).tolist() == [6, 6, 6, 6]


# ---- shapes and the memory length ---------------------------------------------------


def test_output_shapes():
    model = tiny_model(mem_len=5)
    with torch.no_grad():
        out = model(random_ids(3, 4), output_attentions=True)
        assert out.logits.shape == (3, 4, VOCAB)
        assert [m.shape for m in out.mems] == [(3, 4, 16)] * 2
        out = model(random_ids(3, 4), mems=out.mems, output_attentions=True)
    assert [m.shape for m in out.mems] == [(3, 5, 16)] * 2  # 4 + 4 positions, 5 kept
    assert [a.shape for a in out.attentions] == [(3, 2, 4, 8)] * 2
    assert all(not m.requires_grad for m in out.mems)
    assert model(random_ids(3, 4)).attentions is None


def test_mem_len_zero_keeps_empty_memory():
    model = tiny_model(mem_len=0)
    ids = random_ids(2, 9, seed=4)
    logits, mems = run_segments(model, ids, [3, 3, 3])
    assert all(m.shape == (2, 0, 16) for m in mems)
    with torch.no_grad():  # no memory: each segment alone
        alone = torch.cat([model(ids[:, s : s + 3]).logits for s in (0, 3, 6)], dim=1)
    assert max_diff(logits, alone) <= TOL


def _layer_inputs(ids: torch.Tensor, **overrides) -> list[torch.Tensor]:
    """Every layer's input at every position (one pass, memory long enough for all)."""
    model = tiny_model(**{**overrides, "mem_len": 64})
    _, mems = run_segments(model, ids, [ids.size(1)])
    return mems


@pytest.mark.parametrize("new_mem_len", [3, 30])
def test_changing_mem_len_keeps_newest_positions(new_mem_len):
    """model.mem_len set at run time, shorter and longer than config.mem_len (8)."""
    model = tiny_model(mem_len=8)
    ids = random_ids(2, 16, seed=5)
    try:
        model.mem_len = new_mem_len
        _, mems = run_segments(model, ids, [16])
    finally:
        model.mem_len = model.config.mem_len
    everything = _layer_inputs(ids)
    for kept, full in zip(mems, everything):
        assert max_diff(kept, full[:, -min(new_mem_len, 16) :]) <= TOL


def test_shrinking_mem_len_mid_stream_drops_oldest():
    model = tiny_model(mem_len=8)
    ids = random_ids(2, 12, seed=6)
    _, old = run_segments(model, ids[:, :10], [10])  # 8 positions kept
    with torch.no_grad():
        new = model(ids[:, 10:], mems=old, mem_len=3).mems  # per-call override
    for o, n in zip(old, new):
        assert n.shape == (2, 3, 16)
        assert torch.equal(n[:, :1], o[:, -1:])  # the newest old position survives
    embedded = model.embed(ids[:, 9:])  # layer 0's input is the scaled embedding
    assert max_diff(new[0], embedded) <= TOL


def test_float32_model_runs_and_matches_float64():
    model64 = tiny_model()
    model32 = tiny_model(dtype=torch.float32)
    ids = random_ids(2, 10, seed=7)
    a, _ = run_segments(model32, ids, [4, 6])
    b, _ = run_segments(model64, ids, [4, 6])
    assert a.dtype == torch.float32
    assert_ulps_close(a, b, FLOAT32_VS_64)  # in float32's ulps (the coarser dtype)


# ---- input checks -------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        torch.zeros(2, 3),  # float
        torch.zeros(2, 3, dtype=torch.int32),  # not int64
        torch.zeros(3, dtype=torch.long),  # 1-D
        torch.zeros(1, 2, 3, dtype=torch.long),  # 3-D
        torch.tensor([[0, -1]]),  # negative id
        torch.tensor([[0, VOCAB]]),  # beyond the vocabulary
    ],
)
def test_bad_input_ids_raise_value_error(bad):
    with pytest.raises(ValueError):
        tiny_model()(bad)


# ---- config -------------------------------------------------------------------------


def test_config_json_round_trip(tmp_path):
    cfg = TXLConfig(vocab=list("ab?\n é"), d_model=8, n_layer=1, n_head=1, d_head=4,
                    d_inner=8, clamp_len=5, same_length=True, pre_lnorm=True, untie_r=False,
                    unk_symbol="?", extra={"source": "test"})
    cfg.save(tmp_path / "config.json")
    assert TXLConfig.load(tmp_path / "config.json") == cfg
    assert TXLConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.vocab_size == 6


@pytest.mark.parametrize(
    "fields",
    [
        {"vocab_size": 0},
        {"vocab": ["a", "a"]},
        {"vocab": ["a", "b"], "vocab_size": 3},
        {"vocab_size": 5, "d_model": 7},
        {"vocab_size": 5, "mem_len": -1},
        {"vocab_size": 5, "n_layer": 0},
    ],
)
def test_config_rejects_bad_values(fields):
    with pytest.raises(ValueError):
        TXLConfig(**fields)


def test_config_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown TXLConfig fields: colour"):
        TXLConfig.from_dict({"vocab_size": 5, "colour": "red"})


def test_save_and_load_pretrained(tmp_path):
    model = peaky(TransformerXL(tiny_config(vocab=list("abcdefghij?"), vocab_size=0)))
    model.save_pretrained(tmp_path)
    loaded = TransformerXL.from_pretrained(tmp_path)
    assert loaded.config == model.config
    assert loaded.tokenizer.vocab == model.tokenizer.vocab
    ids = random_ids(1, 6)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


# ---- tokenizer ----------------------------------------------------------------------

ALPHABET = "abc xyz\n!?"


@FAST
@given(text=st.text(alphabet=ALPHABET, max_size=40))
def test_tokenizer_round_trip(text):
    tok = CharTokenizer.from_text(ALPHABET)
    ids = tok.encode(text)
    assert all(0 <= i < len(tok) for i in ids)
    assert tok.decode(ids) == text


def test_tokenizer_vocab_is_sorted_characters():
    assert CharTokenizer.from_text("banana").vocab == ["a", "b", "n"]


def test_unknown_characters_strict_names_them():
    tok = CharTokenizer(list("abc"))
    with pytest.raises(UnknownCharactersError) as err:
        tok.encode("abZcZé")
    assert err.value.chars == ["Z", "é"]
    assert "'Z' (U+005A) at 2" in str(err.value) and "U+00E9) at 5" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_unknown_characters_replace_and_ignore():
    tok = CharTokenizer(list("ab?"))  # "?" in the vocabulary is the default replacement
    assert tok.decode(tok.encode("aZb", errors="replace")) == "a?b"
    assert tok.decode(tok.encode("aZb", errors="ignore")) == "ab"
    tok = CharTokenizer(list("ab_"), unk_symbol="_")
    assert tok.decode(tok.encode("aZb", errors="replace")) == "a_b"
    with pytest.raises(ValueError, match="needs an unk_symbol"):
        CharTokenizer(list("ab")).encode("aZ", errors="replace")
    with pytest.raises(ValueError, match="errors must be one of"):
        tok.encode("a", errors="bogus")
    with pytest.raises(ValueError, match="not in the vocabulary"):
        CharTokenizer(list("ab"), unk_symbol="?")


def test_decode_rejects_out_of_range_ids():
    with pytest.raises(ValueError, match="outside 0..2"):
        CharTokenizer(list("abc")).decode([0, 3])
