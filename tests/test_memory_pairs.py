"""The "Memory on | off" tab's views and examples (webapp/memory_pair_viz.py,
scripts/find_memory_pairs.py, webapp/tabs/memory_pairs.json): speaker headings and the
counts on small texts, the attention strip against its trace, the pair's view against its
pair; the shipped examples rerun on the bundled weights give the speakers recorded."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from scripts import find_memory_pairs
from tests.test_counterfactual import PROMPT, tiny_float
from tests.test_weights import WEIGHTS, data_path
from txl import TransformerXL
from txl.counterfactual import MemoryPair
from txl.data import load_text, train_val_split
from webapp import memory_pair_viz as viz
from webapp.tabs.memory_pair import EXAMPLES_FILE, load_examples

SCENE = (
    "ROMEO:\nShe speaks:\nO, speak again.\n\nJULIET:\nWherefore art thou Romeo?\n\n"
    "ROMEO:\nShall I hear more?\n\nFirst Watchman:\nWho's there?\nHence:\n"
)


def test_speaker_headings_are_lines_after_a_blank_line():
    headings = viz.speaker_headings(SCENE)
    # "She speaks:" and "Hence:" end with a colon but follow a line of the speech: not headings
    assert [name for _, name in headings] == ["ROMEO", "JULIET", "ROMEO", "First Watchman"]
    assert all(SCENE[p:].startswith(name + ":\n") for p, name in headings)
    written_from = SCENE.index("First")  # the prompt ends inside the last heading
    assert viz.speaker_headings(SCENE, written_from) == [headings[-1]]
    assert viz.speaker_headings("ROMEO:") == []  # a heading's line must be complete


def test_pair_counts():
    prompt = SCENE[: SCENE.index("ROMEO:\nShall")]
    memory = prompt + "ROMEO:\nAy.\n\nJULIET:\nNo.\n"
    window = prompt + "BOLDWIG:\nAy.\n\nNurse:\nNo.\n"
    counts = viz.pair_counts(len(prompt), memory, window, differing=9)
    assert counts["prompt_speakers"] == ["JULIET", "ROMEO"]
    assert counts["memory"] == {"headings": ["ROMEO", "JULIET"], "of_prompt": 2}
    assert counts["window"] == {"headings": ["BOLDWIG", "Nurse"], "of_prompt": 0}
    assert counts["differ"] == 9


def test_differing_runs():
    assert viz.differing_runs([3, 4, 5, 9, 11, 12]) == [[3, 6], [9, 10], [11, 13]]
    assert viz.differing_runs([]) == []


def test_the_view_is_the_pairs():
    pair = MemoryPair(tiny_float(seed=1), mem_len=24, temperature=1.0, seed=11)
    assert viz.pair_view(pair) is None
    assert "Nothing generated yet" in viz.status_markdown(None)
    pair.start(PROMPT)
    list(pair.generate(120))
    view = viz.pair_view(pair, {"seed": 11})
    assert view["memory_text"] == pair.with_memory.text
    assert view["window_text"] == pair.without_memory.text
    flat = [p for a, b in view["differ"] for p in range(a, b)]
    assert flat == pair.differing and view["counts"]["differ"] == len(flat)
    assert view["prompt_tokens"] == len(PROMPT) and view["steps"] == 120
    assert view["parting"]["position"] == pair.parting.position == flat[0]
    # The strip: the looked trace's attention, mean over layers and heads, one column a key
    # (fewer keys than STRIP_COLUMNS), the first n_far_cols the window or more back.
    strip, trace = view["parting"]["looked"], pair.parting.looked
    mean = trace.attentions.astype(np.float64).mean(axis=(0, 1))
    np.testing.assert_allclose(strip["w"], mean, atol=1e-5)
    assert strip["first"] == list(trace.key_positions) and strip["pos"] == trace.position
    far = trace.position - np.asarray(trace.key_positions) >= pair.with_memory.seg_len
    assert strip["n_far_cols"] == int(far.sum())
    assert strip["far"] == pytest.approx(float(mean[far].sum()), abs=1e-5)
    status = viz.status_markdown(view)
    assert f"they part at step {pair.parting.step + 1}" in status
    assert f"{len(flat)} characters differ" in status


def test_candidates_are_returns_from_beyond_the_window():
    filler = "Of all the things that I have seen, this is the strangest sight.\n"
    text = (
        "Enter ANNA and BORIS.\n\nANNA:\nHello there.\n\nBORIS:\n" + filler * 2 + "\nANNA:\nYes.\n"
    )
    context = text.rindex("ANNA") - 2  # the prompt reaches into the first line
    found = list(find_memory_pairs.candidates(text, 0, len(text), context, 64, 256))
    assert len(found) == 1
    start, end, name, back = found[0]
    assert name == "ANNA" and text[end:].startswith("ANNA:\n") and text[end - 2 : end] == "\n\n"
    assert text[start:end][-back:].startswith("ANNA:")  # back reaches her last heading
    assert 64 <= back <= 256


@pytest.fixture(scope="module")
def report() -> dict:
    report = load_examples()
    assert report is not None, f"{EXAMPLES_FILE} is missing: run scripts/find_memory_pairs.py"
    return report


def test_the_examples_are_measured_on_the_shipped_weights(report):
    weights = (WEIGHTS / "model.safetensors").read_bytes()
    assert report["model_sha256"] == hashlib.sha256(weights).hexdigest(), (
        "the weights changed: rerun scripts/find_memory_pairs.py"
    )
    _, val = train_val_split(load_text(data_path(), download=False))
    model = TransformerXL.from_pretrained(WEIGHTS)
    torch.set_num_threads(1)
    for e in report["examples"]:
        assert val[e["start"] : e["position"]] == e["prompt"]
        memory, window, steps = find_memory_pairs.run(
            model, e["prompt"], e["seed"], report["mem_len"]
        )
        assert (memory, window, steps) == (e["memory_speaker"], e["window_speaker"], e["steps"])
        speakers = {n for _, n in viz.speaker_headings(e["prompt"])}
        assert memory == e["next_speaker"] in speakers and window not in speakers


def test_an_example_fills_the_prompt_and_settings(report):
    from webapp.tabs.memory_pair import MemoryPairTab

    chosen = MemoryPairTab.choose_example("0")  # reads the file alone
    prompt, mem_len, temperature, top_k, top_p, seed, n, guide = chosen
    e = report["examples"][0]
    assert (prompt, seed, n) == (e["prompt"], e["seed"], e["n"])
    assert (mem_len, temperature, top_k, top_p) == tuple(
        report[k] for k in ("mem_len", "temperature", "top_k", "top_p")
    )
    assert e["memory_speaker"] in guide and e["window_speaker"] in guide
