"""Transformer-XL (Dai et al., 2019, "Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context"), as the original code and Hugging Face's TransfoXL compute it.

Shapes: B batch, T tokens in the current segment, M memory positions, K = M + T keys,
d = d_model, H heads of width Dh. Tensors are batch-first: hidden states are [B, T, d].

Each layer attends over [memory | current segment]. The memory of layer l is the INPUT of
layer l at the previous segments (mems[0] is the embedding output), cached without
gradient. Positions enter only through the relative distance i - j between a query and a
key, so cached states keep their meaning when the segment moves on.

Attention score of query i and key j (paper, eq. in section 3.3), with distance
Δ = M + i - j, u and v learned vectors shared by all positions:

    A[i, j] = (q_i + u) · k_j        (a) content + (c) global content bias
            + (q_i + v) · W_r R_Δ    (b) content-position + (d) global position bias

R_Δ = [sin(Δ ω) | cos(Δ ω)] is the sinusoid of the distance, ω_k = 1 / 10000^(2k/d).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model
from torch import Tensor, nn

from . import tokenizer as tokenizers
from .adaptive import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax
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


@dataclass
class TXLOutput:
    logits: Tensor | None  # [B, T, vocab] scores of the next token (None when targets given)
    mems: list[Tensor]  # per layer [B, min(M + T, mem_len), d]: the memory for the next call
    attentions: list[Tensor] | None = None  # per layer [B, H, T, K]; rows sum to 1
    nll: Tensor | None = None  # [B, T] -log p(target) in nats, when targets were given


@dataclass
class CachedOutput:
    logits: Tensor | None  # [B, T, vocab] ([B, 1, vocab] with last_only; None with targets)
    memory: KVMemory  # the same object that was passed in, advanced by T positions
    attentions: list[Tensor] | None = None  # per layer [B, H, T, K]
    nll: Tensor | None = None  # [B, T], when targets were given


class KVMemory:
    """The memory as each layer's keys and values: what generation keeps between calls.

    A layer's memory is a list of cached hidden states x, but attention only ever uses
    W_k x and W_v x. The reference re-projects all M cached states at every step (M·d²
    work per layer per token); projecting each state once, when it enters the memory,
    gives the same numbers for the cost of one position. Keys and values sit in buffers
    with spare room, so a step writes one position instead of copying all M.
    ``TransformerXL.forward_cached`` advances it in place.
    """

    def __init__(self) -> None:
        self.k: list[Tensor] = []  # per layer [B, H, capacity, Dh]
        self.v: list[Tensor] = []
        self.start = self.end = 0  # the memory is buffer[:, :, start:end]

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values in the memory (the buffers hold up to 25 % more)."""
        return sum(t[:, :, self.start : self.end].nbytes for t in self.k + self.v)

    def truncate(self, mem_len: int) -> None:
        """Keep only the newest mem_len positions."""
        self.start = max(self.start, self.end - max(0, mem_len))

    def drop_last(self, n: int = 1) -> None:
        """Forget the newest n positions (to feed them again over a different memory)."""
        self.end = max(self.start, self.end - n)

    def clone(self) -> KVMemory:
        copy = KVMemory()
        copy.k = [t.clone() for t in self.k]
        copy.v = [t.clone() for t in self.v]
        copy.start, copy.end = self.start, self.end
        return copy

    def reserve(self, shape: tuple[int, int, int, int], T: int, dtype, device) -> None:
        """Make room for T more positions; shape is (n_layer, B, H, Dh)."""
        n_layer, B, H, Dh = shape
        if self.k and self.k[0].size(0) != B:
            raise ValueError(f"this memory holds a batch of {self.k[0].size(0)}, not {B}")
        if self.k and self.end + T <= self.k[0].size(2):
            return
        M = len(self)
        # Compact and grow, with 25 % spare room: a copy of M positions every M / 4 steps
        # is amortised O(1) per step, and a big model's memory stays close to its size.
        capacity = M + T + max(64, (M + T) // 4)
        for buffers in (self.k, self.v):
            for layer in range(n_layer):
                fresh = torch.empty(B, H, capacity, Dh, dtype=dtype, device=device)
                if len(buffers) > layer:
                    fresh[:, :, :M] = buffers[layer][:, :, self.start : self.end]
                    buffers[layer] = fresh
                else:
                    buffers.append(fresh)
        self.start, self.end = 0, M

    def extend(self, layer: int):
        """memory_kv for one layer: write the segment's keys and values after the memory
        and return views of [memory | segment]."""

        def memory_kv(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
            stop = self.end + k.size(2)
            self.k[layer][:, :, self.end : stop] = k
            self.v[layer][:, :, self.end : stop] = v
            return self.k[layer][:, :, self.start : stop], self.v[layer][:, :, self.start : stop]

        return memory_kv

    def commit(self, T: int, mem_len: int) -> None:
        """The segment's T positions join the memory; the newest mem_len are kept."""
        self.end += T
        self.truncate(mem_len)

    # ---- offload (txl.budget): the whole state as named tensors, and back ----------------
    # Generic on purpose: every tensor, list-of-tensors and int attribute is saved by name,
    # whatever the buffers' layout, so the memory read back is bit for bit the one written.

    def to_tensors(self) -> dict[str, Tensor]:
        """All the state: "tensor.<name>", "list.<name>.<i>" (with "list.<name>.len")
        and "int.<name>" (a 0-d int64 tensor). The tensors are the buffers, not copies."""
        out: dict[str, Tensor] = {}
        for name, value in vars(self).items():
            if isinstance(value, Tensor):
                out[f"tensor.{name}"] = value
            elif isinstance(value, list) and all(isinstance(t, Tensor) for t in value):
                out[f"list.{name}.len"] = torch.tensor(len(value), dtype=torch.int64)
                out.update({f"list.{name}.{i}": t for i, t in enumerate(value)})
            elif isinstance(value, int) and not isinstance(value, bool):
                out[f"int.{name}"] = torch.tensor(value, dtype=torch.int64)
            else:
                raise TypeError(f"KVMemory.{name}: cannot save a {type(value).__name__}")
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor]) -> KVMemory:
        """The KVMemory that to_tensors() described (the tensors are used as they are)."""
        memory = cls()
        for key, value in tensors.items():
            kind, name = key.split(".", 1)
            if kind == "tensor":
                setattr(memory, name, value)
            elif kind == "int":
                setattr(memory, name, int(value))
            elif kind == "list" and name.endswith(".len"):
                name = name.removesuffix(".len")
                setattr(memory, name, [tensors[f"list.{name}.{i}"] for i in range(int(value))])
        return memory


def make_tokenizer(config: TXLConfig):
    """The tokenizer of config.vocab (characters or words), None without a vocab."""
    if not config.vocab:
        return None
    if config.tokenizer == "word":
        unk = {"unk_symbol": config.unk_symbol} if config.unk_symbol else {}
        return tokenizers.WordTokenizer(config.vocab, **unk)
    return tokenizers.CharTokenizer(config.vocab, config.unk_symbol)


def _prepend(mem_k: Tensor, mem_v: Tensor):
    """memory_kv for hidden-state memory: concatenate the projected memory in front."""
    return lambda k, v: (torch.cat([mem_k, k], dim=2), torch.cat([mem_v, v], dim=2))


def rel_shift(x: Tensor) -> Tensor:
    """Re-index scores by distance into scores by key position.

    In: x [..., T, K] where column c holds distance K - 1 - c (the order of R).
    Out: [..., T, K] where column j holds distance M + i - j for query i (M = K - T).
    The entries with j > M + i (future keys, always masked) receive other values.

    The trick of the original code: pad one zero column in front, read the [T, K + 1]
    block as [K + 1, T], drop the first row, and read it back as [T, K]. Each row ends up
    shifted left by T - 1 - i, which is exactly the offset between the two orders.
    """
    *lead, T, K = x.shape
    padded = F.pad(x, (1, 0))  # [..., T, K + 1]
    return padded.view(*lead, K + 1, T)[..., 1:, :].reshape(*lead, T, K)


class RelativePositionalEncoding(nn.Module):
    """R_Δ = [sin(Δ ω) | cos(Δ ω)] for the distances Δ given (all sines, then all cosines)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = d_model

    def forward(self, distances: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """[K] -> [K, d] in dtype. ω is float32 as in the original code; the angles are
        computed in at least float32 (bfloat16 cannot hold Δω for Δ in the thousands)."""
        d = self.d_model
        inv_freq = 1.0 / (10000 ** (torch.arange(0.0, d, 2.0, device=distances.device) / d))
        work = torch.promote_types(dtype, torch.float32)
        angles = torch.outer(distances.to(work), inv_freq.to(work))  # [K, d/2]
        return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)


class RelMultiHeadAttention(nn.Module):
    """Relative multi-head attention over [memory | current segment] (the "dec_attn")."""

    def __init__(self, cfg: TXLConfig):
        super().__init__()
        self.n_head, self.d_head, self.pre_lnorm = cfg.n_head, cfg.d_head, cfg.pre_lnorm
        self.scale = 1.0 / math.sqrt(cfg.d_head)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.n_head * cfg.d_head, bias=False)
        self.r_proj = nn.Linear(cfg.d_model, cfg.n_head * cfg.d_head, bias=False)  # W_r
        self.out = nn.Linear(cfg.n_head * cfg.d_head, cfg.d_model, bias=False)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_epsilon)
        self.drop = nn.Dropout(cfg.dropout)
        self.dropatt = nn.Dropout(cfg.dropatt)

    def _heads(self, x: Tensor) -> Tensor:  # [B, S, H*Dh] -> [B, H, S, Dh]
        B, S, _ = x.shape
        return x.view(B, S, self.n_head, self.d_head).transpose(1, 2)

    def project_kv(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values [B, H, S, Dh] of hidden states h [B, S, d] (memory or segment)."""
        x = self.norm(h) if self.pre_lnorm else h
        w_kv = self.qkv.weight[self.n_head * self.d_head :]
        k, v = F.linear(x, w_kv).chunk(2, dim=-1)
        return self._heads(k), self._heads(v)

    def position_keys(self, r: Tensor) -> Tensor:
        """W_r R: [K, d] -> [H, K, Dh]."""
        return self.r_proj(r).view(-1, self.n_head, self.d_head).transpose(0, 1)

    def forward(
        self,
        h: Tensor,  # [B, T, d] the current segment
        memory_kv,  # (k, v) [B, H, T, Dh] of the segment -> (k, v) [B, H, K, Dh] of [mem | seg]
        r_k: Tensor,  # [H, K, Dh] position keys for distances K-1 ... 0
        u: Tensor,  # [H, Dh] global content bias
        v_bias: Tensor,  # [H, Dh] global position bias (the paper's v)
        mask: Tensor | None,  # [T, K] True where query i must not see key j
        need_probs: bool,
    ) -> tuple[Tensor, Tensor | None]:
        x = self.norm(h) if self.pre_lnorm else h
        q, k, v = (self._heads(t) for t in self.qkv(x).chunk(3, dim=-1))  # [B, H, T, Dh]
        k, v = memory_kv(k, v)  # prepend the memory's keys and values: [B, H, K, Dh]

        content = (q + u[:, None]) @ k.transpose(-1, -2)  # (a)+(c): [B, H, T, K]
        position = (q + v_bias[:, None]) @ r_k.transpose(-1, -2)  # (b)+(d), by distance
        if q.size(2) > 1:  # one query needs no shift: its row already lines up
            position = rel_shift(position)
        scores = (content + position) * self.scale
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        probs = self.dropatt(scores.softmax(dim=-1))  # [B, H, T, K]

        attn = (probs @ v).transpose(1, 2).flatten(2)  # [B, T, H*Dh]
        attn = self.drop(self.out(attn))
        h = h + attn if self.pre_lnorm else self.norm(h + attn)
        return h, (probs if need_probs else None)


class PositionwiseFF(nn.Module):
    """FF(x) = W2 ReLU(W1 x + b1) + b2, with a residual and a LayerNorm (pre or post)."""

    def __init__(self, cfg: TXLConfig):
        super().__init__()
        self.pre_lnorm = cfg.pre_lnorm
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_inner)
        self.fc2 = nn.Linear(cfg.d_inner, cfg.d_model)
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_epsilon)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, h: Tensor) -> Tensor:
        x = self.norm(h) if self.pre_lnorm else h
        y = self.drop(self.fc2(self.drop(F.relu(self.fc1(x)))))
        return h + y if self.pre_lnorm else self.norm(h + y)


class XLLayer(nn.Module):
    def __init__(self, cfg: TXLConfig):
        super().__init__()
        self.attn = RelMultiHeadAttention(cfg)
        self.ff = PositionwiseFF(cfg)
        if cfg.untie_r:  # this layer's own u and v
            self.u = nn.Parameter(torch.zeros(cfg.n_head, cfg.d_head))
            self.v = nn.Parameter(torch.zeros(cfg.n_head, cfg.d_head))

    def forward(self, h, memory_kv, r_k, u, v, mask, need_probs):
        h, probs = self.attn(h, memory_kv, r_k, u, v, mask, need_probs)
        return self.ff(h), probs


class TransformerXL(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="txl",
    tags=["transformer-xl", "text-generation", "character-level"],
    pipeline_tag="text-generation",
    license="mit",
    repo_url="https://github.com/txl-project/txl",
):
    """Transformer-XL language model: embedding, n_layer XL layers, tied output layer.

    ``model.mem_len`` (initially ``config.mem_len``) sets how many positions each layer
    keeps; change it at any time, longer or shorter than the model was trained with.

    The embedding and output layer are a plain table E (logits = h E^T + b) or, with
    ``config.adaptive``, the adaptive pair of txl/adaptive.py, whose ``logits`` are
    log-probabilities (the same distribution under softmax).
    """

    def __init__(self, config: TXLConfig):
        super().__init__()
        if isinstance(config, dict):  # the Hub mixin hands a plain dict on some paths
            config = TXLConfig.from_dict(config)
        self.config = config
        self.mem_len = config.mem_len
        d = config.d_model
        if config.adaptive:
            self.embedding = AdaptiveEmbedding(config)
            self.softmax = ProjectedAdaptiveLogSoftmax(config, self.embedding)
        else:
            self.embedding = nn.Embedding(config.vocab_size, d)
            self.lm_bias = nn.Parameter(torch.zeros(config.vocab_size))  # weight: tied
        self.pos_enc = RelativePositionalEncoding(d)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(XLLayer(config) for _ in range(config.n_layer))
        if not config.untie_r:  # one u and v shared by every layer
            self.u = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.v = nn.Parameter(torch.zeros(config.n_head, config.d_head))
        self._tokenizer = make_tokenizer(config)
        self._position_table = None  # inference cache of W_r R, see position_keys_cached
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """Normal(0, std) weights, zero biases, unit LayerNorms (the original code's init)."""
        for name, p in self.named_parameters():
            if "norm" in name:
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            elif "bias" in name:  # fc biases, lm_bias, the adaptive softmax's biases
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0.0, std)

    @property
    def tokenizer(self) -> tokenizers.CharTokenizer | tokenizers.WordTokenizer | None:
        """The model's tokenizer, or None for a model that came without a symbol list."""
        return self._tokenizer

    def biases(self, layer: int) -> tuple[Tensor, Tensor]:
        """(u, v) of a layer: its own when untie_r, else the shared pair."""
        owner = self.layers[layer] if self.config.untie_r else self
        return owner.u, owner.v

    # ---- the pieces of a forward pass -------------------------------------------------

    def attention_mask(self, T: int, M: int, mem_len: int, device=None) -> Tensor | None:
        """[T, K] True where query i may not see key j (None when nothing is hidden).

        Causal: key j is in the future of query i when j > M + i.
        same_length: also hide keys so far back that every query sees the same number of
        keys (the reference's rule: hide j <= i - shift, shift = T - max(0, K - mem_len)
        when K > mem_len, else T; a query always sees at least itself).
        """
        if T == 1 and not self.config.same_length:
            return None  # one query has no future keys (the generation hot path)
        K = M + T
        ones = torch.ones(T, K, dtype=torch.bool, device=device)
        mask = torch.triu(ones, diagonal=1 + M)
        if self.config.same_length:
            overflow = K - mem_len
            shift = T - overflow if overflow > 0 else T
            # Each query sees M + shift keys; mem_len 0 would make that 0 (NaN): keep >= 1.
            mask = mask | torch.tril(ones, diagonal=-max(shift, 1 - M))
        return mask if mask.any() else None

    def distances(self, K: int, device=None) -> Tensor:
        """Distances K-1 ... 0 of the keys from the last query, clamped to clamp_len."""
        pos = torch.arange(K - 1, -1, -1.0, device=device)
        if self.config.clamp_len > 0:
            pos = pos.clamp(max=self.config.clamp_len)
        return pos

    def embed(self, input_ids: Tensor) -> Tensor:
        """Token embedding scaled by sqrt(d_model): [B, T] -> [B, T, d]."""
        return self.embedding(input_ids) * math.sqrt(self.config.d_model)

    def lm_head(self, h: Tensor) -> Tensor:
        """Scores of the next token, [B, T, d] -> [B, T, vocab]: the tied output layer
        h E^T + b, or the adaptive softmax's log-probabilities."""
        if self.config.adaptive:
            return self.softmax.log_probs(h)
        return F.linear(h, self.embedding.weight, self.lm_bias)

    def token_nll(self, h: Tensor, targets: Tensor) -> Tensor:
        """-log p(targets) in nats, [B, T, d] and [B, T] -> [B, T] (at least float32).
        The adaptive softmax computes only the clusters the targets fall in."""
        if self.config.adaptive:
            return self.softmax.nll(h, targets)
        logits = self.lm_head(h)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")

    def _head(self, h: Tensor, targets: Tensor | None, last_only: bool = False) -> dict:
        """The output fields: nll when targets are given, else logits (of every position,
        or of the last one only)."""
        if targets is not None:
            return dict(logits=None, nll=self.token_nll(h, targets))
        return dict(logits=self.lm_head(h[:, -1:] if last_only else h))

    def _check_input(self, input_ids: Tensor) -> None:
        if input_ids.dim() != 2 or input_ids.dtype != torch.long:
            raise ValueError(
                f"input_ids must be a LongTensor [batch, time], got {tuple(input_ids.shape)} "
                f"{input_ids.dtype}"
            )
        if input_ids.numel() and not (
            int(input_ids.min()) >= 0 and int(input_ids.max()) < self.config.vocab_size
        ):
            raise ValueError(f"token ids must lie in 0..{self.config.vocab_size - 1}")

    def _layers(self, h, memory_kv, r_k, mask, output_attentions):
        """Run every layer; memory_kv[l] prepends layer l's memory to its keys and values.
        Returns the output, each layer's input, and the attentions (or None)."""
        inputs, attentions = [], []
        for i, layer in enumerate(self.layers):
            inputs.append(h)
            u, v = self.biases(i)
            h, probs = layer(h, memory_kv[i], r_k[i], u, v, mask, output_attentions)
            attentions.append(probs)
        return self.drop(h), inputs, (attentions if output_attentions else None)

    # ---- the forward pass -------------------------------------------------------------

    def forward(
        self,
        input_ids: Tensor,
        mems: list[Tensor] | None = None,
        output_attentions: bool = False,
        mem_len: int | None = None,
        targets: Tensor | None = None,
    ) -> TXLOutput:
        """input_ids [B, T]; mems None (empty memory) or the previous call's ``out.mems``.
        targets [B, T] (the next token of each position): return ``nll``, not ``logits``."""
        self._check_input(input_ids)
        mem_len = self.mem_len if mem_len is None else mem_len
        B, T = input_ids.shape
        if mems is None:
            mems = [input_ids.new_zeros(B, 0, self.config.d_model, dtype=torch.float)] * len(
                self.layers
            )
        M = mems[0].size(1)
        K = M + T

        h = self.drop(self.embed(input_ids))  # [B, T, d]
        r = self.drop(self.pos_enc(self.distances(K, input_ids.device), h.dtype))  # [K, d]
        r_k = [layer.attn.position_keys(r) for layer in self.layers]  # [H, K, Dh] each
        memory_kv = [
            _prepend(*layer.attn.project_kv(m.to(h.dtype))) for layer, m in zip(self.layers, mems)
        ]
        mask = self.attention_mask(T, M, mem_len, input_ids.device)

        h, inputs, attentions = self._layers(h, memory_kv, r_k, mask, output_attentions)

        # New memory: each layer's input appended to its old memory, newest mem_len kept.
        with torch.no_grad():
            new_mems = [torch.cat([m, x], dim=1) for m, x in zip(mems, inputs)]
            new_mems = [m[:, max(0, m.size(1) - mem_len) :].detach() for m in new_mems]
        return TXLOutput(mems=new_mems, attentions=attentions, **self._head(h, targets))

    # ---- inference: keys and values cached ---------------------------------------------

    def position_keys_cached(self, K: int, device, dtype) -> list[Tensor]:
        """W_r R for distances K-1 ... 0, per layer [H, K, Dh], from a table kept between
        calls (it depends only on the weights). Rebuilt when the weights change or a longer
        memory needs more distances."""
        weights = [layer.attn.r_proj.weight for layer in self.layers]
        key = (
            device,
            dtype,
            self.config.clamp_len,
            tuple((w.data_ptr(), w._version) for w in weights),
        )
        table = self._position_table
        if table is None or table[0] != key or table[1] < K - 1:
            longest = max(2 * (K - 1), 256)
            r = self.pos_enc(self.distances(longest + 1, device), dtype)  # longest ... 0
            table = (key, longest, [layer.attn.position_keys(r) for layer in self.layers])
            self._position_table = table
        _, longest, keys = table
        return [k[:, longest - (K - 1) :] for k in keys]

    @torch.no_grad()
    def forward_cached(
        self,
        input_ids: Tensor,
        memory: KVMemory | None = None,
        output_attentions: bool = False,
        mem_len: int | None = None,
        targets: Tensor | None = None,
        last_only: bool = False,
    ) -> CachedOutput:
        """The forward pass for generation: the memory is kept as keys and values.

        Same logits as ``forward`` with the equivalent hidden-state memory; ``memory`` is
        advanced in place (a new one is made when None). Inference only (eval mode).
        last_only: logits of the last position only (all that sampling needs; a 64-token
        prompt segment over 267k words would otherwise make 17M scores).
        """
        if self.training:
            raise RuntimeError("forward_cached is for inference: call model.eval() first")
        self._check_input(input_ids)
        mem_len = self.mem_len if mem_len is None else mem_len
        memory = KVMemory() if memory is None else memory
        B, T = input_ids.shape
        h = self.embed(input_ids)
        cfg = self.config
        memory.reserve((cfg.n_layer, B, cfg.n_head, cfg.d_head), T, h.dtype, h.device)
        M = len(memory)
        r_k = self.position_keys_cached(M + T, h.device, h.dtype)
        mask = self.attention_mask(T, M, mem_len, h.device)
        memory_kv = [memory.extend(layer) for layer in range(cfg.n_layer)]
        h, _, attentions = self._layers(h, memory_kv, r_k, mask, output_attentions)
        memory.commit(T, mem_len)
        return CachedOutput(
            memory=memory, attentions=attentions, **self._head(h, targets, last_only)
        )

    # ---- loading: strict, with errors that name the file --------------------------------

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str,
        *,
        revision: str | None = None,
        cache_dir: str | None = None,
        force_download: bool = False,
        local_files_only: bool = False,
        token: str | bool | None = None,
        map_location: str = "cpu",
        dtype: torch.dtype | None = None,
    ) -> TransformerXL:
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
            model = cls._from_transfo_xl(source, data, config_file, revision, hub)
        else:
            model = cls._from_txl(source, data, fetch_file(source, WEIGHTS_NAME, revision, **hub))
        return model.to(device=map_location, dtype=dtype).eval()

    @staticmethod
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

    @classmethod
    def _from_txl(cls, source: str, data: dict, weights_file: Path) -> TransformerXL:
        """A model from our own config (as a dict) and model.safetensors."""
        try:
            model = cls(TXLConfig.from_dict(data))  # torch / the tokenizer check the values
        except (ValueError, TypeError) as e:
            raise TXLLoadError(f"{source}: {CONFIG_NAME} is not a valid txl config: {e}") from None
        with _weight_errors(source):
            load_model(model, str(weights_file), strict=True)
        return model

    @classmethod
    def _from_transfo_xl(
        cls, source: str, hf_config: dict, config_file: Path, revision, hub: dict
    ) -> TransformerXL:
        """Convert a transformers TransfoXL checkpoint (config, weights, vocabulary); a Hub
        download is converted once per commit and then read from the converted cache."""
        commit = snapshot_commit(Path(config_file))
        cache = converted_cache_dir(source, commit) if commit else None
        if cache is not None and (cache / WEIGHTS_NAME).is_file() and not hub["force_download"]:
            return cls.from_pretrained(cache)
        weights_file = fetch_file(source, WEIGHTS_NAME, revision, **hub)
        found = {
            name: fetch_file(source, name, revision, optional=True, **hub) for name in VOCAB_FILES
        }
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
