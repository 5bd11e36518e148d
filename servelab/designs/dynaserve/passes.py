"""Vectorised building blocks of the predictor's timeline (no per-request Python loops).

- ``coefficients``: the linear costs the timeline's probes use, read off a profile table.
- ``decode_rows``: decode rows and their context sum per pass, for many requests at once
  (request ``i`` holds one row in passes ``[start_i, start_i + length_i)``, its context
  growing by one per pass), by difference arrays.
- ``fcfs_prefill``: prefill of many requests laid first come first served into the free
  budget of existing passes, then into full passes after them.
- ``lay_out``: a whole instance queue (running decodes, then parts ready now) as passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from servelab.designs.dynaserve.profile import ProfileTable


@dataclass(frozen=True, slots=True)
class Coefficients:
    prefill_token_s: float  # marginal time of one prefill token in a mixed pass
    full_pass_tokens: int  # prefill budget of a pass without decodes
    full_pass_token_s: float  # time (and work) per token of such passes
    row_s: float  # marginal time of one decode row: row_s + row_ctx_s * context
    row_ctx_s: float
    base_s: float  # a pass's floor (weights read): a one-decode pass at no context
    full_rows: float  # decode rows a pass holds under the SLO (at 1024 tokens of context)

    @property
    def decode_share_s(self) -> float:
        """The base's share one decode row carries in a full pass."""
        return self.base_s / self.full_rows


def coefficients(table: ProfileTable, target_s: float) -> Coefficients:
    """Linear costs read off the table: what one prefill token, one decode row (by context)
    and a pass without decodes cost, and how many decode rows fill a pass."""
    top = float(table.prefill_axis[-1])
    p1, p2 = min(256.0, top / 2), min(2048.0, top)
    prefill_token_s = max((table.latency_s(p2, 0, 8) - table.latency_s(p1, 0, 8)) / max(p2 - p1, 1.0), 0.0)
    full = max(int(table.prefill_budget(0.0, 0, target_s)), 16)
    full_pass_token_s = table.latency_s(full, 0, 0) / full
    n_top = float(table.decode_axis[-1])
    n1, n2 = min(16.0, n_top / 2), min(64.0, n_top)

    def row(c: float) -> float:
        return (table.latency_s(0, c, n2) - table.latency_s(0, c, n1)) / max(n2 - n1, 1.0)

    r512, r2048 = row(512.0), row(2048.0)
    row_ctx_s = max((r2048 - r512) / 1536.0, 0.0)
    decodes_only = table.prefill_curves(np.full(len(table.decode_axis), 1024.0), table.decode_axis)[:, 0]
    under = table.decode_axis[decodes_only <= target_s]
    full_rows = float(under[-1]) if len(under) else 1.0
    return Coefficients(prefill_token_s, full, full_pass_token_s, max(r512 - 512.0 * row_ctx_s, 0.0), row_ctx_s,
                        table.latency_s(0, 0, 1), max(full_rows, 1.0))


def decode_rows(starts: np.ndarray, lengths: np.ndarray, contexts: np.ndarray, cap: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Rows per pass and their context sum; beyond ``cap`` rows a pass keeps ``cap`` (the
    context sum scaled to match)."""
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(lengths, np.int64)
    keep = lengths > 0
    starts, lengths, contexts = starts[keep], lengths[keep], np.asarray(contexts, np.float64)[keep]
    if not len(starts):
        return np.zeros(0), np.zeros(0)
    ends = starts + lengths
    horizon = int(ends.max())
    count = np.bincount(starts, minlength=horizon + 1) - np.bincount(ends, minlength=horizon + 1)
    offset = contexts - starts  # row i's context at pass k is offset_i + k
    base = (np.bincount(starts, weights=offset, minlength=horizon + 1)
            - np.bincount(ends, weights=offset, minlength=horizon + 1))
    rows = np.cumsum(count)[:horizon].astype(np.float64)
    ctx = np.cumsum(base)[:horizon] + np.arange(horizon) * rows
    if rows.max(initial=0) > cap:
        scale = np.minimum(cap / np.maximum(rows, 1.0), 1.0)
        rows, ctx = rows * scale, ctx * scale
    return rows, ctx


def fcfs_prefill(free: np.ndarray, prefill: np.ndarray, full_pass_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Prefill tokens per pass and the pass where each request's prefill ends, requests in
    order, into ``free`` budget per existing pass and full passes after them."""
    prefill = np.asarray(prefill, np.float64)
    if not len(prefill) or prefill.sum() <= 0:
        return np.zeros(len(free)), np.full(len(prefill), -1, np.int64)
    need = np.cumsum(prefill)
    total = float(need[-1])
    capacity = np.concatenate(([0.0], np.cumsum(free)))  # budget of passes [0, k)
    inside = float(capacity[-1])
    extra = max(0, int(np.ceil((total - inside) / full_pass_tokens))) if total > inside else 0
    if extra:
        capacity = np.concatenate((capacity, inside + full_pass_tokens * np.arange(1, extra + 1)))
    taken = np.minimum(capacity, total)
    pre = np.diff(taken)
    ends = np.searchsorted(capacity, need, side="left") - 1  # the pass holding each request's last token
    return pre, np.maximum(ends, 0)


def lay_out(table: ProfileTable, target_s: float, full_pass_tokens: int, cap: int, decode_left: np.ndarray,
            decode_context: np.ndarray, ready: Sequence) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Passes for running decodes plus segments ready now (FCFS): (rows, ctx, pre, the last
    pass with prefill)."""
    rows_a, ctx_a = decode_rows(np.zeros(len(decode_left), np.int64), decode_left, decode_context, cap)
    mean = np.divide(ctx_a, rows_a, out=np.zeros(len(rows_a)), where=rows_a > 0)
    free = table.budget_many(mean, rows_a, target_s) if len(rows_a) else np.zeros(0)
    prefill = np.array([g.prefill_tokens for g in ready], np.float64)
    pre, ends = fcfs_prefill(free, prefill, full_pass_tokens)
    starts = np.where(prefill > 0, ends + 1, 0)
    rows_b, ctx_b = decode_rows(starts, [g.decode_tokens for g in ready], [g.context for g in ready], cap)
    horizon = max(len(rows_a), len(pre), len(rows_b))
    rows, ctx, pre_all = np.zeros(horizon), np.zeros(horizon), np.zeros(horizon)
    rows[:len(rows_a)] += rows_a
    ctx[:len(ctx_a)] += ctx_a
    rows[:len(rows_b)] += rows_b
    ctx[:len(ctx_b)] += ctx_b
    pre_all[:len(pre)] += pre
    used = np.nonzero(pre_all)[0]
    return rows, ctx, pre_all, int(used[-1]) if len(used) else 0
