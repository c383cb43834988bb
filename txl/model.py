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
import operator
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
    terms: list[Tensor] | None = None  # per layer [4, B, H, T, K]: see score_terms


@dataclass
class CachedOutput:
    logits: Tensor | None  # [B, T, vocab] ([B, 1, vocab] with last_only; None with targets)
    memory: KVMemory  # the same object that was passed in, advanced by T positions
    attentions: list[Tensor] | None = None  # per layer [B, H, T, K]
    nll: Tensor | None = None  # [B, T], when targets were given
    terms: list[Tensor] | None = None  # per layer [4, B, H, T, K]: see score_terms


def _fingerprint(params: list[Tensor]) -> tuple[list[int], list[int]]:
    """Where each tensor's data lives and its version counter (moved by in-place writes):
    equal fingerprints mean nothing derived from the tensors has gone stale."""
    return list(map(Tensor.data_ptr, params)), list(map(_version, params))


_version = operator.attrgetter("_version")
LONG_ROW = 1024  # floats: a row this long streams at full speed in a one-row product


def _for_one_row(w: Tensor) -> Tensor:
    """A Linear's weight [out, in] as the right operand of x @ W^T for one row x: [in, out].

    One token's product is a matrix-vector product that streams W row by row, and MKL
    streams short rows slowly (this machine: 256-float rows 2.5x slower than 1024-float
    rows, either orientation). So W^T is a transposed view (rows of `in`) unless that
    makes short rows and the other orientation does not; then it is a copy (rows of
    `out`). The demo model copies W_qkv and W_1 (11 MB); from d_model 1024 up, nothing.
    """
    w = w.detach()
    n_out, n_in = w.shape
    return w.t().contiguous() if n_in < min(n_out, LONG_ROW) else w.t()


def _layer_norm_args(norm: nn.LayerNorm) -> tuple:
    return norm.normalized_shape, norm.weight.detach(), norm.bias.detach(), norm.eps


@dataclass(frozen=True)
class StepWeights:
    """One layer's weights as the one-token step reads them (``TransformerXL._step``).

    Transposed, so that each product is one ``mm``/``addmm`` of a row vector (views of the
    parameters where their rows are long, see ``_for_one_row``), and u, v stacked so that
    q + u and q + v are one add. Built once per model and rebuilt when a parameter
    changes (see ``TransformerXL.step_weights``).
    """

    pre_lnorm: bool
    w_qkv: Tensor  # [d, 3·H·Dh]  x @ w_qkv = [q | k | v]
    uv: Tensor  # [2, H, Dh]  (u, v): q + uv = (q + u, q + v)
    w_out: Tensor  # [H·Dh, d]
    norm_attn: tuple  # F.layer_norm's (shape, weight, bias, eps)
    w_ff1: Tensor  # [d, d_inner]
    b_ff1: Tensor  # [d_inner]
    w_ff2: Tensor  # [d_inner, d]
    b_ff2: Tensor  # [d]
    norm_ff: tuple

    @classmethod
    def of(cls, layer: XLLayer, u: Tensor, v: Tensor) -> StepWeights:
        attn, ff = layer.attn, layer.ff
        return cls(
            pre_lnorm=attn.pre_lnorm,
            w_qkv=_for_one_row(attn.qkv.weight),
            uv=torch.stack([u.detach(), v.detach()]),
            w_out=_for_one_row(attn.out.weight),
            norm_attn=_layer_norm_args(attn.norm),
            w_ff1=_for_one_row(ff.fc1.weight),
            b_ff1=ff.fc1.bias.detach(),
            w_ff2=_for_one_row(ff.fc2.weight),
            b_ff2=ff.fc2.bias.detach(),
            norm_ff=_layer_norm_args(ff.norm),
        )


@dataclass
class _PositionTable:
    """TransformerXL.position_keys_cached's table of W_r R and what it was made from."""

    setting: tuple  # (device, dtype, clamp_len)
    weights: list[Tensor]  # each layer's W_r ...
    fingerprint: tuple  # ... and their _fingerprint then
    longest: int  # distances longest ... 0
    keys: list[Tensor]  # per layer [H, Dh, longest + 1]
    last: tuple | None = None  # (K, [keys[:, :, -K:] per layer]) of the last call


class KVMemory:
    """The memory as each layer's keys and values: what generation keeps between calls.

    A layer's memory is a list of cached hidden states x, but attention only ever uses
    W_k x and W_v x. The reference re-projects all M cached states at every step (M·d²
    work per layer per token); projecting each state once, when it enters the memory,
    gives the same numbers for the cost of one position. Keys and values sit in buffers
    with spare room, so a step writes one position instead of copying all M.
    ``TransformerXL.forward_cached`` advances it in place.

    Layout (all state is in the tensor attributes k, v and the ints start, end):
    - ``v[layer]`` is a contiguous [B, H, capacity, Dh] buffer;
    - ``k[layer]`` reads the same way, [B, H, capacity, Dh], but is stored key-last: it is
      the transpose of a contiguous [B, H, Dh, capacity] buffer (``k[layer].mT`` is that
      buffer). A new token's scores q · K are then one matrix product over contiguous
      rows, with no transpose (see ``step_views``).
    - the memory is ``k[layer][:, :, start:end]`` and ``v[layer][:, :, start:end]``.
    ``to_tensors`` / ``from_tensors`` save and restore it, layout and all.
    """

    def __init__(self) -> None:
        self.k: list[Tensor] = []  # per layer [B, H, capacity, Dh], stored key-last
        self.v: list[Tensor] = []  # per layer [B, H, capacity, Dh]
        self.start = self.end = 0  # the memory is buffer[:, :, start:end]
        self._views: dict[int, tuple] = {}  # step_views' cache (derived, not state)

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values in the memory (the buffers hold up to 25 % more)."""
        return sum(t[:, :, self.start : self.end].nbytes for t in self.k + self.v)

    @property
    def buffer_bytes(self) -> int:
        """Bytes the buffers take, spare room included: what the memory holds in RAM."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @staticmethod
    def capacity(positions: int) -> int:
        """The positions a buffer is made with to hold ``positions``: 25 % spare room (at
        least 64), so that growing it, a copy of everything, is rare."""
        return positions + max(64, positions // 4)

    def truncate(self, mem_len: int) -> None:
        """Keep only the newest mem_len positions."""
        self.start = max(self.start, self.end - max(0, mem_len))

    def drop_last(self, n: int = 1) -> None:
        """Forget the newest n positions (to feed them again over a different memory)."""
        self.end = max(self.start, self.end - n)

    def clone(self) -> KVMemory:
        copy = KVMemory()
        # clone keeps the strides of a dense tensor: the copy's keys stay key-last.
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
        self._reallocate(shape, self.capacity(M + T), dtype, device)

    def shrink(self, spare: int) -> None:
        """Give back the room a segment needed: after a prompt is fed seg_len at a time,
        the buffers hold mem_len + seg_len + spare positions for a memory of mem_len (2x
        at mem_len 128). Keeps ``spare`` positions of room for the steps to come."""
        if self.k and self.k[0].size(2) > len(self) + spare:
            B, H, _, Dh = self.v[0].shape
            shape, like = (len(self.k), B, H, Dh), self.v[0]
            self._reallocate(shape, len(self) + spare, like.dtype, like.device)

    def _reallocate(self, shape: tuple[int, int, int, int], capacity: int, dtype, device):
        """Fresh buffers of ``capacity`` positions holding the memory at their start."""
        n_layer, B, H, Dh = shape
        M = len(self)
        # Plain tensors (not inference tensors), so code outside inference mode may still
        # write into a memory (a restore, a test).
        with torch.inference_mode(False):
            for buffers, key_last in ((self.k, True), (self.v, False)):
                for layer in range(n_layer):
                    if key_last:  # [B, H, Dh, capacity] read as [B, H, capacity, Dh]
                        fresh = torch.empty(B, H, Dh, capacity, dtype=dtype, device=device).mT
                    else:
                        fresh = torch.empty(B, H, capacity, Dh, dtype=dtype, device=device)
                    if len(buffers) > layer:
                        fresh[:, :, :M] = buffers[layer][:, :, self.start : self.end]
                        buffers[layer] = fresh
                    else:
                        buffers.append(fresh)
        self.start, self.end = 0, M

    def step_views(self, layer: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One layer's whole buffers as the one-token step uses them: keys as stored
        [B, H, Dh, capacity] and with batch and heads merged [B·H, Dh, capacity]; values
        [B, H, capacity, Dh] and [B·H, capacity, Dh]. Views: writing into them writes
        into the memory. Kept until a buffer is replaced (reserve, or a caller's
        assignment), since making them costs a step as much as using them."""
        k, v = self.k[layer], self.v[layer]
        cached = self._views.get(layer)
        if cached is None or cached[0] is not k or cached[1] is not v:
            cached = (k, v, (k.mT, k.mT.flatten(0, 1), v, v.flatten(0, 1)))
            self._views[layer] = cached
        return cached[2]

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

    # ---- offload (webapp.budget): the whole state as named tensors, and back ----------------

    def to_tensors(self) -> dict[str, Tensor]:
        """All the state as named tensors, ready for safetensors: each layer's buffers as
        stored ("k.<layer>": the contiguous [B, H, Dh, capacity] key buffer, "v.<layer>":
        [B, H, capacity, Dh], spare room included) and "start", "end" (0-d int64). The
        tensors are the buffers, not copies."""
        out = {f"k.{i}": k.mT for i, k in enumerate(self.k)}
        out.update({f"v.{i}": v for i, v in enumerate(self.v)})
        out["start"] = torch.tensor(self.start, dtype=torch.int64)
        out["end"] = torch.tensor(self.end, dtype=torch.int64)
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor]) -> KVMemory:
        """The KVMemory that to_tensors() described, bit for bit and key-last again (the
        tensors are used as they are, not copied)."""
        memory = cls()
        n_layer = sum(name.startswith("k.") for name in tensors)
        memory.k = [tensors[f"k.{i}"].mT for i in range(n_layer)]
        memory.v = [tensors[f"v.{i}"] for i in range(n_layer)]
        memory.start, memory.end = int(tensors["start"]), int(tensors["end"])
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


def score_terms(
    q: Tensor,  # [B, H, T, Dh] queries
    k: Tensor,  # [B, H, K, Dh] keys of [memory | segment]
    r_k: Tensor,  # [H, K, Dh] position keys W_r R for distances K-1 ... 0
    u: Tensor,  # [H, Dh] global content bias
    v: Tensor,  # [H, Dh] global position bias
    mask: Tensor | None,  # [T, K] True where query i must not see key j
) -> Tensor:
    """The four terms of the attention score apart, unscaled: [4, B, H, T, K] =

        (a) q_i · k_j   (b) q_i · W_r R_Δ   (c) u · k_j   (d) v · W_r R_Δ,   Δ = M + i - j,

    -inf where the mask hides the key. scale · ((a) + (b) + (c) + (d)) are the scores that
    the attention softmaxes: the forward pass computes (a)+(c) and (b)+(d) in one product
    each, which is why the terms are a separate (slower) computation, made only on request.
    """
    B, H, T, _ = q.shape
    terms = q.new_empty(4, B, H, T, k.size(2))  # written in place: no stacked copies
    terms[0].copy_(q @ k.mT)  # (a) content: [B, H, T, K]
    terms[2].copy_(u[:, None] @ k.mT)  # (c) global content bias: [B, H, 1, K], every query
    b = q @ r_k.mT  # (b) content-dependent position, by distance K-1 ... 0
    d = (v[:, None] @ r_k.mT).expand(B, H, T, -1)  # (d) global position bias: [H, 1, K]
    if T > 1:  # re-index by key position (one query's row already lines up)
        b, d = rel_shift(b), rel_shift(d)
    terms[1].copy_(b)
    terms[3].copy_(d)
    return terms if mask is None else terms.masked_fill_(mask, float("-inf"))


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
        need_terms: bool = False,
        last_query: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(output [B, T, d], attention probabilities or None, score_terms or None).

        last_query: the output of the last position only, [B, 1, d] (the top layer of a
        forward that wants the last logits): every position's keys and values are still
        made (they join the memory), but one query, one attention row and one FF row
        instead of T, about 5/6 of the layer's work saved."""
        x = self.norm(h) if self.pre_lnorm else h
        if last_query:
            k, v = self.project_kv(h)  # [B, H, T, Dh]
            w_q = self.qkv.weight[: self.n_head * self.d_head]
            q = self._heads(F.linear(x[:, -1:], w_q))  # [B, H, 1, Dh]
            h, mask = h[:, -1:], (None if mask is None else mask[-1:])  # [B, 1, d], [1, K]
        else:
            q, k, v = (self._heads(t) for t in self.qkv(x).chunk(3, dim=-1))  # [B, H, T, Dh]
        k, v = memory_kv(k, v)  # prepend the memory's keys and values: [B, H, K, Dh]

        content = (q + u[:, None]) @ k.transpose(-1, -2)  # (a)+(c): [B, H, T, K]
        position = (q + v_bias[:, None]) @ r_k.transpose(-1, -2)  # (b)+(d), by distance
        if q.size(2) > 1:  # the last query alone needs no shift: its row already lines up
            position = rel_shift(position)
        scores = (content + position) * self.scale
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        probs = self.dropatt(scores.softmax(dim=-1))  # [B, H, T, K]

        attn = (probs @ v).transpose(1, 2).flatten(2)  # [B, T, H*Dh]
        attn = self.drop(self.out(attn))
        h = h + attn if self.pre_lnorm else self.norm(h + attn)
        terms = score_terms(q, k, r_k, u, v_bias, mask) if need_terms else None
        return h, (probs if need_probs else None), terms


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

    def forward(
        self, h, memory_kv, r_k, u, v, mask, need_probs, need_terms=False, last_query=False
    ):
        h, probs, terms = self.attn(
            h, memory_kv, r_k, u, v, mask, need_probs, need_terms, last_query
        )
        return self.ff(h), probs, terms


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
        self._step_cache = None  # inference cache of StepWeights, see step_weights
        # A load_state_dict(assign=True) swaps the parameter objects: forget the views.
        self.register_load_state_dict_post_hook(lambda module, _: module._forget_caches())
        self.reset_parameters()

    def _forget_caches(self) -> None:
        self._position_table = self._step_cache = None

    def _apply(self, fn, *args, **kwargs):
        """.to(dtype / device), .float(), .cuda(): the cached views would keep the old
        tensors (and their memory) alive, so drop them."""
        self._forget_caches()
        return super()._apply(fn, *args, **kwargs)

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

    def _layers(
        self, h, memory_kv, r_k, mask, output_attentions, output_terms=False, last_only=False
    ):
        """Run every layer; memory_kv[l] prepends layer l's memory to its keys and values.
        Returns the output, each layer's input, the attentions and the score terms (each
        None unless asked for). last_only: the output of the last position only, [B, 1, d]
        (the top layer then runs one query; attentions and terms need every row)."""
        inputs, attentions, terms = [], [], []
        top_query_only = last_only and not (output_attentions or output_terms)
        for i, layer in enumerate(self.layers):
            inputs.append(h)
            u, v = self.biases(i)
            last_query = top_query_only and i == len(self.layers) - 1
            h, probs, layer_terms = layer(
                h, memory_kv[i], r_k[i], u, v, mask, output_attentions, output_terms, last_query
            )
            attentions.append(probs)
            terms.append(layer_terms)
        return (
            self.drop(h),
            inputs,
            attentions if output_attentions else None,
            terms if output_terms else None,
        )

    # ---- the forward pass -------------------------------------------------------------

    def forward(
        self,
        input_ids: Tensor,
        mems: list[Tensor] | None = None,
        output_attentions: bool = False,
        mem_len: int | None = None,
        targets: Tensor | None = None,
        output_terms: bool = False,
    ) -> TXLOutput:
        """input_ids [B, T]; mems None (empty memory) or the previous call's ``out.mems``.
        targets [B, T] (the next token of each position): return ``nll``, not ``logits``.
        output_terms: also each layer's four score terms apart (``score_terms``)."""
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

        h, inputs, attentions, terms = self._layers(
            h, memory_kv, r_k, mask, output_attentions, output_terms
        )

        # New memory: each layer's input appended to its old memory, newest mem_len kept.
        with torch.no_grad():
            new_mems = [torch.cat([m, x], dim=1) for m, x in zip(mems, inputs)]
            new_mems = [m[:, max(0, m.size(1) - mem_len) :].detach() for m in new_mems]
        return TXLOutput(
            mems=new_mems, attentions=attentions, terms=terms, **self._head(h, targets)
        )

    # ---- inference: keys and values cached ---------------------------------------------

    def position_keys_cached(self, K: int, device, dtype, key_last=False) -> list[Tensor]:
        """W_r R for distances K-1 ... 0, per layer [H, K, Dh], from a table kept between
        calls (it depends only on the weights). Rebuilt when the weights change or a longer
        memory needs more distances. Stored key-last like KVMemory's keys: the views
        returned are transposes of [H, Dh, K] blocks, or those blocks with key_last (a
        step's (q + v) · W_r R is then a product over contiguous rows)."""
        table = self._position_table
        setting = (device, dtype, self.config.clamp_len)
        if (
            table is None
            or table.setting != setting
            or table.longest < K - 1
            or _fingerprint(table.weights) != table.fingerprint
        ):
            longest = self.position_table_longest(K)
            r = self.pos_enc(self.distances(longest + 1, device), dtype)  # longest ... 0
            weights = [layer.attn.r_proj.weight for layer in self.layers]
            keys = [layer.attn.position_keys(r).mT.contiguous() for layer in self.layers]
            table = _PositionTable(setting, weights, _fingerprint(weights), longest, keys)
            self._position_table = table
        last = table.last  # the views of the last K (a full memory asks for it again)
        if last is None or last[0] != K:  # one tuple, swapped whole: threads share a model
            last = (K, [k[:, :, table.longest - (K - 1) :] for k in table.keys])  # [H, Dh, K]
            table.last = last
        return last[1] if key_last else [k.mT for k in last[1]]

    @staticmethod
    def position_table_longest(K: int) -> int:
        """The longest distance a table built for K keys covers: twice what is asked, so a
        memory that grows step by step does not rebuild it every step, and at least 256."""
        return max(2 * (K - 1), 256)

    def position_table_bytes(self) -> int:
        """Bytes of the table of position keys kept now (0 before the first cached call):
        shared by every session of this model, freed only with the model."""
        table = self._position_table
        return sum(k.nbytes for k in table.keys) if table is not None else 0

    def position_table_growth(self, K: int) -> int:
        """Bytes of the table a cached call over K keys builds when the kept one is shorter
        (0 when it covers them): per layer [H, Dh, longest + 1]."""
        table = self._position_table
        if table is not None and table.longest >= K - 1:
            return 0
        c, element = self.config, next(self.parameters()).element_size()
        return c.n_layer * c.n_head * c.d_head * (self.position_table_longest(K) + 1) * element

    def step_weights(self) -> list[StepWeights]:
        """The layers' StepWeights, kept between steps. They hold views of the parameters
        and copies (u and v stacked, short-rowed weights transposed), so they are rebuilt
        when any parameter changes: in place (an optimizer step, load_state_dict: its
        version counter moves) or by a new tensor (``p.data = ...``: its address moves;
        .to() and load_state_dict(assign=True) also drop the cache outright)."""
        cache = self._step_cache
        if cache is not None:
            params, key, weights = cache
            if _fingerprint(params) == key:
                return weights
        with torch.inference_mode(False), torch.no_grad():  # plain tensors, usable anywhere
            weights = [
                StepWeights.of(layer, *self.biases(i)) for i, layer in enumerate(self.layers)
            ]
        params = [p for layer in self.layers for p in layer.parameters()]
        if not self.config.untie_r:
            params += [self.u, self.v]
        self._step_cache = (params, _fingerprint(params), weights)
        return weights

    @staticmethod
    def _step_terms(q: Tensor, uv: Tensor, keys: Tensor, lo: int, r_k: Tensor) -> Tensor:
        """score_terms for one query in few ops (as _step stores things): q [B, H, Dh],
        uv [2, H, Dh] (u, v), keys [B·H, Dh, capacity] key-last of which lo ... lo + K - 1
        are visible, r_k [H, Dh, K] key-last. Returns [4, B, H, 1, K]."""
        B, H, Dh = q.shape
        K = r_k.size(-1)
        # (a), (c): [q | u] · k_j, one product per batch row and head: [B·H, 2, K]
        q_u = torch.stack([q, uv[0].expand_as(q)], 2).view(B * H, 2, Dh)
        a_c = torch.bmm(q_u, keys.narrow(2, lo, K)).view(B, H, 2, K)
        # (b), (d): [q_1 ... q_B | v] · W_r R_Δ, one product per head: [H, B + 1, K]
        q_v = torch.cat([q.transpose(0, 1), uv[1].unsqueeze(1)], 1)
        b_d = torch.bmm(q_v, r_k)
        b, d = b_d[:, :B].transpose(0, 1), b_d[:, B].expand(B, H, K)
        return torch.stack([a_c[:, :, 0], b, a_c[:, :, 1], d]).unsqueeze(3)

    def _step(
        self,
        input_ids: Tensor,  # [B, 1]
        memory: KVMemory,  # reserved for one more position
        output_attentions: bool,
        mem_len: int,
        targets: Tensor | None,
        output_terms: bool = False,
    ) -> CachedOutput:
        """forward_cached for one token, the generation hot path: the same equations as
        RelMultiHeadAttention / PositionwiseFF, for one query, in few operations.

        A step does little arithmetic: its time goes to reading every weight and the
        whole memory once (28 MB at demo size, memory 512) and to the overhead of each
        op. So: fused adds (addmm, baddbmm), batch and heads merged into the batch of
        bmm, keys and position keys stored key-last (q · K over contiguous rows, no
        transpose), weights laid out for one-row products (StepWeights), no mask (a
        same_length cut is a slice), no relative shift (one query's row already lines
        up), no dropout.
        """
        cfg = self.config
        B, H, Dh = input_ids.size(0), cfg.n_head, cfg.d_head
        M, start, new = len(memory), memory.start, memory.end  # `new`: the token's slot
        # same_length hides the oldest keys beyond mem_len (attention_mask's rule for one
        # query): keys lo ... new are visible, K of them. The query always sees itself.
        hidden = max(0, min(M + 1 - mem_len, M)) if cfg.same_length else 0
        lo, K = start + hidden, M + 1 - hidden
        scale = 1.0 / math.sqrt(Dh)

        x = self.embed(input_ids).view(B, cfg.d_model)  # [B, d]
        # W_r R for distances K-1 ... 0, key-last: per layer [H, Dh, K]
        r_k = self.position_keys_cached(K, x.device, x.dtype, key_last=True)
        attentions, terms = [], []
        for layer, w in enumerate(self.step_weights()):
            # keys [B, H, Dh, cap] and [B·H, Dh, cap]; values [B, H, cap, Dh], [B·H, cap, Dh]
            keys4, keys, values4, values = memory.step_views(layer)
            # ---- attention: h = LN(x + W_o Σ_j p_j v_j)  (pre-norm: x + W_o Σ ... of LN(x))
            a = torch.layer_norm(x, *w.norm_attn) if w.pre_lnorm else x
            qkv = torch.mm(a, w.w_qkv).view(B, 3, H, Dh)  # q, k, v of the new token
            keys4.select(3, new).copy_(qkv.select(1, 1))  # the token joins the memory
            values4.select(2, new).copy_(qkv.select(1, 2))
            q_uv = qkv.narrow(1, 0, 1) + w.uv  # [B, 2, H, Dh]: q + u, q + v
            # (b)+(d) (q + v) · W_r R_Δ, one row per head shared by the batch: [H, B, K]
            position = torch.bmm(q_uv.select(1, 1).transpose(0, 1), r_k[layer])
            # A_j = ((q + u) · k_j + position_j) / sqrt(Dh): (a)+(c) fused in: [B·H, 1, K]
            scores = torch.baddbmm(
                position.transpose(0, 1).reshape(B * H, 1, K),
                q_uv.select(1, 0).reshape(B * H, 1, Dh),
                keys.narrow(2, lo, K),  # keys lo ... new
                beta=scale,
                alpha=scale,
            )
            probs = scores.softmax(dim=-1)  # [B·H, 1, K]
            mixed = torch.bmm(probs, values.narrow(1, lo, K)).view(B, H * Dh)  # Σ_j p_j v_j
            h = torch.addmm(x, mixed, w.w_out)  # x + W_o (...)
            if not w.pre_lnorm:
                h = torch.layer_norm(h, *w.norm_attn)
            if output_attentions:  # [B, H, 1, M + 1], hidden keys 0 as in forward's mask
                attentions.append(F.pad(probs.view(B, H, 1, K), (hidden, 0)))
            if output_terms:  # score_terms' [4, B, H, 1, M + 1], hidden keys -inf
                terms.append(self._step_terms(qkv.select(1, 0), w.uv, keys, lo, r_k[layer]))
                if hidden:
                    terms[-1] = F.pad(terms[-1], (hidden, 0), value=float("-inf"))
            # ---- feed-forward: h = LN(h + W_2 ReLU(W_1 h + b_1) + b_2)  (or pre-norm)
            a = torch.layer_norm(h, *w.norm_ff) if w.pre_lnorm else h
            inner = torch.addmm(w.b_ff1, a, w.w_ff1).relu_()  # [B, d_inner]
            y = torch.addmm(w.b_ff2, inner, w.w_ff2).add_(h)  # h + FF(h)
            x = y if w.pre_lnorm else torch.layer_norm(y, *w.norm_ff)

        memory.commit(1, mem_len)
        return CachedOutput(
            memory=memory,
            attentions=attentions if output_attentions else None,
            terms=terms if output_terms else None,
            **self._head(x.view(B, 1, -1), targets),
        )

    def forward_cached(
        self,
        input_ids: Tensor,
        memory: KVMemory | None = None,
        output_attentions: bool = False,
        mem_len: int | None = None,
        targets: Tensor | None = None,
        last_only: bool = False,
        output_terms: bool = False,
    ) -> CachedOutput:
        """The forward pass for generation: the memory is kept as keys and values.

        Same logits as ``forward`` with the equivalent hidden-state memory; ``memory`` is
        advanced in place (a new one is made when None). Inference only (eval mode); runs
        in torch.inference_mode, so its outputs are inference tensors (clone one to change
        it in place). One token (T = 1) takes the lean path ``_step``.
        last_only: logits of the last position only (all that sampling needs; a 64-token
        prompt segment over 267k words would otherwise make 17M scores).
        output_terms: also each layer's four score terms apart (``score_terms``).
        """
        if self.training:
            raise RuntimeError("forward_cached is for inference: call model.eval() first")
        self._check_input(input_ids)
        mem_len = self.mem_len if mem_len is None else mem_len
        memory = KVMemory() if memory is None else memory
        B, T = input_ids.shape
        cfg = self.config
        weight = self.layers[0].attn.qkv.weight  # the buffers take the model's dtype, device
        memory.reserve((cfg.n_layer, B, cfg.n_head, cfg.d_head), T, weight.dtype, weight.device)
        with torch.inference_mode():
            if T == 1:
                return self._step(
                    input_ids, memory, output_attentions, mem_len, targets, output_terms
                )
            h = self.embed(input_ids)
            M = len(memory)
            r_k = self.position_keys_cached(M + T, h.device, h.dtype)
            mask = self.attention_mask(T, M, mem_len, h.device)
            memory_kv = [memory.extend(layer) for layer in range(cfg.n_layer)]
            h, _, attentions, terms = self._layers(
                h,
                memory_kv,
                r_k,
                mask,
                output_attentions,
                output_terms,
                last_only=last_only and targets is None,  # targets need every position
            )
            memory.commit(T, mem_len)
            return CachedOutput(
                memory=memory,
                attentions=attentions,
                terms=terms,
                **self._head(h, targets, last_only),
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
