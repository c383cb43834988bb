"""The "How far back can it recall?" tab through the API: /recall's rows recomputed from
their ``text`` and ``start`` alone by direct forwards (the paper's hidden-state memory
through ``model.forward``, not the app's cached keys and values), streamed one by one;
bad input refused with its message; Watch it's prompt, from which one Step predicts the
first scored letter."""

from __future__ import annotations

import math
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import gradio as gr  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tests import test_app  # noqa: E402
from tests.test_app import MEM_LEN, SEG_LEN, generate, step  # noqa: E402
from txl.recall import DISTANCES, MAX_NAME_CHARS, probe_text  # noqa: E402
from txl.session import Session  # noqa: E402
from webapp.serve import MAX_PROMPT_CHARS  # noqa: E402
from webapp.tabs.examples import RECALL_BEFORE, RECALL_FILLER  # noqa: E402
from webapp.tabs.recall import DEFAULT_NAME, MAX_BEFORE_CHARS  # noqa: E402

server, client = test_app.server, test_app.client  # the app's fixtures: a tiny model

NAME = "QUINTILLA"
FILLER = "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n"
LN2 = math.log(2)


def recall(client, name=NAME, filler=FILLER, mem_len=MEM_LEN, before=""):
    return client.predict(
        name=name, filler=filler, before=before, mem_len=mem_len, api_name="/recall"
    )


@torch.no_grad()
def direct_bits(model, text: str, start: int, seg: int, mem_len: int) -> dict[str, list]:
    """Each scored character's surprisal (bits) read three ways by plain forwards:
    memory: the text from its start in segments of ``seg``, the hidden states of the last
    ``mem_len`` positions carried (``model.forward``'s mems); window: the ``seg``
    characters before it; segments: its segment's characters before it."""
    ids = torch.tensor(model.tokenizer.encode(text))
    L = len(ids)

    def bits(logits, t) -> float:
        return -torch.log_softmax(logits.double(), -1)[ids[t]].item() / LN2

    memory, mems = [], None
    for a in range(0, L - 1, seg):
        x = ids[a : min(a + seg, L - 1)].unsqueeze(0)  # [1, T]
        out = model(x, mems if mem_len > 0 else None, mem_len=mem_len)
        memory += [bits(out.logits[0, i], a + i + 1) for i in range(x.size(1))]
        mems = out.mems
    window, segments = [], []
    for t in range(start, L):
        x = ids[max(0, t - seg) : t].unsqueeze(0)
        window.append(bits(model(x, mem_len=x.size(1)).logits[0, -1], t))
        a = (t - 1) // seg * seg
        segments.append(bits(model(ids[a:t].unsqueeze(0), mem_len=0).logits[0, -1], t))
    return {"memory": memory[start - 1 :], "window": window, "segments": segments}


def mean(xs) -> float:
    return sum(xs) / len(xs)


@pytest.mark.parametrize("mem_len, before", [(MEM_LEN, ""), (100, ""), (MEM_LEN, RECALL_BEFORE)])
def test_every_row_equals_direct_forwards_of_its_text(server, client, mem_len, before):
    plot, sentence, numbers = recall(client, mem_len=mem_len, before=before)
    model = server[1].service.default_model
    rows = numbers["rows"]
    assert [r["distance"] for r in rows] == list(DISTANCES)
    assert numbers["mem_len"] == mem_len and numbers["window"] == SEG_LEN
    for r in rows:
        text, start = r["text"], r["start"]
        assert (text, start) == probe_text(NAME, FILLER, r["distance"], before=before)
        assert text.startswith(f"{before}{NAME}:\n") and text[start:] == NAME[3:]
        direct = direct_bits(model, text, start, SEG_LEN, mem_len)
        for way in ("memory", "window", "segments"):
            # The contract is 1e-3 bits; float32 leaves ~3e-7 here, and a read that mixed
            # in the wrong text moves a row of this (not peaky) model by ~5e-5.
            assert r[f"bits_{way}"] == pytest.approx(mean(direct[way]), abs=1e-5), (r, way)
    assert plot["type"] == "plotly" and "How far back can it recall?" in plot["plot"]
    assert f"with memory ({mem_len})" in sentence and "distances read in" in sentence


def test_rows_stream_one_by_one(client):
    """Rows come one by one; a caller that leaves ``before`` out gets the page's."""
    job = client.submit(name=NAME, filler=FILLER, mem_len=MEM_LEN, api_name="/recall")
    final = job.result()
    stages = job.outputs()
    assert [len(out[2]["rows"]) for out in stages] == list(range(1, len(DISTANCES) + 1))
    assert all(r["text"].startswith(RECALL_BEFORE + NAME) for r in final[2]["rows"])
    assert all("Read " in out[1] for out in stages[:-1]) and stages[-1] == final
    assert final[2]["seconds"] > 0 and stages[0][2]["seconds"] is None


@pytest.mark.parametrize(
    "name, filler, before, mem_len, message",
    [
        ("", FILLER, "", MEM_LEN, "type a name"),
        ("ZAN", FILLER, "", MEM_LEN, "more than 3 letters"),
        ("ZANTHØR", FILLER, "", MEM_LEN, "does not know: 'Ø'"),
        (NAME, "fill{er}", "", MEM_LEN, "does not know: '{}'"),
        (NAME, "", "", MEM_LEN, "filler is empty"),
        (NAME, FILLER, "", 99_999, "mem_len"),
        (NAME, FILLER, "", -1, "mem_len"),
        (NAME, "x" * 20_001, "", MEM_LEN, "20,000"),
        (NAME, FILLER, "BERNARDO:\nWho{s} th\u00e9re?\n\n", MEM_LEN,
         "does not know before the speaker enters: '{}\u00e9'"),
        (NAME, FILLER, "x" * (MAX_BEFORE_CHARS + 1), MEM_LEN, f"{MAX_BEFORE_CHARS:,}"),
    ],
)  # fmt: skip
def test_bad_input_gives_its_message_and_changes_nothing(
    server, client, name, filler, before, mem_len, message
):
    text = generate(client, n_tokens=10)[0]
    with pytest.raises(Exception, match=message.replace("{", r"\{").replace("}", r"\}")):
        recall(client, name=name, filler=filler, mem_len=mem_len, before=before)
    assert step(client)[0][:-1] == text  # the session's text and memory as they were
    if mem_len >= 0 and mem_len <= 2048:  # the page's check before /recall: the same words
        with pytest.raises(gr.Error, match=message.split(":")[0]):
            server[1].recall.recall_click(name, filler, before, mem_len, None)


@pytest.mark.parametrize("before", ["", RECALL_BEFORE])
def test_watch_it_prompt_makes_one_step_predict_the_first_scored_letter(server, client, before):
    txl_app = server[1]
    model = txl_app.service.default_model
    prompt, mem_len = txl_app.recall.recall_prompt(f"  {NAME} ", FILLER, before, 128, MEM_LEN, None)
    text, start = probe_text(NAME, FILLER, 128, before=before)
    assert (prompt, mem_len) == (text[:start], MEM_LEN)
    # The Watch tab's Step from that prompt, memory on: it predicts position ``start``.
    out = step(client, prompt=prompt, mem_len=mem_len)
    assert out[5]["position"] == start and out[0][:start] == prompt
    # ... from the distribution the probe's read with memory had there.
    s = Session(model, mem_len=mem_len)
    s.start(prompt)
    p = torch.log_softmax(s.next_logits.double(), -1)[model.tokenizer.encode(text[start])[0]]
    first = direct_bits(model, text, start, SEG_LEN, mem_len)["memory"][0]
    assert -p.item() / LN2 == pytest.approx(first, abs=1e-3)
    with pytest.raises(gr.Error, match="k must be between"):
        txl_app.recall.recall_prompt(NAME, FILLER, before, 0, MEM_LEN, None)


def test_a_probe_and_a_score_do_not_cancel_each_other_but_a_new_probe_does(server):
    txl_app = server[1]
    state = txl_app.service.ensure(None)
    probe = txl_app.recall.recall(NAME, FILLER, "", MEM_LEN, state)
    assert len(next(probe)[2]["rows"]) == 1  # running
    score = txl_app.score.score(test_app.SCORE_TEXT, MEM_LEN, state)
    next(score)
    assert len(next(probe)[2]["rows"]) == 2  # a Score of the same session left it running
    newer = txl_app.recall.recall(NAME, FILLER, "", MEM_LEN, state)
    assert len(next(newer)[2]["rows"]) == 1
    assert list(next(probe)[:3]) == [gr.skip()] * 3  # replaced: it leaves the page alone
    with pytest.raises(StopIteration):
        next(probe)
    assert list(next(score)[:5]) != [gr.skip()] * 5  # the Score goes on
    txl_app.recall.recall_click(NAME, FILLER, "", MEM_LEN, state)  # the page's click cancels
    assert list(next(newer)[:3]) == [gr.skip()] * 3
    score.close()


def test_the_tab_opens_ready_to_probe(server):
    demo = server[1].build()
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    assert by_id["recall_name"].value == DEFAULT_NAME
    assert by_id["recall_filler"].value == RECALL_FILLER and len(RECALL_FILLER) >= 2048
    assert not set(RECALL_FILLER) - set(test_app.VOCAB)  # the tests' model knows it all
    assert by_id["recall_before"].value == RECALL_BEFORE
    assert not set(RECALL_BEFORE) - set(test_app.VOCAB)
    # Whole speeches of Hamlet's opening, in Tiny Shakespeare's format.
    assert RECALL_BEFORE.startswith("BERNARDO:\nWho's there?\n\n") and RECALL_BEFORE.endswith(
        "And I am sick at heart.\n\n"
    )
    assert 250 <= len(RECALL_BEFORE) <= 350


def test_the_longest_text_before_still_makes_a_prompt_watch_it_takes(server):
    """The longest name after the longest text before it, at the longest distance: Watch
    it's prompt is within the Watch tab's limit."""
    long_name = "Z" * MAX_NAME_CHARS
    prompt, _ = server[1].recall.recall_prompt(
        long_name, RECALL_FILLER, "x" * MAX_BEFORE_CHARS, max(DISTANCES), MEM_LEN, None
    )
    assert len(prompt) > MAX_BEFORE_CHARS + max(DISTANCES) and len(prompt) <= MAX_PROMPT_CHARS
