"""scripts/self_written.py, speeches the model wrote itself spliced into a training text:
the headings stay the text's own, a replaced speech is what the model wrote after that
heading, and a line that is copied elsewhere keeps its copy."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.test_app import tiny_model
from tests.test_generation_check import PLAY
from txl import TransformerXL

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import generation_check as check  # noqa: E402
import self_written as sw  # noqa: E402


def test_a_written_speech_ends_at_its_first_blank_line_or_its_last_whole_line():
    assert sw.speech_of("Ay, sir.\nGo.\n\nROMEO:\nHo") == "Ay, sir.\nGo.\n"
    assert sw.speech_of("Ay, sir.\nGo to, go t") == "Ay, sir.\n"
    assert sw.speech_of("\n\nROMEO:\n") is None and sw.speech_of("no line ends") is None
    assert sw.speech_of("\nAy.\n\n") is None  # the heading would stand alone


def test_writing_until_a_blank_line_stops_when_every_row_has_written_one(tmp_path):
    model = TransformerXL.from_pretrained(tiny_model(tmp_path / "m", seed=5)).eval()
    scenes = check.real_scenes(PLAY, 3, 300, seed=1)
    prompts, own = [p for p, _ in scenes], [t for _, t in scenes]
    texts, probs = check.write(model, prompts, 300, 1.0, 7, 40, forced=own, until="\n\n")
    ends = [t.find("\n\n") + 2 for t in own]  # each row's first blank line
    assert all(e > 1 for e in ends) and len(texts[0]) == max(ends) == probs.shape[1] < 300
    assert texts == [t[: max(ends)] for t in own]
    full, _ = check.write(model, prompts, 60, 1.0, 7, 40)
    cut, _ = check.write(model, prompts, 60, 1.0, 7, 40, until="\n\n")  # the same draws
    assert [t[: len(cut[0])] for t in full] == cut


def test_self_written_speeches_keep_the_texts_headings_and_drills(tmp_path):
    model = TransformerXL.from_pretrained(tiny_model(tmp_path / "m", seed=5)).eval()
    drill = "ZORBA:\nA line said twice.\n\n"
    a, b, c = (PLAY.index("\n\n", at) + 2 for at in (6000, 9000, 12000))  # speeches' ends
    text = PLAY[:a] + drill + PLAY[a:b] + drill + PLAY[b:c]
    out = sw.with_self_written(text, model, 0.5, 1.2, 40, 200, seed=3, batch=8)
    assert out != text and out == sw.with_self_written(text, model, 0.5, 1.2, 40, 200, 3, 8)
    assert [n for _, n in check.headings(out)] == [n for _, n in check.headings(text)]
    assert out.count(drill) == 2  # its line occurs twice: never replaced
    reach = 40 + model.config.tgt_len
    spans = sw.speeches_after_a_blank_line(text, reach)
    old, new = text.split("\n\n"), out.split("\n\n")
    assert len(old) == len(new)
    replaced = [(o, n) for o, n in zip(old, new) if o != n]
    assert 0 < len(replaced) < len(spans)
    for o, n in replaced:  # a speech of the model's own, after the same heading
        assert o.split("\n")[0] == n.split("\n")[0] and len(n) <= len(o.split("\n")[0]) + 201


def test_a_speech_said_again_nearby_is_a_drills_copy_and_stays():
    speech = "ZORBA:\nA line said twice.\n\n"
    filler = PLAY[: sw.COPY_REACH + 100]
    near = filler[:300] + speech + filler[300:600] + speech + filler
    far = filler + speech + filler + speech
    a = near.index(speech) + len("ZORBA:\n")
    assert not sw.alone(near, a, a + len("A line said twice.\n"))
    a = far.index(speech) + len("ZORBA:\n")  # the next pass of the plays says it again
    assert sw.alone(far, a, a + len("A line said twice.\n"))
