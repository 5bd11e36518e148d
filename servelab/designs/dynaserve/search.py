"""Searches over a timeline's sorted per-pass arrays, from a known lower bound outwards.

The answer is usually a few passes past the head of thousands (the passes the clock has
just passed, where a new part lands). Galloping from there reads a few neighbouring cache
lines instead of a dozen spread over the arrays, which is what a binary search costs a
decision that runs with caches cold (the simulator ran in between). The results are
``bisect``'s exactly (``tests/designs/dynaserve/test_fast_paths.py``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np


def gallop_left(a: np.ndarray, x: float, lo: int, hi: int) -> int:
    """``bisect_left(a, x, lo, hi)`` on the sorted ``a``, searched outwards from ``lo``."""
    item, step = a.item, 1
    while lo < hi and item(lo) < x:
        lo, hi_probe = lo + 1, lo + step
        if hi_probe >= hi or not item(hi_probe) < x:
            return bisect_left(a, x, lo, min(hi_probe, hi))
        lo, step = hi_probe + 1, step * 2
    return lo


def gallop_right(a: np.ndarray, x: float, lo: int, hi: int) -> int:
    """``bisect_right(a, x, lo, hi)`` on the sorted ``a``, searched outwards from ``lo``."""
    item, step = a.item, 1
    while lo < hi and item(lo) <= x:
        lo, hi_probe = lo + 1, lo + step
        if hi_probe >= hi or item(hi_probe) > x:
            return bisect_right(a, x, lo, min(hi_probe, hi))
        lo, step = hi_probe + 1, step * 2
    return lo
