"""The shipped weights: they load, and reproduce what their model card says.

The validation text is Tiny Shakespeare's last 10 %. The tests read it from $TXL_DATA, or
from ../shared/data/tinyshakespeare.txt beside the checkout, or download it once into
~/.cache/txl (the repository holds no copy of the data).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.tolerance import RECORDED_ELSEWHERE, assert_ulps_close
from txl import TransformerXL
from txl.data import load_text, tiny_shakespeare_path, train_val_split
from txl.evaluate import evaluate_loss

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "weights" / "shakespeare-char"


def data_path() -> Path:
    return tiny_shakespeare_path(ROOT)


@pytest.fixture(scope="module")
def model() -> TransformerXL:
    return TransformerXL.from_pretrained(WEIGHTS)


@pytest.fixture(scope="module")
def card_eval() -> dict:
    return json.loads((WEIGHTS / "eval.json").read_text())


@pytest.fixture(scope="module")
def val_text() -> str:
    try:
        text = load_text(data_path(), download=True)
    except OSError as e:
        pytest.fail(f"Tiny Shakespeare is needed (set TXL_DATA to its path): {e}", pytrace=False)
    assert len(text) == 1_115_394, "not the Tiny Shakespeare the weights were trained on"
    return train_val_split(text)[1]


@pytest.fixture(scope="module")
def val_ids(model, val_text) -> torch.Tensor:
    return torch.tensor(model.tokenizer.encode(val_text), dtype=torch.long)


def test_the_folder_has_everything_a_hub_repo_needs():
    for name in ("config.json", "model.safetensors", "README.md", "loss_curve.png", "eval.json"):
        assert (WEIGHTS / name).is_file(), name
    assert (WEIGHTS / "model.safetensors").stat().st_size <= 25 * 2**20


def test_the_model_card_tells_the_numbers_of_eval_json(card_eval):
    card = (WEIGHTS / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: txl" in card
    for reading in ("with_memory", "without_memory"):
        assert f"{card_eval[reading]['loss']:.4f}" in card
    for row in card_eval["sweep"]:
        assert re.search(rf"\| {row['mem_len']} \| {row['loss']:.4f} \|", card)
    assert "python -m txl.train" in card  # the exact command


def test_the_recorded_readings_meet_the_floors(card_eval):
    with_memory = card_eval["with_memory"]["loss"]
    without = card_eval["without_memory"]["loss"]
    by_len = {r["mem_len"]: r["loss"] for r in card_eval["sweep"]}
    train_mem = card_eval["train_mem_len"]
    assert with_memory <= 1.4609  # no worse than the model these weights replaced
    # Memory helps at the shipped segment length. Against segments read alone it saves
    # 0.08 nats here: training with fresh starts (--mem-reset) made the model read a
    # segment with nothing before it well (the model before saved 0.20, reading alone at
    # 1.66). What memory adds over the fair baseline, the sliding window, is asserted below.
    assert with_memory <= without - 0.05
    assert by_len[4 * train_mem] <= by_len[train_mem]  # longer memory than trained: no worse


def test_memory_reads_as_well_as_the_window_it_replaces():
    """eval_three_ways.json (the card's table): memory 128 beats the sliding window of the
    segment's length (64) and matches the window of its own attention length (192)."""
    three = json.loads((WEIGHTS / "eval_three_ways.json").read_text())
    memory = {r["mem_len"]: r["loss"] for r in three["sweep"]}[three["train_mem_len"]]
    window = {int(w): r["loss"] for w, r in three["sliding"].items()}
    assert memory < window[64]
    assert memory <= window[192] + 0.002


def test_the_weights_reproduce_the_recorded_slice(model, card_eval, val_ids):
    recorded = card_eval["slice"]
    loss = evaluate_loss(
        model,
        val_ids,
        model.config.tgt_len,
        recorded["mem_len"],
        recorded["n_streams"],
        recorded["max_segments"],
    )
    assert_ulps_close(loss, recorded["loss"], RECORDED_ELSEWHERE, dtype=torch.float32)


def test_memory_helps_on_the_slice(model, card_eval, val_ids):
    recorded = card_eval["slice"]
    without = evaluate_loss(
        model, val_ids, model.config.tgt_len, 0, recorded["n_streams"], recorded["max_segments"]
    )
    assert without > recorded["loss"] + 0.05


def bits_after_the_cue(model, val_text, monkeypatch, **probes) -> tuple[float, float]:
    """scripts/recall_check.py's 16 probes (seed 7) with ``probes`` (its read_probes's
    mem_len, names, distances, opening): the mean bits per character of the name after its
    first three letters, with memory and through the window."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from recall_check import read_probes

    rows = read_probes(model, val_text, probes=16, seed=7, **probes)
    memory = sum(r["memory_after_3"] for r in rows) / len(rows)
    window = sum(r["window_after_3"] for r in rows) / len(rows)
    return memory, window


@pytest.mark.parametrize("names", ["syllables", "english", "compound"])
def test_the_weights_recall_speakers_planted_beyond_the_window(model, val_text, monkeypatch, names):
    """The issue's check, on names, places and distances the training never saw
    (scripts/recall_check.py), of three kinds: a made-up speaker planted in validation text
    50-400 characters back. Its name after the cue costs at most 4 bits per character with
    memory 512 (the floor; the model card gives the figure), while the 64-character window,
    which cannot see it, pays 3.5 or more."""
    memory, window = bits_after_the_cue(model, val_text, monkeypatch, mem_len=512, names=names)
    assert memory <= 4.0 and window >= 3.5, (memory, window)


def test_the_weights_recall_a_name_that_opens_the_text(model, val_text, monkeypatch):
    """Issue 43's opening name: a made-up speaker's heading opens the text, 100 characters
    of validation text follow, then the name's first letters. With memory 512 the rest of
    the name costs at most 1.5 bits per character (the issue's floor), while the window,
    which cannot see the opening, pays 3.5 or more. These 16 probes read 1.16 (window 5.11)
    on phase 72's weights (phase 71's 1.36); the model card's 48 at k = 100 / 200 / 400
    are the figure."""
    memory, window = bits_after_the_cue(
        model, val_text, monkeypatch, mem_len=512, distances=(100,), opening=True
    )
    assert memory <= 1.5 and window >= 3.5, (memory, window)


def test_the_weights_recall_a_speaker_1000_characters_back_with_a_long_memory(
    model, val_text, monkeypatch
):
    """Far back (issue 43's far names): a made-up speaker planted in validation text 1,000
    characters back, read with a memory of 2,048: at most 2.5 bits per character after the
    cue (the issue's floor), the window 3.5 or more. These 16 probes read 1.73 (window 4.93)
    on phase 72's weights (phase 71's 1.77); the model card's 48 at 1,000 and 2,000, the
    figure, are harder (2.54 / 2.45). A name that opens its text is not held to the floor
    that far: the card's reading is 3.2-3.4."""
    memory, window = bits_after_the_cue(
        model, val_text, monkeypatch, mem_len=2048, distances=(1000,)
    )
    assert memory <= 2.5 and window >= 3.5, (memory, window)
