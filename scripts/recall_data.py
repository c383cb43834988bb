"""Training text that rewards recall: Tiny Shakespeare's speakers renamed, plus copy drills.

    python scripts/recall_data.py --data tinyshakespeare.txt --out runs/data/phase1.txt \
        --max-lines 1 --copy-every 2 --seed 1

Reads the *training* part of Tiny Shakespeare only (the first 90 %, nanoGPT's split): the
validation text is never altered or seen. The text is cut into speeches ("NAME:\\n" and the
lines after it). In each chunk of ``--chunk`` speeches, every speaker is renamed, with
probability ``--rename``, to a made-up name of random capital letters: a returning speaker
can then only be predicted by recalling the name from earlier in the chunk, so the loss on
names is a recall signal (8.5 % of the characters are speaker names). ``--max-lines`` cuts
speeches short (names return sooner: within the 64-character window at first, then farther,
where only memory reaches). ``--copy-every`` inserts, after every n-th speech, a copy drill:
a line of made-up words written twice, the purest copying signal there is.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import string
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from txl.data import load_text, train_val_split  # noqa: E402
from txl.recall import copy_drill  # noqa: E402

SPEECH = re.compile(r"(?m)^([A-Za-z][A-Za-z ']*):\n((?:.+\n?)+)")


def made_up_name(rng: random.Random) -> str:
    """A name no play uses: 4-9 random capital letters, sometimes two words."""
    word = "".join(rng.choice(string.ascii_uppercase) for _ in range(rng.randint(4, 9)))
    if rng.random() < 0.15:
        word += " " + "".join(rng.choice(string.ascii_uppercase) for _ in range(rng.randint(3, 7)))
    return word


SYLLABLE_ONSETS = ("B", "D", "G", "H", "K", "L", "M", "N", "P", "R", "S", "T", "V", "W", "Z",
                   "BR", "TR", "GL", "SH", "KR", "FL", "SK")  # fmt: skip
SYLLABLE_VOWELS = ("A", "E", "I", "O", "U", "OU", "EA", "AI")
SYLLABLE_CODAS = ("", "", "", "N", "R", "L", "S", "ND", "ST", "TH", "RN")


def syllable_name(rng: random.Random, onsets, vowels, codas, shortest: int, longest: int) -> str:
    """2-3 syllables (onset, vowel, coda: one of each list), drawn again until the name has
    ``shortest``..``longest`` letters."""
    while True:
        syllables = rng.randint(2, 3)
        name = "".join(
            rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(syllables)
        )
        if shortest <= len(name) <= longest:
            return name


def spoken_name(rng: random.Random) -> str:
    """A made-up name one can say (ZANTHOR, MORVATH), 4-10 letters of 2-3 syllables: its
    letters and letter pairs repeat as real names' do (THANETH, LOULAN), where random
    capitals rarely repeat. A copy that finds its place by one previous letter breaks on
    such repeats (docs/recall-training.md, r1's phase 4)."""
    return syllable_name(rng, SYLLABLE_ONSETS, SYLLABLE_VOWELS, SYLLABLE_CODAS, 4, 10)


def word_namer(text: str):
    """A maker of names that sound like ``text``'s English but are none of its words
    (COREWEL, FRINGIVE), in capitals: each letter drawn after the two before it as often as
    in the words of 3+ letters of ``text``, 5-10 letters. Real names are made of a
    language's letter habits, which neither random capitals nor syllables are."""
    words = {w.lower() for w in re.findall(r"[A-Za-z]{3,}", text)}
    follows: dict[str, Counter] = defaultdict(Counter)
    for word in sorted(words):  # sorted: the same chain, so the same names, every run
        padded = f"^^{word}$"
        for i in range(2, len(padded)):
            follows[padded[i - 2 : i]][padded[i]] += 1
    chains = {pair: (list(c), list(c.values())) for pair, c in follows.items()}

    def name(rng: random.Random) -> str:
        while True:
            word = "^^"
            while word[-1] != "$" and len(word) < 14:
                letters, weights = chains[word[-2:]]
                word += rng.choices(letters, weights)[0]
            ended, word = word[-1] == "$", word[2:-1]
            if ended and 5 <= len(word) <= 10 and word not in words:
                return word.upper()

    return name


def name_maker(text: str, title_share: float, spoken_names: float, word_names: float):
    """A maker of made-up names of the kinds asked for: ``spoken_names`` of them
    ``spoken_name``'s, ``word_names`` of them ``word_namer(text)``'s, the rest random
    capitals; ``title_share`` of them in title case. Call it with a random.Random."""
    word_name = word_namer(text) if word_names else None

    def made_up(rng: random.Random) -> str:
        kind = rng.random() if spoken_names or word_names else 1.0
        if kind < spoken_names:
            name = spoken_name(rng)
        elif kind < spoken_names + word_names:
            name = word_name(rng)
        else:
            name = made_up_name(rng)
        return name.title() if rng.random() < title_share else name

    return made_up


VOWELS = set("AEIOUY")


def near_name(rng: random.Random, name: str) -> str:
    """``name`` with one or two of its letters changed, a vowel for another vowel and a
    consonant for another consonant, the case kept (PETRUCHIO -> PETRACHIO, BAPTISTA ->
    BAPTISKA): a name the model's prior almost knows. Writing from a scene, the model
    begins a cast member's name and then finishes it as its prior would (PAULINA for
    PROSPERO, "BETRUCHIO"); a near name is predictable only from the scene's own headings,
    letter by letter, where the prior's completion is wrong (issue 43)."""
    letters = [i for i, c in enumerate(name) if c.isalpha()]
    out = list(name)
    for i in rng.sample(letters, min(len(letters), rng.randint(1, 2))):
        upper = out[i].upper()
        pool = sorted(VOWELS if upper in VOWELS else set(string.ascii_uppercase) - VOWELS)
        new = rng.choice([c for c in pool if c != upper])
        out[i] = new if out[i].isupper() else new.lower()
    return "".join(out)


def speeches_of(text: str) -> list[tuple[str, list[str]]]:
    """(speaker, lines) of every speech of ``text``."""
    return [(m.group(1), m.group(2).rstrip("\n").split("\n")) for m in SPEECH.finditer(text)]


def span(lo_hi: str) -> tuple[int, int]:
    """A recipe's "LO,HI" (characters): (lo, hi)."""
    lo, hi = (int(x) for x in lo_hi.split(","))
    return lo, hi


def log_uniform(rng: random.Random, lo_hi: tuple[int, int]) -> float:
    """A length drawn log-uniform in lo..hi: as many of 8-16 as of 250-500."""
    lo, hi = lo_hi
    return math.exp(rng.uniform(math.log(max(lo, 1)), math.log(hi)))


def text_slice(rng: random.Random, text: str, gap: tuple[int, int]) -> str:
    """A slice of ``text`` from anywhere, lo..hi characters long (``log_uniform``)."""
    length = round(log_uniform(rng, gap))
    at = rng.randrange(len(text) - length)
    return text[at : at + length]


def said_twice(rng: random.Random, speeches) -> list[str]:
    """Two lines drawn from ``speeches``' lines, for a made-up speaker to say."""
    return [rng.choice(rng.choice(speeches)[1]) for _ in range(2)]


def speaker_returns(name: str, said: list[str], between: str) -> str:
    """A name drill: a made-up speaker says a line, and again after ``between``."""
    return f"{name}:\n{said[0]}\n\n{between}\n\n{name}:\n{said[1]}\n\n"


def scene_under_way(rng: random.Random, speeches, size: tuple[int, int]) -> str:
    """Whole speeches of ``speeches`` in a row, from a random one, until lo..hi characters
    (log-uniform) are reached: a scene under way, opened by its own speaker's heading, as
    the Recall tab's text before the speaker (the opening of *Hamlet*)."""
    target = log_uniform(rng, size)
    i, out = rng.randrange(len(speeches)), ""
    while len(out) < target:
        speaker, lines = speeches[i % len(speeches)]
        out += f"{speaker}:\n" + "\n".join(lines) + "\n\n"
        i += 1
    return out


def with_openings(
    text: str,
    places: list[tuple[int, int]],
    source: str,
    seed: int,
    gap: tuple[int, int] = (100, 2000),
    title_share: float = 0.3,
    spoken_names: float = 0.35,
    word_names: float = 0.35,
    entrant: float = 0.0,
    before: tuple[int, int] = (50, 600),
) -> str:
    """``text`` with a name drill (``speaker_returns``: a made-up speaker, a slice of
    ``source`` of ``gap`` characters between) written over it at each (start, end) of
    ``places``, the same length: the drill starts at ``start`` and ends before ``end``; one
    that would not fit, or would run into the previous drill, is left out.

    scripts/train_recall.py puts the starts where txl.train starts a stream's segment from
    an empty memory (its ``mem_reset`` steps, and the first): the made-up name then opens
    the text the model reads, as in the recall check's opening probe, which carried memory
    and drills at random places almost never showed the model (docs/recall-training.md,
    r2's phase 9: the opening name at 3.2-4.0 bits/char).

    With ``entrant``, that share of the drills starts with a scene under way instead
    (``scene_under_way``: ``before`` characters of whole speeches of ``source``), and the
    made-up speaker enters after it: the name that returns is then not the one that opened
    the text. Drills that always bring the opener back taught phases 12-14 to expect it
    while the text's start is in memory, and a newcomer after the opening of *Hamlet* (the
    Recall tab's probe) was recalled worse (docs/recall-training.md, phase 14). Without
    ``entrant`` the random draws, and so the text, are those of the recipes before it."""
    rng = random.Random(seed)
    speeches = speeches_of(source)
    made_up = name_maker(source, title_share, spoken_names, word_names)
    out, written = [], 0  # the pieces of the new text; characters of ``text`` used so far
    for start, end in sorted(places):
        between = text_slice(rng, source, gap)
        drill = speaker_returns(made_up(rng), said_twice(rng, speeches), between)
        if entrant and rng.random() < entrant:
            drill = scene_under_way(rng, speeches, before) + drill
        if start < written or start + len(drill) > end:
            continue
        out += [text[written:start], drill]
        written = start + len(drill)
    out.append(text[written:])
    new = "".join(out)
    assert len(new) == len(text)  # the starts stay where the segments start
    return new


def recall_text(
    text: str,
    chunk: int,
    rename: float,
    max_lines: int,
    copy_every: int,
    seed: int,
    copy_gap: tuple[int, int] = (0, 0),
    near_share: float = 0.0,
    inline_gap: bool = False,
    name_share: float = 0.0,
    title_share: float = 0.25,
    spoken_names: float = 0.0,
    word_names: float = 0.0,
    cast_names: bool = False,
    near_names: float = 0.0,
    other_speakers: float = 0.0,
) -> str:
    """The speeches of ``text`` renamed per cast, cut to ``max_lines``, with a copy drill
    after every ``copy_every``-th. With ``copy_gap`` (lo, hi), hi > 0, a drill's second line
    comes only after lo..hi characters of the following speeches (drawn per drill), so
    that past a segment only memory holds it, as the recall probe's name is held; then
    ``near_share`` of the drills still repeat at once (a copy skill that has just formed
    is lost without them: docs/recall-training.md, r1's phase 2a).

    With ``inline_gap`` the copy comes inside the drill instead, after a slice of ``text``
    (from anywhere) whose length is drawn log-uniformly in lo..hi: as many gaps of 8-16
    characters as of 250-500, so copies inside the segment, where no memory is needed,
    teach copying by what the line says before memory must carry it. (Copies that always
    follow at once teach a copy of the line just above and no farther: 16 characters of
    filler already undo most of it; docs/recall-training.md, r1's phase 2.)

    ``name_share`` of those inline drills are a made-up speaker instead, who speaks a line
    of the text and speaks again after the slice: "NAME:\\n<line>\\n\\n<slice>\\n\\nNAME:\\n
    <line>". A copy learned on drill lines alone did not carry over to speakers' names,
    which is what the recall probe asks (r1's phase 2b). ``spoken_names`` of those names
    are ``spoken_name``'s, ``word_names`` of them ``word_namer(text)``'s, the rest random
    capitals; ``title_share`` of them are written in title case ("Belisande"). The defaults
    draw the same random numbers as before these options existed, so earlier phases' texts
    regenerate byte for byte.

    With ``cast_names`` a renamed speaker of the text itself gets a name of the drills'
    kinds (spoken, word-like or random capitals, ``title_share`` in title case) instead of
    random capitals alone: in natural scenes a returning speaker's heading is then
    predictable only from the scene's earlier headings, whatever its name looks like, which
    is what a visitor's prompt asks of the model when it writes (issue 43). ``near_names``
    of the renamed speakers get their own name with a letter or two changed instead
    (``near_name``): the prior's completion of the name is then wrong, the scene's right.
    ``other_speakers`` of the rest get the name of another of the text's speakers, one not
    in the cast (PAULINA for PROSPERO): a name the prior knows but does not expect in this
    scene, where writing from a scene slips to the prior's names (issue 43)."""
    rng = random.Random(seed)
    speeches = speeches_of(text)
    speakers = sorted({speaker for speaker, _ in speeches})
    made_up = name_maker(text, title_share, spoken_names, word_names)
    out, names = [], {}

    written = 0  # characters so far
    pending: list[tuple[int, str]] = []  # (write after this many characters, the line again)
    for i, (speaker, lines) in enumerate(speeches):
        if i % chunk == 0:
            names = {}  # a new chunk: a new cast
        if speaker not in names:
            if rng.random() >= rename:
                names[speaker] = speaker
            elif near_names and rng.random() < near_names:  # no draw when off: texts as before
                names[speaker] = near_name(rng, speaker)
            elif other_speakers and rng.random() < other_speakers:  # no draw when off
                in_cast = {speaker, *names, *names.values()}
                names[speaker] = rng.choice([s for s in speakers if s not in in_cast])
            else:
                names[speaker] = made_up(rng) if cast_names else made_up_name(rng)
        if max_lines:
            lines = lines[:max_lines]
        parts = [f"{names[speaker]}:\n" + "\n".join(lines) + "\n\n"]
        due = [line for at, line in pending if at <= written]
        pending = [(at, line) for at, line in pending if at > written]
        parts += [line + "\n\n" for line in due]
        if copy_every and i % copy_every == copy_every - 1:
            drill = copy_drill(rng)
            if copy_gap[1] > 0 and rng.random() >= near_share:  # the line now, its copy later
                line = drill.split("\n")[0]
                if inline_gap:  # after a slice of text, inside the drill
                    between = text_slice(rng, text, copy_gap)
                    if rng.random() < name_share:  # a made-up speaker returns
                        name = made_up(rng)
                        parts.append(speaker_returns(name, said_twice(rng, speeches), between))
                    else:
                        parts.append(f"{line}\n{between}\n{line}\n\n")
                else:  # after the speeches that follow
                    parts.append(line + "\n\n")
                    gap = rng.randint(*copy_gap)
                    pending.append((written + sum(map(len, parts)) + gap, line))
            else:
                parts.append(drill)
        out += parts
        written += sum(map(len, parts))
    out += [line + "\n\n" for _, line in pending]  # the text ends: every copy is written
    return "".join(out)


def recall_passes(
    train: str,
    chunk: int,
    rename: float,
    max_lines: int,
    copy_every: int,
    seed: int,
    copy_gap: str = "0,0",
    near_share: float = 0.0,
    repeat: int = 1,
    inline_gap: bool = False,
    name_share: float = 0.0,
    title_share: float = 0.25,
    spoken_names: float = 0.0,
    word_names: float = 0.0,
    cast_names: bool = False,
    near_names: float = 0.0,
    other_speakers: float = 0.0,
) -> str:
    """``repeat`` passes of ``recall_text`` over the training text, each with its own seed
    (new names, new drills); ``copy_gap`` as written on the command line: "LO,HI". The
    keywords are a recipe's: scripts/train_recall.py passes a phase's ``data`` as they are."""
    drills = dict(
        copy_gap=span(copy_gap),
        near_share=near_share,
        inline_gap=inline_gap,
        name_share=name_share,
        title_share=title_share,
        spoken_names=spoken_names,
        word_names=word_names,
        cast_names=cast_names,
        near_names=near_names,
        other_speakers=other_speakers,
    )
    return "".join(
        recall_text(train, chunk, rename, max_lines, copy_every, seed + r, **drills)
        for r in range(repeat)
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="Tiny Shakespeare (the training 90 % is used)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--chunk", type=int, default=30, help="speeches per cast")
    p.add_argument("--rename", type=float, default=0.7, help="chance a speaker is renamed")
    p.add_argument("--max-lines", type=int, default=0, help="cut speeches to n lines (0: no)")
    p.add_argument("--copy-every", type=int, default=0, help="a copy drill every n speeches")
    p.add_argument(
        "--copy-gap",
        default="0,0",
        help="LO,HI: a drill's copy comes LO..HI characters after its line (0,0: at once)",
    )
    p.add_argument(
        "--near-share", type=float, default=0.0, help="with --copy-gap: drills copied at once"
    )
    p.add_argument(
        "--inline-gap",
        action="store_true",
        help="with --copy-gap: the copy follows inside the drill, after LO..HI characters "
        "of training text (log-uniform), not after the next speeches",
    )
    p.add_argument(
        "--name-share",
        type=float,
        default=0.0,
        help="with --inline-gap: drills that are a made-up speaker who speaks again",
    )
    p.add_argument(
        "--title-share", type=float, default=0.25, help="name drills' names in title case"
    )
    p.add_argument(
        "--spoken-names",
        type=float,
        default=0.0,
        help="name drills' names one can say (spoken_name), not random capitals",
    )
    p.add_argument(
        "--word-names",
        type=float,
        default=0.0,
        help="name drills' names that sound like the text's words (word_namer)",
    )
    p.add_argument(
        "--cast-names",
        action="store_true",
        help="renamed speakers get the drills' kinds of names and case, not random capitals",
    )
    p.add_argument(
        "--near-names",
        type=float,
        default=0.0,
        help="the share of renamed speakers who get their own name with a letter or two changed",
    )
    p.add_argument(
        "--other-speakers",
        type=float,
        default=0.0,
        help="of the other renamed speakers, the share named as another speaker of the text",
    )
    p.add_argument("--drills", type=int, default=0, help="only this many copy drills")
    p.add_argument("--repeat", type=int, default=1, help="passes, each with new names")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    train, _ = train_val_split(load_text(a.data))
    if a.drills:  # a text of copy drills alone: the densest copying signal
        rng = random.Random(a.seed)
        text = "".join(copy_drill(rng) for _ in range(a.drills))
    else:
        text = recall_passes(
            train, a.chunk, a.rename, a.max_lines, a.copy_every, a.seed, a.copy_gap,
            a.near_share, a.repeat, a.inline_gap, a.name_share, a.title_share, a.spoken_names,
            a.word_names, a.cast_names, a.near_names, a.other_speakers,
        )  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    print(f"{a.out}: {len(text):,} characters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
