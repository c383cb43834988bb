"""scripts/recall_check.py, the held-out recall check of docs/recall-training.md: the text
it plants a speaker in is the validation text's own, the name comes back where it says,
and the bits it prints are the model's direct reads of the name."""

from __future__ import annotations

import json
import math
import random
import re
import string
import subprocess
import sys
from pathlib import Path

import torch

from tests.test_app import tiny_model
from txl import TransformerXL
from txl.scoring import memory_nll, sliding_nll

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import recall_check  # noqa: E402

WORDS = ["east", "sun", "moon", "light", "night", "rose", "name", "word", "love", "hate"]
SPEECHES = "".join(  # no two alike: where a piece of text came from is one place
    f"ROMEO:\nIt is the {WORDS[i % 10]}, and {WORDS[i // 10 % 10]} is the sun.\n"
    f"Arise, fair {WORDS[i // 100]}.\n\nJULIET:\nAy me! {WORDS[i % 7]}, what breaks?\n\n"
    for i in range(1000)
)


def test_names_are_made_up_words_of_five_to_ten_letters():
    rng = random.Random(0)
    names = [recall_check.made_up_name(rng) for _ in range(500)]
    assert all(5 <= len(n) <= 10 and set(n) <= set(string.ascii_letters) for n in names)
    assert all(n.isupper() or n.istitle() for n in names)
    assert 0.1 < sum(n.istitle() for n in names) / len(names) < 0.4
    assert len(set(names)) > 450  # drawn afresh, not a list


def test_the_speaker_is_planted_between_whole_speeches_and_the_text_that_follows():
    starts, rng = recall_check.speech_starts(SPEECHES), random.Random(3)
    for k in (50, 173, 400):
        text, at = recall_check.planted(SPEECHES, starts, rng, "ZANTHOR", k)
        before, rest = text.split("ZANTHOR:\n", 1)
        assert before in SPEECHES and before.endswith("\n\n")  # whole speeches of the text
        assert SPEECHES[SPEECHES.index(before) - 2 : SPEECHES.index(before)] == "\n\n"
        assert len(before) >= 200
        line, after = rest.split("\n\n", 1)
        assert line in SPEECHES.splitlines()  # one line of a speech
        gap = SPEECHES[SPEECHES.index(before) + len(before) :][:k]  # what follows, k chars
        assert after == f"{gap}\n\nZANTHOR" and text[at:] == "ZANTHOR"


def test_the_script_prints_the_direct_reads_of_the_name(tmp_path):
    folder = tiny_model(tmp_path / "model", seed=4)
    data = tmp_path / "plays.txt"
    data.write_text(SPEECHES)  # its last 10 % is the validation text
    out = tmp_path / "rows.json"
    script = [sys.executable, str(ROOT / "scripts" / "recall_check.py"), folder]
    args = ["--data", str(data), "--probes", "3", "--mem-len", "64", "--json", str(out)]
    printed = subprocess.run(script + args, capture_output=True, text=True, check=True).stdout
    assert "| 50-400 | 3 |" in printed

    model = TransformerXL.from_pretrained(folder).eval()
    val = SPEECHES[int(0.9 * len(SPEECHES)) :]
    rows = json.loads(out.read_text())
    assert rows == recall_check.read_probes(model, val, 3, seed=1, mem_len=64)  # the default seed
    starts, rng = recall_check.speech_starts(val), random.Random(1)
    for row in rows:  # ... and each reading is the direct read of its name
        name, k = recall_check.made_up_name(rng), rng.randint(50, 400)
        assert (name, k) == (row["name"], row["k"])
        text, at = recall_check.planted(val, starts, rng, name, k)
        assert text[at:] == name
        ids = torch.tensor(model.tokenizer.encode(text))
        memory = memory_nll(model, ids, 16, 64, start=at + 1).double() / math.log(2)
        window = sliding_nll(model, ids, 16, start=at + 1).double() / math.log(2)
        assert row["memory_after_1"] == memory.mean().item()
        assert row["window_after_3"] == window[2:].mean().item()


def test_english_names_are_new_words_in_the_texts_letters():
    """--names english: 5-10 letters, a quarter in title case, none a word of the text."""
    namer, rng = recall_check.english_namer(SPEECHES), random.Random(0)
    names = [namer(rng) for _ in range(400)]
    words = {w.lower() for w in re.findall(r"[A-Za-z]+", SPEECHES)}
    assert all(5 <= len(n) <= 10 and n.lower() not in words for n in names)
    assert all(n.isupper() or n.istitle() for n in names)
    assert 0.1 < sum(n.istitle() for n in names) / len(names) < 0.4
    assert set("".join(names).lower()) <= set("".join(words))


def test_the_kind_of_names_is_chosen_and_read_the_same_way(tmp_path):
    model = TransformerXL.from_pretrained(tiny_model(tmp_path / "model", seed=4)).eval()
    val = SPEECHES[int(0.9 * len(SPEECHES)) :]
    rows = recall_check.read_probes(model, val, 2, seed=1, mem_len=64, names="english")
    namer, rng = recall_check.english_namer(val), random.Random(1)
    first = namer(rng)
    assert rows[0]["name"] == first and first.lower() not in val.lower().split()
    assert rows != recall_check.read_probes(model, val, 2, seed=1, mem_len=64)  # syllables


def test_compound_names_join_two_short_words_of_the_text_into_a_new_one():
    """--names compound: two words of 3-5 letters of the text, joined; not itself a word."""
    namer, rng = recall_check.compound_namer(SPEECHES), random.Random(0)
    words = {w.lower() for w in re.findall(r"[A-Za-z]+", SPEECHES)}
    short = sorted(w for w in words if 3 <= len(w) <= 5)
    names = [namer(rng) for _ in range(400)]
    assert all(n.lower() not in words and (n.isupper() or n.istitle()) for n in names)
    for n in names:
        assert any(n.lower() == a + b for a in short for b in short if n.lower().startswith(a))
    assert 0.1 < sum(n.istitle() for n in names) / len(names) < 0.4
