"""The latency profile table of DynaServe's local scheduler (Algorithm 2), shared with the
global scheduler's predictor.

A step is summarised by (prefill tokens, mean decode context, number of decodes); the table
holds its latency on a grid of those three and interpolates between grid points (linear in
each axis, extrapolated beyond the last point). It answers the two questions the schedulers
ask: how long a step of this composition takes, and how many prefill tokens a step with
these decodes may take while staying under a latency target.

Where the values come from: profiling. In the simulator the instance's cost model is the
profiler (``from_cost_model``, built at first use); on the engine there is none, so the table
starts empty and a linear fit of measured steps fills it (``unprofiled``). Either way every
measured step refines the table online (``observe``): the cell nearest the step takes a
moving average of measured / predicted (folded into lookups every few steps), so the interpolation error of the grid and the
table's simplifications (one prefill chunk, mean context) are corrected where steps run.

Invariant: latency never decreases with prefill tokens along the prefill axis (enforced after
every change), so the budget inversion is well defined.
"""

from __future__ import annotations

import bisect
import math
from functools import lru_cache
from typing import Any

import numpy as np

from servelab.core.plan import StepShape

PREFILL_GRID = (0, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
CONTEXT_GRID = (0, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
DECODE_GRID = (0, 1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
_MIN_FIT_OBSERVATIONS = 8
_REFIT_EVERY = 32
_MAX_OBSERVATIONS = 512
_REFRESH_EVERY = 16  # measured steps folded into the table at once (lookups stay cached between)


def _axis(grid: tuple[int, ...], top: int) -> np.ndarray:
    """The grid cut at ``top`` with ``top`` itself as the last point."""
    return np.array(sorted({g for g in grid if g < top} | {top}), dtype=np.float64)


def _locate_one(axis: list[float], x: float) -> tuple[int, float]:
    i = min(max(bisect.bisect_right(axis, x) - 1, 0), len(axis) - 2)
    return i, max((x - axis[i]) / (axis[i + 1] - axis[i]), 0.0)


def _locate(axis: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower grid index and weight of ``x`` on ``axis``: clamped below, extrapolated above."""
    i = np.clip(np.searchsorted(axis, x, side="right") - 1, 0, len(axis) - 2)
    w = (x - axis[i]) / (axis[i + 1] - axis[i])
    return i, np.maximum(w, 0.0)


class ProfileTable:
    """latency_s[p, c, n] on the prefill x context x decode grid (NaN: not known yet)."""

    def __init__(self, max_batch_tokens: int, max_num_seqs: int, *, context_top: int = CONTEXT_GRID[-1]) -> None:
        self.prefill_axis = _axis(PREFILL_GRID, max(1, max_batch_tokens))
        self.context_axis = _axis(CONTEXT_GRID, max(1, context_top))
        self.decode_axis = _axis(DECODE_GRID, max(1, max_num_seqs))
        shape = (len(self.prefill_axis), len(self.context_axis), len(self.decode_axis))
        self.base = np.full(shape, np.nan)  # profiled or fitted latency
        self.correction = np.ones(shape)  # measured / predicted, per cell, from observed steps
        self._applied = np.ones(shape)  # the correction ``latency`` was last refreshed with
        self.latency = np.full(shape, np.nan)
        self._axes = (self.prefill_axis.tolist(), self.context_axis.tolist(), self.decode_axis.tolist())
        self._pending = 0  # observations not yet folded into ``latency``
        self.prefill_context_s = 0.0  # extra seconds per (chunk token x context token) of a prefill
        self.version = 0  # bumped whenever latencies change (predictors refresh derived figures)
        self.num_observed = 0
        self._observations: list[tuple[float, float, float, float]] = []
        self._budget_cache: dict[float, list] = {}  # target -> budgets of the (context, decodes) cells
        # the predictor's per-probe lookups repeat a few shapes: a small LRU cache per table
        self.cached_latency = lru_cache(maxsize=1024)(self._latency_at_bucket)

    # ---- construction ----
    @classmethod
    def from_cost_model(cls, cost_model: Any, max_batch_tokens: int, max_num_seqs: int) -> ProfileTable:
        """Profile ``cost_model`` over the grid: one prefill chunk from scratch plus ``n``
        decodes of the same context."""
        table = cls(max_batch_tokens, max_num_seqs)
        for i, p in enumerate(table.prefill_axis.astype(int).tolist()):
            for j, c in enumerate(table.context_axis.astype(int).tolist()):
                for k, n in enumerate(table.decode_axis.astype(int).tolist()):
                    shape = StepShape(prefill_tokens=(p,) if p else (), prefill_context=(p,) if p else (),
                                      num_decodes=n, decode_context_sum=n * c, decode_context_max=c if n else 0)
                    table.base[i, j, k] = cost_model.step_time_s(shape) if (p or n) else 0.0
        chunk, context = 512, 8192
        late = StepShape(prefill_tokens=(chunk,), prefill_context=(context,))
        early = StepShape(prefill_tokens=(chunk,), prefill_context=(chunk,))
        extra = cost_model.step_time_s(late) - cost_model.step_time_s(early)
        table.prefill_context_s = max(extra, 0.0) / (chunk * (context - chunk))
        table._refresh()
        return table

    @classmethod
    def unprofiled(cls, max_batch_tokens: int, max_num_seqs: int) -> ProfileTable:
        """No profiler: filled by a linear fit once enough steps have been measured."""
        return cls(max_batch_tokens, max_num_seqs)

    @property
    def context_weight(self) -> float:
        """Prefill tokens' worth of time one token of earlier context adds to a chunk token."""
        per_token = (self.latency_s(2048, 0, 0) - self.latency_s(256, 0, 0)) / 1792.0
        return self.prefill_context_s / per_token if per_token > 0 else 0.0

    @property
    def ready(self) -> bool:
        return not math.isnan(self.latency.item(0, 0, 0))  # a Python float: asked several times per decision

    # ---- lookups ----
    def latency_s(self, prefill_tokens: float, mean_context: float, num_decodes: float) -> float:
        """Scalar ``latency_many`` in plain Python (schedulers ask on every step and probe)."""
        i, wi = _locate_one(self._axes[0], prefill_tokens)
        j, wj = _locate_one(self._axes[1], mean_context)
        k, wk = _locate_one(self._axes[2], num_decodes)
        item = self.latency.item
        # along the decode axis at the four (prefill, context) corners, then context, then prefill
        low = item(i, j, k)
        v00 = low + wk * (item(i, j, k + 1) - low)
        low = item(i, j + 1, k)
        v01 = low + wk * (item(i, j + 1, k + 1) - low)
        low = item(i + 1, j, k)
        v10 = low + wk * (item(i + 1, j, k + 1) - low)
        low = item(i + 1, j + 1, k)
        v11 = low + wk * (item(i + 1, j + 1, k + 1) - low)
        c0 = v00 + wj * (v01 - v00)
        c1 = v10 + wj * (v11 - v10)
        return c0 + wi * (c1 - c0)

    def latency_many(self, prefill: np.ndarray, context: np.ndarray, decodes: np.ndarray) -> np.ndarray:
        """Trilinear interpolation, one value per (prefill, context, decodes) triple."""
        i, wi = _locate(self.prefill_axis, prefill)
        j, wj = _locate(self.context_axis, context)
        k, wk = _locate(self.decode_axis, decodes)
        lat = self.latency
        c00 = lat[i, j, k] + wk * (lat[i, j, k + 1] - lat[i, j, k])
        c01 = lat[i, j + 1, k] + wk * (lat[i, j + 1, k + 1] - lat[i, j + 1, k])
        c10 = lat[i + 1, j, k] + wk * (lat[i + 1, j, k + 1] - lat[i + 1, j, k])
        c11 = lat[i + 1, j + 1, k] + wk * (lat[i + 1, j + 1, k + 1] - lat[i + 1, j + 1, k])
        c0 = c00 + wj * (c01 - c00)
        c1 = c10 + wj * (c11 - c10)
        return c0 + wi * (c1 - c0)

    def prefill_curves(self, context: np.ndarray, decodes: np.ndarray) -> np.ndarray:
        """Latency along the whole prefill axis for each (context, decodes): [m, len(prefill_axis)]."""
        j, wj = _locate(self.context_axis, context)
        k, wk = _locate(self.decode_axis, decodes)
        lat = self.latency  # [P, C, N]
        wj, wk = wj[:, None], wk[:, None]
        a = lat[:, j, k].T + wk * (lat[:, j, k + 1].T - lat[:, j, k].T)
        b = lat[:, j + 1, k].T + wk * (lat[:, j + 1, k + 1].T - lat[:, j + 1, k].T)
        return a + wj * (b - a)

    def budget_many(self, context: np.ndarray, decodes: np.ndarray, target_s: float) -> np.ndarray:
        """Largest prefill tokens per step keeping each (context, decodes) step under ``target_s``."""
        curves = self.prefill_curves(context, decodes)  # non-decreasing along axis 1
        axis = self.prefill_axis
        under = (curves <= target_s).sum(axis=1)  # grid points under the target
        out = np.zeros(len(curves))
        full = under == len(axis)
        out[full] = axis[-1]
        mid = (under > 0) & ~full
        rows = np.nonzero(mid)[0]
        if len(rows):
            lo = under[rows] - 1
            t0, t1 = curves[rows, lo], curves[rows, lo + 1]
            frac = np.where(t1 > t0, (target_s - t0) / np.maximum(t1 - t0, 1e-12), 0.0)
            out[rows] = axis[lo] + frac * (axis[lo + 1] - axis[lo])
        return np.floor(out)

    def prefill_budget(self, mean_context: float, num_decodes: float, target_s: float) -> int:
        """Algorithm 2's lookup: the prefill token budget of a step with these decodes, from
        the budgets of the grid's (context, decodes) cells (inverted once per table version)
        interpolated in plain Python."""
        grid = self._budget_cache.get(target_s)
        if grid is None:
            grid = self._budget_grid(target_s)
        j, wj = _locate_one(self._axes[1], mean_context)
        k, wk = _locate_one(self._axes[2], num_decodes)
        low = grid[j][k] + wk * (grid[j][k + 1] - grid[j][k])
        high = grid[j + 1][k] + wk * (grid[j + 1][k + 1] - grid[j + 1][k])
        return max(int(low + wj * (high - low)), 0)

    def _budget_grid(self, target_s: float) -> list:
        """The budgets of the grid's (context, decodes) cells for ``target_s`` (cached until the
        latencies change; ``_refresh`` recomputes the targets in use)."""
        c, n = np.meshgrid(self.context_axis, self.decode_axis, indexing="ij")
        grid = self.budget_many(c.ravel(), n.ravel(), target_s).reshape(c.shape).tolist()
        self._budget_cache[target_s] = grid
        return grid

    # ---- online refinement ----
    def observe(self, shape: StepShape, duration_s: float) -> None:
        """A measured step: refine the nearest cell (and refit the base when unprofiled)."""
        if shape.padding is not None or shape.swap_blocks or not duration_s > 0 or not math.isfinite(duration_s):
            return
        p = float(sum(shape.prefill_tokens))
        n = float(shape.num_decodes)
        c = shape.decode_context_sum / n if n else 0.0
        if p == 0 and n == 0:
            return
        self.num_observed += 1
        if not self._base_is_profiled:
            self._observations.append((p, c, n, duration_s))
            del self._observations[:-_MAX_OBSERVATIONS]
            if len(self._observations) >= _MIN_FIT_OBSERVATIONS and (
                    not self.ready or self.num_observed % _REFIT_EVERY == 0):
                self._fit()
            return
        predicted = self.latency_s(p, c, n)
        if not predicted > 0:
            return
        cell = (self._nearest(self.prefill_axis, p), self._nearest(self.context_axis, c),
                self._nearest(self.decode_axis, n))
        ratio = min(max(duration_s / predicted, 0.5), 2.0)  # one odd step cannot swing a cell far
        target = self._applied[cell] * ratio  # ``predicted`` used the correction of the last refresh
        self.correction[cell] += 0.2 * (target - self.correction[cell])
        self._pending += 1
        if self._pending >= _REFRESH_EVERY:
            self._refresh()

    @property
    def _base_is_profiled(self) -> bool:
        return not self._observations and not np.isnan(self.base[0, 0, 0])

    def _fit(self) -> None:
        """Least squares of latency on (1, p, n, n*c, p*p) over measured steps fills the grid."""
        obs = np.array(self._observations)
        p, c, n, t = obs.T
        design = np.column_stack([np.ones_like(p), p, n, n * c, p * p])
        coef, *_ = np.linalg.lstsq(design, t, rcond=None)
        P, C, N = np.meshgrid(self.prefill_axis, self.context_axis, self.decode_axis, indexing="ij")
        grid = coef[0] + coef[1] * P + coef[2] * N + coef[3] * N * C + coef[4] * P * P
        self.base = np.maximum(grid, max(float(t.min()), 1e-6))
        self._refresh()

    @staticmethod
    def _nearest(axis: np.ndarray, x: float) -> int:
        return int(np.abs(axis - x).argmin())

    def _refresh(self) -> None:
        self._applied = self.correction.copy()
        self.latency = np.maximum.accumulate(self.base * self.correction, axis=0)
        self._pending = 0
        self.version += 1
        targets = list(self._budget_cache)
        self._budget_cache.clear()
        self.cached_latency.cache_clear()
        # the budgets of the targets in use are inverted here, after the step that refined the
        # table, not in the next step's planning: that inversion (a few numpy passes over the
        # grid, ~100 us) in 1 step of 16 was the batch planner's p99 (the same values either way)
        for target_s in targets:
            self._budget_grid(target_s)

    def _latency_at_bucket(self, prefill_tokens: int, context_bucket: int, num_decodes: int) -> float:
        """``latency_s`` on a quantised context (buckets of 64 tokens); ``cached_latency``."""
        return self.latency_s(prefill_tokens, context_bucket * 64.0, num_decodes)
