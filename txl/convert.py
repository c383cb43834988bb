"""Convert a Hugging Face transformers TransfoXL checkpoint into the txl format.

    python -m txl.convert SRC DST [--overwrite]

SRC is a folder written by ``TransfoXLLMHeadModel.save_pretrained`` (config.json plus
model.safetensors or pytorch_model.bin, possibly sharded), with its word vocabulary
(vocab.json, vocab.pkl or vocab.bin) when it has one. DST receives config.json,
model.safetensors and a model card, loadable with ``TransformerXL.from_pretrained(DST)``.

Plain and adaptive (cutoffs, div_val, d_embed != d_model) embeddings and softmaxes are
supported, with the output layer tied to the embedding as in every published checkpoint.
Anything else is refused with :class:`UnsupportedCheckpoint` (exit code 2 from the command
line), never loaded half-way. The mapping itself is txl/hf_format.py.

pytorch_model.bin is read with ``torch.load(weights_only=True)``, which refuses to run
code from the pickle; the vocabulary pickles are read by txl/vocab.py, which builds plain
data only.
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
from .hf_format import (
    SHARD_INDEXES,
    WEIGHT_FILES,
    UnsupportedCheckpoint,
    map_state,
    txl_config_from_hf,
)
from .model import TransformerXL
from .vocab import VOCAB_FILES, load_word_vocab

__all__ = ["UnsupportedCheckpoint", "convert_folder", "convert_state_dict", "main"]


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


def convert_state_dict(
    hf_config: dict, hf_state: dict, vocab: list[str] | None = None
) -> tuple[TXLConfig, dict]:
    """(TXLConfig, our state dict) for a transformers TransfoXLLMHeadModel.

    hf_config is the checkpoint's config.json as a dict. Raises UnsupportedCheckpoint for
    unsupported configs and for missing, unexpected or misshapen tensors, naming them.
    """
    config, state = map_state(hf_config, hf_state, vocab)
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
    vocab_files = {name: src / name for name in VOCAB_FILES if (src / name).is_file()}
    vocab = load_word_vocab(vocab_files) if vocab_files else None
    model = _load(*map_state(hf_config, load_hf_state(src), vocab))
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
