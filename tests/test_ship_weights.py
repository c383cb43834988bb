"""scripts/ship_weights.py: docs/weights.md's list for shipping new weights, in one run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from txl import TransformerXL, TXLConfig

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "weights" / "shakespeare-char"


@pytest.fixture
def ship(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import ship_weights

    return ship_weights


def test_every_script_the_list_names_is_a_step(ship, tmp_path):
    """The driver runs what docs/weights.md's "Shipping new weights" names: a script added
    to the list and not to the driver (or taken out of it) fails here."""
    doc = (ROOT / "docs" / "weights.md").read_text()
    section = doc.split("## Shipping new weights", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"scripts/(\w+)\.py", section)) - {"ship_weights"}
    argv = {a for s in ship.steps(WEIGHTS, tmp_path, tmp_path) for a in s.argv}
    run = {Path(a).stem for a in argv}
    assert named, "the list names no script"
    assert named <= run, f"named in docs/weights.md, not run: {sorted(named - run)}"
    assert "txl.evaluate" in argv


def test_install_copies_the_model_keeps_the_card_and_ships_the_phase(ship, tmp_path):
    weights, candidate = tmp_path / "weights", tmp_path / "run" / "model"
    weights.mkdir()
    candidate.mkdir(parents=True)
    (weights / "README.md").write_text("the card")
    (weights / "model.safetensors").write_bytes(b"old")
    (weights / "log.jsonl").write_text("the old model's training")  # the candidate has none
    (weights / "eval_three_ways.json").write_text("{}")  # a reading: step 2 writes it anew
    (candidate / "model.safetensors").write_bytes(b"new")
    (candidate / "eval.json").write_text("{}")
    (candidate / "README.md").write_text("a run's own readme")
    (candidate / "config.json").write_text(json.dumps({"mem_len": 128, "d_model": 8}))
    plan = tmp_path / "plan.json"
    plan.write_text(
        '{\n  "shipped": {"phase": "p1", "weights": "w", "about": "..."},\n'
        '  "phases": [{"name": "p1"}, {"name": "p2"}],\n  "tried": [{"name": "t"}]\n}\n'
    )
    layout = plan.read_text()

    with pytest.raises(SystemExit, match="not a phase"):
        ship.install(candidate, "t", weights, plan)  # a tried phase: nothing changes
    assert (weights / "model.safetensors").read_bytes() == b"old"
    assert (weights / "log.jsonl").exists()
    assert plan.read_text() == layout

    copied = ship.install(candidate, "p2", weights, plan)
    assert copied == ["config.json", "eval.json", "model.safetensors"]
    assert (weights / "model.safetensors").read_bytes() == b"new"
    assert (weights / "README.md").read_text() == "the card"
    assert not (weights / "log.jsonl").exists()  # a soup's folder tells no old model's run
    assert (weights / "eval_three_ways.json").exists()
    assert json.loads((weights / "config.json").read_text()) == {"mem_len": 512, "d_model": 8}
    assert plan.read_text() == layout.replace('"phase": "p1"', '"phase": "p2"')


def test_the_gate_passes_the_shipped_model_and_stops_an_untrained_one(ship, tmp_path):
    passes, read = ship.gate(WEIGHTS)
    assert passes, read
    vocab = json.loads((WEIGHTS / "config.json").read_text())["vocab"]
    torch.manual_seed(0)
    config = TXLConfig(vocab=vocab, d_model=16, n_layer=1, n_head=2, d_head=8, d_inner=16,
                       tgt_len=64, mem_len=128)  # fmt: skip
    TransformerXL(config).save_pretrained(tmp_path / "untrained")
    passes, read = ship.gate(tmp_path / "untrained")
    assert not passes, read
    assert "k 32:" in read and "k 256:" in read


def test_a_failed_step_stops_the_steps_after_it_and_no_other(ship, tmp_path):
    out = tmp_path / "out"

    def step(name, code, after=()):
        return ship.Step(name, ["-c", code], after)

    todo = [
        step("d", "raise SystemExit(0)", after=("c",)),  # listed first, waits for c
        step("a", f"open({str(tmp_path / 'a')!r}, 'w').write('a')"),
        step("b", f"assert open({str(tmp_path / 'a')!r}).read() == 'a'", after=("a",)),
        step("c", "raise SystemExit(3)"),
    ]
    codes = ship.run(todo, out, jobs=2)
    assert codes == {"a": 0, "b": 0, "c": 3, "d": -1}
    assert not (out / "d.out").exists()
    assert (out / "c.out").exists()


def test_only_names_steps_that_exist(ship, tmp_path, capsys):
    with pytest.raises(SystemExit, match="no such step: nope"):
        ship.main([str(tmp_path), "--phase", "x", "--only", "moments,nope", "--dry-run"])
    assert ship.main([str(tmp_path), "--phase", "x", "--only", "pairs,moments", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["moments", "pairs"]
