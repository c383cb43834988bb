"""Inside the attention: the relative attention score's four terms, and attention averaged
by distance (Dai et al. 2019, Section 3.3 and Appendix D, Figures 5 and 7).

    from txl import TransformerXL
    from txl.anatomy import distance_profile, term_profiles

    model = TransformerXL.from_pretrained("weights/shakespeare-char")
    ids = model.tokenizer.encode(text)
    p = distance_profile(model, ids, mem_len=128)  # [n_layer, n_head, 128 + 64]
    t = term_profiles(model, ids, mem_len=128)     # [3, n_layer, n_head, 192]: (a), (b), (d)

The score of query i on key j, Δ = M + i - j positions back (``txl.model.score_terms``):

    A[i, j] = scale · ( q_i·k_j  +  q_i·W_r R_Δ  +  u·k_j  +  v·W_r R_Δ ),   scale = 1/sqrt(Dh)
                        (a)         (b)             (c)       (d)

The text is read as in evaluation: segments of the model's ``tgt_len``, each over a memory of
the last ``mem_len`` positions, starting from an empty memory. Every query's weights are
binned by how far back each key is (0 = the query itself) and averaged over all N queries:

    profile[l, h, Δ] = (1/N) Σ_queries  p_lh(query -> the key Δ back)          (Figure 5)

so each [l, h] row sums to 1. ``term_profiles`` does the same with each of (a), (b), (d)
softmaxed alone over the query's keys, softmax(scale · term) (Figure 7: what each term
would attend to by itself; (c) is left out as in the paper).

The newest token's four terms in a step are ``StepTrace.terms`` (``txl.session``), shown by
the demo's ``webapp.anatomy_viz.step_terms``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .cached import KVMemory, cached_forward
from .model import TransformerXL

TERM_INDEX = {"a": 0, "b": 1, "c": 2, "d": 3}  # in score_terms' [4, ...] output
TERMS = ("a", "b", "d")  # term_profiles' first axis (the paper's Figure 7)


@dataclass
class Profiles:
    """Attention (and each term alone) by distance, averaged over the queries read so far."""

    attention: np.ndarray  # [n_layer, n_head, D] float64, D = mem_len + seg_len; rows sum to 1
    terms: np.ndarray | None  # [3, n_layer, n_head, D]: (a), (b), (d) each softmaxed alone
    n_queries: int  # N: the queries averaged over (tokens read so far)
    n_tokens: int  # the whole text's tokens (n_queries == n_tokens once done)
    mem_len: int
    seg_len: int
    seconds: float  # wall time so far

    @property
    def done(self) -> bool:
        return self.n_queries == self.n_tokens


def _as_ids(ids) -> Tensor:
    """A 1-D token id sequence as a [1, L] LongTensor."""
    ids = torch.as_tensor(np.asarray(ids), dtype=torch.long)
    if ids.dim() != 1:
        raise ValueError(f"ids must be a 1-D sequence of token ids, got shape {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError("ids is empty: there is nothing to read")
    return ids.view(1, -1)


def by_distance(weights: Tensor, D: int) -> Tensor:
    """[X, T, K] weights of a segment's queries over their keys (K = M + T) -> [X, D]:
    entry Δ sums the weights of every query i on the key j = M + i - Δ back.

    The inverse of model.rel_shift's trick: row i moved right by T - 1 - i puts every
    row's keys in one order of distance (column c = distance K - 1 - c), so that a sum
    over the rows adds up equal distances. Pad T - 1 zeros in front of each row [.., K + T
    - 1] and read it with a row stride one longer: row i starts i places later."""
    X, T, K = weights.shape
    W = K + T - 1
    padded = F.pad(weights, (T - 1, 0))  # [X, T, W]
    aligned = padded.as_strided((X, T, K), (T * W, W + 1, 1))  # [X, T, K]: by distance
    out = weights.new_zeros(X, D)
    out[:, :K] = aligned.sum(dim=1).flip(-1)  # distances 0 ... K - 1
    return out


def mean_distance(profile: np.ndarray) -> np.ndarray:
    """[..., D] -> [...]: the mean distance a head reads at, Σ_Δ Δ · profile[..., Δ]."""
    return profile @ np.arange(profile.shape[-1], dtype=np.float64)


def share_beyond(profile: np.ndarray, distance: int) -> np.ndarray:
    """[..., D] -> [...]: the share of attention on keys ``distance`` or more back."""
    return profile[..., distance:].sum(axis=-1)


def iter_profiles(
    model: TransformerXL,
    ids: Sequence[int] | np.ndarray | Tensor,
    mem_len: int,
    terms: bool = True,
    seg_len: int | None = None,
) -> Iterator[Profiles]:
    """Read ids in segments and yield the running Profiles after each segment (the last
    one yielded covers the whole text). A generator, so that a caller can show progress and
    stop early. The model reads in eval mode (no dropout); its mode is put back after."""
    if isinstance(mem_len, bool) or int(mem_len) != mem_len or mem_len < 0:
        raise ValueError(f"mem_len must be an integer >= 0, got {mem_len!r}")
    mem_len = int(mem_len)
    seg_len = int(seg_len or model.config.tgt_len)
    x = _as_ids(ids).to(next(model.parameters()).device)
    cfg, n = model.config, x.size(1)
    D, L, H = mem_len + seg_len, cfg.n_layer, cfg.n_head
    scale = 1.0 / math.sqrt(cfg.d_head)
    # Sums over all queries so far, in float64; each segment's own sums (64 queries at
    # most per distance) are taken in the model's precision.
    attention = torch.zeros(L, H, D, dtype=torch.float64, device=x.device)
    alone = torch.zeros(len(TERMS), L, H, D, dtype=torch.float64, device=x.device)
    # bfloat16 models: softmax and sums in float32 at least
    work = torch.promote_types(next(model.parameters()).dtype, torch.float32)
    memory, started = KVMemory(), time.perf_counter()
    # inference_mode: the model's outputs are inference tensors, scaled here in place
    with _eval_mode(model), torch.inference_mode():
        for start in range(0, n, seg_len):
            out = cached_forward(
                model,
                x[:, start : start + seg_len],
                memory,
                output_attentions=True,
                mem_len=mem_len,
                last_only=True,  # the logits are not needed: the last position's are cheap
                output_terms=terms,
            )
            T = out.attentions[0].size(2)
            for layer, probs in enumerate(out.attentions):  # [1, H, T, K]
                attention[layer] += by_distance(probs[0].to(work), D)
            for layer, layer_terms in enumerate(out.terms or ()):  # [4, 1, H, T, K]
                scaled = layer_terms[:, 0].to(work).mul_(scale)  # [4, H, T, K]
                for t, name in enumerate(TERMS):  # each softmaxed alone over the query's keys
                    weights = scaled[TERM_INDEX[name]].softmax(dim=-1)
                    alone[t, layer] += by_distance(weights, D)
            done = start + T
            yield Profiles(
                attention=(attention / done).cpu().numpy(),
                terms=(alone / done).cpu().numpy() if terms else None,
                n_queries=done,
                n_tokens=n,
                mem_len=mem_len,
                seg_len=seg_len,
                seconds=time.perf_counter() - started,
            )


@contextmanager
def _eval_mode(model: TransformerXL):
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


def profiles(model: TransformerXL, ids, mem_len: int, terms: bool = True, seg_len=None):
    """The Profiles of the whole text (iter_profiles' last)."""
    *_, result = iter_profiles(model, ids, mem_len, terms, seg_len)
    return result


def distance_profile(model: TransformerXL, ids, mem_len: int) -> np.ndarray:
    """[n_layer, n_head, mem_len + tgt_len]: entry [l, h, Δ] is the mean over all N query
    positions of the weight head h of layer l gives to the key Δ positions back (0 = the
    query itself; 0 where a query has no key that far back). Each [l, h] row sums to 1."""
    return profiles(model, ids, mem_len, terms=False).attention


def term_profiles(model: TransformerXL, ids, mem_len: int) -> np.ndarray:
    """[3, n_layer, n_head, mem_len + tgt_len]: the same average for the terms (a), (b),
    (d), each softmaxed alone over the query's keys (softmax(scale · term))."""
    return profiles(model, ids, mem_len, terms=True).terms
