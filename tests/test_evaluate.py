"""txl.evaluate's three ways of reading (segments alone, sliding window, memory) against
direct computations: one plain ``model.forward`` per prediction, nothing shared with the
batched code under test. Tiny random models, built in milliseconds."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.tolerance import SAME_SUMS, assert_ulps_close
from txl import TransformerXL, TXLConfig
from txl.evaluate import (
    evaluate_model,
    evaluate_positions,
    format_table,
    main,
    parse_positions,
    summary,
)
from txl.scoring import memory_nll, sliding_nll, stream_nll

VOCAB = list("abcdefgh \n")
TEXT = "abc abd\nabe fgh hag bad cab deaf\nface bead\nhead fade each cage"  # 61 chars


def tiny_model(seed=0, **overrides) -> TransformerXL:
    cfg = dict(d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=32, tgt_len=4, mem_len=6,
               dropout=0.0)
    cfg.update(overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TransformerXL(TXLConfig(vocab=VOCAB, **cfg))
        model.reset_parameters(0.3)  # peaky: every logit depends on every key
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def ids_of(model, text=TEXT) -> torch.Tensor:
    return torch.tensor(model.tokenizer.encode(text))


@torch.no_grad()
def direct_sliding(model, ids, window, start=1, stop=None) -> torch.Tensor:
    """-log p(ids[t] | ids[max(0, t-W) : t]): one plain forward per token."""
    stop = len(ids) if stop is None else stop
    out = []
    for t in range(start, stop):
        x = ids[max(0, t - window) : t].unsqueeze(0)  # [1, <= W]
        logits = model(x, mem_len=x.size(1)).logits[0, -1]
        out.append(-torch.log_softmax(logits, -1)[ids[t]])
    return torch.stack(out)


@torch.no_grad()
def direct_segments_alone(model, ids, seg_len, start, stop) -> torch.Tensor:
    """Segments [k*seg, (k+1)*seg) of inputs, each read alone: token t sees ids[k*seg : t]
    where k*seg <= t-1 < (k+1)*seg."""
    out = []
    for t in range(start, stop):
        a = (t - 1) // seg_len * seg_len
        logits = model(ids[a:t].unsqueeze(0), mem_len=0).logits[0, -1]
        out.append(-torch.log_softmax(logits, -1)[ids[t]])
    return torch.stack(out)


@torch.no_grad()
def direct_whole(model, ids, start, stop) -> torch.Tensor:
    """Everything before each token (what a memory longer than the text gives)."""
    logits = model(ids[: stop - 1].unsqueeze(0), mem_len=stop).logits[0]  # [stop-1, V]
    logp = torch.log_softmax(logits, -1)
    t = torch.arange(start, stop)
    return -logp[t - 1, ids[t]]


# ---- the sliding window -----------------------------------------------------------------


@pytest.mark.parametrize("same_length", [False, True])
@pytest.mark.parametrize("window", [1, 3, 7, 100])
def test_sliding_window_equals_one_forward_per_token(window, same_length):
    model = tiny_model(same_length=same_length)
    ids = ids_of(model)
    expected = direct_sliding(model, ids, window)  # includes t < W: the shorter prefix
    for batch_size in (None, 1, 5):
        got = sliding_nll(model, ids, window, batch_size=batch_size)
        assert_ulps_close(got, expected, SAME_SUMS, what=f"batch_size {batch_size}")
    # A sub-range gives the same numbers for the same tokens, across the t = W boundary.
    part = sliding_nll(model, ids, window, start=2, stop=40, batch_size=3)
    assert_ulps_close(part, expected[1:39], SAME_SUMS)


def test_sliding_window_sees_exactly_w_tokens(model):
    """Changing a token W or more positions back changes nothing; W - 1 back does."""
    ids, W, t = ids_of(model), 5, 30
    base = sliding_nll(model, ids, W, start=t, stop=t + 1)
    far, near = ids.clone(), ids.clone()
    far[t - W - 1] = (far[t - W - 1] + 1) % len(VOCAB)
    near[t - W] = (near[t - W] + 1) % len(VOCAB)
    assert torch.equal(sliding_nll(model, far, W, start=t, stop=t + 1), base)
    assert not torch.allclose(sliding_nll(model, near, W, start=t, stop=t + 1), base)


def test_sliding_window_rejects_bad_ranges(model):
    ids = ids_of(model)
    for kwargs in ({"start": 0}, {"start": 5, "stop": 4}, {"stop": len(ids) + 1}):
        with pytest.raises(ValueError):
            sliding_nll(model, ids, 4, **kwargs)
    with pytest.raises(ValueError):
        sliding_nll(model, ids, 0)
    assert sliding_nll(model, ids, 4, start=3, stop=3).shape == (0,)


# ---- memory rows on the same tokens -------------------------------------------------------


def test_memory_rows_score_only_the_positions_but_read_from_the_start(model):
    ids = ids_of(model)
    start, stop = 13, 50
    whole = stream_nll(model, ids.view(1, -1), 4, 6)[0]  # token j + 1 in column j
    assert_ulps_close(memory_nll(model, ids, 4, 6, start, stop), whole[12:49], SAME_SUMS)
    # A memory longer than the text: every token sees everything before it.
    assert_ulps_close(memory_nll(model, ids, 4, 64, start, stop),
                      direct_whole(model, ids, start, stop), SAME_SUMS)
    assert_ulps_close(memory_nll(model, ids, 4, 0, start, stop),
                      direct_segments_alone(model, ids, 4, start, stop), SAME_SUMS)


def test_every_row_scores_the_same_tokens(model):
    ids = ids_of(model)
    start, stop = 9, 47
    rows = evaluate_positions(model, ids, start, stop, [0, 6, 64], [3, 8], progress=False)
    expect = {
        ("memory", 0): direct_segments_alone(model, ids, 4, start, stop),
        ("memory", 64): direct_whole(model, ids, start, stop),
        ("sliding", 3): direct_sliding(model, ids, 3, start, stop),
        ("sliding", 8): direct_sliding(model, ids, 8, start, stop),
    }
    for (kind, n), nll in expect.items():
        row = rows[kind][n]
        # a mean of float32 surprisals, as a Python float: float32's ulps
        assert_ulps_close(row["loss"], nll.mean().item(), SAME_SUMS, dtype=torch.float32,
                          what=f"{kind} {n}")
        assert row["bpc"] == pytest.approx(row["loss"] / math.log(2))
        assert row["seconds"] > 0 and row["ms_per_token"] > 0
    # Tokens outside [start, stop) do not count: a different range, a different loss.
    other = evaluate_positions(model, ids, start + 10, stop, [6], [3], progress=False)
    assert_ulps_close(other["sliding"][3]["loss"],
                      direct_sliding(model, ids, 3, start + 10, stop).mean().item(),
                      SAME_SUMS, dtype=torch.float32)
    assert other["memory"][6]["loss"] != pytest.approx(rows["memory"][6]["loss"], abs=1e-4)


def test_parse_positions():
    assert parse_positions("2000:12000", 20000) == (2000, 12000)
    assert parse_positions(":50", 100) == (1, 50) and parse_positions("7:", 100) == (7, 100)
    for bad in ("5", "0:10", "10:10", "10:5", "1:101"):
        with pytest.raises(ValueError):
            parse_positions(bad, 100)


# ---- the CLI ----------------------------------------------------------------------------------


def test_cli_writes_every_row_with_times(model, tmp_path, capsys):
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    data = tmp_path / "text.txt"
    data.write_text(TEXT * 20)  # 1,220 chars: the last 122 validate
    out = tmp_path / "eval.json"
    argv = ["--model", str(folder), "--data", str(data), "--sliding", "4,12",
            "--positions", "30:100", "--no-sweep", "--json", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["positions"] == [30, 100] and result["tokens"] == 70
    assert set(result["sliding"]) == {"4", "12"}
    rows = [result["with_memory"], result["without_memory"], *result["sliding"].values()]
    for row in rows:
        assert {"loss", "bpc", "seconds", "ms_per_token"} <= set(row)
    # The validation text is the last 10 %: the same numbers from a direct computation.
    val = (TEXT * 20)[int(len(TEXT * 20) * 0.9) :]
    ids = ids_of(model, val)
    assert_ulps_close(result["sliding"]["12"]["loss"],
                      direct_sliding(model, ids, 12, 30, 100).mean().item(),
                      SAME_SUMS, dtype=torch.float32)
    printed = capsys.readouterr().out
    assert "segments of 4 read alone (no memory)" in printed
    assert "sliding window of 12, recomputed for every token" in printed
    assert "segments of 4 + memory of 6" in printed
    with pytest.raises(SystemExit):  # a range beyond the validation text
        main(argv[:-2] + ["--positions", "30:100000"])


def test_without_sliding_or_positions_the_streams_stay(model):
    result = evaluate_model(model, TEXT * 4, n_streams=2, sweep=False, progress=False)
    assert "sliding" not in result and result["n_streams"] == 2
    assert result["with_memory"]["ms_per_token"] > 0
    table = format_table(result)
    assert "segments of 4 read alone (no memory)" in table and "sliding" not in table


def test_summary_names_every_baseline(model):
    result = evaluate_model(
        model, TEXT * 2, sweep=False, progress=False, windows=[4], positions=(20, 100)
    )
    text = summary(result)
    assert "vs segments of 4 read alone" in text
    assert "sliding window of 4" in text and "faster per token" in text


def test_format_table_reads_an_untimed_result():
    """An eval.json written before the rows were timed still prints."""
    row = {"mem_len": 0, "loss": 1.5, "bpc": 1.5 / math.log(2)}
    old = {"tgt_len": 64, "train_mem_len": 128, "tokens": 100, "n_streams": 8,
           "without_memory": row, "with_memory": dict(row, mem_len=128),
           "sweep": [row, dict(row, mem_len=128)]}
    table = format_table(old)
    assert "| segments of 64 + memory of 128 | 1.5000 | 2.1640 | - | - |" in table
