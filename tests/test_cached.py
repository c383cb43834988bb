"""The cached engine (txl/cached.py) against the model's forward: the KV memory, the
one-token step, the table of position keys and the step's weights give the forward's
numbers, call by call, and follow every change of the weights, dtype and clamp_len.

The models and helpers are test_model's: tiny, peaky weights, float64 where two ways of
computing the same thing are compared.
"""

from __future__ import annotations

import pytest
import torch

from tests.test_model import (
    TOL,
    VOCAB,
    max_diff,
    peaky,
    random_ids,
    run_segments,
    tiny_config,
    tiny_model,
)
from tests.tolerance import SAME_SUMS, assert_ulps_close
from txl.cached import cached_forward
from txl.model import TransformerXL

# ---- segments: the KV memory against the hidden-state memory -----------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize(
    "overrides",
    [{}, {"pre_lnorm": True}, {"same_length": True, "mem_len": 6}, {"clamp_len": 3},
     {"untie_r": False, "mem_len": 5}],
)
def test_cached_forward_equals_forward(overrides, dtype):
    """KV-cached memory (generation) gives forward's numbers, segment after segment."""
    model = peaky(TransformerXL(tiny_config(**overrides))).to(dtype)
    ids = random_ids(2, 30, seed=3)
    expected, _ = run_segments(model, ids, [7, 1, 1, 9, 1, 11])
    memory, pieces, start = None, [], 0
    for length in [7, 1, 1, 9, 1, 11]:
        out = cached_forward(model, ids[:, start : start + length], memory)
        memory, start = out.memory, start + length
        pieces.append(out.logits)
        assert len(memory) == min(start, model.mem_len)
    assert_ulps_close(torch.cat(pieces, dim=1), expected, SAME_SUMS)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"pre_lnorm": True}, {"same_length": True, "mem_len": 6}, {"untie_r": False}],
)
def test_cached_forward_last_only_is_the_last_row(overrides):
    """last_only runs the top layer for the last query alone: the same last logits as a
    full forward, and the same memory after it (every position's keys and values are
    still made), segment after segment."""
    model = tiny_model(**overrides)
    ids = random_ids(2, 26, seed=5)
    full = lean = None
    start = 0
    for length in [7, 1, 9, 9]:
        segment = ids[:, start : start + length]
        full = cached_forward(model, segment, full)
        out = cached_forward(model, segment, lean, last_only=True)
        lean, start = out.memory, start + length
        assert out.logits.shape == (2, 1, VOCAB)
        assert max_diff(out.logits, full.logits[:, -1:]) <= TOL
        full = full.memory
        for a, b in zip(full.k + full.v, lean.k + lean.v):
            assert max_diff(a[:, :, full.start : full.end], b[:, :, lean.start : lean.end]) <= TOL


def test_cached_forward_follows_a_clamp_len_changed_at_run_time():
    """The cached table of position keys must not outlive a change of clamp_len."""
    model = TransformerXL(tiny_config())  # float32
    peaky(model)
    ids = random_ids(1, 20, seed=4)
    cached_forward(model, ids)  # fills the table with unclamped distances
    model.config.clamp_len = 2
    expected = model(ids).logits
    assert_ulps_close(cached_forward(model, ids).logits, expected, SAME_SUMS)
    model.config.clamp_len = -1
    assert_ulps_close(cached_forward(model, ids).logits, model(ids).logits, SAME_SUMS)


def test_cached_forward_is_for_inference_only():
    model = TransformerXL(tiny_config()).train()
    with pytest.raises(RuntimeError, match="eval"):
        cached_forward(model, random_ids(1, 3))


# ---- the one-token step (cached_forward with T = 1: _step) ----------------------------

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
    """cached_forward (KV memory) call by call against forward (hidden-state memory):
    logits, attentions and the memory's length, within SAME_SUMS ulps of the model's dtype."""
    ids = random_ids(B, sum(length for length, _ in schedule), seed=8)
    mems, memory, start = None, None, 0
    for length, mem_len in schedule:
        x = ids[:, start : start + length]
        with torch.no_grad():
            want = model(x, mems=mems, output_attentions=capture, mem_len=mem_len)
        got = cached_forward(model, x, memory, output_attentions=capture, mem_len=mem_len)
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
    out = cached_forward(model, random_ids(2, 1), mem_len=0, output_attentions=True)
    assert all(torch.equal(a, torch.ones(2, 2, 1, 1, dtype=a.dtype)) for a in out.attentions)


def test_step_batch_of_one():
    assert_steps_equal_forward(tiny_model(), capture=True, B=1)


def check_step_matches_forward(model: TransformerXL, seed: int = 9) -> None:
    """A step over a memory of 5 = forward over all 6 tokens (the last position)."""
    ids = random_ids(2, 6, seed)
    memory = cached_forward(model, ids[:, :5]).memory
    got = cached_forward(model, ids[:, 5:], memory, output_attentions=True)
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
    memory = cached_forward(model, ids[:, :3]).memory
    got = cached_forward(model, ids[:, 3:], memory).logits
    with torch.no_grad():
        want = model(ids).logits[:, -1:]
    assert got.dtype == torch.bfloat16
    assert_ulps_close(got, want, 6)  # in bfloat16 ulps (eps 2**-7): 4.7 % of the largest


def test_kv_memory_layout():
    """Keys read as [B, H, capacity, Dh] but are stored key-last; clone keeps that; the
    buffers are plain tensors that code outside inference mode may write to."""
    model = tiny_model()
    memory = cached_forward(model, random_ids(2, 5)).memory
    cached_forward(model, random_ids(2, 1), memory)
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
    memory = cached_forward(model, ids[:, :2]).memory
    buffers = memory.k[0]
    for t in range(2, 150):  # capacity 66 at first: it regrows twice
        got = cached_forward(model, ids[:, t : t + 1], memory).logits
        if t % 37 == 0:
            with torch.no_grad():
                want = model(ids[:, : t + 1]).logits[:, -1:]
            assert max_diff(got, want) <= TOL, t
    assert memory.k[0] is not buffers and len(memory) == 150
    memory.k = [k.clone() for k in memory.k]  # as a restore might: new tensors, same values
    memory.v = [v.clone() for v in memory.v]
    got = cached_forward(model, torch.tensor([[3]]), memory).logits
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
        memory, token, out = cached_forward(model, prompt).memory, prompt[:, -1:], []
        for _ in range(40):
            logits = cached_forward(model, token, memory, mem_len=len(memory) + 1).logits
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
