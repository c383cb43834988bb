"""Where memory matters (txl/moments.py, scripts/find_memory_moments.py,
webapp/tabs/watch_examples.py):
the shipped passages' figures recomputed on the bundled model by plain forwards; the
selection (largest saving first, passages disjoint) on synthetic arrays and on a tiny
model against direct reads; the Watch tab's examples through the app."""

from __future__ import annotations

import hashlib
import json
import math
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import app  # noqa: E402
from scripts import find_memory_moments  # noqa: E402
from tests import raw_api, test_app  # noqa: E402
from tests.test_app import MEM_LEN, SEG_LEN, step, tiny_model  # noqa: E402
from tests.test_weights import WEIGHTS, data_path  # noqa: E402
from txl import TransformerXL  # noqa: E402
from txl.data import load_text, train_val_split  # noqa: E402
from txl.moments import LINE_SEARCH, find_moments, passage_start, pick_disjoint  # noqa: E402
from txl.recall import probe_text  # noqa: E402
from webapp.tabs import watch_examples  # noqa: E402

server, client = test_app.server, test_app.client  # the app's fixtures: a tiny model
LN2 = math.log(2)


@torch.no_grad()
def direct_reads(model, text: str, seg: int, mem_len: int, window_from: int = 1):
    """Log-probabilities [L - 1, V] (float64) of the next character after each of text[:-1],
    read two ways by plain forwards: with memory (the text from its start in segments of
    ``seg``, the hidden states of the last ``mem_len`` positions carried: ``model.forward``'s
    mems, the paper's memory, not the app's cached keys and values), and through the window
    (the ``seg`` characters before it alone; row t - 1 for t >= window_from, else NaN)."""
    ids = torch.tensor(model.tokenizer.encode(text))
    L = len(ids)
    memory, mems = [], None
    for a in range(0, L - 1, seg):
        x = ids[a : min(a + seg, L - 1)].unsqueeze(0)  # [1, T]
        out = model(x, mems, mem_len=mem_len)
        memory.append(torch.log_softmax(out.logits[0].double(), -1))  # [T, V]
        mems = out.mems
    window = torch.full((L - 1, model.config.vocab_size), math.nan, dtype=torch.float64)
    for t in range(window_from, L):
        x = ids[max(0, t - seg) : t].unsqueeze(0)
        window[t - 1] = torch.log_softmax(model(x, mem_len=x.size(1)).logits[0, -1].double(), -1)
    return ids[1:], torch.cat(memory), window


def bits(targets, logp) -> list[float]:
    """-log2 p of each target under its row of logp."""
    return (-logp.gather(1, targets.unsqueeze(1))[:, 0] / LN2).tolist()


def rank(target: int, logp) -> int:
    """1 + how many tokens are likelier than ``target`` under logp [V]."""
    return 1 + int((logp > logp[target]).sum())


def direct_bits(model, text: str, seg: int, mem_len: int) -> tuple[list[float], list[float]]:
    """Surprisal (bits) of every character text[1:], with memory and through the window."""
    targets, memory, window = direct_reads(model, text, seg, mem_len)
    return bits(targets, memory), bits(targets, window)


# ---- the shipped passages ----------------------------------------------------------------


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads(watch_examples.MOMENTS_FILE.read_text(encoding="utf-8"))


def test_the_shipped_passages_are_the_bundled_model_s(report):
    model = TransformerXL.from_pretrained(WEIGHTS)
    digest = hashlib.sha256((WEIGHTS / "model.safetensors").read_bytes()).hexdigest()
    assert digest == report["model_sha256"], (
        "the weights changed since webapp/tabs/memory_moments.json was written: "
        "rerun scripts/find_memory_moments.py"
    )
    assert report["model"] == "weights/shakespeare-char"
    c = model.config
    assert (report["seg_len"], report["mem_len"]) == (c.tgt_len, c.mem_len)
    moments = report["moments"]
    assert 3 <= len(moments) <= 4
    assert [m["bits_saved"] for m in moments] == sorted(
        (m["bits_saved"] for m in moments), reverse=True
    )
    for m in moments:
        # Each passage's last character, read as one stream from the passage's start, then
        # through the window: what one Step from that prompt computes, to 1e-3 bits.
        text = m["passage"] + m["char"]
        targets, memory, window = direct_reads(
            model, text, c.tgt_len, c.mem_len, window_from=len(text) - 1
        )
        assert bits(targets, memory)[-1] == pytest.approx(m["bits_memory"], abs=1e-3)
        assert bits(targets, window)[-1] == pytest.approx(m["bits_window"], abs=1e-3)
        assert rank(targets[-1], memory[-1]) == m["rank_memory"]
        assert rank(targets[-1], window[-1]) == m["rank_window"]
        assert m["bits_saved"] == pytest.approx(m["bits_window"] - m["bits_memory"], abs=1e-9)
        assert m["bits_saved"] > 1.0  # memory matters there
        assert len(m["passage"]) >= report["context"] - LINE_SEARCH
    # The passages are the validation text's, just before their characters, disjoint.
    _, val = train_val_split(load_text(data_path(), download=True))
    for m in moments:
        assert val[m["start"] : m["position"]] == m["passage"]
        assert val[m["position"]] == m["char"]
        assert val[m["position"] :].startswith(m["after"])
    spans = sorted((m["start"], m["position"]) for m in moments)
    assert all(b < a2 for (_, b), (a2, _) in zip(spans, spans[1:]))


# ---- the selection ----------------------------------------------------------------------


def test_pick_disjoint_keeps_the_largest_savings_whose_spans_share_no_character():
    # spans [start, position]:   0:[10,20] 1:[15,25] 2:[21,30] 3:[0,9] 4:[30,40] 5:[50,60]
    starts = [10, 15, 21, 0, 30, 50]
    positions = [20, 25, 30, 9, 40, 60]
    savings = [5.0, 6.0, 4.0, 1.0, 3.0, 2.0]
    # 1 first; 0 overlaps it (15..20); 2 overlaps it (21..25); 4 does not; 5; then 3.
    assert pick_disjoint(savings, starts, positions, 3) == [1, 4, 5]
    assert pick_disjoint(savings, starts, positions, 10) == [1, 4, 5, 3]  # all there are
    # Touching spans share a character (2 ends at 30, where 4 starts): 2 excludes 4.
    assert pick_disjoint([1.0, 9.0, 0.5], [30, 21, 0], [40, 30, 5], 3) == [1, 2]
    # Ties: the earlier position first.
    assert pick_disjoint([2.0, 2.0], [100, 0], [110, 10], 1) == [1]
    assert pick_disjoint([], [], [], 4) == []
    with pytest.raises(ValueError, match="same length"):
        pick_disjoint([1.0], [0, 1], [5], 1)


def test_a_passage_starts_at_a_line_start_when_one_is_near():
    text = "abc\n" * 50 + "x" * 300
    assert passage_start(text, 150, 100) == 52  # 50 -> the line starting at 52
    assert passage_start(text, 148, 100) == 48  # already a line start
    assert passage_start(text, 450, 200) == 250  # no new line within LINE_SEARCH: as it is
    with pytest.raises(ValueError):
        passage_start(text, 50, 100)


def test_find_moments_picks_the_largest_savings_of_direct_reads(tmp_path):
    model = TransformerXL.from_pretrained(tiny_model(tmp_path / "tiny"))
    lines = ["ROMEO:", "I take thee at thy word:", "JULIET:", "What man art thou?", "NURSE:"]
    text = "\n".join(lines[i % 5] + " " * (i % 3) for i in range(60))[:520]
    context, start, stop = 160, 200, 520
    # Character t's saving in the scan: the window's bits less the long read's, which
    # starts `context` characters before the range (text[40:]: j is character 40 + j + 1).
    first = start - context
    memory, window = direct_bits(model, text[first:], SEG_LEN, MEM_LEN)
    saved = {t: window[t - first - 1] - memory[t - first - 1] for t in range(start, stop)}

    found = find_moments(model, text, start, stop, k=1, context=context, shortlist=1, progress=str)
    best = max(saved, key=saved.get)
    assert [m.position for m in found] == [best]  # the scan's largest saving

    found = find_moments(model, text, start, stop, k=2, context=context, shortlist=2, progress=str)
    first_start = passage_start(text, best, context)
    second = max(
        (t for t in saved if t < first_start or passage_start(text, t, context) > best),
        key=saved.get,
    )
    assert {m.position for m in found} == {best, second}  # the next one that does not overlap
    assert found[0].bits_saved >= found[1].bits_saved
    for m in found:
        # Each measured on its passage alone, as a Step from that prompt would see it.
        assert m.context == text[m.context_start : m.position] and m.char == text[m.position]
        alone = m.context + m.char
        targets, memory, window = direct_reads(model, alone, SEG_LEN, MEM_LEN, len(alone) - 1)
        assert m.bits_memory == pytest.approx(bits(targets, memory)[-1], abs=1e-4)
        assert m.bits_window == pytest.approx(bits(targets, window)[-1], abs=1e-4)
        assert (m.rank_memory, m.rank_window) == (
            rank(targets[-1], memory[-1]),
            rank(targets[-1], window[-1]),
        )
    with pytest.raises(ValueError, match="too short"):
        find_moments(model, text, start, stop, context=100)


def test_the_script_writes_what_the_tab_reads(tmp_path, capsys):
    model_dir = tiny_model(tmp_path / "tiny")
    lines = ["ROMEO:", "I take thee at thy word:", "JULIET:", "What man art thou?", ""]
    data = tmp_path / "play.txt"
    data.write_text("\n".join(lines[i % 5] for i in range(600)))  # its last 10 %: 720
    _, val = train_val_split(data.read_text())
    out = tmp_path / "moments.json"
    args = ["--model", model_dir, "--data", str(data), "--positions", "0:500", "--k", "2"]
    args += ["--context", "160", "--shortlist", "3", "--out", str(out), "--nice", "0"]
    assert find_memory_moments.main(args) == 0
    report = watch_examples.load_moments(out)
    assert (report["seg_len"], report["mem_len"], report["positions"]) == (16, 32, [160, 500])
    assert len(report["moments"]) == 2
    printed = capsys.readouterr().out
    assert "scanned 340 characters (160:500)" in printed and "wrote" in printed
    for m in report["moments"]:
        assert val[m["start"] : m["position"]] == m["passage"] and val[m["position"]] == m["char"]
        assert val[m["position"] :].startswith(m["after"]) and "\n" not in m["after"][1:]
        assert f"position {m['position']:>7,}" in printed
    first = report["moments"][0]
    assert watch_examples.label(first).endswith(
        f" · {2 ** first['bits_saved']:,.0f}× likelier with memory "
        f"({first['bits_memory']:.2f} bits; window {first['bits_window']:.2f})"
    )
    # Bad arguments: a clear message, no file written.
    with pytest.raises(SystemExit):
        find_memory_moments.main(args + ["--context", "50", "--out", str(tmp_path / "x")])
    assert "too short" in capsys.readouterr().err and not (tmp_path / "x").exists()


# ---- the Watch tab ----------------------------------------------------------------------


def test_choosing_an_example_puts_its_passage_in_the_prompt(server, client, report):
    moment = report["moments"][1]
    prompt, memory, mem_len, guide = client.predict("1", api_name="/watch_example")
    assert prompt == moment["passage"]
    assert memory is True and mem_len == MEM_LEN  # the session's model's own mem_len
    assert f"{moment['bits_memory']:.2f} bits" in guide
    assert f"{moment['bits_window']:.2f} bits" in guide
    # One Step from it predicts the passage's character: the very position measured.
    out = step(client, prompt=prompt, mem_len=mem_len)
    assert out[5]["position"] == len(prompt) and out[0][: len(prompt)] == prompt

    # Anything but a choice offered is refused with its message; none leaves all as it was.
    with pytest.raises(Exception, match="not in the list of choices"):
        client.predict("99", api_name="/watch_example")
    assert raw_api.call(server[0], "watch_example", [None])[0]

    prompt, memory, _, guide = client.predict("recall", api_name="/watch_example")
    text, start = probe_text(
        watch_examples.DEFAULT_NAME,
        watch_examples.RECALL_FILLER,
        watch_examples.DEFAULT_WATCH,
        before=watch_examples.RECALL_BEFORE,  # the Recall tab's defaults: a scene under way
    )
    assert prompt == text[:start] and memory is True
    assert "How far back can it recall?" in guide
    # How far back: from the name (after the text before it) to the first scored letter.
    back = start - len(watch_examples.RECALL_BEFORE)
    assert text[start - back :].startswith(f"{watch_examples.DEFAULT_NAME}:\n")
    assert f"spoke {back} characters back" in guide


def test_the_first_screen_opens_on_the_best_passage_with_the_bundled_model(report, tmp_path):
    demo = app.Demo.serving(str(WEIGHTS)).build()
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    assert by_id["prompt"].value == report["moments"][0]["passage"]
    assert by_id["example"].value == "0"
    assert f"{report['moments'][0]['bits_memory']:.2f} bits" in by_id["example_guide"].value
    # Another model: the plain prompt (the passages were measured on the bundled one).
    other = app.Demo.serving(tiny_model(tmp_path / "tiny"))
    assert watch_examples.opening(other.service, report) == ("ROMEO:\n", None)
