"""Adaptive input embedding and projected adaptive softmax (the WikiText-103 model).

Baevski & Auli (2019) "Adaptive Input Representations", Grave et al. (2017) "Efficient
softmax approximation for GPUs", as the Transformer-XL code combines them (and
Hugging Face's TransfoXL: AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax).

The vocabulary, sorted by frequency, is cut into clusters by ``cutoffs``: cluster i holds
the ids [b_i, b_{i+1}) with b = [0, *cutoffs, V]. Frequent words get wide embeddings, rare
ones narrow: cluster i has width d_i = d_embed // div_val**i and a projection P_i
[d_model, d_i] to the model's width (with div_val 1 all clusters share one embedding of
width d_embed and one projection, which is omitted when d_embed == d_model).

Input:   x = sqrt(d_model) · P_i E_i[w - b_i]                    for w in cluster i

Output: the *head* scores the shortlist (cluster 0's words) and one entry per tail
cluster; a tail cluster scores its own words. With h the final hidden state [d_model]:

    head = softmax(E'_0 (Q_0^T h) + c_0)      E'_0 = [E_0; cluster weights], c_0 likewise
    log p(w) = log head[w]                                          (w in cluster 0)
    log p(w) = log head[b_1 + i - 1]                                (w in cluster i > 0)
             + log softmax(E_i (Q_i^T h) + c_i)[w - b_i]

The output weights E_i are the input embeddings (tied); the projections Q_i are the input
ones P_i where ``tie_projs[i]`` says so, else their own. Biases c_i are the output's own.
Only what is asked for is computed: ``nll`` evaluates the tail of a cluster only for the
positions whose target lies in it; ``log_probs`` (for sampling) fills all V columns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import TXLConfig


class AdaptiveEmbedding(nn.Module):
    """ids [...] -> P_i E_i[id - b_i]  [..., d_model] (unscaled: the model multiplies by
    sqrt(d_model), as it does for the plain embedding)."""

    def __init__(self, cfg: TXLConfig):
        super().__init__()
        self.bounds, dims = cfg.cluster_bounds, cfg.embed_dims
        self.d_model = cfg.d_model
        self.layers = nn.ModuleList(nn.Embedding(n, d) for n, d in zip(cfg.table_sizes, dims))
        self.projs = nn.ParameterList(
            nn.Parameter(torch.zeros(cfg.d_model, d)) for d in dims if cfg.projected
        )  # P_i [d_model, d_i]

    def forward(self, ids: Tensor) -> Tensor:
        if len(self.layers) == 1:
            x = self.layers[0](ids)
            return F.linear(x, self.projs[0]) if len(self.projs) else x
        weight = self.projs[0]
        out = torch.zeros(*ids.shape, self.d_model, dtype=weight.dtype, device=weight.device)
        for i, layer in enumerate(self.layers):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            in_cluster = (ids >= lo) & (ids < hi)
            if in_cluster.any():
                out[in_cluster] = F.linear(layer(ids[in_cluster] - lo), self.projs[i])
        return out


class ProjectedAdaptiveLogSoftmax(nn.Module):
    """Log-probabilities over the vocabulary from hidden states, clusters as above.

    Holds only what the output side owns (biases, cluster weights, untied projections);
    the tied tensors are read from the ``embedding`` given at construction (kept outside
    the module tree, so the state dict stores them once)."""

    def __init__(self, cfg: TXLConfig, embedding: AdaptiveEmbedding):
        super().__init__()
        self._embedding = [embedding]  # a list: not registered as a submodule
        self.bounds = cfg.cluster_bounds
        self.n_clusters = len(cfg.cutoffs)  # tail clusters
        self.shortlist = self.bounds[1]
        self.div_val = cfg.div_val
        if self.n_clusters:
            self.cluster_weight = nn.Parameter(torch.zeros(self.n_clusters, cfg.d_embed))
            self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(n)) for n in cfg.table_sizes)
        # Q_i: the embedding's projection where tied, else an own one (keys "0", "1", ...).
        self.projs = nn.ParameterDict(
            {
                str(i): nn.Parameter(torch.zeros(cfg.d_model, cfg.cluster_dim(i)))
                for i, tied in enumerate(cfg.tied_projections)
                if cfg.projected and not tied
            }
        )

    def cluster_params(self, i: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """(E_i [n_i, d_i], c_i [n_i], Q_i [d_model, d_i] or None) of cluster i."""
        emb = self._embedding[0]
        lo, hi = self.bounds[i], self.bounds[i + 1]
        if self.div_val == 1:  # slices of the one table
            weight, bias = emb.layers[0].weight[lo:hi], self.biases[0][lo:hi]
        else:
            weight, bias = emb.layers[i].weight, self.biases[i]
        if str(i) in self.projs:
            proj = self.projs[str(i)]
        elif len(emb.projs):  # tied: the input's projection
            proj = emb.projs[0 if self.div_val == 1 else i]
        else:
            proj = None
        return weight, bias, proj

    def cluster_logits(self, h: Tensor, i: int) -> Tensor:
        """[N, d_model] -> [N, n_i] scores inside cluster i (the head: [N, b_1 + n_clusters]),
        in float32 at least (log-softmax over 200k words in bfloat16 would lose the tail)."""
        weight, bias, proj = self.cluster_params(i)
        x = h if proj is None else h @ proj  # Q_i^T h: [N, d_i]
        logits = F.linear(x, weight, bias)
        if i == 0 and self.n_clusters:  # the head also scores each tail cluster
            clusters = F.linear(x, self.cluster_weight, self.cluster_bias)
            logits = torch.cat([logits, clusters], dim=-1)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def log_probs(self, h: Tensor) -> Tensor:
        """[..., d_model] -> [..., V] log-probabilities of every token."""
        lead, h = h.shape[:-1], h.reshape(-1, h.size(-1))
        head = self.cluster_logits(h, 0).log_softmax(dim=-1)  # [N, b_1 + n_clusters]
        if not self.n_clusters:
            return head.view(*lead, -1)
        out = head.new_empty(h.size(0), self.bounds[-1])
        out[:, : self.shortlist] = head[:, : self.shortlist]
        for i in range(1, self.n_clusters + 1):
            tail = self.cluster_logits(h, i).log_softmax(dim=-1)
            cluster = head[:, self.shortlist + i - 1, None]  # log p(cluster i)
            out[:, self.bounds[i] : self.bounds[i + 1]] = cluster + tail
        return out.view(*lead, -1)

    def nll(self, h: Tensor, targets: Tensor) -> Tensor:
        """-log p(target): [..., d_model], [...] -> [...] (float32), computing each tail
        cluster only at the positions whose target lies in it."""
        shape, h, targets = targets.shape, h.reshape(-1, h.size(-1)), targets.reshape(-1)
        head = self.cluster_logits(h, 0).log_softmax(dim=-1)
        in_head = targets < self.shortlist
        out = torch.empty(targets.shape, dtype=head.dtype, device=head.device)
        out[in_head] = -head[in_head].gather(1, targets[in_head, None]).squeeze(1)
        for i in range(1, self.n_clusters + 1):
            rows = ((targets >= self.bounds[i]) & (targets < self.bounds[i + 1])).nonzero()[:, 0]
            if not len(rows):
                continue
            tail = self.cluster_logits(h[rows], i).log_softmax(dim=-1)
            within = (targets[rows] - self.bounds[i])[:, None]
            logp = head[rows, self.shortlist + i - 1] + tail.gather(1, within).squeeze(1)
            out[rows] = -logp
        return out.view(shape)
