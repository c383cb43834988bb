"""Convert a Hugging Face transformers TransfoXL checkpoint into the txl format.

    python -m txl.convert SRC DST [--overwrite]

SRC is a folder written by ``TransfoXLLMHeadModel.save_pretrained`` (config.json plus
model.safetensors or pytorch_model.bin, possibly sharded). DST receives config.json,
model.safetensors and a model card, loadable with ``TransformerXL.from_pretrained(DST)``.

Only the plain-softmax form is supported: no cutoffs (no adaptive softmax), div_val 1,
d_embed == d_model, output layer tied to the embedding. Anything else is refused with
:class:`UnsupportedCheckpoint` (exit code 2 from the command line), never loaded half-way.

pytorch_model.bin is read with ``torch.load(weights_only=True)``, which refuses to run
code from the pickle; nothing else here unpickles.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from .config import TXLConfig
from .model import TransformerXL

# TransfoXLConfig's defaults (transformers 4.37): a config.json only lists the fields that
# differ from them, so a missing field means this value, exactly as transformers reads it.
HF_DEFAULTS = {
    "vocab_size": 267735,
    "cutoffs": [20000, 40000, 200000],
    "d_model": 1024,
    "d_embed": 1024,
    "n_head": 16,
    "d_head": 64,
    "d_inner": 4096,
    "div_val": 4,
    "pre_lnorm": False,
    "n_layer": 18,
    "mem_len": 1600,
    "clamp_len": 1000,
    "same_length": True,
    "attn_type": 0,
    "sample_softmax": -1,
    "dropout": 0.1,
    "dropatt": 0.0,
    "untie_r": True,
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": True,
}
# Old names transformers still accepts (TransfoXLConfig.attribute_map).
HF_ALIASES = {
    "n_token": "vocab_size",
    "hidden_size": "d_model",
    "num_attention_heads": "n_head",
    "num_hidden_layers": "n_layer",
}
# Fields copied unchanged into TXLConfig.
COPIED_FIELDS = (
    "vocab_size", "d_model", "n_layer", "n_head", "d_head", "d_inner", "dropout", "dropatt",
    "mem_len", "clamp_len", "same_length", "pre_lnorm", "untie_r", "layer_norm_epsilon",
)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class UnsupportedCheckpoint(ValueError):
    """The checkpoint is not one this converter can turn into an exact TransformerXL."""


# ---- config -------------------------------------------------------------------------


def read_hf_config(hf_config: dict) -> dict:
    """config.json as transformers would read it: aliases resolved, defaults filled in."""
    cfg = dict(HF_DEFAULTS)
    for key, value in hf_config.items():
        cfg[HF_ALIASES.get(key, key)] = value
    return cfg


def check_supported(cfg: dict) -> None:
    """Raise UnsupportedCheckpoint naming every feature our model does not implement."""
    problems = []
    model_type = cfg.get("model_type", "transfo-xl")
    if model_type != "transfo-xl":
        problems.append(f"model_type is {model_type!r}, not 'transfo-xl'")
    if cfg["cutoffs"]:
        problems.append(
            f"cutoffs {cfg['cutoffs']}: adaptive softmax / adaptive input is not yet supported "
            "(only checkpoints with cutoffs [] can be converted)"
        )
    if cfg["div_val"] != 1:
        problems.append(f"div_val {cfg['div_val']} (only 1 is supported)")
    if cfg["d_embed"] != cfg["d_model"]:
        problems.append(
            f"d_embed {cfg['d_embed']} != d_model {cfg['d_model']} (embedding projections are "
            "not supported)"
        )
    if cfg["attn_type"] != 0:
        problems.append(
            f"attn_type {cfg['attn_type']} (only 0, the relative attention of the paper, is "
            "supported)"
        )
    if cfg["sample_softmax"] > 0:
        problems.append(f"sample_softmax {cfg['sample_softmax']} (sampled softmax)")
    if not cfg["tie_word_embeddings"]:
        problems.append("tie_word_embeddings is false (our output layer is tied to the embedding)")
    if problems:
        raise UnsupportedCheckpoint("unsupported TransfoXL checkpoint: " + "; ".join(problems))


def txl_config_from_hf(hf_config: dict) -> TXLConfig:
    """TXLConfig for a supported transformers config (raises UnsupportedCheckpoint)."""
    cfg = read_hf_config(hf_config)
    check_supported(cfg)
    fields = {name: cfg[name] for name in COPIED_FIELDS}
    if "tgt_len" in cfg:  # only the original code's configs carry it
        fields["tgt_len"] = cfg["tgt_len"]
    extra = {
        "converted_from": "transformers TransfoXLLMHeadModel",
        "transformers_version": cfg.get("transformers_version"),
    }
    try:
        return TXLConfig(vocab=None, extra=extra, **fields)
    except ValueError as err:
        raise UnsupportedCheckpoint(f"config cannot be converted: {err}") from err


# ---- weights ------------------------------------------------------------------------


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)


def _take_shared(hf_state: dict, names: list[str], what: str, used: set, missing: list):
    """One tensor stored under several names (tied or shared); the copies must agree.

    Safetensors files keep one of the names, pytorch_model.bin files keep them all.
    Returns None (and records the first name as missing) when none is present.
    """
    present = [n for n in names if n in hf_state]
    if not present:
        missing.append(names[0] if len(names) == 1 else f"{names[0]} (or {', '.join(names[1:])})")
        return None
    first = hf_state[present[0]]
    for name in present[1:]:
        if not _same(first, hf_state[name]):
            raise UnsupportedCheckpoint(f"{name} differs from {present[0]} but must be {what}")
    used.update(present)
    return first


def _layer_map(n: int) -> dict[str, str]:
    """Our name -> the reference's name, for layer n (u and v handled apart)."""
    src, dst = f"transformer.layers.{n}.", f"layers.{n}."
    pairs = {
        "attn.qkv.weight": "dec_attn.qkv_net.weight",
        "attn.r_proj.weight": "dec_attn.r_net.weight",
        "attn.out.weight": "dec_attn.o_net.weight",
        "attn.norm.weight": "dec_attn.layer_norm.weight",
        "attn.norm.bias": "dec_attn.layer_norm.bias",
        "ff.fc1.weight": "pos_ff.CoreNet.0.weight",
        "ff.fc1.bias": "pos_ff.CoreNet.0.bias",
        "ff.fc2.weight": "pos_ff.CoreNet.3.weight",
        "ff.fc2.bias": "pos_ff.CoreNet.3.bias",
        "ff.norm.weight": "pos_ff.layer_norm.weight",
        "ff.norm.bias": "pos_ff.layer_norm.bias",
    }
    return {dst + ours: src + theirs for ours, theirs in pairs.items()}


def _biases(config: TXLConfig, hf_state: dict, used: set, missing: list) -> dict:
    """u (r_w_bias) and v (r_r_bias): per layer with untie_r, else one shared pair."""
    out = {}
    for ours, theirs in (("u", "r_w_bias"), ("v", "r_r_bias")):
        per_layer = [f"transformer.layers.{n}.dec_attn.{theirs}" for n in range(config.n_layer)]
        if config.untie_r:
            for n, name in enumerate(per_layer):
                out[f"layers.{n}.{ours}"] = _take_shared(hf_state, [name], name, used, missing)
        else:
            # The layers hold references to the model's pair; any surviving copy must agree.
            names = [f"transformer.{theirs}"] + per_layer
            out[ours] = _take_shared(hf_state, names, f"the shared {theirs}", used, missing)
    return out


def _map_state(hf_config: dict, hf_state: dict) -> tuple[TXLConfig, dict]:
    """Rename the reference's tensors to ours; name any missing or unexpected one."""
    config = txl_config_from_hf(hf_config)
    used = {"transformer.pos_emb.inv_freq"}  # a buffer we recompute
    missing = []
    state = {}

    names = {"lm_bias": "crit.out_layers.0.bias"}
    for n in range(config.n_layer):
        names.update(_layer_map(n))
    for ours, theirs in names.items():
        state[ours] = _take_shared(hf_state, [theirs], theirs, used, missing)
    state["embedding.weight"] = _take_shared(
        hf_state,
        ["transformer.word_emb.emb_layers.0.weight", "crit.out_layers.0.weight"],
        "the embedding (tied to the output layer)",
        used,
        missing,
    )
    state.update(_biases(config, hf_state, used, missing))
    if missing:
        raise UnsupportedCheckpoint(f"checkpoint lacks tensors: {', '.join(missing)}")

    unexpected = sorted(set(hf_state) - used)
    if unexpected:
        raise UnsupportedCheckpoint(f"checkpoint has unexpected tensors: {', '.join(unexpected)}")
    return config, {k: v.detach().to(torch.float32).contiguous() for k, v in state.items()}


def _load(config: TXLConfig, state: dict) -> TransformerXL:
    """Our model holding the converted tensors; a shape mismatch names the tensor."""
    model = TransformerXL(config)
    expected = model.state_dict()
    bad = [
        f"{k}: checkpoint {tuple(v.shape)}, config expects {tuple(expected[k].shape)}"
        for k, v in state.items()
        if v.shape != expected[k].shape
    ]
    if bad:
        raise UnsupportedCheckpoint("tensor shapes do not match config.json: " + "; ".join(bad))
    model.load_state_dict(state, strict=True)
    return model.eval()


def convert_state_dict(hf_config: dict, hf_state: dict) -> tuple[TXLConfig, dict]:
    """(TXLConfig, our state dict) for a transformers TransfoXLLMHeadModel.

    hf_config is the checkpoint's config.json as a dict. Raises UnsupportedCheckpoint for
    unsupported configs and for missing, unexpected or misshapen tensors, naming them.
    """
    config, state = _map_state(hf_config, hf_state)
    _load(config, state)  # proves the state dict loads with strict=True
    return config, state


# ---- folders ------------------------------------------------------------------------


def _load_weight_file(path: Path) -> dict[str, Tensor]:
    if path.name.endswith(".safetensors"):
        return load_file(path)
    # weights_only=True: tensors only, no code from the pickle is ever run.
    return torch.load(path, map_location="cpu", weights_only=True)


def load_hf_state(src: Path) -> dict[str, Tensor]:
    """All tensors of a checkpoint folder: single file or shards listed in an index."""
    for name in WEIGHT_FILES:
        if (src / name).is_file():
            return _load_weight_file(src / name)
    for name in SHARD_INDEXES:
        if (src / name).is_file():
            weight_map = json.loads((src / name).read_text())["weight_map"]
            state = {}
            for shard in sorted(set(weight_map.values())):
                state.update(_load_weight_file(src / shard))
            return state
    raise FileNotFoundError(
        f"{src} has no weights: expected one of {', '.join(WEIGHT_FILES + SHARD_INDEXES)}"
    )


def convert_folder(src: str | Path, dst: str | Path) -> TransformerXL:
    """Convert the checkpoint folder src into dst; returns the loaded model (eval mode)."""
    src, dst = Path(src), Path(dst)
    config_path = src / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found (is {src} a checkpoint folder?)")
    hf_config = json.loads(config_path.read_text())
    txl_config_from_hf(hf_config)  # refuse before reading gigabytes of weights
    model = _load(*_map_state(hf_config, load_hf_state(src)))
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst)
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m txl.convert",
        description="Convert a transformers TransfoXL checkpoint folder into the txl format.",
    )
    parser.add_argument("src", help="folder with config.json and model.safetensors / .bin")
    parser.add_argument("dst", help="output folder for TransformerXL.from_pretrained")
    parser.add_argument("--overwrite", action="store_true", help="replace files in dst")
    args = parser.parse_args(argv)

    dst = Path(args.dst)
    if dst.exists() and any(dst.iterdir()) and not args.overwrite:
        print(f"error: {dst} is not empty (pass --overwrite to replace it)", file=sys.stderr)
        return 2
    try:
        model = convert_folder(args.src, dst)
    except (UnsupportedCheckpoint, OSError, ValueError) as err:  # incl. FileNotFoundError
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (SafetensorError, pickle.UnpicklingError) as err:  # damaged or unsafe weights
        print(f"error: cannot read the weights of {args.src}: {err}", file=sys.stderr)
        return 2
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"converted {args.src} -> {dst}: vocab {cfg.vocab_size}, {cfg.n_layer} layers, "
        f"d_model {cfg.d_model}, {cfg.n_head} heads x {cfg.d_head}, {n_params:,} parameters"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
