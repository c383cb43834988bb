"""TXLConfig: every number the model's math needs, round-tripped through config.json."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TXLConfig:
    """Hyper-parameters of a Transformer-XL (names follow the paper and the original code).

    A character model carries its symbol list in ``vocab``; a converted checkpoint that
    came without one sets only ``vocab_size`` and works on token ids.
    """

    vocab: list[str] | None = None  # symbol of each token id (character models)
    vocab_size: int = 0  # derived from vocab when vocab is given
    d_model: int = 256  # width of the residual stream
    n_layer: int = 6
    n_head: int = 8
    d_head: int = 32  # per-head width; n_head * d_head need not equal d_model
    d_inner: int = 1024  # hidden width of the position-wise feed-forward
    dropout: float = 0.1  # on embeddings, R, attention output and inside the feed-forward
    dropatt: float = 0.0  # on attention probabilities
    tgt_len: int = 64  # segment length used in training (and the no-memory window)
    mem_len: int = 256  # how many cached hidden states each layer keeps
    clamp_len: int = -1  # distances above this use this distance's encoding (<= 0: off)
    same_length: bool = False  # every query sees the same number of keys
    pre_lnorm: bool = False  # LayerNorm before (True) or after (False) each sub-layer
    untie_r: bool = True  # a u and v per layer (True) or one pair shared by all layers
    layer_norm_epsilon: float = 1e-5
    unk_symbol: str | None = None  # what tokenizer.encode(errors="replace") substitutes
    extra: dict = field(default_factory=dict)  # free-form provenance (not used by the math)

    def __post_init__(self) -> None:
        if self.vocab is not None:
            self.vocab = list(self.vocab)
            if len(set(self.vocab)) != len(self.vocab):
                raise ValueError("vocab has repeated symbols")
            if self.vocab_size not in (0, len(self.vocab)):
                raise ValueError(
                    f"vocab_size={self.vocab_size} but vocab has {len(self.vocab)} symbols"
                )
            self.vocab_size = len(self.vocab)
        if self.vocab_size <= 0:
            raise ValueError("a TXLConfig needs a vocab or a positive vocab_size")
        for name in ("d_model", "n_layer", "n_head", "d_head", "d_inner", "tgt_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.mem_len < 0:
            raise ValueError(f"mem_len must be >= 0, got {self.mem_len}")
        if self.d_model % 2:
            raise ValueError("d_model must be even (sinusoids come in sin/cos pairs)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TXLConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TXLConfig fields: {', '.join(unknown)}")
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> TXLConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))
