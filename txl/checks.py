"""The checks of a session's settings and of the numbers a scoring call takes: each returns
the value as the code uses it, or raises ValueError with a message a person can act on.
Every setting is checked before anything changes (``Session.configure``)."""

from __future__ import annotations

import math

import numpy as np


def as_int(name: str, value, minimum: int) -> int:
    """An int >= minimum; integral floats (a UI slider's 40.0) are accepted."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def as_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def check_temperature(value) -> float:
    value = as_float("temperature", value)
    if value < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {value}")
    return value


def check_top_p(value) -> float:
    value = as_float("top_p", value)
    if not 0 < value <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {value}")
    return value


def check_seed(value) -> int:
    value = as_int("seed", value, -(2**63))
    if value >= 2**64:  # torch.Generator.manual_seed's range
        raise ValueError(f"seed must be < 2**64, got {value}")
    return value
