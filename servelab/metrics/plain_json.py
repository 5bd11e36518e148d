"""Results as plain JSON: what reports write beside their markdown, so a later command (the
reproduction README, a test) can read the numbers back without numpy or NaN surprises."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def plain(value: Any) -> Any:
    """``value`` with dict keys as strings, tuples as lists, numpy scalars as Python numbers
    and non-finite Python floats as None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
