"""How far apart two floating-point results may be, in units of the last place (ulps).

A fixed ``atol`` is the rounding of one machine: float32 products round differently on
different CPUs (MKL's AVX-512 kernels against its AVX2 ones, ATen's vectorised loops).
The same last logits computed as a one-row product and as a five-row one differ by
1.34e-6 with MKL's AVX-512 kernels (an Intel Xeon) and by less than 1e-6 with its AVX2
ones (an AMD EPYC): ``atol=1e-6`` held on one machine and failed on the other. A bound
in ulps of the values compared holds on every CPU:

    |actual - expected| <= ulps * eps(dtype) * scale,    scale = max |expected|

eps is the machine epsilon of the coarser of the two dtypes (float32: 2**-23 = 1.19e-7,
float64: 2**-52 = 2.2e-16), so one assertion states an exactness claim in float64 (to
~1e-14) and the same claim in float32 (to ~1e-5) with the same number of ulps. A real
bug (a wrong mask, a position off by one) moves the values by 1e-2 and more: thousands
of float32 ulps at least, far beyond the budgets below (tests/test_tolerance.py).

Set TXL_ULPS_LOG=FILE and every call appends how many ulps it measured and allowed, with
the test line it came from: the numbers to size a budget with, under any kernel setting
(``make test-kernels``).
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import NamedTuple

import numpy as np
import torch

# Budgets, in ulps of the largest value compared. [In brackets: the most seen in any
# check of its kind under the kernel settings of `make test-kernels`, on an Intel Xeon
# with AVX-512 and AMX.] Each is 3x that or more, and far below what a bug moves: a
# logit off by 1e-2 is 9,000 ulps of the shipped model's logits and 50,000 of a tiny
# one's, a position off by one 500,000 or more (tests/test_tolerance.py).
SAME_SUMS = 64  # the same arithmetic in another order or through other kernels: a step
#                 against a forward, segments against one pass [float32 8.7, float64 12]
ROW_SUM = 16  # attention weights summed against 1 [2]
FLOAT32_VS_64 = 256  # a float32 model against the same weights in float64 [4.8; 21 in
#                      ulps of a probability itself, 6 significant digits shown]
AGAINST_REFERENCE = 128  # ours against transformers' TransfoXL in the same dtype, each
#                          rounding in its own order, with a scale of REFERENCE_FLOOR at
#                          least [float32: up to 41 with MKL's SSE4.2 kernels, 19 with its
#                          AVX2 ones, 7 with AVX-512; float64 21]. At the adaptive cases'
#                          log-probabilities of -521 it allows 7.9e-3, still under 1e-2
#                          (3.7e-4 seen there).
REFERENCE_FLOOR = 16  # the memories (LayerNorm outputs, ~4) carry the rounding of the
#                       larger sums before the norm: up to 73 ulps of their own size, 19 of 16
RECORDED_ELSEWHERE = 1024  # a float32 mean over 111,528 tokens, recorded on another
#                            machine with its own kernels and threads [0.7]


def eps_of(x) -> float:
    """Machine epsilon of x's dtype (tensor, array or number; Python floats are float64)."""
    if isinstance(x, torch.Tensor):
        return torch.finfo(x.dtype).eps
    dtype = np.asarray(x).dtype
    return float(np.finfo(dtype).eps) if np.issubdtype(dtype, np.floating) else 2.0**-52


def _float64(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double()
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


class Apart(NamedTuple):
    diff: float  # max |actual - expected|
    ulps: float  # diff in units of eps * scale
    eps: float  # machine epsilon of the coarser dtype
    scale: float  # max |expected| unless given


def ulps_apart(actual, expected, scale: float | None = None, dtype=None,
               floor: float = 0.0) -> Apart:
    """How far actual is from expected, in ulps of scale of dtype.

    scale: max |expected| (at least floor: the size of the sums a result came from, when
    it is smaller than they were, as a LayerNorm's output is) unless given. dtype: the
    coarser of the two unless given (name it when the values were computed in float32
    but arrive as Python floats or float64 means).

    expected may be a scalar (compared with every element); otherwise the shapes must be
    equal (broadcasting would hide a missing or extra row). NaN anywhere is infinitely far.
    """
    a, e = _float64(actual), _float64(expected)
    if e.dim() and a.shape != e.shape:
        raise AssertionError(f"shapes differ: {tuple(a.shape)} against {tuple(e.shape)}")
    eps = torch.finfo(dtype).eps if dtype is not None else max(eps_of(actual), eps_of(expected))
    if scale is None:
        scale = max(e.abs().max().item() if e.numel() else 0.0, floor)
    diff = (a - e).abs().max().item() if a.numel() else 0.0
    if diff != diff:  # NaN
        diff = math.inf
    unit = eps * scale
    ulps = diff / unit if unit else (0.0 if diff == 0 else math.inf)
    return Apart(diff, ulps, eps, scale)


def assert_ulps_close(actual, expected, ulps: float, *, scale: float | None = None,
                      dtype=None, floor: float = 0.0, what: str = "") -> None:
    """|actual - expected| <= ulps * eps * scale (see the module's docstring, and
    ulps_apart for scale, dtype and floor)."""
    apart = ulps_apart(actual, expected, scale, dtype, floor)
    _record(apart, ulps)
    if not apart.ulps <= ulps:
        raise AssertionError(
            f"{what + ': ' if what else ''}{apart.diff:.3g} apart, {apart.ulps:.1f} ulps of "
            f"{apart.scale:.3g} (eps {apart.eps:.3g}), more than the {ulps} allowed"
        )


KERNEL_SETTINGS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")  # scripts/test-kernels.sh


def _record(apart: Apart, allowed: float) -> None:
    path = os.environ.get("TXL_ULPS_LOG")
    if not path:
        return
    frame = sys._getframe(2)
    while frame and not os.path.basename(frame.f_code.co_filename).startswith("test_"):
        frame = frame.f_back  # the test's own line, past shared helpers
    frame = frame or sys._getframe(2)
    site = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}:{frame.f_code.co_name}"
    kernels = " ".join(f"{k}={os.environ[k]}" for k in KERNEL_SETTINGS if k in os.environ)
    with open(path, "a") as log:
        log.write(json.dumps({"site": site, "kernels": kernels or "own", "eps": apart.eps,
                              "ulps": apart.ulps, "diff": apart.diff, "scale": apart.scale,
                              "allowed": allowed}) + "\n")
