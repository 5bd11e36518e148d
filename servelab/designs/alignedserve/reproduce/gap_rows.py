"""Reading the per-seed result rows of the gap tests: pick rows by their settings, the seeds
they share, and 95% t intervals and their bounds, for the report sections that state verdicts
from paired per-seed differences (``report_open_gaps``, ``report_prefetch_gaps``)."""

from __future__ import annotations

import math

from servelab.reproduce.stats import t_interval

F2 = "{:.2f}"


def interval_text(values, fmt=F2) -> str:
    return t_interval(values).format(fmt)


def rows_matching(rows, **match) -> list[dict]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def row_matching(rows, **match) -> dict:
    got = rows_matching(rows, **match)
    return got[0] if got else {}


def seeds_of(rows) -> list[int]:
    return sorted({r["seed"] for r in rows})


def is_above(iv, value) -> bool:
    return math.isfinite(iv.low) and iv.low > value


def is_below(iv, value) -> bool:
    return math.isfinite(iv.high) and iv.high < value
