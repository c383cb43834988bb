"""Training, resuming, the stream batcher, evaluation and DDP, on tiny models and texts."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from tests.tolerance import SAME_SUMS, assert_ulps_close
from txl import TransformerXL, TXLConfig
from txl.data import StreamBatcher, train_val_split
from txl.evaluate import evaluate_loss
from txl.recall import recall_progress
from txl.train import TrainArgs, cpu_has_bf16, train

REPO = Path(__file__).resolve().parents[1]
TINY_MODEL = dict(d_model=32, n_layer=2, n_head=2, d_head=16, d_inner=64, tgt_len=16, mem_len=16)


@pytest.fixture(scope="module")
def toy_text(tmp_path_factory) -> Path:
    """A made-up text with structure a tiny model can learn in a few dozen steps."""
    rng = random.Random(0)
    words = ["the cat", "a dog", "my bird", "her fish"]
    verbs = ["sat on", "ran to", "looked at", "slept by"]
    lines = [f"{rng.choice(words)} {rng.choice(verbs)} {rng.choice(words)}.\n" for _ in range(900)]
    path = tmp_path_factory.mktemp("data") / "toy.txt"
    path.write_text("".join(lines))
    return path


def run_args(data: Path, out: Path, **overrides) -> TrainArgs:
    settings = dict(data=str(data), out=str(out), batch=4, steps=20, lr=3e-3, warmup=5,
                    eval_every=1000, sample_every=1000, ckpt_every=10, log_every=1, seed=7)
    settings.update(overrides)
    return TrainArgs(**settings)


def logged_losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_training_lowers_the_loss_and_writes_a_model(toy_text, tmp_path):
    out = tmp_path / "run"
    train(run_args(toy_text, out, steps=80), dict(TINY_MODEL, dropout=0.0))
    losses = logged_losses(out)
    first, last = losses[1], sum(losses[s] for s in range(71, 81)) / 10
    assert last < first - 1.0, (first, last)
    model_dir = out / "model"
    for name in ("config.json", "model.safetensors", "README.md", "loss_curve.png", "log.jsonl"):
        assert (model_dir / name).is_file(), name
    card = (model_dir / "README.md").read_text()
    assert "without memory" in card and "library_name: txl" in card
    model = TransformerXL.from_pretrained(model_dir)
    result = json.loads((out / "eval.json").read_text())
    assert result["with_memory"]["mem_len"] == TINY_MODEL["mem_len"]
    assert f"{result['with_memory']['loss']:.4f}" in card
    assert model.config.tgt_len == TINY_MODEL["tgt_len"]


def test_training_without_matplotlib_saves_everything_but_the_loss_curve(
    toy_text, tmp_path, monkeypatch, capsys
):
    """matplotlib is the app's extra, not txl's: without it a run still ends with its model,
    card and logs, says that the curve was not drawn, and the card links no missing PNG."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises
    out = tmp_path / "run"
    train(run_args(toy_text, out, steps=4), dict(TINY_MODEL, dropout=0.0))
    model_dir = out / "model"
    for name in ("config.json", "model.safetensors", "README.md", "log.jsonl", "eval.json"):
        assert (model_dir / name).is_file(), name
    assert not (model_dir / "loss_curve.png").exists()
    assert "loss_curve.png" not in (model_dir / "README.md").read_text()
    assert "matplotlib is not installed" in capsys.readouterr().out
    assert TransformerXL.from_pretrained(model_dir).config.tgt_len == TINY_MODEL["tgt_len"]


def test_resume_continues_exactly(toy_text, tmp_path):
    model_kw = dict(TINY_MODEL, dropout=0.1)  # dropout: the RNG state must be restored too
    train(run_args(toy_text, tmp_path / "straight"), model_kw)
    train(run_args(toy_text, tmp_path / "broken", stop_after=10), model_kw)
    assert not (tmp_path / "broken" / "model").exists()
    train(run_args(toy_text, tmp_path / "broken"), model_kw, resume=True)
    straight = logged_losses(tmp_path / "straight")
    resumed = logged_losses(tmp_path / "broken")
    assert sorted(resumed) == list(range(1, 21))
    assert [resumed[s] for s in range(11, 21)] == [straight[s] for s in range(11, 21)]


def test_the_cli_runs_and_resumes(toy_text, tmp_path):
    out = tmp_path / "cli"
    base = [sys.executable, "-m", "txl.train", "--data", str(toy_text), "--out", str(out),
            "--steps", "6", "--batch", "2", "--d-model", "32", "--n-layer", "1", "--n-head", "2",
            "--d-head", "16", "--d-inner", "32", "--tgt-len", "8", "--mem-len", "8",
            "--ckpt-every", "3", "--eval-every", "100", "--stop-after", "3"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run(base, check=True, env=env, capture_output=True, timeout=300)
    run = json.loads((out / "run.json").read_text())
    assert run["model"]["d_model"] == 32 and run["train"]["steps"] == 6
    resume = [sys.executable, "-m", "txl.train", "--out", str(out), "--resume"]
    subprocess.run(resume, check=True, env=env, capture_output=True, timeout=300)
    assert (out / "model" / "model.safetensors").is_file()
    assert max(logged_losses(out)) == 6


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(50, 400),
    n_streams=st.integers(1, 6),
    seg_len=st.integers(1, 9),
    world=st.sampled_from([1, 2, 3]),
)
def test_batcher_keeps_every_stream_contiguous(n, n_streams, seg_len, world):
    n_streams *= world
    ids = torch.arange(n)
    if n // n_streams < seg_len + 1:
        with pytest.raises(ValueError):
            StreamBatcher(ids, n_streams, seg_len)
        return
    row_len = n // n_streams
    rows_seen = []
    for rank in range(world):
        batcher = StreamBatcher(ids, n_streams, seg_len, rank, world)
        inputs = torch.cat([b.inputs for b in batcher], dim=1)
        targets = torch.cat([b.targets for b in batcher], dim=1)
        # Each row reads consecutive ids: segment s + 1 continues exactly where s ended.
        assert torch.equal(inputs[:, 1:] - inputs[:, :-1], torch.ones_like(inputs[:, 1:]))
        assert torch.equal(targets, inputs + 1)
        rows_seen += [int(r) // row_len for r in inputs[:, 0]]
        assert [b.first for b in batcher] == [True] + [False] * (len(batcher) - 1)
    assert sorted(rows_seen) == list(range(n_streams))  # the ranks share the rows out


def test_evaluate_agrees_with_a_direct_computation():
    torch.manual_seed(0)
    cfg = TXLConfig(vocab_size=20, dropout=0.0, **dict(TINY_MODEL, mem_len=64))
    model = TransformerXL(cfg).eval()
    model.reset_parameters(0.2)
    ids = torch.randint(0, 20, (3 * 41,))
    with torch.no_grad():
        rows = ids.view(3, 41)
        whole = F.cross_entropy(model(rows[:, :-1]).logits.transpose(1, 2), rows[:, 1:])
        # Without memory every segment of 16 is read alone.
        alone = [
            F.cross_entropy(model(rows[:, a : a + 16][:, : 40 - a]).logits.transpose(1, 2),
                            rows[:, a + 1 : a + 17], reduction="sum")
            for a in range(0, 40, 16)
        ]
    with_memory = evaluate_loss(model, ids, 16, mem_len=64, n_streams=3)
    without = evaluate_loss(model, ids, 16, mem_len=0, n_streams=3)
    # means of float32 losses, as Python floats: float32's ulps
    f32 = dict(ulps=SAME_SUMS, dtype=torch.float32)
    assert_ulps_close(with_memory, whole.item(), **f32)
    assert_ulps_close(without, sum(a.item() for a in alone) / (3 * 40), **f32)
    assert with_memory < without


def test_torchrun_two_ranks_end_with_identical_parameters(toy_text, tmp_path):
    spec = {"train": dataclass_dict(run_args(toy_text, tmp_path, steps=6, batch=4, ckpt_every=3)),
            "model": dict(TINY_MODEL, dropout=0.1)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(29500 + os.getpid() % 1000),
           str(REPO / "tests" / "ddp_train_check.py"), json.dumps(spec)]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rank0 = load_file(tmp_path / "params.rank0.safetensors")
    rank1 = load_file(tmp_path / "params.rank1.safetensors")
    assert rank0.keys() == rank1.keys()
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    initial = TransformerXL(TXLConfig(vocab_size=rank0["embedding.weight"].shape[0], **TINY_MODEL))
    assert not torch.equal(initial.state_dict()["lm_bias"], rank0["lm_bias"])  # it did train
    assert (tmp_path / "model" / "model.safetensors").is_file()


def dataclass_dict(args: TrainArgs) -> dict:
    import dataclasses

    return dataclasses.asdict(args)


def test_memory_length_augmentation_is_in_range_and_repeatable():
    from txl.train import memory_length

    plain = TrainArgs(data="x", out="y")
    assert memory_length(5, plain, 128) == 128  # off: always the config's mem_len
    args = TrainArgs(data="x", out="y", mem_min=3, mem_max=9, seed=1)
    lengths = [memory_length(step, args, 128) for step in range(200)]
    assert set(lengths) == set(range(3, 10))  # every length in [mem_min, mem_max] occurs
    assert lengths == [memory_length(step, args, 128) for step in range(200)]  # per step
    fresh = TrainArgs(data="x", out="y", mem_min=3, mem_max=9, seed=1, mem_reset=0.25)
    lengths = [memory_length(step, fresh, 128) for step in range(400)]
    assert set(lengths) == {0} | set(range(3, 10))
    assert 60 < lengths.count(0) < 140  # a quarter of the steps start afresh


def test_training_with_augmented_memory_resumes_exactly(toy_text, tmp_path):
    model_kw = dict(TINY_MODEL, dropout=0.0)
    aug = dict(mem_min=4, mem_max=40, mem_reset=0.3, steps=14, ckpt_every=7)
    train(run_args(toy_text, tmp_path / "straight", **aug), model_kw)
    train(run_args(toy_text, tmp_path / "broken", stop_after=7, **aug), model_kw)
    train(run_args(toy_text, tmp_path / "broken", **aug), model_kw, resume=True)
    straight, resumed = logged_losses(tmp_path / "straight"), logged_losses(tmp_path / "broken")
    assert [resumed[s] for s in range(8, 15)] == [straight[s] for s in range(8, 15)]


def test_the_log_shows_copying_and_recall_as_training_goes(tmp_path):
    """--probe-every logs the copy drill and the recall probe of the model at that step:
    the last row is what txl.recall.recall_progress reads off the final model."""
    rng = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    lines = [
        " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 6))) for _ in range(4))
        for _ in range(300)
    ]
    data = tmp_path / "letters.txt"
    data.write_text("ROMEO:\nI will go.\n\n" + "\n".join(lines) + "\n:;,.\n")
    out = tmp_path / "run"
    train(run_args(data, out, steps=6, probe_every=3), dict(TINY_MODEL, dropout=0.0))

    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    probes = [r for r in rows if "copy_drill" in r]
    assert [r["step"] for r in probes] == [3, 6]
    assert [r["tokens"] for r in probes] == [3 * 4 * 16, 6 * 4 * 16]  # batch 4, tgt_len 16
    _, val_text = train_val_split(data.read_text())
    final = TransformerXL.from_pretrained(out / "model")
    expected = recall_progress(final, val_text)
    assert {k: probes[-1][k] for k in expected} == expected
    assert set(expected["copy_drill"]) == {"0", "32", "100", "400"}
    readings = ("recall_memory", "recall_window", "planted_memory", "planted_window")
    assert all(set(expected[key]) == {"100", "200", "400"} for key in readings)


def test_probes_need_the_characters_they_read(toy_text, tmp_path):
    with pytest.raises(SystemExit, match="lacks characters the probes use"):
        train(run_args(toy_text, tmp_path / "run", probe_every=3), dict(TINY_MODEL))


def test_heading_weights_mark_the_character_after_a_blank_line():
    from txl.train import heading_weights

    text = "A:\nhi.\n\nB:\nso.\n\nA"
    ids = torch.tensor([[ord(c) for c in text[:-1]]])  # inputs; target t is text[t + 1]
    w = heading_weights(ids, ord("\n"), 4.0)
    weighted = [t + 1 for t in range(ids.size(1)) if w[0, t] == 4.0]
    assert weighted == [text.index("B"), len(text) - 1]  # who speaks next, both times
    assert w.sum().item() == ids.numel() + 2 * 3.0  # every other target counts once
    w = heading_weights(ids, ord("\n"), 4.0, line=True)  # the name, ":" and its newline
    weighted = "".join(text[t + 1] for t in range(ids.size(1)) if w[0, t] == 4.0)
    assert weighted == "B:\nA" and w.sum().item() == ids.numel() + 4 * 3.0


def test_a_heading_line_without_a_weight_says_so_before_it_trains(toy_text, tmp_path):
    with pytest.raises(SystemExit, match="give one"):
        train(run_args(toy_text, tmp_path / "run", heading_line=True), dict(TINY_MODEL))
    assert not (tmp_path / "run").exists()  # nothing started


def test_the_cpus_bfloat16_support_is_read_from_its_flags():
    amd = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c\n"
    xeon = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n"
    sapphire = "flags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n"
    assert cpu_has_bf16(amd) is False
    assert cpu_has_bf16(xeon) is True
    assert cpu_has_bf16(sapphire) is True
    assert cpu_has_bf16("processor\t: 0\n") is None  # no flags line: not known


def test_a_heading_weight_changes_training_not_what_the_log_reports(tmp_path):
    rng = random.Random(0)
    play = "".join(f"{rng.choice(['ROMEO', 'NURSE'])}:\n{rng.choice(['ay.', 'no, sir.'])}\n\n"
                   for _ in range(400))  # fmt: skip
    data = tmp_path / "play.txt"
    data.write_text(play)
    model_kw = dict(TINY_MODEL, dropout=0.0)
    train(run_args(data, tmp_path / "plain", steps=3), model_kw)
    train(run_args(data, tmp_path / "weighted", steps=3, heading_weight=8.0), model_kw)
    plain, weighted = logged_losses(tmp_path / "plain"), logged_losses(tmp_path / "weighted")
    assert weighted[1] == plain[1]  # the same model on the same batch: the plain mean
    assert weighted[2] != plain[2]  # but the step it took differed
