"""Does memory show in what the model *writes*? Speaker headings in generated scenes.

    .venv/bin/python scripts/generation_check.py weights/shakespeare-char
    .venv/bin/python scripts/generation_check.py runs/recall/phase7-scenes --only probe
    .venv/bin/python scripts/generation_check.py weights/shakespeare-char --only real --top-p 1

The recall probes (scripts/recall_check.py) hand the model a name's first letters; when it
writes a scene itself it has to *choose* the speaker. Three readings, seeded, with memory
``--mem-len`` (M) and through the window of tgt_len (W, no memory, recomputed):

- **real scenes**: prompts of 1,500 characters of the validation text (Tiny Shakespeare's
  last 10 %) that end at a speech boundary, so that the next thing written is a heading;
  ``--chars`` characters generated at each ``--temperatures``. Read: the share of written
  headings that name a speaker of the prompt's last M + W characters (the *cast*, which a
  memory of M reaches from the newest segment's end), beside the share in the text's own
  continuation of the same prompts (the reference line: what a writer who remembers the
  scene does). And at each heading written, the probability the model gave the cast's
  first letters: at the first heading (straight after the prompt, where the text itself
  has the same context) and at the later ones (after speeches the model wrote itself),
  beside the same read of the text's own headings (teacher-forced, the same steps).
- **made-up scenes**: three made-up speakers (held out from training: the kinds of
  recall_check.py) who each speak twice, real validation speeches as their lines, at the
  end of a 1,500-character prompt. Read: the share of written headings that are the
  scene's speakers, exactly, and those that only begin with a speaker's first two letters.
- **the heading probe** (teacher-forced, cheap enough for every checkpoint): on the first
  ``--probe-chars`` characters of validation, as it is and with every speaker renamed per
  30-speech scene (consistently, held-out names), the bits of a *returning* speaker's
  heading (one who spoke in the previous M + W characters): its first letter, which only
  the scene's cast predicts, and the rest of the name, which is a copy.

Sampling is the page's: softmax of the logits / temperature, cut to the ``--top-p``
nucleus (txl.sampling.filter_logits; the default 0.9 is the page's, webapp/tabs/examples.py's
TOP_P; 1: no cut, the issue's first reading); the readings are named for the sampler
("memory T=0.8 top-p=0.9", "memory T=0.8" uncut).

Generation is batched (every prompt has the same length): the memory side reads the
prompt in segments of W as the page does and then steps one character at a time over
its KV memory (txl.cached); the window side recomputes the last W characters each step.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from copy_drill import load  # noqa: E402  (scripts/, beside this file)
from recall_check import NAMERS, speech_starts  # noqa: E402
from recall_data import SPEECH  # noqa: E402

from txl.cached import cached_forward  # noqa: E402
from txl.data import load_text, tiny_shakespeare_path, train_val_split  # noqa: E402
from txl.recall import LN2  # noqa: E402
from txl.sampling import filter_logits  # noqa: E402
from txl.scoring import memory_nll, window_batches  # noqa: E402
from webapp.tabs.examples import TEMPERATURE, TOP_P  # noqa: E402  (the page's sampler)

PROMPT_CHARS = 1500
# A heading: a speaker's name alone on its line, after a blank line (or at the start).
HEADING = re.compile(r"(?:^|\n\n)([A-Za-z][A-Za-z ']*):\n")


def headings(text: str) -> list[tuple[int, str]]:
    """(where the name starts, the name) of each speaker heading of ``text``."""
    return [(m.start(1), m.group(1)) for m in HEADING.finditer(text)]


def cast(prompt: str, reach: int) -> set[str]:
    """The speakers whose heading lies in the last ``reach`` characters of ``prompt``."""
    return {name for at, name in headings(prompt) if at >= len(prompt) - reach}


# ---- generation, a batch of prompts at once --------------------------------------------


@torch.no_grad()
def generate(model, prompts: list[str], n: int, temperature: float, seed: int,
             mem_len: int | None, top_p: float = 1.0) -> list[str]:  # fmt: skip
    """``n`` characters after each prompt (all of one length), sampled at ``temperature``
    (and ``top_p``: the page's nucleus) from one seeded generator. ``mem_len`` None:
    through the window of tgt_len, recomputed every step; else with a memory of ``mem_len``
    (the prompt read in segments of tgt_len)."""
    return write(model, prompts, n, temperature, seed, mem_len, top_p=top_p)[0]


@torch.no_grad()
def write(model, prompts: list[str], n: int, temperature: float, seed: int,
          mem_len: int | None, forced: list[str] | None = None,
          until: str | None = None, top_p: float = 1.0):  # fmt: skip
    """``generate``, and the distribution each character was drawn from, [B, n, vocab]
    (softmax of the logits / ``temperature``, outside the ``top_p`` nucleus none: the
    page's sampler, txl.sampling.filter_logits). ``forced``: the characters are these texts'
    (teacher forcing, the same steps), not sampled: what the model expected of them.
    ``until`` (two characters): stop once every row has written it (rows then differ in
    what they wrote after it)."""
    tok, W = model.tokenizer, model.config.tgt_len
    ids = torch.tensor([tok.encode(p) for p in prompts], dtype=torch.long)  # [B, T]
    given = torch.tensor([tok.encode(t[:n]) for t in forced]) if forced else None  # [B, n]
    generator = torch.Generator().manual_seed(seed)
    memory = None
    if mem_len is not None:
        for a in range(0, ids.size(1), W):
            out = cached_forward(model, ids[:, a : a + W], memory, mem_len=mem_len, last_only=True)
            memory = out.memory
    written, drawn_from = [], []
    stop = torch.tensor(tok.encode(until)) if until else None
    ended = torch.zeros(len(prompts), dtype=torch.bool)
    for step in range(n):
        if mem_len is None:
            out = cached_forward(model, ids[:, -W:], None, mem_len=W, last_only=True)
        probs = filter_logits(out.logits[:, -1], temperature, top_p=top_p).softmax(-1)  # [B, V]
        if given is None:
            nxt = torch.multinomial(probs, 1, generator=generator)  # [B, 1]
        else:
            nxt = given[:, step : step + 1]
        written.append(nxt)
        drawn_from.append(probs)
        if stop is not None and step > 0:
            ended |= (written[-2][:, 0] == stop[0]) & (nxt[:, 0] == stop[1])
            if ended.all():
                break
        ids = torch.cat([ids, nxt], 1) if mem_len is None else nxt
        if mem_len is not None:
            out = cached_forward(model, nxt, memory, mem_len=mem_len)
    texts = [tok.decode(row) for row in torch.cat(written, 1).tolist()]
    return texts, torch.stack(drawn_from, 1)


def cast_probability(texts: list[str], probs: torch.Tensor, casts: list[set[str]],
                     tokenizer) -> dict:  # fmt: skip
    """At each heading written in ``texts``: the probability the model gave the first
    letters of the prompt's cast (``probs[b, j]``: what character j of text b was drawn
    from). Split at the first heading, written straight after the prompt (the context the
    text itself has there), and the later ones, written after the model's own speeches."""
    first, later = [], []
    for b, (text, names) in enumerate(zip(texts, casts)):
        letters = sorted({tokenizer.encode(name[0])[0] for name in names})
        for at, _ in headings("\n\n" + text):
            mass = probs[b, at - 2, letters].sum().item()  # "\n\n" moved it 2 along
            (first if at == 2 else later).append(mass)
    return {"first": mean(first), "first_n": len(first), "later": mean(later),
            "later_n": len(later)}  # fmt: skip


# ---- the prompts ------------------------------------------------------------------------


def real_scenes(val: str, count: int, after: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, the text's own next ``after`` characters): ``count`` prompts of
    PROMPT_CHARS characters that end where a speech starts, spread over the text."""
    rng = random.Random(seed)
    starts = [s for s in speech_starts(val) if PROMPT_CHARS <= s <= len(val) - after]
    picked = sorted(rng.sample(starts, count))
    return [(val[s - PROMPT_CHARS : s], val[s : s + after]) for s in picked]


def made_up_scenes(val: str, count: int, seed: int) -> list[tuple[str, list[str]]]:
    """(prompt, the scene's three speakers): validation text, then a scene in which three
    made-up speakers (names of recall_check's kinds, in turn) each speak twice (A B C A B
    C), real speeches of up to four lines as their lines; PROMPT_CHARS in all."""
    rng = random.Random(seed)
    kinds = [NAMERS[k](val) for k in sorted(NAMERS)]
    speeches = [m.group(2).rstrip("\n").split("\n")[:4] for m in SPEECH.finditer(val)]
    speeches = [s for s in speeches if sum(map(len, s)) < 160]
    starts = [s for s in speech_starts(val) if s >= PROMPT_CHARS]
    scenes = []
    for i in range(count):
        names: list[str] = []
        while len(names) < 3:
            name = kinds[(i + len(names)) % len(kinds)](rng)
            if name[:2].upper() not in {n[:2].upper() for n in names}:  # tell apart by 2
                names.append(name)
        scene = "".join(
            f"{names[j % 3]}:\n" + "\n".join(rng.choice(speeches)) + "\n\n" for j in range(6)
        )
        at = rng.choice(starts)
        scenes.append((val[at - (PROMPT_CHARS - len(scene)) : at] + scene, names))
    return scenes


def renamed(val: str, seed: int, chunk: int = 30) -> str:
    """``val`` with every speaker renamed per ``chunk`` speeches, consistently inside a
    chunk (held-out names of recall_check's kinds): a returning heading is then predictable
    only from the scene's own earlier headings."""
    rng = random.Random(seed)
    kinds = [NAMERS[k](val) for k in sorted(NAMERS)]
    out, names = [], {}
    for i, m in enumerate(SPEECH.finditer(val)):
        if i % chunk == 0:
            names = {}
        while m.group(1) not in names:  # a name no other speaker of the scene has
            name = kinds[len(names) % len(kinds)](rng)
            if name not in names.values():
                names[m.group(1)] = name
        out.append(f"{names[m.group(1)]}:\n{m.group(2).rstrip(chr(10))}\n\n")
    return "".join(out)


# ---- the readings -----------------------------------------------------------------------


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def share(hits: int, total: int) -> float:
    return hits / total if total else float("nan")


def sides(args) -> list[tuple[str, float, int | None]]:
    """(side, temperature, memory) of each generation: with memory at every temperature,
    through the window at ``--window-temperatures`` (it recomputes tgt_len characters for
    every character written, ~100x the memory side's work here)."""
    return [("memory", t, args.mem_len) for t in args.temperatures] + [
        ("window", t, None) for t in args.window_temperatures
    ]


def sampler(temperature: float, args) -> str:
    """How a generation was sampled, as its readings are named: "T=0.8", "T=0.8 top-p=0.9"."""
    return f"T={temperature}" + (f" top-p={args.top_p}" if args.top_p < 1 else "")


def label(side: str, temperature: float, args) -> str:
    """A generation's key in the readings: "memory T=0.8", and " top-p=0.9" when cut."""
    return f"{side} {sampler(temperature, args)}"


def read_real(model, val, args, known: set[str] = frozenset()) -> dict:
    """``known``: the training text's speakers (what a miss that is the prior's name is)."""
    reach = args.mem_len + model.config.tgt_len
    scenes = real_scenes(val, args.scenes, args.chars, args.seed)
    prompts, own = [p for p, _ in scenes], [t for _, t in scenes]
    casts = [cast(p, reach) for p in prompts]
    result = {"reference": _heading_share(own, casts, known)}
    for side, temperature, mem in sides(args):
        texts, probs = write(model, prompts, args.chars, temperature, args.seed, mem,
                             top_p=args.top_p)  # fmt: skip
        result[label(side, temperature, args)] = {
            **_heading_share(texts, casts, known),
            "cast_probability": cast_probability(texts, probs, casts, model.tokenizer),
            "samples": texts[: args.samples],
        }
        if side == "memory":  # the text's own headings, read the same way
            _, probs = write(model, prompts, args.chars, temperature, args.seed, mem, own,
                             top_p=args.top_p)  # fmt: skip
            result["reference"][f"cast_probability {sampler(temperature, args)}"] = (
                cast_probability(own, probs, casts, model.tokenizer)
            )
    return result


def letters_apart(a: str, b: str) -> int:
    """The edit distance of ``a`` and ``b``: letters put in, left out or changed."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        row, before = [i], row
        for j, y in enumerate(b, 1):
            row.append(min(before[j] + 1, row[j - 1] + 1, before[j - 1] + (x != y)))
    return row[-1]


def _heading_share(texts: list[str], casts: list[set[str]], known: set[str] = frozenset()) -> dict:
    """The share of written headings that name the cast; and, to tell the choice of the
    speaker from the copy of the name, the share that begin with a cast member's first
    letter, and of those the share that are then a cast member exactly.

    The misses (begun with a cast letter, not a cast member) read apart: ``blend``, within
    two letters of a cast member of that letter ("BETRUCHIO" for PETRUCHIO: the copy slipped),
    and ``prior``, a speaker of ``known`` (the training text's) outside the cast (PAULINA for
    PROSPERO: the model's prior won)."""
    written = [[name for _, name in headings("\n\n" + t)] for t in texts]
    pairs = [(name, c) for names, c in zip(written, casts) for name in names]
    hits = sum(name in c for name, c in pairs)
    begun = [(name, c) for name, c in pairs if name[0] in {n[0] for n in c}]
    missed = [(name, c) for name, c in begun if name not in c]
    blends = sum(
        any(n[0] == name[0] and letters_apart(name.upper(), n.upper()) <= 2 for n in c)
        for name, c in missed
    )
    prior = sum(name in known for name, _ in missed)
    return {
        "headings": len(pairs), "from_cast": hits, "share": share(hits, len(pairs)),
        "cast_letter": share(len(begun), len(pairs)), "exact_of_begun": share(hits, len(begun)),
        "missed": len(missed), "blend_of_missed": share(blends, len(missed)),
        "prior_of_missed": share(prior, len(missed)),
    }  # fmt: skip


def read_made_up(model, val, args) -> dict:
    scenes = made_up_scenes(val, args.scenes, args.seed)
    prompts = [p for p, _ in scenes]
    result = {}
    for side, temperature, mem in sides(args):
        texts = generate(model, prompts, args.chars, temperature, args.seed, mem, args.top_p)
        exact = begun = total = 0
        for text, (_, names) in zip(texts, scenes):
            for _, written in headings("\n\n" + text):
                total += 1
                exact += written in names
                begun += any(written[:2].upper() == n[:2].upper() for n in names)
        result[label(side, temperature, args)] = {
            "headings": total, "exact": exact, "share": share(exact, total),
            "first_two_letters": share(begun, total),
            "samples": [f"[{', '.join(n)}] {t}" for t, (_, n) in zip(texts, scenes)][
                : args.samples
            ],
        }  # fmt: skip
    return result


@torch.no_grad()
def heading_bits(model, text: str, mem_len: int) -> dict:
    """Bits of each returning speaker's heading in ``text``: its first letter, and the rest
    of the name per character, with memory ``mem_len`` and through the window."""
    W = model.config.tgt_len
    ids = torch.tensor(model.tokenizer.encode(text), dtype=torch.long)
    returning, last_spoke = [], {}  # (where the name starts, its length)
    for at, name in headings(text):
        before, last_spoke[name] = last_spoke.get(name), at
        if at >= W and before is not None and at - before <= mem_len + W:
            returning.append((at, len(name)))
    # the names' characters only: the window is recomputed for each
    scored = sorted({t for at, n in returning for t in range(at, at + n)})
    with_memory = memory_nll(model, ids, W, mem_len).double() / LN2  # column j: token j + 1
    window = {}  # position -> bits through the window, recomputed
    for at, scores in window_batches(model, ids, scored, W):
        logp = torch.log_softmax(scores.float(), -1)  # [n, vocab]
        bits = -logp.gather(1, ids[at][:, None])[:, 0].double() / LN2
        window.update(zip(at.tolist(), bits.tolist()))
    first = {"memory": [], "window": []}
    rest = {"memory": [], "window": []}
    for at, n in returning:
        first["memory"].append(with_memory[at - 1].item())
        rest["memory"].append(with_memory[at : at + n - 1].mean().item())
        first["window"].append(window[at])
        rest["window"].append(statistics.fmean(window[t] for t in range(at + 1, at + n)))
    return {
        "returning": len(first["memory"]),
        **{f"first_letter_{s}": mean(first[s]) for s in first},
        **{f"rest_{s}": mean(rest[s]) for s in rest},
    }


def read_probe(model, val, args) -> dict:
    text = val[: args.probe_chars]
    return {
        "as_it_is": heading_bits(model, text, args.mem_len),
        "renamed": heading_bits(model, renamed(val, args.seed)[: args.probe_chars], args.mem_len),
    }


def report(source, result: dict, args, window: int) -> str:
    lines = [f"{source}: memory {args.mem_len}, window {window}, seed {args.seed}"]
    if "probe" in result:
        lines += [
            "",
            "a returning speaker's heading: bits of its first letter, and per character after",
            "| text | returning | first letter, memory | window | rest, memory | window |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for kind, r in result["probe"].items():
            cells = ("first_letter_memory", "first_letter_window", "rest_memory", "rest_window")
            numbers = " | ".join(f"{r[c]:.2f}" for c in cells)
            lines.append(f"| {kind} | {r['returning']} | {numbers} |")
    if "real" in result:
        reach = args.mem_len + window
        lines += [
            "",
            f"real scenes: headings from the prompt's last {reach} characters; those that "
            "begin with a cast member's first letter, and of those the share that are one",
        ]
        for key, r in result["real"].items():
            who = "the text itself" if key == "reference" else key
            lines.append(
                f"  {who}: {r['share']:.0%} of {r['headings']}; {r['cast_letter']:.0%}, "
                f"of those {r['exact_of_begun']:.0%}; of the {r['missed']} missed, "
                f"{r['blend_of_missed']:.0%} a blend (within two letters of the cast member), "
                f"{r['prior_of_missed']:.0%} another speaker of the training text"
            )
        lines += [
            "the probability of the cast's first letters at each heading: the first one "
            "(straight after the prompt) / the later ones (after the speeches before them)",
        ]
        for key, r in result["real"].items():
            for name, c in r.items():
                if name.startswith("cast_probability"):
                    who = name.replace("cast_probability", "the text itself,")
                    who = who if key == "reference" else key
                    lines.append(
                        f"  {who}: {c['first']:.0%} of {c['first_n']} / "
                        f"{c['later']:.0%} of {c['later_n']}"
                    )
    if "made_up" in result:
        lines += ["", "made-up scenes: headings that are the scene's speakers (first 2 letters)"]
        for key, r in result["made_up"].items():
            lines.append(
                f"  {key}: {r['share']:.0%} of {r['headings']} ({r['first_two_letters']:.0%})"
            )
    for part in ("real", "made_up"):
        for key, r in result.get(part, {}).items():
            for text in r.get("samples", []):
                lines += ["", f"--- {part}, {key} ---", text[:300]]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("source", type=Path, help="a model folder or a txl.train run folder")
    p.add_argument("--data", type=Path, default=tiny_shakespeare_path(ROOT))
    p.add_argument("--mem-len", type=int, default=512)
    p.add_argument("--scenes", type=int, default=20, help="prompts of each kind")
    p.add_argument("--chars", type=int, default=600, help="characters generated per prompt")
    p.add_argument("--temperatures", default=str(TEMPERATURE), help="comma-separated")
    p.add_argument("--window-temperatures", default=str(TEMPERATURE), help="comma-separated")
    p.add_argument(
        "--top-p",
        type=float,
        default=TOP_P,
        help="the nucleus sampled from (the page's 0.9 by default; 1: all, uncut)",
    )
    p.add_argument("--probe-chars", type=int, default=12000)
    p.add_argument("--only", choices=("probe", "real", "made_up"), action="append")
    p.add_argument("--samples", type=int, default=2, help="generations printed of each")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, help="write the readings here")
    args = p.parse_args(argv)
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    args.window_temperatures = [float(t) for t in args.window_temperatures.split(",") if t]
    torch.set_num_threads(args.threads)
    model = load(args.source).eval()
    train, val = train_val_split(load_text(args.data, download=True))
    known = {name for _, name in headings(train)}
    parts = args.only or ["probe", "real", "made_up"]
    readers = {
        "probe": read_probe,
        "real": lambda model, val, args: read_real(model, val, args, known),
        "made_up": read_made_up,
    }
    result = {}
    for part in parts:  # each printed when it is read: the window's generations are slow
        result[part] = readers[part](model, val, args)
        print(report(args.source, {part: result[part]}, args, model.config.tgt_len), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
