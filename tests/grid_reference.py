"""grid_sample's reflection padding as docs/enable.md states it, for the 2-d and 3-d oracle tests."""

from __future__ import annotations

import math


def reflect(c: float, size: int, align: bool) -> tuple:
    """torch's reflect_coordinates as docs/enable.md states it (binary64, math.fmod exact), and the gradient's sign."""
    low, high = (0.0, 2.0 * (size - 1)) if align else (-1.0, 2.0 * size - 1.0)
    if low == high:
        return 0.0, 0.0
    lo, span = low / 2, (high - low) / 2
    d = c - lo
    extra = math.fmod(abs(d), span)
    odd = math.floor(abs(d) / span) % 2 == 1
    return ((span - extra) + lo if odd else extra + lo), (-1.0 if d < 0 else 1.0) * (-1.0 if odd else 1.0)
