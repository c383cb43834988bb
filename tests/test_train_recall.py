"""scripts/train_recall.py: the recall plan's phases in tokens, and a run that outlives a
session (saved into the checkout, restored on a new one, resumed exactly)."""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(d_model=32, n_layer=1, n_head=2, d_head=16, d_inner=32, dropout=0.1, dropatt=0.0,
            tgt_len=16, mem_len=16)  # fmt: skip


@pytest.fixture
def driver(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # it imports recall_data beside it
    import train_recall

    return train_recall


def plays(path: Path) -> Path:
    """A made-up play: speeches Tiny Shakespeare's way, every letter the probes write."""
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    speeches = [
        f"{rng.choice(['ROMEO', 'JULIET', 'NURSE'])}:\n"
        + " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 6))) for _ in range(5))
        + ".\n\n"
        for _ in range(400)
    ]
    path.write_text("ROMEO:\nI will go.\n\n" + "".join(speeches) + ",;\n")
    return path


def plan_file(path: Path, **second) -> Path:
    phase = {"copy_every": 1, "rename": 0.7, "chunk": 5, "max_lines": 0, "copy_gap": "0,0",
             "repeat": 1, "seed": 1}  # fmt: skip
    plan = {
        "law_log10": 1.5,  # 10^1.5 * sqrt(2 * 16) = 179 tokens: 6 steps of 2 x 16
        "init_from": None,
        "model": TINY,
        "train": {"warmup": 2, "eval_every": 1000, "sample_every": 1000, "ckpt_every": 2,
                  "log_every": 1, "probe_every": 1000, "batch": 2, "lr": 0.003, "seed": 5},
        "phases": [
            {"name": "a", "data": phase, "tokens": "law", "train": {}},
            {"name": "b", "data": dict(phase, copy_gap="20,40", seed=2), "tokens": "a",
             "train": {"probe_every": 3, **second}},
        ],
    }  # fmt: skip
    path.write_text(json.dumps(plan))
    return path


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_the_plan_counts_tokens_by_the_law(driver, tmp_path):
    assert driver.law_tokens(8, 64, 5.7) == 11_340_573  # 10^5.7 * sqrt(512)
    plan = driver.Plan(ROOT / "configs" / "recall-plan.json", tmp_path)
    first, second, content, names, fresh, text, more_names, spoken, words, *r2 = plan.phases
    scenes, casts, natural, *_ = r2
    assert plan.tokens(first) == driver.law_tokens(8, 64, 5.7)
    assert plan.steps(first) == 22_150  # ceil(11,340,573 / (8 x 64))
    assert plan.tokens(second) == plan.tokens(first)  # as many as phase 1, until it has run
    assert plan.tokens(content) == 7_000_000
    assert plan.tokens(names) == plan.tokens(fresh) == 5_000_000
    assert plan.tokens(text) == 4_000_000
    assert plan.tokens(more_names) == 6_000_000
    assert plan.steps(more_names) == 5_860  # ceil(6,000,000 / (16 x 64))
    assert plan.tokens(spoken) == 6_000_000
    assert plan.tokens(words) == 5_000_000
    assert plan.tokens(scenes) == 4_500_000
    assert plan.tokens(casts) == 2_000_000 and plan.steps(casts) == 3_907  # B 8
    assert plan.tokens(natural) == 4_500_000


def plan_with_next_phase(tmp_path: Path) -> Path:
    """The project's plan with one more phase after the shipped ones: phase-next, a copy
    of the last (the next session's case)."""
    extended = json.loads((ROOT / "configs" / "recall-plan.json").read_text())
    trained = [p for p in extended["phases"] if "soup_of" not in p]
    last = {k: v for k, v in trained[-1].items() if k != "from"}
    extended["phases"].append({**last, "name": "phase-next"})
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(extended))
    return path


def test_phases_in_the_shipped_weights_are_not_run_again_and_the_next_starts_from_them(
    driver, tmp_path
):
    plan = driver.Plan(ROOT / "configs" / "recall-plan.json", tmp_path)
    # the shipped phases come first; the first after them (when the plan has one: run,
    # not shipped) starts from the shipped weights
    shipped = [plan.shipped(p) for p in plan.phases]
    assert shipped[0] and shipped == sorted(shipped, reverse=True)
    assert "| phase9-natural | 8 x 64 | 4,500,000 (4500000) | 0 | — | shipped |" in (
        driver.table(plan)
    )
    first_after = plan.phases[shipped.index(False)] if not all(shipped) else {}
    if first_after and "from" not in first_after:  # a branch starts where "from" says
        assert plan.start_from(first_after) == ROOT / "weights" / "shakespeare-char"
    # the tries that were not kept stay out of the path
    kept = {p["name"] for p in plan.phases}
    assert not kept & {p["name"] for p in plan.plan["tried"]}
    # a phase added after the last one starts from the one before it
    plan = driver.Plan(plan_with_next_phase(tmp_path), tmp_path)
    *earlier, before, following = plan.phases
    assert not plan.shipped(following)
    if plan.shipped(before):
        assert plan.start_from(following) == ROOT / "weights" / "shakespeare-char"
    else:
        assert plan.start_from(following) == tmp_path / before["name"] / "model"
    # a phase may branch from an earlier one ("from"): its model; one before the shipped
    # phase is in the shipped weights only as a step, so its own model must be at hand
    names = [p["name"] for p in plan.phases]
    inside = names[names.index(plan.plan["shipped"]["phase"]) - 1]  # shipped, as a step
    following["from"] = inside
    with pytest.raises(ValueError, match="whose model is not at hand"):
        plan.start_from(following)
    (tmp_path / inside / "model").mkdir(parents=True)
    assert plan.start_from(following) == tmp_path / inside / "model"
    if not plan.shipped(before):  # a phase after the shipped one: its run's model
        following["from"] = before["name"]
        assert plan.start_from(following) == tmp_path / before["name"] / "model"
    following["from"] = plan.plan["shipped"]["phase"]
    assert plan.start_from(following) == ROOT / "weights" / "shakespeare-char"
    following["from"] = "phase-next"  # itself, or a phase after it: said, not guessed
    with pytest.raises(ValueError, match="'phase-next' is not an earlier phase"):
        plan.start_from(following)


def test_a_run_saved_in_one_checkout_goes_on_in_another(driver, tmp_path, capfd):
    data = plays(tmp_path / "plays.txt")
    straight = tmp_path / "straight"
    args = ["--data", str(data), "--threads", "1", "--runs"]  # one thread: tests run beside others
    driver.main([*args, str(straight), "--plan", str(plan_file(tmp_path / "p1.json"))])
    a, b = straight / "a", straight / "b"
    assert (a / "model" / "config.json").exists() and (b / "model" / "config.json").exists()
    assert max(losses(a)) == max(losses(b)) == 6  # b: as many tokens as a spent
    rows = [json.loads(x) for x in (b / "log.jsonl").read_text().splitlines()]
    probes = [row for row in rows if "copy_drill" in row]
    assert [p["step"] for p in probes] == [3, 6]

    # The same plan, cut off in phase b after step 2 (as a session ends), saved ...
    cut, saved = tmp_path / "cut", tmp_path / "saved"
    interrupted = plan_file(tmp_path / "p2.json", stop_after=2)
    driver.main([*args, str(cut), "--plan", str(interrupted)])
    assert driver.status(cut / "b") == "started"
    driver.main([*args, str(cut), "--plan", str(interrupted), "--saved", str(saved), "--save"])
    kept = saved / "b" / "checkpoint"
    assert sorted(p.name for p in kept.iterdir()) == sorted(driver.KEPT_CHECKPOINT)
    assert not (saved / "a" / "model").exists()  # b has started: a's model is not needed
    assert (saved / "a" / "eval.json").exists()  # but a is known to be done
    shutil.copytree(cut, tmp_path / "ended")  # b's goal met at step 2: it ends there
    driver.main([*args, str(tmp_path / "ended"), "--plan", str(interrupted), "--phases", "1",
                 "--end-phase", "b"])  # fmt: skip
    assert driver.status(tmp_path / "ended" / "b") == "done"
    assert max(losses(tmp_path / "ended" / "b")) == 2

    # ... and a new checkout (nothing in its runs) restores it and goes on from step 2,
    # though the old checkout, and a's model that b started from with it, are gone.
    shutil.rmtree(cut)
    new = tmp_path / "new"
    capfd.readouterr()
    driver.main([*args, str(new), "--plan", str(interrupted), "--saved", str(saved)])
    printed = capfd.readouterr().out
    assert "a: 6 steps" not in printed  # phase a is not run again
    assert "AdamW's moments start afresh at step 2" in printed
    assert driver.status(new / "b") == "done"
    resumed = losses(new / "b")
    assert sorted(resumed) == list(range(1, 7))
    assert {s: resumed[s] for s in (1, 2)} == {s: losses(b)[s] for s in (1, 2)}


def test_a_branch_not_yet_started_finds_its_model_in_a_new_checkout(driver, tmp_path):
    # a, b done; c, not started, branches from a ("from"): --save keeps a's model, which a
    # new checkout needs to start c, and not b's, which nothing starts from
    data = plays(tmp_path / "plays.txt")
    plan = json.loads(plan_file(tmp_path / "p.json").read_text())
    plan["phases"].append(dict(plan["phases"][1], name="c", tokens=2**5, **{"from": "a"}))
    (tmp_path / "p.json").write_text(json.dumps(plan))
    args = ["--data", str(data), "--threads", "1", "--plan", str(tmp_path / "p.json")]
    old, saved = tmp_path / "old", tmp_path / "saved"
    driver.main([*args, "--runs", str(old), "--phases", "2"])
    assert [driver.status(old / n) for n in "abc"] == ["done", "done", "new"]
    driver.main([*args, "--runs", str(old), "--saved", str(saved), "--save"])
    assert (saved / "a" / "model").exists() and not (saved / "b" / "model").exists()

    new = tmp_path / "new"
    driver.main([*args, "--runs", str(new), "--saved", str(saved)])
    assert driver.status(new / "c") == "done"
    ran = json.loads((new / "c" / "run.json").read_text())["train"]
    assert ran["init_from"] == str(new / "a" / "model")


def test_a_soup_phase_is_the_mean_of_its_phases_models_read_on_validation(driver, tmp_path):
    # a and b trained; s, their uniform soup ("soup_of"), trains nothing: its model is the
    # mean of theirs, read as a run's is (eval.json), and a new checkout finds its
    # ingredients' models when --save kept them before s was made
    from safetensors.torch import load_file

    data = plays(tmp_path / "plays.txt")
    plan = json.loads(plan_file(tmp_path / "p.json").read_text())
    plan["phases"].append({"name": "s", "soup_of": ["a", "b"]})
    (tmp_path / "p.json").write_text(json.dumps(plan))
    args = ["--data", str(data), "--threads", "1", "--plan", str(tmp_path / "p.json")]
    old, saved = tmp_path / "old", tmp_path / "saved"
    driver.main([*args, "--runs", str(old), "--phases", "2"])
    driver.main([*args, "--runs", str(old), "--saved", str(saved), "--save"])
    assert (saved / "a" / "model").exists() and (saved / "b" / "model").exists()
    new = tmp_path / "new"
    driver.main([*args, "--runs", str(new), "--saved", str(saved)])
    assert driver.status(new / "s") == "done"
    a, b, soup = (load_file(new / n / "model" / "model.safetensors") for n in "abs")
    for name, value in soup.items():
        assert torch.allclose(value, (a[name] + b[name]) / 2, rtol=0, atol=1e-7), name
    read = json.loads((new / "s" / "eval.json").read_text())
    assert read["sweep"] and (new / "s" / "model" / "eval.json").exists()
    plan = driver.Plan(tmp_path / "p.json", new)
    assert "| s | 2 x 16 | 0 (a soup) | 0 | — | done |" in driver.table(plan)

    plan.plan["phases"][-1]["soup_of"] = ["a", "s"]  # itself: said, not guessed
    with pytest.raises(ValueError, match="not earlier phases: s"):
        plan.ingredients(plan.phases[-1])
    plan.plan["phases"][-1]["soup_of"] = ["a", "b"]  # a shipped: its model is the weights'
    plan.plan["shipped"] = {"phase": "a", "weights": "weights/shakespeare-char"}
    assert plan.ingredients(plan.phases[-1]) == [ROOT / "weights" / "shakespeare-char",
                                                new / "b" / "model"]  # fmt: skip
    plan.plan["tried"] = [plan.plan["phases"].pop(1)]  # b tried: its run's model still counts
    assert plan.ingredients(plan.phases[-1])[1] == new / "b" / "model"


def test_a_phase_says_where_its_rows_stop(driver, tmp_path):
    # validation reads lower when the rows stop near the training text's end (the play it
    # continues): the driver says where each phase stops, so that phases compare alike
    plan = driver.Plan(plan_file(tmp_path / "p.json"), tmp_path)
    a = plan.phases[0]  # 6 steps of 2 rows x 16 tokens: 96 tokens of each row
    assert driver.where_it_stops(plan, a, 2 * 100) == "stops at 96% of each of its 2 rows"
    assert driver.where_it_stops(plan, a, 2 * 80) == "wraps past the end of its rows (1.20 passes)"


def test_the_table_says_what_was_spent(driver, tmp_path, capsys):
    plan = driver.Plan(plan_with_next_phase(tmp_path), tmp_path)
    run = tmp_path / "phase-next"  # the first phase after the shipped ones
    run.mkdir()
    (run / "log.jsonl").write_text(
        json.dumps({"step": 10, "loss": 2.0, "tokens": 5120, "tok_s": 2000.0}) + "\n"
    )
    table = driver.table(plan)
    budget = plan.tokens(plan.phases[-1])  # phase-next copies the last trained phase's budget
    assert f"| phase-next | 8 x 64 | {budget:,} ({budget}) | 5,120 | 2,000 | new |" in table
    assert "| phase1-copy | 8 x 64 | 11,340,573 (law) | 0 | — | shipped |" in table


def test_opening_drills_start_where_the_training_starts_from_an_empty_memory(driver, tmp_path):
    """A recipe's ``openings`` write a made-up speaker at the very start of the segments
    txl.train reads from an empty memory: read them as txl.train does (StreamBatcher, the
    steps whose memory_length is 0), and each of those that holds a drill opens with its
    name, which returns later in the same stream."""
    import torch

    from txl.data import StreamBatcher

    plan_path = plan_file(tmp_path / "plan.json", mem_min=16, mem_max=48, mem_reset=0.3)
    plan = driver.Plan(plan_path, tmp_path / "runs")
    phase = plan.phases[1]
    phase["data"]["openings"] = {"share": 0.5, "gap": "20,200", "seed": 3}
    phase["data"]["repeat"] = 8  # rows long enough for drills of up to ~300 characters
    phase["tokens"] = 20_000  # 625 steps of 2 x 16, within the first pass
    text = driver.make_text(plan, phase, plays(tmp_path / "plays.txt")).read_text()
    s = plan.settings(phase)

    def read(chars: str) -> StreamBatcher:  # one token a character, as the model's vocab
        return StreamBatcher(torch.tensor([ord(c) for c in chars]), s["batch"], s["tgt_len"])

    batcher = read(text)
    drawn = driver.TrainArgs(
        seed=s["seed"], mem_min=s["mem_min"], mem_max=s["mem_max"], mem_reset=s["mem_reset"]
    )
    fresh = [
        step
        for step in range(plan.steps(phase))
        if step == 0 or driver.memory_length(step, drawn, s["mem_len"]) == 0
    ]
    assert plan.steps(phase) < len(batcher) and len(fresh) > 100
    plain = driver.recall_passes(
        driver.train_val_split(driver.load_text(str(tmp_path / "plays.txt")))[0],
        **{k: v for k, v in phase["data"].items() if k != "openings"},
    )
    assert len(text) == len(plain)  # written over the text: the layout stays
    unaltered = read(plain)
    opened = 0
    for step in fresh:
        segment, before = batcher.segment(step), unaltered.segment(step)
        for row in range(s["batch"]):
            # the row from the segment txl.train reads at this step, to the row's end
            rest = "".join(map(chr, batcher.streams[row, segment.index * s["tgt_len"] :].tolist()))
            name = rest.split(":\n", 1)[0]
            written = not torch.equal(segment.inputs[row], before.inputs[row])  # not the play's
            if written and name[:1].isalpha() and f"\n\n{name}:\n" in rest:
                opened += 1  # a made-up speaker opens the segment and speaks again later
    # share 0.5 of the fresh starts, less those that would run into the drill before
    assert 0.15 * len(fresh) * s["batch"] <= opened <= 0.5 * len(fresh) * s["batch"]


def test_an_entrant_drill_brings_back_a_speaker_who_did_not_open_the_text(driver, tmp_path):
    """With ``entrant`` an opening drill starts with a scene under way (whole speeches of
    the source, opened by their own heading, as the Recall tab's text before the speaker)
    and the made-up speaker enters after it and returns: the name that comes back is not
    the text's opener. Without it, the text is the one the earlier recipes were made of."""
    from recall_data import speeches_of, with_openings

    source = plays(tmp_path / "plays.txt").read_text()
    blank = "\0" * 40_000  # a character no drill writes: each drill ends where it resumes
    places = [(a, a + 4_000) for a in range(0, 40_000, 4_000)]
    assert with_openings(blank, places, source, 3, (20, 200)) == with_openings(
        blank, places, source, 3, (20, 200), entrant=0.0
    )
    new = with_openings(blank, places, source, 3, (20, 200), entrant=1.0, before=(50, 300))
    speakers = {speaker for speaker, _ in speeches_of(source)}
    drills = [new[a : new.index("\0", a)] for a, _ in places if new[a] != "\0"]
    assert len(drills) >= 8
    for drill in drills:
        name = drill.rstrip("\n").rsplit("\n\n", 1)[1].split(":\n")[0]  # who returns last
        opener = drill.split(":\n", 1)[0]
        assert opener in speakers and name not in speakers  # a scene's own speaker opens it
        assert drill.count(f"\n\n{name}:\n") == 2  # the newcomer enters after it, and returns


def test_a_self_written_recipe_is_the_recipe_with_speeches_of_the_start_model(
    driver, tmp_path, monkeypatch
):
    import generation_check as check  # scripts/, on the path by the driver fixture

    from tests.test_app import tiny_model

    plan = driver.Plan(plan_file(tmp_path / "plan.json"), tmp_path / "runs")
    phase = plan.phases[1]
    plain = driver.make_text(plan, phase, plays(tmp_path / "plays.txt")).read_text()
    model = tiny_model(tmp_path / "start", seed=2)
    monkeypatch.setattr(plan, "start_from", lambda p: Path(model))
    phase = dict(phase, name="b-self")
    phase["data"] = dict(phase["data"], self_written={
        "share": 0.3, "temperature": 1.0, "mem_len": 32, "max_chars": 80, "seed": 4})  # fmt: skip
    written = driver.make_text(plan, phase, tmp_path / "plays.txt").read_text()
    assert written != plain  # its speeches are the model's, its headings the recipe's
    assert [n for _, n in check.headings(written)] == [n for _, n in check.headings(plain)]


def test_more_plays_come_before_the_training_text_whose_end_validation_continues(driver, tmp_path):
    plan = driver.Plan(plan_file(tmp_path / "plan.json"), tmp_path / "runs")
    phase = dict(plan.phases[1], name="b-more")
    phase["data"] = dict(phase["data"], more_plays=True)
    more = "ALPHA:\nA speech of a play Tiny Shakespeare does not hold.\n\nBETA:\nAnd hers.\n\n"
    (tmp_path / "runs" / "data").mkdir(parents=True)
    (tmp_path / "runs" / "data" / "more-plays.txt").write_text(more * 40)  # made once, kept
    data = plays(tmp_path / "plays.txt")
    text = driver.make_text(plan, phase, data).read_text()
    recipe = {k: v for k, v in phase["data"].items() if k != "more_plays"}
    train, _ = driver.train_val_split(data.read_text())
    # the plays first: each pass still ends with the play that validation continues
    assert text == driver.recall_passes(more * 40 + train, **recipe)


def test_a_kept_candidate_outlives_its_session_after_the_plan_moves_on(driver, tmp_path):
    # a and b done and saved (b the last: its model is the run's result); b is then moved
    # to "tried": --save keeps its record (log, eval: the record of every try) but not its
    # model, until "keep" names it (a candidate to ship); a new checkout has it back
    data = plays(tmp_path / "plays.txt")
    path = plan_file(tmp_path / "p.json")
    args = ["--data", str(data), "--threads", "1", "--plan", str(path)]
    old, saved = tmp_path / "old", tmp_path / "saved"
    driver.main([*args, "--runs", str(old)])
    driver.main([*args, "--runs", str(old), "--saved", str(saved), "--save"])
    assert (saved / "b" / "model" / "model.safetensors").exists()
    plan = json.loads(path.read_text())
    plan["tried"] = [plan["phases"].pop()]
    path.write_text(json.dumps(plan))
    driver.main([*args, "--runs", str(old), "--saved", str(saved), "--save"])
    assert sorted(p.name for p in (saved / "b").iterdir()) == sorted(driver.RUN_RECORDS)
    assert (saved / "b" / "log.jsonl").read_bytes() == (old / "b" / "log.jsonl").read_bytes()
    path.write_text(json.dumps(dict(plan, keep=["b"])))
    driver.main([*args, "--runs", str(old), "--saved", str(saved), "--save"])
    assert (saved / "b" / "model" / "model.safetensors").exists()

    new = tmp_path / "new"
    driver.main([*args, "--runs", str(new), "--saved", str(saved)])
    kept = new / "b" / "model" / "model.safetensors"
    assert kept.read_bytes() == (old / "b" / "model" / "model.safetensors").read_bytes()
    assert driver.status(new / "a") == "done"  # and nothing ran again


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))


@pytest.mark.parametrize("how", [{"noise": 0.001}, {"fresh": True}])
def test_a_widen_phase_trains_the_start_model_made_wider(driver, tmp_path, how):
    # b starts from a's model with twice the heads and FF units (scripts/widen_model.py),
    # twins or fresh units as "widen" says, its config the wider one its "train" names
    from txl import TransformerXL

    data = plays(tmp_path / "plays.txt")
    plan = json.loads(plan_file(tmp_path / "p.json", n_head=4, d_inner=64).read_text())
    plan["phases"][1]["widen"] = {"heads": 2, "inner": 2, **how}
    (tmp_path / "p.json").write_text(json.dumps(plan))
    runs = tmp_path / "runs"
    driver.main(["--data", str(data), "--threads", "1", "--plan", str(tmp_path / "p.json"),
                 "--runs", str(runs)])  # fmt: skip
    start = TransformerXL.from_pretrained(str(runs / "b-start"))
    trained = TransformerXL.from_pretrained(str(runs / "b" / "model"))
    assert (start.config.n_head, start.config.d_inner) == (4, 64)
    assert (trained.config.n_head, trained.config.d_inner) == (4, 64)
    w_o = start.layers[0].attn.out.weight  # [d, 4 heads x d_head]: the new heads' half last
    new_heads_out = w_o[:, w_o.shape[1] // 2 :]
    assert bool((new_heads_out == 0).all()) == ("fresh" in how)  # fresh: the new heads silent
    ran = json.loads((runs / "b" / "run.json").read_text())["train"]
    assert ran["init_from"] == str(runs / "b-start")


def test_save_asks_nothing_of_the_phases_in_the_shipped_weights(driver, tmp_path):
    # a and b are shipped and their runs are an earlier checkout's: --save keeps what the
    # phases still to run need, and asks no model of a (b's start) for b, which never runs
    data = plays(tmp_path / "plays.txt")
    plan = json.loads(plan_file(tmp_path / "p.json").read_text())
    plan["shipped"] = {"phase": "b", "weights": "weights/shakespeare-char"}
    (tmp_path / "p.json").write_text(json.dumps(plan))
    saved = tmp_path / "saved"
    assert driver.main(["--data", str(data), "--plan", str(tmp_path / "p.json"), "--runs",
                        str(tmp_path / "runs"), "--saved", str(saved), "--save"]) == 0  # fmt: skip
    assert not list(saved.rglob("model.safetensors"))  # no run here, none to keep
