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

from tests.tolerance import FLOAT32_VS_64, SAME_SUMS, assert_ulps_close
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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize(
    "overrides",
    [{}, {"pre_lnorm": True}, {"same_length": True, "mem_len": 6}, {"clamp_len": 3},
     {"untie_r": False, "mem_len": 5}],
)
def test_forward_cached_equals_forward(overrides, dtype):
    """KV-cached memory (generation) gives forward's numbers, segment after segment."""
    model = peaky(TransformerXL(tiny_config(**overrides))).to(dtype)
    ids = random_ids(2, 30, seed=3)
    expected, _ = run_segments(model, ids, [7, 1, 1, 9, 1, 11])
    memory, pieces, start = None, [], 0
    for length in [7, 1, 1, 9, 1, 11]:
        out = model.forward_cached(ids[:, start : start + length], memory)
        memory, start = out.memory, start + length
        pieces.append(out.logits)
        assert len(memory) == min(start, model.mem_len)
    assert_ulps_close(torch.cat(pieces, dim=1), expected, SAME_SUMS)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"pre_lnorm": True}, {"same_length": True, "mem_len": 6}, {"untie_r": False}],
)
def test_forward_cached_last_only_is_the_last_row(overrides):
    """last_only runs the top layer for the last query alone: the same last logits as a
    full forward, and the same memory after it (every position's keys and values are
    still made), segment after segment."""
    model = tiny_model(**overrides)
    ids = random_ids(2, 26, seed=5)
    full = lean = None
    start = 0
    for length in [7, 1, 9, 9]:
        segment = ids[:, start : start + length]
        full = model.forward_cached(segment, full)
        out = model.forward_cached(segment, lean, last_only=True)
        lean, start = out.memory, start + length
        assert out.logits.shape == (2, 1, VOCAB)
        assert max_diff(out.logits, full.logits[:, -1:]) <= TOL
        full = full.memory
        for a, b in zip(full.k + full.v, lean.k + lean.v):
            assert max_diff(a[:, :, full.start : full.end], b[:, :, lean.start : lean.end]) <= TOL


def test_forward_cached_follows_a_clamp_len_changed_at_run_time():
    """The cached table of position keys must not outlive a change of clamp_len."""
    model = TransformerXL(tiny_config())  # float32
    peaky(model)
    ids = random_ids(1, 20, seed=4)
    model.forward_cached(ids)  # fills the table with unclamped distances
    model.config.clamp_len = 2
    expected = model(ids).logits
    assert_ulps_close(model.forward_cached(ids).logits, expected, SAME_SUMS)
    model.config.clamp_len = -1
    assert_ulps_close(model.forward_cached(ids).logits, model(ids).logits, SAME_SUMS)


def test_forward_cached_is_for_inference_only():
    model = TransformerXL(tiny_config()).train()
    with pytest.raises(RuntimeError, match="eval"):
        model.forward_cached(random_ids(1, 3))


# ---- the one-token step (forward_cached with T = 1: TransformerXL._step) ----------------

# (segment length, mem_len of the call): a step on an empty memory, steps on a partial
# one, a segment in between (the other path), steps on a full one, and a call whose
# mem_len is shorter than the memory it gets (same_length then hides several keys).
STEP_SCHEDULE = [(1, 6), (1, 6), (3, 6), (1, 6), (1, 6), (1, 6), (1, 6), (1, 3), (1, 3), (1, 6)]
STEP_CONFIGS = [
    {},
    {"pre_lnorm": True},
    {"same_length": True},
    {"clamp_len": 3},
    {"untie_r": False},
    {"same_length": True, "pre_lnorm": True, "clamp_len": 2},
]


def assert_steps_equal_forward(model, capture: bool, schedule=STEP_SCHEDULE, B=2):
    """forward_cached (KV memory) call by call against forward (hidden-state memory):
    logits, attentions and the memory's length, within SAME_SUMS ulps of the model's dtype."""
    ids = random_ids(B, sum(length for length, _ in schedule), seed=8)
    mems, memory, start = None, None, 0
    for length, mem_len in schedule:
        x = ids[:, start : start + length]
        with torch.no_grad():
            want = model(x, mems=mems, output_attentions=capture, mem_len=mem_len)
        got = model.forward_cached(x, memory, output_attentions=capture, mem_len=mem_len)
        where = f"segment of {length} at {start}, mem_len {mem_len}"
        assert_ulps_close(got.logits, want.logits, SAME_SUMS, what=where)
        if capture:
            for a, b in zip(got.attentions, want.attentions, strict=True):
                # same shape [B, H, T, M + T], hidden keys 0
                assert_ulps_close(a, b, SAME_SUMS, what=where)
        else:
            assert got.attentions is None
        mems, memory, start = want.mems, got.memory, start + length
        assert len(memory) == mems[0].size(1)


@pytest.mark.parametrize("capture", [False, True])
@pytest.mark.parametrize("overrides", STEP_CONFIGS)
def test_step_equals_forward_float64(overrides, capture):
    assert_steps_equal_forward(tiny_model(**overrides), capture)


@pytest.mark.parametrize("capture", [False, True])
def test_step_equals_forward_float32(capture):
    model = tiny_model(dtype=torch.float32, same_length=True)
    assert_steps_equal_forward(model, capture)


@pytest.mark.parametrize("same_length", [False, True])
def test_step_with_mem_len_zero_sees_only_itself(same_length):
    model = tiny_model(same_length=same_length)
    assert_steps_equal_forward(model, capture=True, schedule=[(1, 0), (2, 0), (1, 0), (1, 0)])
    # A token alone, no memory: its attention is 1 on itself.
    out = model.forward_cached(random_ids(2, 1), mem_len=0, output_attentions=True)
    assert all(torch.equal(a, torch.ones(2, 2, 1, 1, dtype=a.dtype)) for a in out.attentions)


def test_step_batch_of_one():
    assert_steps_equal_forward(tiny_model(), capture=True, B=1)


def check_step_matches_forward(model: TransformerXL, seed: int = 9) -> None:
    """A step over a memory of 5 = forward over all 6 tokens (the last position)."""
    ids = random_ids(2, 6, seed)
    memory = model.forward_cached(ids[:, :5]).memory
    got = model.forward_cached(ids[:, 5:], memory, output_attentions=True)
    with torch.no_grad():
        want = model(ids, output_attentions=True)
    assert got.logits.dtype == next(model.parameters()).dtype
    assert_ulps_close(got.logits, want.logits[:, -1:], SAME_SUMS)
    assert_ulps_close(got.attentions[-1], want.attentions[-1][:, :, -1:], SAME_SUMS)


def test_step_weights_never_go_stale():
    """The cached StepWeights (views, transposed copies, u and v stacked) follow every
    way the parameters can change: each change is followed by a step that must see it."""
    model = peaky(TransformerXL(tiny_config())).double()
    check_step_matches_forward(model)
    model.load_state_dict(peaky(TransformerXL(tiny_config()), seed=1).state_dict())  # in place
    check_step_matches_forward(model)
    fresh = peaky(TransformerXL(tiny_config()), seed=2).double().state_dict()
    model.load_state_dict(fresh, assign=True)  # new parameter objects
    check_step_matches_forward(model)
    model.train()  # a training step: the optimizer updates in place
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = random_ids(2, 6, seed=10)
    model(ids[:, :-1], targets=ids[:, 1:]).nll.mean().backward()
    optimizer.step()
    model.eval()
    check_step_matches_forward(model)
    fc1 = model.layers[0].ff.fc1.weight
    fc1.data = fc1.data * 2  # a new tensor under the same parameter
    check_step_matches_forward(model)
    with torch.no_grad():
        model.layers[1].u.add_(0.5)  # u and v are stacked into a copy
        model.layers[0].attn.qkv.weight.mul_(1.5)  # W_qkv is read from a transposed copy
    check_step_matches_forward(model)


def test_step_follows_dtype_changes():
    model = peaky(TransformerXL(tiny_config()))
    check_step_matches_forward(model)  # float32
    model.double()
    check_step_matches_forward(model)
    model.float()
    check_step_matches_forward(model)
    model.to(torch.bfloat16)  # runs; the step and forward agree to bfloat16's precision
    ids = random_ids(1, 4, seed=11)
    memory = model.forward_cached(ids[:, :3]).memory
    got = model.forward_cached(ids[:, 3:], memory).logits
    with torch.no_grad():
        want = model(ids).logits[:, -1:]
    assert got.dtype == torch.bfloat16
    assert_ulps_close(got, want, 6)  # in bfloat16 ulps (eps 2**-7): 4.7 % of the largest


def test_kv_memory_layout():
    """Keys read as [B, H, capacity, Dh] but are stored key-last; clone keeps that; the
    buffers are plain tensors that code outside inference mode may write to."""
    model = tiny_model()
    memory = model.forward_cached(random_ids(2, 5)).memory
    model.forward_cached(random_ids(2, 1), memory)
    k, v = memory.k[0], memory.v[0]
    assert k.shape == v.shape and k.shape[:2] == (2, 2) and k.size(3) == 8
    assert k.mT.is_contiguous() and v.is_contiguous()
    copy = memory.clone()
    assert copy.k[0].mT.is_contiguous() and torch.equal(copy.k[0], k)
    assert len(copy) == len(memory) == 6
    assert memory.nbytes == 2 * 2 * (2 * 2 * 6 * 8) * 8  # n_layer · (k, v) · B·H·M·Dh · 8 B
    assert not k.is_inference()
    memory.k[0][:, :, memory.start] = 0.0  # allowed outside inference mode


def test_step_survives_buffer_growth_and_replacement():
    """Steps across KVMemory.reserve's regrowth (new buffers: the step's cached views
    must follow) and after a caller replaces a layer's buffers by copies."""
    model = tiny_model(mem_len=200)
    ids = random_ids(1, 150, seed=12)
    memory = model.forward_cached(ids[:, :2]).memory
    buffers = memory.k[0]
    for t in range(2, 150):  # capacity 66 at first: it regrows twice
        got = model.forward_cached(ids[:, t : t + 1], memory).logits
        if t % 37 == 0:
            with torch.no_grad():
                want = model(ids[:, : t + 1]).logits[:, -1:]
            assert max_diff(got, want) <= TOL, t
    assert memory.k[0] is not buffers and len(memory) == 150
    memory.k = [k.clone() for k in memory.k]  # as a restore might: new tensors, same values
    memory.v = [v.clone() for v in memory.v]
    got = model.forward_cached(torch.tensor([[3]]), memory).logits
    with torch.no_grad():
        want = model(torch.cat([ids, torch.tensor([[3]])], dim=1)).logits[:, -1:]
    assert max_diff(got, want) <= TOL


def test_steps_in_threads_sharing_a_model():
    """The model's caches (StepWeights, the position table and its last views) are shared
    by every session of a server: threads stepping memories of different lengths on one
    model get what each gets alone."""
    import threading

    model = tiny_model(mem_len=64)
    prompts = [random_ids(1, n, seed=n) for n in (3, 8, 13, 21)]

    def run(prompt) -> torch.Tensor:
        memory, token, out = model.forward_cached(prompt).memory, prompt[:, -1:], []
        for _ in range(40):
            logits = model.forward_cached(token, memory, mem_len=len(memory) + 1).logits
            token = logits[:, -1:].argmax(-1)
            out.append(logits)
        return torch.cat(out, dim=1)

    alone = [run(p) for p in prompts]
    together = [None] * len(prompts)
    threads = [
        threading.Thread(target=lambda i=i: together.__setitem__(i, run(prompts[i])))
        for i in range(len(prompts))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(alone, together):
        assert torch.equal(a, b)
