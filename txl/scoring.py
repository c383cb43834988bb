"""Per-token surprisal of a text read segment by segment, with or without memory.

One function serves both ``python -m txl.evaluate`` (the validation loss) and
``Session.score`` (the app's "does memory help?" view), so the two always agree.
"""

from __future__ import annotations

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .model import TransformerXL


@torch.no_grad()
def stream_nll(
    model: TransformerXL,
    streams: Tensor,
    seg_len: int,
    mem_len: int,
    max_segments: int | None = None,
    progress: bool = False,
    desc: str = "score",
) -> Tensor:
    """Negative log-likelihood (nats) of every predicted token of ``streams``.

    streams [S, L]: S independent rows of token ids, each read left to right in segments
    of ``seg_len``, the memory (``mem_len`` positions; 0 = none, each segment alone)
    carried from one segment to the next. Token t is predicted from tokens < t.
    Returns [S, L - 1] (fewer columns with ``max_segments``). Runs in eval mode.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    n_pred = streams.size(1) - 1
    starts = range(0, n_pred, seg_len)
    if max_segments is not None:
        starts = starts[:max_segments]
    memory, losses = None, []
    for a in tqdm(starts, desc=desc, disable=not progress, leave=False):
        b = min(a + seg_len, n_pred)
        inputs = streams[:, a:b].to(device)
        targets = streams[:, a + 1 : b + 1].to(device)
        out = model.forward_cached(
            inputs, memory if mem_len > 0 else None, mem_len=mem_len, targets=targets
        )
        memory = out.memory
        losses.append(out.nll.float().cpu())
    model.train(was_training)
    return torch.cat(losses, dim=1) if losses else torch.zeros(streams.size(0), 0)


def split_streams(ids: Tensor, n_streams: int) -> Tensor:
    """Cut a 1-D id tensor into n_streams contiguous rows of equal length: [S, L]."""
    row_len = len(ids) // n_streams
    if row_len < 2:
        raise ValueError(f"{len(ids)} tokens are too few for {n_streams} streams")
    return ids[: n_streams * row_len].view(n_streams, row_len)
