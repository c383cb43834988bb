"""The cached engine: Transformer-XL's forward for generation, fast one token at a time.

``txl/model.py`` is the paper: a segment attends over a memory of hidden states, which
every call projects to keys and values again. A session that generates calls the model
once per token, and then that re-projection is nearly all the work. This module computes
the same forward another way, for inference:

- the memory is kept as each layer's keys and values (``KVMemory``), projected once, when
  a position enters it, in buffers with spare room, advanced in place;
- the position keys W_r R are kept in a table between calls (they depend only on the
  weights and the distance);
- one token (T = 1) takes a fused step (``_step``): the same equations for one query in
  few operations, over weights laid out for one-row products (``StepWeights``).

Its numbers are the forward's, up to the rounding of sums taken in another order: the
tests (tests/test_cached.py) hold the step and the segment path to SAME_SUMS ulps of
``model(...)``, call by call. Nothing here is trained: it only reads the model, and keeps
what it derives from the weights in ``model.inference_caches``, which the model drops
when its weights are replaced.

    memory = KVMemory()
    out = cached_forward(model, prompt_ids, memory)  # [B, T]: a segment, memory advanced
    out = cached_forward(model, next_id, memory)  # [B, 1]: the one-token step

Shapes as in txl/model.py: B batch, T tokens, M memory positions, K keys, H heads of Dh.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model import TransformerXL, XLLayer


@dataclass
class CachedOutput:
    logits: Tensor | None  # [B, T, vocab] ([B, 1, vocab] with last_only; None with targets)
    memory: KVMemory  # the same object that was passed in, advanced by T positions
    attentions: list[Tensor] | None = None  # per layer [B, H, T, K]
    nll: Tensor | None = None  # [B, T], when targets were given
    terms: list[Tensor] | None = None  # per layer [4, B, H, T, K]: see score_terms


class KVMemory:
    """The memory as each layer's keys and values: what generation keeps between calls.

    A layer's memory is a list of cached hidden states x, but attention only ever uses
    W_k x and W_v x. The reference re-projects all M cached states at every step (M·d²
    work per layer per token); projecting each state once, when it enters the memory,
    gives the same numbers for the cost of one position. Keys and values sit in buffers
    with spare room, so a step writes one position instead of copying all M.
    ``cached_forward`` advances it in place.

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

    # ---- offload (webapp.offload): the whole state as named tensors, and back ---------------

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


# ---- the forward, cached ------------------------------------------------------------


def cached_forward(
    model: TransformerXL,
    input_ids: Tensor,
    memory: KVMemory | None = None,
    output_attentions: bool = False,
    mem_len: int | None = None,
    targets: Tensor | None = None,
    last_only: bool = False,
    output_terms: bool = False,
) -> CachedOutput:
    """The model's forward pass for generation: the memory is kept as keys and values.

    Same logits as ``model(...)`` with the equivalent hidden-state memory; ``memory`` is
    advanced in place (a new one is made when None). Inference only (eval mode); runs
    in torch.inference_mode, so its outputs are inference tensors (clone one to change
    it in place). One token (T = 1) takes the lean path ``_step``.
    last_only: logits of the last position only (all that sampling needs; a 64-token
    prompt segment over 267k words would otherwise make 17M scores).
    output_terms: also each layer's four score terms apart (``txl.model.score_terms``).
    """
    if model.training:
        raise RuntimeError("cached_forward is for inference: call model.eval() first")
    model.check_input(input_ids)
    mem_len = model.mem_len if mem_len is None else mem_len
    memory = KVMemory() if memory is None else memory
    B, T = input_ids.shape
    cfg = model.config
    weight = model.layers[0].attn.qkv.weight  # the buffers take the model's dtype, device
    memory.reserve((cfg.n_layer, B, cfg.n_head, cfg.d_head), T, weight.dtype, weight.device)
    with torch.inference_mode():
        if T == 1:
            return _step(
                model, input_ids, memory, output_attentions, mem_len, targets, output_terms
            )
        h = model.embed(input_ids)
        M = len(memory)
        r_k = position_keys(model, M + T, h.device, h.dtype)
        mask = model.attention_mask(T, M, mem_len, h.device)
        memory_kv = [memory.extend(layer) for layer in range(cfg.n_layer)]
        h, _, attentions, terms = model.run_layers(
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
            **model.outputs(h, targets, last_only),
        )


def _step(
    model: TransformerXL,
    input_ids: Tensor,  # [B, 1]
    memory: KVMemory,  # reserved for one more position
    output_attentions: bool,
    mem_len: int,
    targets: Tensor | None,
    output_terms: bool = False,
) -> CachedOutput:
    """cached_forward for one token, the generation hot path: the same equations as
    RelMultiHeadAttention / PositionwiseFF, for one query, in few operations.

    A step does little arithmetic: its time goes to reading every weight and the
    whole memory once (28 MB at demo size, memory 512) and to the overhead of each
    op. So: fused adds (addmm, baddbmm), batch and heads merged into the batch of
    bmm, keys and position keys stored key-last (q · K over contiguous rows, no
    transpose), weights laid out for one-row products (StepWeights), no mask (a
    same_length cut is a slice), no relative shift (one query's row already lines
    up), no dropout.
    """
    cfg = model.config
    B, H, Dh = input_ids.size(0), cfg.n_head, cfg.d_head
    M, start, new = len(memory), memory.start, memory.end  # `new`: the token's slot
    # same_length hides the oldest keys beyond mem_len (attention_mask's rule for one
    # query): keys lo ... new are visible, K of them. The query always sees itself.
    hidden = max(0, min(M + 1 - mem_len, M)) if cfg.same_length else 0
    lo, K = start + hidden, M + 1 - hidden
    scale = 1.0 / math.sqrt(Dh)

    x = model.embed(input_ids).view(B, cfg.d_model)  # [B, d]
    # W_r R for distances K-1 ... 0, key-last: per layer [H, Dh, K]
    r_k = position_keys(model, K, x.device, x.dtype, key_last=True)
    attentions, terms = [], []
    for layer, w in enumerate(step_weights(model)):
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
            terms.append(_step_terms(qkv.select(1, 0), w.uv, keys, lo, r_k[layer]))
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
        **model.outputs(x.view(B, 1, -1), targets),
    )


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


# ---- the table of position keys W_r R, kept between calls ------------------------------


@dataclass
class _PositionTable:
    """position_keys' table of W_r R and what it was made from."""

    setting: tuple  # (device, dtype, clamp_len)
    weights: list[Tensor]  # each layer's W_r ...
    fingerprint: tuple  # ... and their _fingerprint then
    longest: int  # distances longest ... 0
    keys: list[Tensor]  # per layer [H, Dh, longest + 1]
    last: tuple | None = None  # (K, [keys[:, :, -K:] per layer]) of the last call


def position_keys(model: TransformerXL, K: int, device, dtype, key_last=False) -> list[Tensor]:
    """W_r R for distances K-1 ... 0, per layer [H, K, Dh], from a table kept between
    calls (it depends only on the weights). Rebuilt when the weights change or a longer
    memory needs more distances. Stored key-last like KVMemory's keys: the views
    returned are transposes of [H, Dh, K] blocks, or those blocks with key_last (a
    step's (q + v) · W_r R is then a product over contiguous rows)."""
    table = model.inference_caches.get("position_table")
    setting = (device, dtype, model.config.clamp_len)
    if (
        table is None
        or table.setting != setting
        or table.longest < K - 1
        or _fingerprint(table.weights) != table.fingerprint
    ):
        longest = position_table_longest(K)
        r = model.pos_enc(model.distances(longest + 1, device), dtype)  # longest ... 0
        weights = [layer.attn.r_proj.weight for layer in model.layers]
        keys = [layer.attn.position_keys(r).mT.contiguous() for layer in model.layers]
        table = _PositionTable(setting, weights, _fingerprint(weights), longest, keys)
        model.inference_caches["position_table"] = table
    last = table.last  # the views of the last K (a full memory asks for it again)
    if last is None or last[0] != K:  # one tuple, swapped whole: threads share a model
        last = (K, [k[:, :, table.longest - (K - 1) :] for k in table.keys])  # [H, Dh, K]
        table.last = last
    return last[1] if key_last else [k.mT for k in last[1]]


def position_table_longest(K: int) -> int:
    """The longest distance a table built for K keys covers: twice what is asked, so a
    memory that grows step by step does not rebuild it every step, and at least 256."""
    return max(2 * (K - 1), 256)


def position_table_bytes(model: TransformerXL) -> int:
    """Bytes of the table of position keys kept now (0 before the first cached call):
    shared by every session of this model, freed only with the model."""
    table = model.inference_caches.get("position_table")
    return sum(k.nbytes for k in table.keys) if table is not None else 0


def position_table_growth(model: TransformerXL, K: int) -> int:
    """Bytes of the table a cached call over K keys builds when the kept one is shorter
    (0 when it covers them): per layer [H, Dh, longest + 1]."""
    table = model.inference_caches.get("position_table")
    if table is not None and table.longest >= K - 1:
        return 0
    c, element = model.config, next(model.parameters()).element_size()
    return c.n_layer * c.n_head * c.d_head * (position_table_longest(K) + 1) * element


# ---- the weights as the one-token step reads them ------------------------------------


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
    """One layer's weights as the one-token step reads them (``_step``).

    Transposed, so that each product is one ``mm``/``addmm`` of a row vector (views of the
    parameters where their rows are long, see ``_for_one_row``), and u, v stacked so that
    q + u and q + v are one add. Built once per model and rebuilt when a parameter
    changes (see ``step_weights``).
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


def step_weights(model: TransformerXL) -> list[StepWeights]:
    """The layers' StepWeights, kept between steps. They hold views of the parameters
    and copies (u and v stacked, short-rowed weights transposed), so they are rebuilt
    when any parameter changes: in place (an optimizer step, load_state_dict: its
    version counter moves) or by a new tensor (``p.data = ...``: its address moves;
    .to() and load_state_dict(assign=True) also drop the cache outright)."""
    cache = model.inference_caches.get("step_weights")
    if cache is not None:
        params, key, weights = cache
        if _fingerprint(params) == key:
            return weights
    with torch.inference_mode(False), torch.no_grad():  # plain tensors, usable anywhere
        weights = [StepWeights.of(layer, *model.biases(i)) for i, layer in enumerate(model.layers)]
    params = [p for layer in model.layers for p in layer.parameters()]
    if not model.config.untie_r:
        params += [model.u, model.v]
    model.inference_caches["step_weights"] = (params, _fingerprint(params), weights)
    return weights
