"""The copy drill of docs/recall-training.md (txl/recall.py's drill_bits, printed by
scripts/copy_drill.py): it scores the characters it says it scores, and the script reads a
model folder and a txl.train run folder alike."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_model

from tests.test_app import tiny_model
from txl import TransformerXL, recall

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("gap", [0, 100])
def test_the_drill_scores_each_line_after_its_first_character(monkeypatch, tmp_path, gap):
    # A stand-in for the model's costs: token t costs t bits. The mean the drill prints
    # then says which tokens it summed: those of positions start .. start + n - 1 average to
    # start + (n - 1) / 2.
    streams = []

    def position_bits(model, ids, seg_len, mem_len):
        streams.append(ids)
        return torch.arange(1, ids.numel(), dtype=torch.float64) * math.log(2)

    monkeypatch.setattr(recall, "memory_nll", position_bits)
    model = TransformerXL.from_pretrained(tiny_model(tmp_path / "m"))
    once, again = recall.drill_bits(model, gap=gap, drills=1, seed=3, mem_len=8)

    line = recall.copy_drill(random.Random(3)).split("\n")[0]
    text = model.tokenizer.decode(streams[0].tolist())
    n = len(line)
    first, second = (round(bits - (n - 1) / 2) for bits in (once, again))
    assert text[first : first + n] == line[1:] + "\n"  # the line once, after its first letter
    assert text[second : second + n] == line[1:] + "\n"  # and again, `gap` characters on
    assert second - first == n + 1 + (gap + 1 if gap else 0)


def test_the_script_reads_a_model_folder_and_a_run_folder_alike(tmp_path):
    folder = tiny_model(tmp_path / "model", seed=4)
    model = TransformerXL.from_pretrained(folder)
    run = tmp_path / "run"  # what txl.train writes: run.json and checkpoint/model.safetensors
    (run / "checkpoint").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"config": model.config.to_dict()}))
    save_model(model, str(run / "checkpoint" / "model.safetensors"))

    printed = []
    for source in (folder, run):
        args = [str(source), "--gaps", "0,20", "--drills", "3", "--mem-len", "16"]
        script = [sys.executable, str(ROOT / "scripts" / "copy_drill.py")]
        out = subprocess.run(script + args, capture_output=True, text=True, check=True).stdout
        lines = out.strip().splitlines()
        assert [line.split(": ")[0] for line in lines] == [f"{source} gap 0", f"{source} gap 20"]
        printed.append([line.split(": ")[1] for line in lines])
    assert printed[0] == printed[1]  # the same weights, read from either folder


def test_far_copies_come_later_and_near_ones_at_once(monkeypatch):
    """recall_data.recall_text(copy_gap=(lo, hi), near_share): every drill line is written
    twice; a far one's copy comes lo or more characters after it, a near one's at once."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from recall_data import recall_text

    speeches = "".join(f"ROMEO:\n{i} {i + 1}.\n\nJULIET:\n{i * 7}, {i}!\n\n" for i in range(200))

    def copies(text: str) -> list[int]:
        """Characters between the two writings of each drill line (letters and spaces)."""
        lines = text.split("\n")
        starts, gaps = {}, []
        at = 0
        for line in lines:
            if line and all(c.isalpha() or c == " " for c in line):
                if line in starts:
                    gaps.append(at - starts.pop(line))
                else:
                    starts[line] = at
            at += len(line) + 1
        assert not starts  # every line was written twice
        return gaps

    far = copies(recall_text(speeches, 30, 0.0, 0, 1, 3, copy_gap=(64, 100)))
    assert len(far) == 400 and min(far) >= 64
    near = copies(recall_text(speeches, 30, 0.0, 0, 1, 3, copy_gap=(64, 100), near_share=1.0))
    assert len(near) == 400 and all(gap <= 40 for gap in near)  # the line, then its copy
    mixed = copies(recall_text(speeches, 30, 0.0, 0, 1, 3, copy_gap=(64, 100), near_share=0.5))
    assert 100 < sum(gap >= 64 for gap in mixed) < 300


def test_inline_copies_follow_a_slice_of_text_of_log_uniform_length(monkeypatch):
    """recall_data.recall_text(inline_gap=True): each far drill is its line, a slice of the
    text lo..hi characters long, the line again; the lengths are spread evenly in log, so
    short gaps (in the segment) are as common as long ones (only memory reaches those)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from recall_data import recall_text

    speeches = "".join(f"ROMEO:\n{i} {i + 1}.\n\nJULIET:\n{i * 7}, {i}!\n\n" for i in range(400))
    text = recall_text(speeches, 30, 0.0, 0, 1, 3, copy_gap=(8, 512), inline_gap=True)
    drills = re.findall(r"\n\n([a-zA-Z ]+)\n(.*?)\n\1\n\n", "\n\n" + text, flags=re.S)
    assert len(drills) == 800  # a drill after every speech
    gaps = sorted(len(between) for _, between in drills)
    assert gaps[0] >= 8 and gaps[-1] <= 512
    assert 0.35 < sum(g < 64 for g in gaps) / len(gaps) < 0.65  # 64 = sqrt(8 * 512)
    assert all(between in speeches for _, between in drills)  # a slice of the text itself
    assert text == recall_text(speeches, 30, 0.0, 0, 1, 3, copy_gap=(8, 512), inline_gap=True)


def test_name_drills_are_a_made_up_speaker_who_speaks_again(monkeypatch):
    """recall_data.recall_text(name_share=1.0): every drill is a made-up speaker with a line
    of the text, a slice of the text, the same speaker again with another line."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from recall_data import recall_text

    speeches = "".join(f"ROMEO:\n{i} {i + 1}.\n\nJULIET:\n{i * 7}, {i}!\n\n" for i in range(100))
    text = recall_text(speeches, 30, 0.0, 0, 1, 3, (8, 512), inline_gap=True, name_share=1.0)
    speakers = re.finditer(r"(?m)^([A-Za-z ]+):\n", text)
    made_up = [m for m in speakers if m[1] not in "ROMEO JULIET"]  # nor a slice's "IET:"
    assert len(made_up) == 2 * 200  # a drill after every speech, its speaker there twice
    for first, again in zip(made_up[::2], made_up[1::2]):
        assert first[1] == again[1] and (first[1].isupper() or first[1].istitle())
        said = text[first.end() :].split("\n")[0]
        assert f"\n{said}\n" in speeches  # a line of the text
        between = text[first.end() + len(said) + 2 : again.start() - 2]
        assert 8 <= len(between) <= 512 and between in speeches


def test_spoken_names_repeat_letters_and_title_share_sets_the_case(monkeypatch):
    """recall_text(spoken_names=1, title_share=1): every name drill's speaker is a
    spoken_name (syllables of the inventory, 4-10 letters) in title case."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from recall_data import (
        SYLLABLE_CODAS,
        SYLLABLE_ONSETS,
        SYLLABLE_VOWELS,
        recall_text,
        spoken_name,
    )

    def alternatives(parts):
        return "|".join(sorted((p for p in parts if p), key=len, reverse=True))

    onset, vowel, coda = (
        alternatives(p) for p in (SYLLABLE_ONSETS, SYLLABLE_VOWELS, SYLLABLE_CODAS)
    )
    syllables = re.compile(rf"(?:(?:{onset})(?:{vowel})(?:{coda})?){{2,3}}")
    rng = random.Random(0)
    names = [spoken_name(rng) for _ in range(2000)]
    assert all(4 <= len(n) <= 10 and syllables.fullmatch(n) for n in names)
    assert sum(len(set(n)) < len(n) for n in names) / len(names) > 0.3  # letters repeat

    speeches = "".join(f"ROMEO:\n{i} {i + 1}.\n\nJULIET:\n{i * 7}, {i}!\n\n" for i in range(100))
    drills = dict(copy_gap=(8, 512), inline_gap=True, name_share=1.0)
    text = recall_text(speeches, 30, 0.0, 0, 1, 3, **drills, title_share=1.0, spoken_names=1.0)
    made_up = [m[1] for m in re.finditer(r"(?m)^([A-Za-z ]+):\n", text)]
    made_up = [n for n in made_up if n not in "ROMEO JULIET"]
    assert len(made_up) == 400 and all(
        n.istitle() and syllables.fullmatch(n.upper()) for n in made_up
    )


def test_word_names_sound_like_the_text_and_are_none_of_its_words(monkeypatch):
    """word_namer(text): 5-10 capitals, none a word of the text, every letter triple one of
    its words has (the chain draws only what follows); recall_text(word_names=1) gives every
    name drill such a name, the same from the same seed."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from recall_data import recall_text, word_namer

    words = "tempest thunder lightning gentle tender master mistress sister brother"
    text = " ".join(f"{w} {w.title()}, {w}!" for w in words.split() * 3)
    known = set(words.split())
    triples = {f"^^{w}$"[i : i + 3] for w in known for i in range(len(w) + 1)}
    name, rng = word_namer(text), random.Random(0)
    names = [name(rng) for _ in range(300)]
    assert all(5 <= len(n) <= 10 and n.isupper() and n.lower() not in known for n in names)
    for n in names:
        padded = f"^^{n.lower()}$"
        assert all(padded[i : i + 3] in triples for i in range(len(padded) - 2)), n
    assert len(set(names)) > 15  # drawn: as many as nine words allow (BROTHUNDER, MASTEMPEST)
    again, rng = word_namer(text), random.Random(0)
    assert names == [again(rng) for _ in range(300)]  # the same chain: the same names

    speeches = "".join(f"ROMEO:\n{words} {i}.\n\nJULIET:\n{i * 7}, {i}!\n\n" for i in range(100))
    drills = dict(copy_gap=(8, 512), inline_gap=True, name_share=1.0, title_share=0.0)
    text = recall_text(speeches, 30, 0.0, 0, 1, 3, **drills, word_names=1.0)
    assert text == recall_text(speeches, 30, 0.0, 0, 1, 3, **drills, word_names=1.0)
    made_up = [m[1] for m in re.finditer(r"(?m)^([A-Za-z ]+):\n", text)]
    made_up = [n for n in made_up if n not in "ROMEO JULIET"]
    assert len(made_up) == 400
    known |= {"romeo", "juliet"}  # words of this text too
    triples |= {f"^^{w}$"[i : i + 3] for w in ("romeo", "juliet") for i in range(7)}
    for n in made_up:
        padded = f"^^{n.lower()}$"
        assert n.isupper() and n.lower() not in known
        assert all(padded[i : i + 3] in triples for i in range(len(padded) - 2)), n


def test_cast_names_rename_the_texts_own_speakers_with_the_drills_kinds_one_way_per_cast(
    monkeypatch,
):
    """recall_text(cast_names=True): a renamed speaker of the text gets a name of the drills'
    kinds and case (here all spoken names in title case), the same name for the whole cast
    of ``chunk`` speeches; off, the text is what it was before the option existed."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from recall_data import SPEECH, recall_text

    speeches = "".join(f"ROMEO:\n{i} {i + 1}.\n\nJULIET:\n{i * 7}, {i}!\n\n" for i in range(90))
    kinds = dict(spoken_names=1.0, title_share=1.0)
    text = recall_text(speeches, 30, 1.0, 0, 0, 3, **kinds, cast_names=True)
    heads = [m.group(1) for m in SPEECH.finditer(text)]
    assert len(heads) == 180 and all(h.istitle() and h not in ("Romeo", "Juliet") for h in heads)
    for cast in range(0, 180, 30):  # two speakers, one name each, per 30 speeches
        assert len(set(heads[cast : cast + 30])) == 2 and heads[cast] == heads[cast + 2]
    assert len(set(heads)) > 6  # a new cast, new names
    plain = recall_text(speeches, 30, 1.0, 0, 0, 3, **kinds)
    assert all(h.isupper() for h in (m.group(1) for m in SPEECH.finditer(plain)))
    body = [s.split("\n", 1)[1] for s in text.split("\n\n") if s]
    assert body == [s.split("\n", 1)[1] for s in plain.split("\n\n") if s]  # lines kept


def test_near_names_change_a_letter_or_two_of_the_speakers_own_name_one_way_per_cast(
    monkeypatch,
):
    """recall_text(near_names=1.0): every renamed speaker is their own name with one or two
    letters changed (a vowel for a vowel, a consonant for a consonant, the case kept), the
    same for the whole cast; at 0 the text is what it was before the option existed."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from recall_data import SPEECH, VOWELS, recall_text

    speeches = "".join(
        f"PETRUCHIO:\n{i} {i + 1}.\n\nFirst Citizen:\n{i * 7}, {i}!\n\n" for i in range(90)
    )
    text = recall_text(speeches, 30, 1.0, 0, 0, 3, cast_names=True, near_names=1.0)
    heads = [m.group(1) for m in SPEECH.finditer(text)]
    assert len(heads) == 180
    for head, own in zip(heads, ["PETRUCHIO", "First Citizen"] * 90):
        changed = [(a, b) for a, b in zip(head, own) if a != b]
        assert len(head) == len(own) and 1 <= len(changed) <= 2, (head, own)
        for new, old in changed:
            assert new.isupper() == old.isupper() and (new.upper() in VOWELS) == (
                old.upper() in VOWELS
            )
    for cast in range(0, 180, 30):
        assert len(set(heads[cast : cast + 30])) == 2 and heads[cast] == heads[cast + 2]
    assert len(set(heads)) > 6  # a new cast, new near names
    kinds = dict(spoken_names=0.5, title_share=0.3, cast_names=True)
    assert recall_text(speeches, 30, 0.6, 0, 0, 3, **kinds, near_names=0.0) == recall_text(
        speeches, 30, 0.6, 0, 0, 3, **kinds
    )


def test_other_speakers_rename_a_cast_to_speakers_of_other_scenes_one_way_per_cast(
    monkeypatch,
):
    """recall_text(other_speakers=1.0): every renamed speaker is another speaker of the
    text, never one of the cast (their own name or a cast member's), the same for the whole
    cast; at 0 the text is what it was before the option existed."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from recall_data import SPEECH, recall_text

    casts = [("PROSPERO", "MIRANDA"), ("PAULINA", "LEONTES"), ("CURTIS", "GRUMIO")]
    speeches = "".join(
        f"{a}:\n{i} {i + 1}.\n\n{b}:\n{i * 7}, {i}!\n\n"
        for a, b in casts
        for i in range(15)  # each pair speaks 30 speeches: one cast
    )
    text = recall_text(speeches, 30, 1.0, 0, 0, 3, cast_names=True, other_speakers=1.0)
    heads = [m.group(1) for m in SPEECH.finditer(text)]
    everyone = {name for cast in casts for name in cast}
    assert len(heads) == 90 and set(heads) <= everyone
    for n, cast in enumerate(casts):
        written = heads[30 * n : 30 * n + 30]
        assert len(set(written)) == 2 and written[0] == written[2]  # one name each
        assert not set(written) & set(cast)  # never their own, never a cast member's
    kinds = dict(spoken_names=0.5, title_share=0.3, cast_names=True, near_names=0.3)
    assert recall_text(speeches, 30, 0.6, 0, 0, 3, **kinds, other_speakers=0.0) == recall_text(
        speeches, 30, 0.6, 0, 0, 3, **kinds
    )
