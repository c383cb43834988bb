"""The recall probe (txl/recall.py) against direct computations on tiny random models in
float64: the window from one plain forward of the characters before each scored one, the
memory and segments alone from ``stream_nll`` reading the whole probe from its start (and,
with a memory longer than the probe, from one forward of the whole prefix)."""

from __future__ import annotations

import math
import re

import plotly.graph_objects as go
import pytest
import torch

from txl import TransformerXL, TXLConfig
from txl.recall import (
    CUE,
    DISTANCES,
    MAX_NAME_CHARS,
    SPEECH,
    RecallRow,
    check_recall,
    name_back,
    planted_bits,
    probe_head,
    probe_text,
    reach,
    recall_probe,
    recall_row,
    recall_summary,
)
from txl.scoring import memory_nll, sliding_nll, stream_nll
from webapp.recall_viz import recall_figure, recall_markdown, recall_numbers

VOCAB = sorted(set("\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))
NAME = "ZANTHOR"
FILLER = "Good morrow, cousin; the day is young.\nWhat news abroad?\n"  # 56 characters
# Tiny segments make every case appear: probes shorter than one segment past the head,
# boundaries inside and at the filler's end, the filler repeated (k > 56).
SEG, MEM = 8, 12
KS = (1, 4, 8, 13, 16, 37, 64, 100)
# Text read before the speaker enters: 34 characters, so that the shared boundaries
# (len(BEFORE) + head + k) // SEG * SEG fall elsewhere in the probe than without it.
BEFORE = "ROMEO:\nI will go; and you, stay.\n\n"
assert len(BEFORE) % SEG != 0
LN2 = math.log(2)
# The model runs in float64; the scoring code hands its losses back in float32
# (stream_nll, sliding_nll), so the rows agree with the float64 forwards to ~1e-7 bits.
TOL = 1e-6


def tiny_model(seed=0, **overrides) -> TransformerXL:
    cfg = dict(
        d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=32, tgt_len=SEG, mem_len=MEM,
        dropout=0.0,
    )  # fmt: skip
    cfg.update(overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TransformerXL(TXLConfig(vocab=VOCAB, **cfg))
        model.reset_parameters(0.3)  # peaky: every logit depends on every key
    return model.double().eval()


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def ids_of(model, text: str) -> torch.Tensor:
    return torch.tensor(model.tokenizer.encode(text))


def bits(nll: torch.Tensor) -> float:
    return nll.double().mean().item() / LN2


@torch.no_grad()
def direct_window(model, ids, start, window) -> torch.Tensor:
    """-log p(ids[t] | ids[t-W : t]) for t >= start: one plain forward per character."""
    out = []
    for t in range(start, len(ids)):
        x = ids[max(0, t - window) : t].unsqueeze(0)  # [1, <= W]
        logits = model(x, mem_len=x.size(1)).logits[0, -1]
        out.append(-torch.log_softmax(logits.double(), -1)[ids[t]])
    return torch.stack(out)


@torch.no_grad()
def direct_whole(model, ids, start) -> torch.Tensor:
    """Everything before each character: one forward of the whole prefix."""
    logits = model(ids[:-1].unsqueeze(0), mem_len=len(ids)).logits[0]  # [L-1, V]
    logp = torch.log_softmax(logits.double(), -1)
    t = torch.arange(start, len(ids))
    return -logp[t - 1, ids[t]]


def streamed(model, ids, mem_len, start) -> torch.Tensor:
    """stream_nll of the whole probe from its first character: column j is token j + 1."""
    return stream_nll(model, ids.view(1, -1), SEG, mem_len)[0][start - 1 :]


# ---- the probe's text -------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 37, 56, 57, 130])
def test_probe_text_plants_the_name_k_characters_back(k):
    text, start = probe_text(NAME, FILLER, k)
    head = probe_head(NAME)
    assert text.startswith(f"{NAME}:\n") and head.endswith("\n\n")
    body = text[len(head) : start - CUE - 2]
    assert len(body) == k and (FILLER * 3).startswith(body)  # cut, repeated when short
    assert text[start - CUE - 2 : start] == "\n\n" + NAME[:CUE]  # the cue
    assert text[start:] == NAME[CUE:]  # the scored characters: the rest of the name
    longer, _ = probe_text(NAME, FILLER, k + 50)
    assert longer[: len(head) + k] == text[: len(head) + k]  # what the reads share


@pytest.mark.parametrize("k", [1, 37, 130])
def test_text_before_is_read_first_and_k_keeps_its_meaning(k):
    body = (FILLER * 3)[:k]
    old = f"{NAME}:\n{SPEECH}\n\n{body}\n\n{NAME}"  # the probe as it was before ``before``
    assert probe_text(NAME, FILLER, k) == (old, len(old) - len(NAME) + CUE)
    assert probe_text(NAME, FILLER, k, before="") == probe_text(NAME, FILLER, k)
    text, start = probe_text(NAME, FILLER, k, before=BEFORE)
    assert (text, start) == (BEFORE + old, len(BEFORE) + len(old) - len(NAME) + CUE)
    assert text[start:] == NAME[CUE:]
    # name_back: from the name's last letter to the first scored one, with or without.
    last_letter = len(BEFORE) + len(NAME) - 1
    assert name_back(k) == start - last_letter == probe_text(NAME, FILLER, k)[1] - len(NAME) + 1
    shared = len(BEFORE) + len(probe_head(NAME)) + k  # what the reads share
    assert probe_text(NAME, FILLER, k + 50, before=BEFORE)[0][:shared] == text[:shared]


# ---- the three reads against direct computations -----------------------------------------


@pytest.mark.parametrize("before", ["", BEFORE])
@pytest.mark.parametrize("mem_len", [0, 5, MEM, 300])
def test_every_row_equals_direct_forwards(model, mem_len, before):
    rows = list(recall_probe(model, NAME, FILLER, KS, mem_len, before=before))
    assert [r.distance for r in rows] == list(KS)
    for r in rows:
        assert (r.text, r.start) == probe_text(NAME, FILLER, r.distance, before=before)
        ids = ids_of(model, r.text)
        assert r.bits_window == pytest.approx(
            bits(direct_window(model, ids, r.start, SEG)), abs=TOL
        )
        assert r.bits_memory == pytest.approx(bits(streamed(model, ids, mem_len, r.start)), abs=TOL)
        assert r.bits_segments == pytest.approx(bits(streamed(model, ids, 0, r.start)), abs=TOL)
        if mem_len == 0:  # no memory: the read with memory is the segments read alone
            assert r.bits_memory == r.bits_segments
        if mem_len >= len(r.text):  # a memory longer than the probe sees all of it
            whole = bits(direct_whole(model, ids, r.start))
            assert r.bits_memory == pytest.approx(whole, abs=TOL)


@pytest.mark.parametrize("k", [4, 37])
def test_a_planted_probe_is_the_probe_read_after_the_text_before_it(model, k):
    """planted_bits: the name after its cue, the probe written after ``before``, read with
    memory from the text's start and through the window; with nothing before, the probe's."""
    before = "ROMEO:\nI will go; and you, stay.\n\n"
    text, start = probe_text(NAME, FILLER, k)
    ids = ids_of(model, before + text)
    memory, window = planted_bits(model, before, NAME, FILLER, k, MEM)
    assert memory == pytest.approx(bits(streamed(model, ids, MEM, len(before) + start)), abs=TOL)
    assert window == pytest.approx(
        bits(direct_window(model, ids, len(before) + start, SEG)), abs=TOL
    )
    row = next(recall_probe(model, NAME, FILLER, [k], MEM))
    assert planted_bits(model, "", NAME, FILLER, k, MEM) == pytest.approx(
        (row.bits_memory, row.bits_window), abs=TOL
    )
    # The planted probe is recall_row's with ``before``: the same reads, bit for bit.
    row = recall_row(model, NAME, FILLER, k, MEM, before=before)
    assert (memory, window) == (row.bits_memory, row.bits_window)


@pytest.mark.parametrize("mem_len", [0, MEM])
def test_nothing_before_gives_the_rows_of_the_probe_that_opens_the_text(model, mem_len):
    """before="" (the default): each row is the one read plainly off the probe as it was
    written before ``before`` existed, bit for bit."""
    for r in recall_probe(model, NAME, FILLER, KS, mem_len):
        body = (FILLER * 2)[: r.distance]
        text = f"{NAME}:\n{SPEECH}\n\n{body}\n\n{NAME}"
        start = len(text) - len(NAME) + CUE
        ids = ids_of(model, text)
        assert r == RecallRow(
            r.distance,
            text,
            start,
            bits(memory_nll(model, ids, SEG, mem_len, start=start)),
            bits(sliding_nll(model, ids, SEG, start=start)),
            bits(memory_nll(model, ids, SEG, 0, start=start)),
        )


def test_shared_reads_equal_the_plain_reads_bit_for_bit():
    """recall_probe shares the longest probe's read; recall_row reads each probe whole."""
    model = tiny_model(seed=1, same_length=True)
    for before in ("", BEFORE, BEFORE[:5]):  # 34 and 5 characters: no multiple of SEG
        for mem_len in (3, MEM):
            for r in recall_probe(model, NAME, FILLER, KS, mem_len, before=before):
                assert r == recall_row(model, NAME, FILLER, r.distance, mem_len, before)


def test_memory_reaches_back_where_segments_cannot(model):
    """A letter of the planted name changed (one the cue does not give back): the window
    (8) and the segments alone read the same, the read with memory does not while its
    memory (64) still holds the name."""
    text, start = probe_text(NAME, FILLER, 8)
    changed = "ZANTHIR" + text[len(NAME) :]
    ids, ids2 = ids_of(model, text), ids_of(model, changed)
    assert start - len(NAME) > SEG  # the name lies beyond the window
    for read in (
        lambda i: direct_window(model, i, start, SEG),
        lambda i: streamed(model, i, 0, start),
    ):
        assert torch.equal(read(ids), read(ids2))
    assert not torch.allclose(streamed(model, ids, 64, start), streamed(model, ids2, 64, start))


@pytest.mark.parametrize("text_before", ["", BEFORE])
def test_rows_come_one_by_one_shortest_first_and_pace_every_chunk(model, text_before):
    chunks, before = [], model.training
    model.train()

    class Pace:
        def __enter__(self):
            chunks.append("enter")

        def __exit__(self, *exc):
            chunks.append("exit")

    probe = recall_probe(model, NAME, FILLER, (64, 4, 16, 16), MEM, pace=Pace, before=text_before)
    first = next(probe)
    assert first.distance == 4 and chunks and chunks.count("enter") == chunks.count("exit")
    n = len(chunks)
    assert [r.distance for r in probe] == [16, 64]
    # The longest shared read goes one segment per chunk; three reads per row besides.
    head = len(text_before) + len(probe_head(NAME))
    shared_segments = (head + 64) // SEG
    assert len(chunks) // 2 == shared_segments + 3 * 3
    assert n < len(chunks)  # the later rows paced too
    assert model.training  # put back as it was
    model.train(before)


def test_a_pace_that_raises_stops_the_probe(model):
    class Cancelled(Exception):
        pass

    calls = []

    def pace():
        calls.append(1)
        if len(calls) > 5:
            raise Cancelled
        return torch.no_grad()

    with pytest.raises(Cancelled):
        list(recall_probe(model, NAME, FILLER, KS, MEM, pace=pace))
    assert len(calls) == 6


# ---- bad input: a clear message before any work -------------------------------------


@pytest.mark.parametrize(
    "name, filler, message",
    [
        ("", FILLER, "type a name"),
        ("   ", FILLER, "type a name"),
        ("ZAN", FILLER, "more than 3 letters"),
        ("Z" * (MAX_NAME_CHARS + 1), FILLER, f"at most {MAX_NAME_CHARS}"),
        ("ZAN:THOR", FILLER, "without ':'"),
        ("ZAN\nTHOR", FILLER, "without ':'"),
        (NAME, "", "filler is empty"),
        ("ZANTHØR", FILLER, "does not know: 'Ø'"),
        (NAME, "caf\u00e9 {x}", "does not know: '\u00e9{}'"),
    ],
)
def test_bad_probes_are_refused_with_a_message(model, name, filler, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        next(recall_probe(model, name, filler, KS, MEM))


def test_text_before_with_unknown_characters_is_refused(model):
    message = "does not know before the speaker enters: '\u00e9{}'"
    with pytest.raises(ValueError, match=re.escape(message)):
        next(recall_probe(model, NAME, FILLER, KS, MEM, before=BEFORE + "caf\u00e9 {x}\n\n"))
    with pytest.raises(ValueError, match=re.escape(message)):
        recall_row(model, NAME, FILLER, 8, MEM, before="caf\u00e9 {x}")


@pytest.mark.parametrize(
    "distances, mem_len", [((), MEM), ((0, 8), MEM), ((2.5,), MEM), ((8,), -1), ((8,), 1.5)]
)
def test_bad_distances_and_memories_are_refused(model, distances, mem_len):
    with pytest.raises(ValueError, match="distances|mem_len"):
        check_recall(model, NAME, FILLER, distances, mem_len)


# ---- the sentence, the chart, the numbers -------------------------------------------------


def fake_rows(memory, window) -> list[RecallRow]:
    text, start = probe_text(NAME, FILLER, 8)
    return [RecallRow(k, text, start, m, w, 5.0) for k, m, w in zip(DISTANCES, memory, window)]


def test_reach_counts_only_an_unbroken_run_from_the_shortest():
    rows = fake_rows([0.1, 0.2, 1.9, 3.0, 0.5, 4, 4], [1.0, 2.5, 0.1, 4, 4, 4, 4])
    assert reach(rows, "bits_memory") == 128  # 512's lucky 0.5 after a miss: not reach
    assert reach(rows, "bits_window") == 32
    assert reach(rows, "bits_segments") is None
    said = recall_summary(rows, 64, mem_len=128)
    assert said.startswith("recalled up to 128 characters back with memory (128)")
    assert "through the window (64) only within 32" in said
    nothing = recall_summary(fake_rows([4] * 7, [4] * 7), 64)
    assert "not recalled with memory at any distance" in nothing
    assert "; not recalled through the window (64) at any distance tried" in nothing


def test_figure_numbers_and_words(model):
    rows = list(recall_probe(model, NAME, FILLER, DISTANCES[:3], MEM))
    fig = recall_figure(rows, MEM, SEG)
    go.Figure(fig.to_dict())  # a valid plotly figure (recall_figure skips validation)
    spec = fig.to_dict()
    assert [d["x"] for d in spec["data"]] == [list(DISTANCES[:3])] * 3
    assert spec["data"][0]["y"] == [round(r.bits_memory, 4) for r in rows]
    assert spec["layout"]["xaxis"]["type"] == "log"
    lines = [s["x0"] for s in spec["layout"]["shapes"] if s.get("x0") == s.get("x1")]
    assert lines == [SEG, MEM]  # the window and mem_len
    assert [s["x0"] for s in recall_figure(rows, 0, SEG).to_dict()["layout"]["shapes"]][0] == SEG
    # The hover: how far back the name's last letter lies, with text before the speaker too.
    for before in ("", BEFORE):
        planted = list(recall_probe(model, NAME, FILLER, DISTANCES[:3], MEM, before=before))
        back = [f"{r.start - (len(before) + len(NAME) - 1):,}" for r in planted]
        assert recall_figure(planted, MEM, SEG).to_dict()["data"][0]["customdata"] == back
    numbers = recall_numbers(rows, MEM, SEG, 1.25)
    assert numbers["rows"] == [r.to_dict() for r in rows]
    assert set(numbers["rows"][0]) == {
        "distance", "text", "start", "bits_memory", "bits_window", "bits_segments"
    }  # fmt: skip
    assert (numbers["mem_len"], numbers["window"], numbers["seconds"]) == (MEM, SEG, 1.25)
    partial = recall_markdown(rows, MEM, SEG, total=7, seconds=0.4)
    assert "Read 3 of 7 distances" in partial and "with memory (12)" in partial
    assert "3 distances read in 0.4 s" in recall_markdown(rows, MEM, SEG, total=3, seconds=0.4)


def test_the_cli_writes_the_mean_of_every_probe(model, tmp_path):
    """python -m txl.evaluate --recall: each distance's row is the mean of that distance's
    rows over every name and filler."""
    import argparse
    import json

    from txl.evaluate import recall_main

    text = (
        "But soft, what light through yonder window breaks? It is the east, and Juliet "
        "is the sun. Arise, fair sun, and kill the envious moon. "
    ) * 4
    args = argparse.Namespace(
        recall="ZANTHOR,Quibley", filler_at="0,7", distances="16,40", mem_len=32,
        json=tmp_path / "recall.json", recall_before_at=None,
    )  # fmt: skip
    assert recall_main(model, text, args) == 0
    written = json.loads(args.json.read_text())
    probes = [
        list(recall_probe(model, name, text[at : at + 40], [16, 40], 32))
        for name in ("ZANTHOR", "Quibley")
        for at in (0, 7)
    ]
    for i, row in enumerate(written):
        for field in ("bits_memory", "bits_window", "bits_segments"):
            mean = sum(getattr(p[i], field) for p in probes) / len(probes)
            assert row[field] == pytest.approx(mean, rel=1e-12)
        assert row["distance"] == [16, 40][i]


def test_the_cli_plants_the_speakers_after_whole_speeches(model, tmp_path, capsys):
    """--recall-before-at P: every probe written after progress_before(text, P)."""
    import argparse
    import json

    from txl.evaluate import recall_main
    from txl.recall import progress_before

    text = "ROMEO:\nGood morrow, cousin.\n\nJULIET:\nIs the day so young?\n\n" * 10
    args = argparse.Namespace(
        recall="ZANTHOR", filler_at="5", distances="16,40", mem_len=32,
        json=tmp_path / "recall.json", recall_before_at=100,
    )  # fmt: skip
    assert recall_main(model, text, args) == 0
    before = progress_before(text, 100)
    assert before.startswith("ROMEO:\n") and before.endswith("\n\n") and len(before) >= 150
    assert f"after {len(before):,} characters" in capsys.readouterr().out
    rows = recall_probe(model, "ZANTHOR", text[5:45], [16, 40], 32, before=before)
    assert json.loads(args.json.read_text()) == [r.to_dict() for r in rows]
    # A text with no whole speeches to plant after: a message, no table.
    args.recall_before_at, args.json = 0, None
    assert recall_main(model, "no speeches here " * 20, args) == 2
    assert "no whole speeches" in capsys.readouterr().err
