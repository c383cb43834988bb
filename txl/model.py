"""Transformer-XL (Dai et al., 2019, "Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context"), as the original code and Hugging Face's TransfoXL compute it.

Shapes: B batch, T tokens in the current segment, M memory positions, K = M + T keys,
d = d_model, H heads of width Dh. Tensors are batch-first: hidden states are [B, T, d].

Each layer attends over [memory | current segment]. The memory of layer l is the INPUT of
layer l at the previous segments (mems[0] is the embedding output), cached without
gradient. Positions enter only through the relative distance i - j between a query and a
key, so cached states keep their meaning when the segment moves on.

Attention score of query i and key j (the paper's A^rel_{i,j}, section 3.3), with
q_i = W_q x_i, k_j = W_k x_j, distance Δ = M + i - j, u and v learned vectors shared by
all positions:

    A[i, j] = q_i · k_j          (a) content
            + q_i · W_r R_Δ      (b) content-dependent position
            + u · k_j            (c) global content bias
            + v · W_r R_Δ        (d) global position bias
            = (q_i + u) · k_j  +  (q_i + v) · W_r R_Δ    (the original code's AC and BD)

R_Δ = [sin(Δ ω) | cos(Δ ω)] is the sinusoid of the distance, ω_k = 1 / 10000^(2k/d).
``RelMultiHeadAttention.forward`` computes it as those two products; ``score_terms`` keeps
the four apart. (txl/cached.py computes the same forward faster for generation.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from torch import Tensor, nn

from . import loading
from . import tokenizer as tokenizers
from .adaptive import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax
from .config import TXLConfig


@dataclass
class TXLOutput:
    logits: Tensor | None  # [B, T, vocab] scores of the next token (None when targets given)
    mems: list[Tensor]  # per layer [B, min(M + T, mem_len), d]: the memory for the next call
    attentions: list[Tensor] | None = None  # per layer [B, H, T, K]; rows sum to 1
    nll: Tensor | None = None  # [B, T] -log p(target) in nats, when targets were given
    terms: list[Tensor] | None = None  # per layer [4, B, H, T, K]: see score_terms


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

    def normed(self, h: Tensor) -> Tensor:
        """What the projections read: h, after the LayerNorm when pre_lnorm."""
        return self.norm(h) if self.pre_lnorm else h

    def project_kv(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values [B, H, S, Dh] of hidden states h [B, S, d] (memory or segment)."""
        return self._kv(self.normed(h))

    def _kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values [B, H, S, Dh] of x = normed(h) [B, S, d]."""
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
        qkv: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(output [B, T, d], attention probabilities or None, score_terms or None).

        last_query: the output of the last position only, [B, 1, d] (the top layer of a
        forward that wants the last logits): every position's keys and values are still
        made (they join the memory), but one query, one attention row and one FF row
        instead of T, about 5/6 of the layer's work saved.
        qkv: [B, T, 3·H·Dh] the projections [q | k | v] of h, when the caller has them
        (layer 0's, looked up per token: ``TransformerXL.first_layer_qkv``)."""
        if last_query and qkv is None:
            x = self.normed(h)  # normed once, for the keys, values and the one query
            k, v = self._kv(x)  # [B, H, T, Dh]
            w_q = self.qkv.weight[: self.n_head * self.d_head]
            q = self._heads(F.linear(x[:, -1:], w_q))  # [B, H, 1, Dh]
        else:
            qkv = self.qkv(self.normed(h)) if qkv is None else qkv  # [B, T, 3·H·Dh]
            q, k, v = (self._heads(t) for t in qkv.chunk(3, dim=-1))  # [B, H, T, Dh]
            q = q[:, :, -1:] if last_query else q
        if last_query:
            h, mask = h[:, -1:], (None if mask is None else mask[-1:])  # [B, 1, d], [1, K]
        k, v = memory_kv(k, v)  # prepend the memory's keys and values: [B, H, K, Dh]

        # A[i, j] = (a) q_i·k_j + (c) u·k_j + (b) q_i·W_r R_Δ + (d) v·W_r R_Δ, Δ = M + i - j
        content = (q + u[:, None]) @ k.transpose(-1, -2)  # (a)+(c), AC: [B, H, T, K]
        # (b)+(d), BD: [B, H, T, K], column c for distance K-1-c (r_k's order) ...
        position = (q + v_bias[:, None]) @ r_k.transpose(-1, -2)
        if q.size(2) > 1:  # ... re-indexed by key j (one query's row already lines up)
            position = rel_shift(position)
        # in place: the products are fresh tensors no one else holds (and autograd needs
        # neither), so no [B, H, T, K] copies for the sum, the scale and the mask
        scores = content.add_(position).mul_(self.scale)
        if mask is not None:
            scores.masked_fill_(mask, float("-inf"))
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
        y = self.drop(self.fc2(self.drop(F.relu_(self.fc1(x)))))  # in place: fc1's output is ours
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
        self,
        h,
        memory_kv,
        r_k,
        u,
        v,
        mask,
        need_probs,
        need_terms=False,
        last_query=False,
        qkv=None,
    ):
        h, probs, terms = self.attn(
            h, memory_kv, r_k, u, v, mask, need_probs, need_terms, last_query, qkv
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
        # What inference derives from the weights and keeps between calls (txl/cached.py:
        # the table of position keys, the step's weights), dropped when they are replaced.
        self.inference_caches: dict = {}
        # A load_state_dict(assign=True) swaps the parameter objects: forget the views.
        self.register_load_state_dict_post_hook(lambda module, _: module.inference_caches.clear())
        self.reset_parameters()

    def _apply(self, fn, *args, **kwargs):
        """.to(dtype / device), .float(), .cuda(): the cached views would keep the old
        tensors (and their memory) alive, so drop them."""
        self.inference_caches.clear()
        return super()._apply(fn, *args, **kwargs)

    # Loading (txl/loading.py): strict, safetensors only, errors that name the file.
    # save_pretrained and push_to_hub are the Hub mixin's.
    from_pretrained = classmethod(loading.from_pretrained)

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

    def first_layer_qkv(self, input_ids: Tensor) -> Tensor:
        """Layer 0's projections [q | k | v] of each token, [..., 3·H·Dh] (inference: no
        dropout). Layer 0's input is the token's embedding alone (positions enter through
        the scores, not the input), so a token's projections are the same wherever it
        stands: windows that overlap look them up (txl.scoring.window_forward) instead of
        making them again for every copy of the token."""
        attn = self.layers[0].attn
        return attn.qkv(attn.normed(self.embed(input_ids)))

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

    def outputs(self, h: Tensor, targets: Tensor | None, last_only: bool = False) -> dict:
        """The output fields: nll when targets are given, else logits (of every position,
        or of the last one only)."""
        if targets is not None:
            return dict(logits=None, nll=self.token_nll(h, targets))
        return dict(logits=self.lm_head(h[:, -1:] if last_only else h))

    def check_input(self, input_ids: Tensor) -> None:
        if input_ids.dim() != 2 or input_ids.dtype != torch.long:
            raise ValueError(
                f"input_ids must be a LongTensor [batch, time], got {tuple(input_ids.shape)} "
                f"{input_ids.dtype}"
            )
        if input_ids.numel() and not (
            int(input_ids.min()) >= 0 and int(input_ids.max()) < self.config.vocab_size
        ):
            raise ValueError(f"token ids must lie in 0..{self.config.vocab_size - 1}")

    def run_layers(
        self,
        h,
        memory_kv,
        r_k,
        mask,
        output_attentions,
        output_terms=False,
        last_only=False,
        first_qkv=None,
    ):
        """Run every layer; memory_kv[l] prepends layer l's memory to its keys and values.
        Returns the output, each layer's input, the attentions and the score terms (each
        None unless asked for). last_only: the output of the last position only, [B, 1, d]
        (the top layer then runs one query; attentions and terms need every row).
        first_qkv: layer 0's projections of h when the caller has them (``first_layer_qkv``)."""
        inputs, attentions, terms = [], [], []
        top_query_only = last_only and not (output_attentions or output_terms)
        for i, layer in enumerate(self.layers):
            inputs.append(h)
            u, v = self.biases(i)
            last_query = top_query_only and i == len(self.layers) - 1
            qkv = first_qkv if i == 0 else None
            h, probs, layer_terms = layer(
                h,
                memory_kv[i],
                r_k[i],
                u,
                v,
                mask,
                output_attentions,
                output_terms,
                last_query,
                qkv,
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
        self.check_input(input_ids)
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

        h, inputs, attentions, terms = self.run_layers(
            h, memory_kv, r_k, mask, output_attentions, output_terms
        )

        # New memory: each layer's input appended to its old memory, newest mem_len kept.
        with torch.no_grad():
            new_mems = [torch.cat([m, x], dim=1) for m, x in zip(mems, inputs)]
            new_mems = [m[:, max(0, m.size(1) - mem_len) :].detach() for m in new_mems]
        return TXLOutput(
            mems=new_mems, attentions=attentions, terms=terms, **self.outputs(h, targets)
        )
