"""Ship a phase's model as the bundled weights: docs/weights.md's list, steps 0-4, in one run.

    .venv/bin/python scripts/ship_weights.py runs/recall/phase34-near-names-from-nine/model \\
        --phase phase34-near-names-from-nine --data ../shared/data/tinyshakespeare.txt
    .venv/bin/python scripts/ship_weights.py ... --dry-run         # the steps, nothing run
    .venv/bin/python scripts/ship_weights.py ... --only moments,pair-screenshot  # again

0. **The gate**: the Recall tab's own probe (ZANTHOR after the opening of Hamlet, memory
   512) must be recalled at every k up to 256, as the shipped model's is; a candidate that
   is not (phase 14 was not) stops here with nothing changed.
1. **The folder**: the model's files over ``weights/shakespeare-char/`` (its hand-written
   card, README.md, kept), config.json's ``mem_len`` set to 512 (a run writes the plan's
   128), and the recall plan's ``shipped`` set to the phase.
2-4. **The readings, the examples and the pictures**: every command the list names, two at
   a time by default (one torch thread each), each one's output in ``--out``/<step>.out
   (the figures the prose quotes), a step after the steps it needs.

Step 5, the prose (the card, README, docs/weights.md, docs/app.md, docs/figures.md,
docs/recall-training.md), is a person's: this prints where each figure is. Then
``pytest tests/test_weights.py tests/test_docs.py tests/test_memory_moments.py
tests/test_memory_pairs.py tests/test_browser_first_sight.py``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from txl.data import tiny_shakespeare_path  # noqa: E402

WEIGHTS = ROOT / "weights" / "shakespeare-char"
PLAN = ROOT / "configs" / "recall-plan.json"
OUT = ROOT / "runs" / "ship"
SHIPPED_MEM_LEN = 512  # the memory the page opens at: the one the model was trained for
GATE_REACH = 256  # the Recall tab's probe recalled at every k up to this
# What a model folder tells of how that model was made: replaced by the candidate's, and
# removed where the candidate has none (a soup has no training log of its own).
MODEL_RECORDS = ("log.jsonl", "loss_curve.png", "eval.json", "soup.json")


@dataclass(frozen=True)
class Step:
    name: str
    argv: list[str]  # after the interpreter
    after: tuple[str, ...] = ()  # steps whose files it reads


def steps(weights: Path, data: Path, out: Path) -> list[Step]:
    """docs/weights.md's steps 2-4 for the model in ``weights``: its readings, then the
    examples the page opens on, then the pictures; each writes what the prose quotes."""
    w, d = str(weights), str(data)

    def reading(name: str, *argv: str) -> Step:  # its figures as JSON in out/<name>.json
        return Step(name, [*argv, "--json", str(out / f"{name}.json")])

    gen = ("scripts/generation_check.py", w, "--data", d, "--threads", "1", "--scenes", "60",
           "--window-temperatures=")  # fmt: skip
    recall = ("scripts/recall_check.py", w, "--data", d, "--threads", "1")
    far = ("--mem-len", "2048", "--distances", "1000,2000")
    evaluate = ["-m", "txl.evaluate", "--model", w, "--data", d, "--positions", "2000:12000",
                "--sliding", "64,192", "--threads", "1", "--json",
                str(weights / "eval_three_ways.json")]  # fmt: skip
    uncut = ("--top-p", "1")  # the first reading, beside the page's sampler
    readings = [
        Step("eval-three-ways", evaluate),
        *(
            reading(f"generation-real{cut}-{s}", *gen, *extra, "--only", "real", "--seed", str(s))
            for cut, extra in (("", ()), ("-uncut", uncut))
            for s in (1, 2, 3)
        ),
        reading("generation-made-up", *gen, "--only", "made_up"),
        reading("generation-made-up-uncut", *gen, *uncut, "--only", "made_up"),
        reading("generation-probe", *gen, "--only", "probe"),
        *(
            reading(f"recall-{kind}", *recall, "--names", kind)
            for kind in ("syllables", "english", "compound")
        ),
        reading("recall-opening", *recall, "--opening", "--distances", "100,200,400"),
        reading("recall-far", *recall, *far),
        reading("recall-far-opening", *recall, *far, "--opening"),
    ]
    examples = [
        Step("moments", ["scripts/find_memory_moments.py", "--model", w, "--data", d]),
        Step("pairs", ["scripts/find_memory_pairs.py", "--model", w, "--data", d]),
    ]
    # The page the pictures show opens on the examples: after them.
    page = ("moments", "pairs")
    pictures = [
        Step("anatomy", ["scripts/anatomy_figures.py", "--model", w, "--data", d]),
        *(
            Step(f"{name}screenshot", [f"scripts/make_{script}screenshot.py", "--model", w], page)
            for name, script in (
                ("", ""),
                ("predictions-", "predictions_"),
                ("moments-", "moments_"),
                ("recall-", "recall_"),
                ("pair-", "memory_pair_"),
            )
        ),
    ]
    return readings + examples + pictures


def gate(candidate: Path) -> tuple[bool, str]:
    """(passes, what it read): the Recall tab's default probe on the candidate."""
    from txl import TransformerXL
    from txl.recall import reach, recall_probe
    from webapp.tabs.examples import DEFAULT_NAME, RECALL_BEFORE, RECALL_FILLER

    model = TransformerXL.from_pretrained(candidate).eval()
    probe = recall_probe(
        model, DEFAULT_NAME, RECALL_FILLER, mem_len=SHIPPED_MEM_LEN, before=RECALL_BEFORE
    )
    rows = list(probe)
    read = ", ".join(f"k {r.distance}: {r.bits_memory:.2f}" for r in rows)
    recalled = reach(rows, "bits_memory") or 0
    return recalled >= GATE_REACH, f"the Recall tab's probe, bits with memory 512: {read}"


def install(candidate: Path, phase: str, weights: Path, plan: Path) -> list[str]:
    """Step 1: the candidate's files over ``weights`` (its README.md, the card, kept),
    ``mem_len`` 512, and the plan's ``shipped`` phase. The plan file's own layout is kept
    (it is written by hand): only the shipped phase's name changes. Returns the files
    copied."""
    names = json.loads(plan.read_text())
    if phase not in [p["name"] for p in names["phases"]]:
        raise SystemExit(f"{phase!r} is not a phase of {plan} (its 'phases', not 'tried')")
    copied = []
    for name in MODEL_RECORDS:  # the last model's, where the candidate has none (a soup's log)
        if not (candidate / name).exists():
            (weights / name).unlink(missing_ok=True)
    for file in sorted(candidate.iterdir()):
        if file.is_file() and file.name != "README.md":
            shutil.copy(file, weights / file.name)
            copied.append(file.name)
    config = json.loads((weights / "config.json").read_text())
    config["mem_len"] = SHIPPED_MEM_LEN
    (weights / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    text, n = re.subn(
        r'("shipped": \{"phase": )"[^"]*"', lambda m: f'{m.group(1)}"{phase}"', plan.read_text()
    )
    if n != 1:
        raise SystemExit(f'{plan}: no single "shipped": {{"phase": ...}} to set')
    plan.write_text(text)
    return copied


def run(todo: list[Step], out: Path, jobs: int) -> dict[str, int]:
    """Run the steps ``jobs`` at a time, each after the steps it names (when they are run
    here); each one's stdout and stderr in ``out``/<name>.out. Returns each exit code."""
    out.mkdir(parents=True, exist_ok=True)
    pending, running, codes = list(todo), {}, {}
    names = {s.name for s in todo}
    while pending or running:
        for step in list(pending):
            waits = [a for a in step.after if a in names and codes.get(a) is None]
            if len(running) < jobs and not waits:
                pending.remove(step)
                log = (out / f"{step.name}.out").open("w")
                proc = subprocess.Popen(
                    [sys.executable, *step.argv], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
                )
                running[step.name] = (proc, log, time.perf_counter())
                print(f"started {step.name}", flush=True)
        for name, (proc, log, t0) in list(running.items()):
            if proc.poll() is not None:
                log.close()
                codes[name] = proc.returncode
                del running[name]
                said = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
                print(f"{said}: {name}, {time.perf_counter() - t0:.0f} s, {out / name}.out")
        failed = {name for name, code in codes.items() if code}
        for step in [s for s in pending if failed & set(s.after)]:  # it would read stale files
            pending.remove(step)
            codes[step.name] = -1
            print(f"not run: {step.name} (after {', '.join(failed & set(step.after))})")
        time.sleep(0.5)
    return codes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("candidate", type=Path, help="the model folder to ship (a run's model/)")
    p.add_argument("--phase", required=True, help="its phase in configs/recall-plan.json")
    p.add_argument("--data", type=Path, default=tiny_shakespeare_path(ROOT))
    p.add_argument("--weights", type=Path, default=WEIGHTS)
    p.add_argument("--plan", type=Path, default=PLAN)
    p.add_argument("--out", type=Path, default=OUT, help="each step's output (default runs/ship)")
    p.add_argument("--jobs", type=int, default=2, help="steps at once (default 2: one per core)")
    p.add_argument("--only", help="comma-separated steps to run again (no gate, no copy)")
    p.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    a = p.parse_args(argv)
    todo = steps(a.weights, a.data, a.out)
    if a.only:
        wanted = a.only.split(",")
        unknown = sorted(set(wanted) - {s.name for s in todo})
        if unknown:
            raise SystemExit(f"no such step: {', '.join(unknown)} (--dry-run lists them)")
        todo = [s for s in todo if s.name in wanted]
    if a.dry_run:
        for s in todo:
            after = f"   (after {', '.join(s.after)})" if s.after else ""
            print(f"{s.name}: python {' '.join(s.argv)}{after}")
        return 0
    if not a.only:
        passes, read = gate(a.candidate)
        print(read)
        if not passes:
            print(f"not recalled at every k up to {GATE_REACH}: not shipped, nothing changed")
            return 1
        copied = install(a.candidate, a.phase, a.weights, a.plan)
        print(f"copied {', '.join(copied)} into {a.weights}; mem_len {SHIPPED_MEM_LEN}; "
              f"{a.plan.name} ships {a.phase}")  # fmt: skip
    codes = run(todo, a.out, a.jobs)
    failed = [name for name, code in codes.items() if code]
    print(f"{len(codes) - len(failed)} of {len(codes)} steps done; outputs in {a.out}")
    if failed:
        print(f"failed or not run: {', '.join(failed)} (again: --only {','.join(failed)})")
    print("Step 5, the prose: docs/weights.md's list, then its tests.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
