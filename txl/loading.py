"""Loading a model: config.json + model.safetensors from a folder or a Hub repo id.

``TransformerXL.from_pretrained`` is ``from_pretrained`` below; ``save_pretrained`` and
``push_to_hub`` are huggingface_hub's ``PyTorchModelHubMixin``'s. txl/hub.py finds the
files (a folder, the Hub, the converted cache); this module reads them. Strict: weights
that do not match the config are an error, and every failure is a ``TXLLoadError`` that
names the source, the file and the cause. Weights are read from safetensors only (no
torch.load); a transformers TransfoXL checkpoint is converted on the fly
(txl/hf_format.py), its word vocabulary read without running its pickles (txl/vocab.py).
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model
from torch import nn

from .config import TXLConfig
from .hf_format import is_transfo_xl_config, map_state, txl_config_from_hf
from .hub import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    TXLLoadError,
    converted_cache_dir,
    fetch_file,
    snapshot_commit,
)
from .vocab import VOCAB_FILES, load_word_vocab

Model = TypeVar("Model", bound=nn.Module)  # TransformerXL (txl/model.py, which imports this)


def from_pretrained(
    cls: type[Model],
    pretrained_model_name_or_path: str,
    *,
    revision: str | None = None,
    cache_dir: str | None = None,
    force_download: bool = False,
    local_files_only: bool = False,
    token: str | bool | None = None,
    map_location: str = "cpu",
    dtype: torch.dtype | None = None,
) -> Model:
    """Load config.json + model.safetensors from a folder or a Hub repo id.

    A transformers TransfoXL checkpoint (``model_type: transfo-xl``, such as the
    paper's ``transfo-xl/transfo-xl-wt103``) is recognised by its config.json,
    converted on the fly with its word vocabulary (read without running pickles) and,
    when it came from the Hub, kept converted under $TXL_CACHE for the next load.

    Strict: weights that do not match the config are an error. Every failure is a
    TXLLoadError naming the source, the file and the cause. ``dtype`` (e.g.
    torch.bfloat16, half the memory) converts the loaded weights. Returns the model in
    eval mode. (Weights are read from safetensors only: no torch.load.)
    """
    source = str(pretrained_model_name_or_path)
    hub = dict(
        cache_dir=cache_dir,
        force_download=force_download,
        local_files_only=local_files_only,
        token=token,
    )
    config_file = fetch_file(source, CONFIG_NAME, revision, **hub)
    data = _read_config_json(source, config_file)
    if is_transfo_xl_config(data):
        model = _from_transfo_xl(cls, source, data, config_file, revision, hub)
    else:
        model = _from_txl(cls, source, data, fetch_file(source, WEIGHTS_NAME, revision, **hub))
    return model.to(device=map_location, dtype=dtype).eval()


def load_config(source: str, revision: str | None = None, **hub) -> TXLConfig:
    """The TXLConfig of a folder or Hub repo, from config.json alone (to check a model
    before downloading its weights). A transformers TransfoXL config is converted; its
    vocabulary is not read (``vocab`` is None, ``vocab_size`` is right)."""
    data = _read_config_json(source, fetch_file(source, CONFIG_NAME, revision, **hub))
    try:
        if is_transfo_xl_config(data):
            return txl_config_from_hf(data)
        return TXLConfig.from_dict(data)
    except (ValueError, TypeError) as e:  # includes UnsupportedCheckpoint
        raise TXLLoadError(f"{source}: {CONFIG_NAME} is not a valid txl config: {e}") from None


def _from_txl(cls: type[Model], source: str, data: dict, weights_file: Path) -> Model:
    """A model from our own config (as a dict) and model.safetensors."""
    try:
        model = cls(TXLConfig.from_dict(data))  # torch / the tokenizer check the values
    except (ValueError, TypeError) as e:
        raise TXLLoadError(f"{source}: {CONFIG_NAME} is not a valid txl config: {e}") from None
    with _weight_errors(source):
        load_model(model, str(weights_file), strict=True)
    return model


def _from_transfo_xl(
    cls: type[Model], source: str, hf_config: dict, config_file: Path, revision, hub: dict
) -> Model:
    """Convert a transformers TransfoXL checkpoint (config, weights, vocabulary); a Hub
    download is converted once per commit and then read from the converted cache."""
    commit = snapshot_commit(Path(config_file))
    cache = converted_cache_dir(source, commit) if commit else None
    if cache is not None and (cache / WEIGHTS_NAME).is_file() and not hub["force_download"]:
        return cls.from_pretrained(cache)
    weights_file = fetch_file(source, WEIGHTS_NAME, revision, **hub)
    found = {name: fetch_file(source, name, revision, optional=True, **hub) for name in VOCAB_FILES}
    vocab_files = {name: path for name, path in found.items() if path is not None}
    with _weight_errors(source):
        hf_state = load_file(weights_file)
    try:
        vocab = load_word_vocab(vocab_files) if vocab_files else None
        config, state = map_state(hf_config, hf_state, vocab)
    except (ValueError, OSError) as e:  # UnsupportedCheckpoint, UnsafePickleError, ...
        raise TXLLoadError(f"{source}: cannot convert this TransfoXL checkpoint: {e}") from None
    model = cls(config)
    with _weight_errors(source):
        model.load_state_dict(state, strict=True)
    if cache is not None:  # written aside, then renamed: a reader never sees half of it
        partial = cache.with_name(f"{cache.name}.partial-{os.getpid()}")
        model.save_pretrained(partial)
        try:
            partial.rename(cache)
        except OSError:  # another process converted it first
            shutil.rmtree(partial, ignore_errors=True)
    return model


@contextmanager
def _weight_errors(source: str):
    """Reading or loading model.safetensors: a damaged file, or tensors that do not fit
    the config, become a TXLLoadError that says which."""
    try:
        yield
    except SafetensorError as e:
        raise TXLLoadError(f"{source}: {WEIGHTS_NAME} is damaged or not safetensors: {e}") from None
    except RuntimeError as e:
        raise TXLLoadError(
            f"{source}: {WEIGHTS_NAME} does not match {CONFIG_NAME}: {str(e)[:600]}"
        ) from None


def _read_config_json(source: str, path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    except (ValueError, UnicodeDecodeError) as e:  # includes json.JSONDecodeError
        raise TXLLoadError(f"{source}: {CONFIG_NAME} is not a valid txl config: {e}") from None
    return data
