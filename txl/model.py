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

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from huggingface_hub import PyTorchModelHubMixin
from safetensors import SafetensorError
from safetensors.torch import load_model
from torch import Tensor, nn

from .config import TXLConfig
from .hub import CONFIG_NAME, WEIGHTS_NAME, TXLLoadError, fetch_file
from .tokenizer import CharTokenizer


@dataclass
class TXLOutput:
    logits: Tensor  # [B, T, vocab] raw scores of the next token
    mems: list[Tensor]  # per layer [B, min(M + T, mem_len), d]: the memory for the next call
    attentions: list[Tensor] | None = None  # per layer [B, H, T, K]; rows sum to 1


@dataclass
class CachedOutput:
    logits: Tensor  # [B, T, vocab]
    memory: KVMemory  # the same object that was passed in, advanced by T positions
    attentions: list[Tensor] | None = None  # per layer [B, H, T, K]


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
        """Bytes of keys and values in the memory (the buffers hold up to twice that)."""
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
        capacity = max(64, 2 * (M + T))  # compact and grow: amortised O(1) per position
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
        inv_freq = 1.0 / (10000 ** (torch.arange(0.0, d_model, 2.0) / d_model))  # ω [d/2]
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, distances: Tensor) -> Tensor:  # [K] -> [K, d]
        angles = torch.outer(distances.to(self.inv_freq.dtype), self.inv_freq)
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


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
    """

    def __init__(self, config: TXLConfig):
        super().__init__()
        if isinstance(config, dict):  # the Hub mixin hands a plain dict on some paths
            config = TXLConfig.from_dict(config)
        self.config = config
        self.mem_len = config.mem_len
        d = config.d_model
        self.embedding = nn.Embedding(config.vocab_size, d)
        self.pos_enc = RelativePositionalEncoding(d)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(XLLayer(config) for _ in range(config.n_layer))
        if not config.untie_r:  # one u and v shared by every layer
            self.u = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.v = nn.Parameter(torch.zeros(config.n_head, config.d_head))
        self.lm_bias = nn.Parameter(torch.zeros(config.vocab_size))  # output weight is tied
        self._tokenizer = CharTokenizer(config.vocab, config.unk_symbol) if config.vocab else None
        self._position_table = None  # inference cache of W_r R, see position_keys_cached
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """Normal(0, std) weights, zero biases, unit LayerNorms (the original code's init)."""
        for name, p in self.named_parameters():
            if "norm" in name:
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            elif name.endswith("bias") and "layers" in name or name == "lm_bias":
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0.0, std)

    @property
    def tokenizer(self) -> CharTokenizer | None:
        """The character tokenizer, or None for a model that came without a symbol list."""
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
        """Tied output layer: logits = h E^T + b, [B, T, d] -> [B, T, vocab]."""
        return F.linear(h, self.embedding.weight, self.lm_bias)

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
    ) -> TXLOutput:
        """input_ids [B, T]; mems None (empty memory) or the previous call's ``out.mems``."""
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
        r = self.drop(self.pos_enc(self.distances(K, input_ids.device)))  # [K, d]
        r = r.to(h.dtype)
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
        return TXLOutput(self.lm_head(h), new_mems, attentions)

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
            r = self.pos_enc(self.distances(longest + 1, device)).to(dtype)  # longest ... 0
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
    ) -> CachedOutput:
        """The forward pass for generation: the memory is kept as keys and values.

        Same logits as ``forward`` with the equivalent hidden-state memory; ``memory`` is
        advanced in place (a new one is made when None). Inference only (eval mode).
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
        return CachedOutput(self.lm_head(h), memory, attentions)

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
    ) -> TransformerXL:
        """Load config.json + model.safetensors from a folder or a Hub repo id.

        Strict: weights that do not match the config are an error. Every failure is a
        TXLLoadError naming the source, the file and the cause. Returns the model in
        eval mode. (Only safetensors are read: no pickle, no torch.load.)
        """
        source = str(pretrained_model_name_or_path)
        hub = dict(
            cache_dir=cache_dir,
            force_download=force_download,
            local_files_only=local_files_only,
            token=token,
        )
        config_file = fetch_file(source, CONFIG_NAME, revision, **hub)
        weights_file = fetch_file(source, WEIGHTS_NAME, revision, **hub)
        try:
            config = TXLConfig.load(config_file)
            model = cls(config)  # torch / the tokenizer check the values' kinds
        except (ValueError, TypeError) as e:  # includes json.JSONDecodeError
            raise TXLLoadError(f"{source}: {CONFIG_NAME} is not a valid txl config: {e}") from None
        try:
            load_model(model, str(weights_file), strict=True, device=map_location)
        except SafetensorError as e:
            raise TXLLoadError(
                f"{source}: {WEIGHTS_NAME} is damaged or not safetensors: {e}"
            ) from None
        except RuntimeError as e:
            raise TXLLoadError(
                f"{source}: {WEIGHTS_NAME} does not match {CONFIG_NAME}: {str(e)[:600]}"
            ) from None
        return model.eval()
