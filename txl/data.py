"""Text -> token ids -> contiguous parallel streams -> segments.

Transformer-XL's memory only helps if the memory carried into a segment is the text that
really came before it. So the token stream is cut into ``n_streams`` contiguous rows, and
segment s of every row follows segment s - 1 of the same row: batch s is
``streams[:, s*T : (s+1)*T]`` with targets shifted by one.
"""

from __future__ import annotations

import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)


def tiny_shakespeare_path(checkout: Path) -> Path:
    """Where a checkout's scripts and tests find Tiny Shakespeare: $TXL_DATA, else the
    shared copy beside the checkout (../shared/data), else ~/.cache/txl (for
    ``load_text(..., download=True)`` to fetch it there once)."""
    if os.environ.get("TXL_DATA"):
        return Path(os.environ["TXL_DATA"])
    shared = checkout.parent / "shared" / "data" / "tinyshakespeare.txt"
    if shared.exists():
        return shared
    return Path.home() / ".cache" / "txl" / "tinyshakespeare.txt"


def load_text(path: str | Path, download: bool = False) -> str:
    """Read a UTF-8 text; with ``download``, fetch Tiny Shakespeare to ``path`` if absent."""
    path = Path(path)
    if not path.exists():
        if not download:
            raise FileNotFoundError(
                f"{path} does not exist (pass --download to fetch Tiny Shakespeare there)"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(TINY_SHAKESPEARE_URL, timeout=60) as response:
            path.write_bytes(response.read())
    return path.read_text(encoding="utf-8")


def train_val_split(text: str, val_fraction: float = 0.1) -> tuple[str, str]:
    """nanoGPT's split: the first 90 % of the characters train, the last 10 % validate."""
    n = int(len(text) * (1 - val_fraction))
    return text[:n], text[n:]


@dataclass
class SegmentBatch:
    inputs: Tensor  # [n_streams, T]
    targets: Tensor  # [n_streams, T]: inputs shifted left by one token
    index: int  # which segment of the streams this is
    first: bool  # the first segment of the streams: start from empty memory


class StreamBatcher:
    """Cuts ``ids`` into ``n_streams`` contiguous rows and walks them T tokens at a time.

    ``rank``/``world`` select this process's share of the rows (DistributedDataParallel):
    rank r gets rows r, r + world, r + 2*world, ...
    """

    def __init__(self, ids: Tensor, n_streams: int, seg_len: int, rank: int = 0, world: int = 1):
        if n_streams % world:
            raise ValueError(f"n_streams={n_streams} is not divisible by world size {world}")
        row_len = len(ids) // n_streams
        if row_len < seg_len + 1:
            raise ValueError(
                f"{len(ids)} tokens are too few for {n_streams} streams of segment {seg_len}"
            )
        self.streams = ids[: n_streams * row_len].view(n_streams, row_len)[rank::world]
        self.seg_len = seg_len
        self.n_segments = (row_len - 1) // seg_len

    def __len__(self) -> int:
        return self.n_segments

    def segment(self, index: int) -> SegmentBatch:
        """Segment ``index`` (taken modulo the number of segments: epochs wrap around)."""
        s = index % self.n_segments
        a = s * self.seg_len
        return SegmentBatch(
            self.streams[:, a : a + self.seg_len],
            self.streams[:, a + 1 : a + self.seg_len + 1],
            s,
            s == 0,
        )

    def __iter__(self):
        return (self.segment(i) for i in range(self.n_segments))
