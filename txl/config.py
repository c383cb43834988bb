"""TXLConfig: every number the model's math needs, round-tripped through config.json."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TXLConfig:
    """Hyper-parameters of a Transformer-XL (names follow the paper and the original code).

    A model carries its symbol list in ``vocab`` (characters, or words when ``tokenizer``
    is "word"); a converted checkpoint that came without one sets only ``vocab_size`` and
    works on token ids.

    Adaptive input and softmax (Baevski & Auli, 2019; the WikiText-103 model): ``cutoffs``
    split the vocabulary, sorted by frequency, into clusters [0, c0), [c0, c1), ...;
    cluster i is embedded in ``d_embed // div_val**i`` dimensions and projected to
    d_model, so rare words cost few parameters. No cutoffs, div_val 1 and d_embed ==
    d_model is the plain tied embedding and softmax.
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
    tokenizer: str = "char"  # how vocab's symbols make text: "char" or "word"
    # Adaptive input and softmax: cluster bounds (WT103: 20000, 40000, 200000), see above.
    cutoffs: list[int] = field(default_factory=list)
    div_val: int = 1  # cluster i is embedded in d_embed // div_val**i dimensions
    d_embed: int = 0  # embedding width of the first cluster (0: d_model)
    tie_projs: list[bool] = field(default_factory=list)  # per cluster: softmax uses the
    # embedding's projection (True) or its own (False); [] means all False
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
        self._check_adaptive()

    def _check_adaptive(self) -> None:
        if self.tokenizer not in ("char", "word"):
            raise ValueError(f"tokenizer must be 'char' or 'word', got {self.tokenizer!r}")
        self.cutoffs = [int(c) for c in self.cutoffs]
        bounds = [0, *self.cutoffs, self.vocab_size]
        if any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(
                f"cutoffs {self.cutoffs} must increase strictly inside (0, {self.vocab_size})"
            )
        if self.div_val < 1 or self.d_embed < 0:
            raise ValueError(
                f"div_val must be >= 1 and d_embed >= 0, got {self.div_val}, {self.d_embed}"
            )
        if self.d_embed == 0:
            self.d_embed = self.d_model
        if min(self.embed_dims) < 1:
            raise ValueError(
                f"d_embed {self.d_embed} / div_val {self.div_val} leaves a cluster "
                "with no dimensions"
            )
        self.tie_projs = [bool(t) for t in self.tie_projs]
        if self.tie_projs and len(self.tie_projs) != len(self.cutoffs) + 1:
            raise ValueError(f"tie_projs needs one entry per cluster ({len(self.cutoffs) + 1})")

    @property
    def adaptive(self) -> bool:
        """Whether the embedding and softmax are adaptive / projected (else plain, tied)."""
        return bool(self.cutoffs) or self.div_val != 1 or self.d_embed != self.d_model

    @property
    def cluster_bounds(self) -> list[int]:
        """[0, *cutoffs, vocab_size]: cluster i holds the ids [bounds[i], bounds[i + 1])."""
        return [0, *self.cutoffs, self.vocab_size]

    @property
    def embed_dims(self) -> list[int]:
        """Width of each embedding table: d_embed // div_val**i (one table if div_val 1)."""
        if self.div_val == 1:
            return [self.d_embed]
        return [self.d_embed // self.div_val**i for i in range(len(self.cutoffs) + 1)]

    @property
    def table_sizes(self) -> list[int]:
        """Rows of each embedding table: the whole vocabulary in one table with div_val 1
        (its clusters are slices of it), else one table per cluster."""
        if self.div_val == 1:
            return [self.vocab_size]
        bounds = self.cluster_bounds
        return [b - a for a, b in zip(bounds, bounds[1:])]

    @property
    def projected(self) -> bool:
        """Whether the embedding tables are projected to d_model (the P_i exist)."""
        return self.div_val != 1 or self.d_embed != self.d_model

    def cluster_dim(self, i: int) -> int:
        """Embedding width of cluster i (the width of its projection's second axis)."""
        return self.embed_dims[0 if self.div_val == 1 else i]

    @property
    def tied_projections(self) -> list[bool]:
        """tie_projs with one entry per cluster ([] means none is tied)."""
        return self.tie_projs or [False] * (len(self.cutoffs) + 1)

    def n_params(self) -> int:
        """Parameter count of the model this config builds (without building it)."""
        c, inner = self, self.n_head * self.d_head
        per_layer = (
            4 * inner * c.d_model  # q, k, v, W_r
            + inner * c.d_model  # output projection
            + 2 * c.d_model * c.d_inner
            + c.d_inner
            + c.d_model  # feed-forward
            + 4 * c.d_model  # two LayerNorms
            + (2 * inner if c.untie_r else 0)  # u, v
        )
        shared_r = 0 if c.untie_r else 2 * inner
        if not c.adaptive:
            return c.n_layer * per_layer + shared_r + c.vocab_size * (c.d_model + 1)
        dims = c.embed_dims
        embeddings = sum(n * d for n, d in zip(c.table_sizes, dims))
        emb_projs = c.d_model * sum(dims) if c.projected else 0
        n_clusters = len(c.cutoffs)
        head = n_clusters * (c.d_embed + 1) + c.vocab_size  # cluster weight + bias, biases
        out_projs = sum(
            c.d_model * c.cluster_dim(i)
            for i, tied in enumerate(c.tied_projections)
            if c.projected and not tied
        )
        return c.n_layer * per_layer + shared_r + embeddings + emb_projs + head + out_projs

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
