"""Our TransformerXL against the reference (transformers' TransfoXLLMHeadModel), and the
converter between their checkpoints.

One subprocess in the reference's own virtual environment builds every reference model
with peaky random weights, saves it and records its log-probabilities and memories over
segments of different lengths (tests/peer_reference.py). Here each checkpoint goes
through txl.convert, our model runs the same segments, and both must agree within a few
ulps of the values compared (tests/tolerance.py), in float64 and in float32.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from tests.tolerance import AGAINST_REFERENCE, REFERENCE_FLOOR, assert_ulps_close, ulps_apart
from txl.config import TXLConfig
from txl.convert import UnsupportedCheckpoint, convert_folder, convert_state_dict, main
from txl.model import TransformerXL

ROOT = Path(__file__).resolve().parents[1]

BASE = dict(vocab_size=65, cutoffs=[], div_val=1, d_inner=128, mem_len=16, attn_type=0,
            dropout=0.0, dropatt=0.0)
# Each row: d_model, n_head, d_head, n_layer, pre_lnorm, same_length, clamp_len, untie_r.
# Segment lengths change between calls; the second case starts with a single token and
# feeds a segment longer than mem_len, so the memory is cut in the middle of a segment.
CASES = {
    "post_ln": (dict(d_model=64, n_head=4, d_head=16, n_layer=2, pre_lnorm=False,
                     same_length=False, clamp_len=-1, untie_r=True), [7, 12, 1]),
    "pre_ln_same_length_clamp_shared_r": (dict(d_model=32, n_head=2, d_head=8, n_layer=3,
                                               pre_lnorm=True, same_length=True, clamp_len=5,
                                               untie_r=False), [1, 20, 3, 1]),
    "post_ln_same_length_clamp": (dict(d_model=64, n_head=3, d_head=12, n_layer=2,
                                       pre_lnorm=False, same_length=True, clamp_len=5,
                                       untie_r=True), [7, 12, 1]),
    "pre_ln_shared_r": (dict(d_model=32, n_head=4, d_head=8, n_layer=2, pre_lnorm=True,
                             same_length=False, clamp_len=-1, untie_r=False), [7, 12, 1]),
    "post_ln_same_length_shared_r": (dict(d_model=64, n_head=2, d_head=16, n_layer=3,
                                          pre_lnorm=False, same_length=True, clamp_len=-1,
                                          untie_r=False), [12, 7, 1, 5]),
    "pre_ln_clamp": (dict(d_model=64, n_head=4, d_head=12, n_layer=2, pre_lnorm=True,
                          same_length=False, clamp_len=5, untie_r=True), [7, 12, 1]),
}
# Adaptive input and softmax (full configs). Peaky weights put real mass on every cluster,
# so the tail clusters' log-probabilities are compared too, over three segments.
ADAPTIVE = dict(BASE, d_model=64, n_head=4, d_head=16, n_layer=2, pre_lnorm=False,
                same_length=False, clamp_len=-1, untie_r=True, cutoffs=[20, 40], div_val=2,
                d_embed=64)
ADAPTIVE_CASES = {
    "adaptive_div2": (ADAPTIVE, [7, 12, 1]),
    "adaptive_div2_shared_r": (dict(ADAPTIVE, untie_r=False, pre_lnorm=True, same_length=True,
                                    clamp_len=5), [7, 12, 1]),
    # div_val 1 with d_embed != d_model: one table, projected, projections tied but the first
    "adaptive_div1_projected": (dict(ADAPTIVE, div_val=1, d_embed=48), [1, 12, 7]),
    # the WikiText-103 model's shape in miniature: 3 tail clusters, div_val 4, same_length
    "wt103_shaped": (dict(ADAPTIVE, cutoffs=[20, 40, 55], div_val=4, d_embed=64,
                          same_length=True, clamp_len=10, mem_len=12), [7, 12, 5]),
}
BIN_CASE = "pytorch_bin_shared_r"  # saved with safe_serialization=False


def _spec(out: Path) -> dict:
    cases = []
    for seed, (name, (cfg, segments)) in enumerate(CASES.items()):
        cases.append(dict(out=str(out / name), config={**BASE, **cfg, "d_embed": cfg["d_model"]},
                          seed=seed, init_std=0.3, segments=segments, batch=2))
    bin_cfg = {**BASE, **CASES["pre_ln_shared_r"][0], "d_embed": 32}
    cases.append(dict(out=str(out / BIN_CASE), config=bin_cfg, seed=99, init_std=0.3,
                      segments=[7, 12, 1], batch=2, safe_serialization=False))
    for seed, (name, (cfg, segments)) in enumerate(ADAPTIVE_CASES.items(), start=50):
        cases.append(dict(out=str(out / name), config=cfg, seed=seed, init_std=0.3,
                          segments=segments, batch=2))
    return {"cases": cases}


@pytest.fixture(scope="module")
def reference(peer_python, tmp_path_factory) -> Path:
    """Folder with one sub-folder per case (model/ and reference.safetensors)."""
    out = tmp_path_factory.mktemp("reference")
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps(_spec(out)))
    result = subprocess.run(
        [peer_python, str(ROOT / "tests" / "peer_reference.py"), str(spec_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, f"reference run failed:\n{result.stderr[-4000:]}"
    return out


def _run_ours(model: TransformerXL, input_ids: torch.Tensor, segments: list[int]):
    """Log-probabilities and memories after each segment, memory carried from empty."""
    logprobs, mems_after, mems, start = [], [], None, 0
    with torch.no_grad():
        for length in segments:
            out = model(input_ids[:, start : start + length], mems=mems)
            start += length
            mems = out.mems
            logprobs.append(F.log_softmax(out.logits, dim=-1))
            mems_after.append(mems)
    return logprobs, mems_after


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item() if a.numel() else 0.0


def _compare(model: TransformerXL, ref: dict, prefix: str, ulps: float) -> None:
    """Run our model over the reference's segments; assert agreement within ulps of the
    largest value compared (REFERENCE_FLOOR at least), in the dtype both ran in."""
    n_segments = sum(key.startswith(f"{prefix}/logprobs.") for key in ref)
    segments = [ref[f"{prefix}/logprobs.{s}"].shape[1] for s in range(n_segments)]
    logprobs, mems_after = _run_ours(model, ref["input_ids"], segments)
    for s, (lp, mems) in enumerate(zip(logprobs, mems_after)):
        expected = ref[f"{prefix}/logprobs.{s}"]
        assert_ulps_close(lp, expected, ulps, floor=REFERENCE_FLOOR,
                          what=f"{prefix}, segment {s} (length {segments[s]}): log-probs")
        for layer, mem in enumerate(mems):
            expected = ref[f"{prefix}/mems.{s}.{layer}"].transpose(0, 1)  # [M,B,d] -> [B,M,d]
            assert_ulps_close(mem, expected, ulps, floor=REFERENCE_FLOOR,
                              what=f"{prefix}, segment {s}, layer {layer}: memory")


@pytest.mark.parametrize("name", [*CASES, *ADAPTIVE_CASES, BIN_CASE])
def test_matches_reference_float64(reference, tmp_path, name):
    """In float64 rounding is out of the way: the same budget in ulps is ~1e-12."""
    convert_folder(reference / name / "model", tmp_path / "converted")
    model = TransformerXL.from_pretrained(tmp_path / "converted").double()  # saved, reloaded
    ref = load_file(reference / name / "reference.safetensors")
    _compare(model, ref, "float64", AGAINST_REFERENCE)


@pytest.mark.parametrize("name", [*CASES, *ADAPTIVE_CASES, BIN_CASE])
def test_matches_reference_float32(reference, tmp_path, name):
    """Against the reference exactly as shipped (float32, no patch).

    Both sides round in float32, in their own order; with peaky weights log-probabilities
    reach -100, where one float32 step is 8e-6: the bound is in ulps of the values compared.
    """
    model = convert_folder(reference / name / "model", tmp_path / "converted")
    ref = load_file(reference / name / "reference.safetensors")
    _compare(model, ref, "float32", AGAINST_REFERENCE)


def test_reference_is_sensitive(reference, tmp_path):
    """The weights are peaky enough that positions matter: a one-step error would show."""
    ref = load_file(reference / "post_ln" / "reference.safetensors")
    model = convert_folder(reference / "post_ln" / "model", tmp_path / "c")
    # Without the memory the second segment's predictions must move by 1e-2 and more:
    # beyond the float32 comparison's budget by a wide margin.
    with torch.no_grad():
        alone = F.log_softmax(model(ref["input_ids"][:, 7:19]).logits, dim=-1)
    assert _max_diff(alone, ref["float32/logprobs.1"]) > 1e-2
    assert ulps_apart(alone, ref["float32/logprobs.1"]).ulps > 10 * AGAINST_REFERENCE


def test_converted_config(reference, tmp_path):
    model = convert_folder(reference / "pre_ln_same_length_clamp_shared_r" / "model", tmp_path)
    cfg = TransformerXL.from_pretrained(tmp_path).config
    assert (cfg.vocab, cfg.vocab_size, cfg.d_model, cfg.n_layer, cfg.n_head, cfg.d_head) == (
        None, 65, 32, 3, 2, 8)
    assert (cfg.mem_len, cfg.clamp_len, cfg.same_length, cfg.pre_lnorm, cfg.untie_r) == (
        16, 5, True, True, False)
    assert model.tokenizer is None
    assert {p.name for p in tmp_path.iterdir()} >= {"config.json", "model.safetensors"}


def test_bin_input_is_read(reference):
    files = {p.name for p in (reference / BIN_CASE / "model").iterdir()}
    assert "pytorch_model.bin" in files and "model.safetensors" not in files


def test_cli_converts(reference, tmp_path, capsys):
    assert main([str(reference / "post_ln" / "model"), str(tmp_path / "out")]) == 0
    assert "converted" in capsys.readouterr().out
    # A second run into the same folder refuses unless told to overwrite.
    assert main([str(reference / "post_ln" / "model"), str(tmp_path / "out")]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main([str(reference / "post_ln" / "model"), str(tmp_path / "out"), "--overwrite"]) == 0


def test_cli_reports_unreadable_input(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    assert "config.json" in capsys.readouterr().err
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"cutoffs": [], "div_val": 1, "d_embed": 1024}))
    assert main([str(src), str(tmp_path / "out")]) == 2
    assert "has no weights" in capsys.readouterr().err
    (src / "model.safetensors").write_bytes(b"not a safetensors file")
    assert main([str(src), str(tmp_path / "out")]) == 2
    assert "error" in capsys.readouterr().err


def test_adaptive_model_layout(reference, tmp_path):
    """The WT103-shaped checkpoint: four clusters, own first projection, tied others."""
    model = convert_folder(reference / "wt103_shaped" / "model", tmp_path / "c")
    cfg = model.config
    assert (cfg.cutoffs, cfg.div_val, cfg.embed_dims, cfg.tie_projs) == (
        [20, 40, 55], 4, [64, 16, 4, 1], [False, True, True, True])
    assert [w.shape for w in model.embedding.layers.parameters()] == [
        (20, 64), (20, 16), (15, 4), (10, 1)]
    assert set(model.softmax.projs) == {"0"}  # clusters 1-3 use the input's projections
    assert sum(p.numel() for p in model.parameters()) == cfg.n_params()


@pytest.mark.parametrize("name", ADAPTIVE_CASES)
def test_adaptive_nll_matches_log_probs(reference, tmp_path, name):
    """token_nll computes only the targets' clusters; it must equal gathering log_probs."""
    model = convert_folder(reference / name / "model", tmp_path / "c").double()
    ids = load_file(reference / name / "reference.safetensors")["input_ids"]
    with torch.no_grad():
        full = model(ids[:, :-1]).logits
        nll = model(ids[:, :-1], targets=ids[:, 1:]).nll
    expected = -full.gather(2, ids[:, 1:, None]).squeeze(2)
    assert {int(t) // 20 for t in ids.flatten()} >= {0, 1, 2}  # several clusters are hit
    assert _max_diff(nll, expected) < 1e-12


def test_cli_refuses_unsupported_checkpoint(reference, tmp_path):
    """attn_type 1: exit code 2, the reason on stderr, no output folder."""
    src = tmp_path / "src"
    shutil.copytree(reference / "post_ln" / "model", src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "attn_type": 1}))
    result = subprocess.run(
        [sys.executable, "-m", "txl.convert", str(src), str(tmp_path / "out")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "attn_type 1" in result.stderr
    assert not (tmp_path / "out").exists()


def test_refuses_attn_type_1(reference, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(reference / "post_ln" / "model", src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "attn_type": 1}))
    with pytest.raises(UnsupportedCheckpoint, match="attn_type 1"):
        convert_folder(src, tmp_path / "out")


# ---- convert_state_dict on its own (no reference needed) ----------------------------


# Our parameter names -> transformers' names, written out independently of txl.convert.
HF_NAMES = [("attn.qkv", "dec_attn.qkv_net"), ("attn.r_proj", "dec_attn.r_net"),
            ("attn.out", "dec_attn.o_net"), ("attn.norm", "dec_attn.layer_norm"),
            ("ff.fc1", "pos_ff.CoreNet.0"), ("ff.fc2", "pos_ff.CoreNet.3"),
            ("ff.norm", "pos_ff.layer_norm")]
HF_TOP = {"embedding.weight": "transformer.word_emb.emb_layers.0.weight",
          "lm_bias": "crit.out_layers.0.bias", "u": "transformer.r_w_bias",
          "v": "transformer.r_r_bias"}


def _hf_name(ours: str) -> str:
    if ours in HF_TOP:
        return HF_TOP[ours]
    _, layer, rest = ours.split(".", 2)
    rest = {"u": "dec_attn.r_w_bias", "v": "dec_attn.r_r_bias"}.get(rest, rest)
    for a, b in HF_NAMES:
        rest = rest.replace(a + ".", b + ".")
    return f"transformer.layers.{layer}.{rest}"


def _hf_checkpoint(untie_r: bool = True) -> tuple[dict, dict]:
    """A small config.json dict and a state dict laid out as transformers saves them."""
    hf_config = {"model_type": "transfo-xl", "vocab_size": 11, "cutoffs": [], "div_val": 1,
                 "d_model": 8, "d_embed": 8, "n_head": 2, "d_head": 4, "d_inner": 16,
                 "n_layer": 2, "mem_len": 4, "untie_r": untie_r}
    cfg = TXLConfig(vocab_size=11, d_model=8, n_head=2, d_head=4, d_inner=16, n_layer=2,
                    untie_r=untie_r)
    hf_state = {_hf_name(k): v for k, v in TransformerXL(cfg).state_dict().items()}
    hf_state["transformer.pos_emb.inv_freq"] = torch.ones(4)
    return hf_config, hf_state


@pytest.mark.parametrize("untie_r", [True, False])
def test_convert_state_dict_round_trip(untie_r):
    hf_config, hf_state = _hf_checkpoint(untie_r)
    config, state = convert_state_dict(hf_config, hf_state)
    model = TransformerXL(config)
    model.load_state_dict(state, strict=True)
    assert torch.equal(model.embedding.weight, hf_state["transformer.word_emb.emb_layers.0.weight"])


def test_convert_accepts_tied_copies_that_agree():
    """pytorch_model.bin keeps every alias of a tied or shared tensor."""
    hf_config, hf_state = _hf_checkpoint(untie_r=False)
    hf_state["crit.out_layers.0.weight"] = hf_state["transformer.word_emb.emb_layers.0.weight"]
    for n in range(2):
        hf_state[f"transformer.layers.{n}.dec_attn.r_w_bias"] = hf_state["transformer.r_w_bias"]
    convert_state_dict(hf_config, hf_state)
    hf_state["crit.out_layers.0.weight"] = hf_state["crit.out_layers.0.weight"] + 1
    with pytest.raises(UnsupportedCheckpoint, match="crit.out_layers.0.weight differs"):
        convert_state_dict(hf_config, hf_state)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"cutoffs": [20]}, r"cutoffs \[20\] must increase strictly inside \(0, 11\)"),
        ({"cutoffs": [5], "tie_projs": [True]}, "tie_projs needs one entry per cluster"),
        ({"attn_type": 1}, "attn_type 1"),
        ({"attn_type": 2}, "attn_type 2"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings"),
        ({"sample_softmax": 5}, "sample_softmax"),
        ({"model_type": "gpt2"}, "model_type"),
    ],
)
def test_convert_refuses_unsupported_configs(change, message):
    hf_config, hf_state = _hf_checkpoint()
    with pytest.raises(UnsupportedCheckpoint, match=message):
        convert_state_dict({**hf_config, **change}, hf_state)


def test_missing_defaults_are_transformers_defaults():
    """A config.json without cutoffs means transformers' default cutoffs: adaptive."""
    hf_config, hf_state = _hf_checkpoint()
    del hf_config["cutoffs"]
    with pytest.raises(UnsupportedCheckpoint, match="cutoffs"):
        convert_state_dict(hf_config, hf_state)


def test_old_field_names():
    hf_config, hf_state = _hf_checkpoint()
    hf_config["n_token"] = hf_config.pop("vocab_size")
    config, _ = convert_state_dict(hf_config, hf_state)
    assert config.vocab_size == 11


def test_convert_names_missing_and_unexpected_tensors():
    hf_config, hf_state = _hf_checkpoint()
    del hf_state["transformer.layers.1.pos_ff.CoreNet.3.bias"]
    del hf_state["transformer.layers.0.dec_attn.r_r_bias"]
    with pytest.raises(UnsupportedCheckpoint) as err:
        convert_state_dict(hf_config, hf_state)
    assert "transformer.layers.1.pos_ff.CoreNet.3.bias" in str(err.value)
    assert "transformer.layers.0.dec_attn.r_r_bias" in str(err.value)

    hf_config, hf_state = _hf_checkpoint()
    hf_state["transformer.layers.0.dec_attn.extra.weight"] = torch.zeros(2)
    with pytest.raises(UnsupportedCheckpoint, match="unexpected tensors: transformer.layers.0"):
        convert_state_dict(hf_config, hf_state)


def test_convert_names_shape_mismatch():
    hf_config, hf_state = _hf_checkpoint()
    hf_state["transformer.layers.0.pos_ff.CoreNet.0.weight"] = torch.zeros(17, 8)
    expected = r"layers.0.ff.fc1.weight: checkpoint \(17, 8\)"
    with pytest.raises(UnsupportedCheckpoint, match=expected):
        convert_state_dict(hf_config, hf_state)
