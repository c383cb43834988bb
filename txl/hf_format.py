"""The transformers TransfoXL checkpoint format, mapped to ours (no model needed here).

A checkpoint written by ``TransfoXLLMHeadModel.save_pretrained`` (transformers <= 4.x, or
the Hub's ``transfo-xl/transfo-xl-wt103``) is a config.json in transformers' names and a
state dict in its module layout. This module reads the config into a TXLConfig, renames
the tensors to ours and names anything it cannot map. ``txl.convert`` (the command line)
and ``TransformerXL.from_pretrained`` (which converts a Hub repo on the fly) both use it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import TXLConfig

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
    "proj_share_all_but_first": True,
}
# Old names transformers still accepts (TransfoXLConfig.attribute_map).
HF_ALIASES = {
    "n_token": "vocab_size",
    "hidden_size": "d_model",
    "num_attention_heads": "n_head",
    "num_hidden_layers": "n_layer",
    "tie_weight": "tie_word_embeddings",  # the original code's name
}
# Fields copied unchanged into TXLConfig.
COPIED_FIELDS = (
    "vocab_size",
    "d_model",
    "n_layer",
    "n_head",
    "d_head",
    "d_inner",
    "dropout",
    "dropatt",
    "mem_len",
    "clamp_len",
    "same_length",
    "pre_lnorm",
    "untie_r",
    "layer_norm_epsilon",
    "cutoffs",
    "div_val",
    "d_embed",
)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# Fields only a transformers / original TransfoXL config.json has (ours always has "vocab").
HF_ONLY_FIELDS = {"n_token", "architectures", "sample_softmax", "tie_projs", "adaptive"}


class UnsupportedCheckpoint(ValueError):
    """The checkpoint is not one this converter can turn into an exact TransformerXL."""


# ---- config -------------------------------------------------------------------------


def is_transfo_xl_config(data: dict) -> bool:
    """Whether a config.json dict is a transformers (or original) TransfoXL config."""
    if data.get("model_type") == "transfo-xl":
        return True
    return "vocab" not in data and bool(HF_ONLY_FIELDS & data.keys())


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


def txl_config_from_hf(hf_config: dict, vocab: list[str] | None = None) -> TXLConfig:
    """TXLConfig for a supported transformers config (raises UnsupportedCheckpoint).
    vocab: the word of each id (from the checkpoint's vocabulary file), if there is one."""
    cfg = read_hf_config(hf_config)
    check_supported(cfg)
    fields = {name: cfg[name] for name in COPIED_FIELDS}
    if "tgt_len" in cfg:  # only the original code's configs carry it
        fields["tgt_len"] = cfg["tgt_len"]
    if "tie_projs" in cfg:  # transformers derives it; some config.json files store it
        fields["tie_projs"] = cfg["tie_projs"]
    else:
        fields["tie_projs"] = [False] + [cfg["proj_share_all_but_first"]] * len(cfg["cutoffs"])
    extra = {
        "converted_from": "transformers TransfoXLLMHeadModel",
        "transformers_version": cfg.get("transformers_version"),
    }
    words = {}
    if vocab is not None:
        if len(vocab) != cfg["vocab_size"]:
            raise UnsupportedCheckpoint(
                f"the vocabulary has {len(vocab)} symbols but the config says {cfg['vocab_size']}"
            )
        unk = next((u for u in ("<unk>", "<UNK>") if u in vocab), None)
        words = dict(vocab=vocab, tokenizer="word", unk_symbol=unk)
        del fields["vocab_size"]
    try:
        return TXLConfig(extra=extra, **words, **fields)
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


def _io_map(config: TXLConfig) -> dict[str, list[str]]:
    """Embedding and output tensors: our name -> the reference's names (several when the
    tensor is tied: every copy present must agree)."""
    if not config.adaptive:
        return {
            "embedding.weight": [
                "transformer.word_emb.emb_layers.0.weight",
                "crit.out_layers.0.weight",
            ],
            "lm_bias": ["crit.out_layers.0.bias"],
        }
    emb, crit = "transformer.word_emb", "crit"
    n_tables = len(config.embed_dims)  # 1 with div_val 1: slices of one table
    names = {}
    for i in range(n_tables):
        names[f"embedding.layers.{i}.weight"] = [
            f"{emb}.emb_layers.{i}.weight",
            f"{crit}.out_layers.{i}.weight",
        ]
        names[f"softmax.biases.{i}"] = [f"{crit}.out_layers.{i}.bias"]
        if config.projected:
            names[f"embedding.projs.{i}"] = [f"{emb}.emb_projs.{i}"]
    if config.cutoffs:
        names["softmax.cluster_weight"] = [f"{crit}.cluster_weight"]
        names["softmax.cluster_bias"] = [f"{crit}.cluster_bias"]
    for i, tied in enumerate(config.tied_projections):
        if not config.projected:
            continue  # no projections at all: transformers stores None
        own = f"{crit}.out_projs.{i}"
        if tied:  # the input's projection; a stored copy must be the same tensor
            names[f"embedding.projs.{0 if config.div_val == 1 else i}"].append(own)
        else:
            names[f"softmax.projs.{i}"] = [own]
    return names


def map_state(
    hf_config: dict, hf_state: dict, vocab: list[str] | None = None
) -> tuple[TXLConfig, dict]:
    """(TXLConfig, our state dict) from a transformers config.json dict and state dict:
    the tensors renamed, tied copies checked, any missing or unexpected tensor named."""
    config = txl_config_from_hf(hf_config, vocab)
    used = {"transformer.pos_emb.inv_freq"}  # a buffer we recompute
    missing = []
    state = {}

    names = {
        ours: [theirs] for n in range(config.n_layer) for ours, theirs in _layer_map(n).items()
    }
    names.update(_io_map(config))
    for ours, theirs in names.items():
        what = f"the same tensor as {theirs[0]} (tied)" if len(theirs) > 1 else theirs[0]
        state[ours] = _take_shared(hf_state, theirs, what, used, missing)
    state.update(_biases(config, hf_state, used, missing))
    if missing:
        raise UnsupportedCheckpoint(f"checkpoint lacks tensors: {', '.join(missing)}")

    unexpected = sorted(set(hf_state) - used)
    if unexpected:
        raise UnsupportedCheckpoint(f"checkpoint has unexpected tensors: {', '.join(unexpected)}")
    return config, {k: v.detach().to(torch.float32).contiguous() for k, v in state.items()}
