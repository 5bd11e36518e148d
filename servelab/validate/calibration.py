"""The cost model a validation compares against: ``servelab calibrate``'s linear model, fitted
on this machine, timed with the same clock as the engine run it will be compared with.

``VALIDATION_GRID`` is the default grid with the small decode batches filled in (2, 3, 6, 8,
12 rows) and a longer prefill chunk: on a CPU a step's time is not linear in its rows at
small batch sizes (measured: docs/fidelity.md), so a grid that skips them fits a line that
misses the batches a small validation run actually makes.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from servelab.engine.calibrate import CalibrationGrid

VALIDATION_GRID = replace(CalibrationGrid(), prefill_tokens=(16, 64, 192, 384),
                          decode_rows=(1, 2, 3, 4, 6, 8, 12, 16), decode_context=(64, 256, 512))

# A short grid for a calibration before every validation run (about 3.5 CPU-s on bench-30m): on a
# shared VM even CPU time per step drifts with the load, so each run gets a model timed under
# the same conditions it runs in. Three interleaved rounds (engine.calibrate.time_interleaved):
# the median of three drops a round that a burst of load hit; the median of two cannot.
COMPACT_GRID = CalibrationGrid(prefill_tokens=(16, 64, 192, 384), prefill_cached=(0, 256),
                               decode_rows=(1, 2, 3, 4, 8, 16), decode_context=(64, 512),
                               decode_skewed=((8, 64, 512),), mixed_decodes=(4, 16),
                               padded_decode=((8, 128),), padded_prefill=((4, 32), (4, 96)), repeats=3,
                               swap_blocks=8)


def clock_fn(clock: str):
    return time.process_time if clock == "cpu" else time.perf_counter


def calibrate_to(loaded: Any, path: Path, clock: str, grid: CalibrationGrid = VALIDATION_GRID,
                 block_size: int = 16) -> tuple[Any, Any]:
    """Fit and save the linear cost model; returns (model, fit error)."""
    from servelab.engine.calibrate import calibrate

    model, error, _ = calibrate(loaded, grid, block_size=block_size, clock=clock_fn(clock))
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    return model, error


# Re-timed around each validation run: what the machine charges now for steps the calibration
# also predicts (a 1-row and a 4-row decode, a 64-token prefill), three interleaved rounds.
DRIFT_PROBES = ((1, 128), (4, 128), (64, 0))  # (decode rows, context) or (prefill tokens, 0)


def level_drift(loaded: Any, cost: Any, clock: str, repeats: int = 3) -> float:
    """Median over ``DRIFT_PROBES`` of measured / ``cost``-predicted - 1: how far this machine's
    step times have moved since ``cost`` was calibrated (> 0: slower now). No cost model of
    step shapes can follow this part of a step-time error."""
    from servelab.engine.calibrate import _Point, time_steps

    points = [_Point(((1, ctx - 1),) * n) if ctx else _Point(((n, 0),)) for n, ctx in DRIFT_PROBES]
    times, _ = time_steps(loaded, points, repeats, clock=clock_fn(clock), seed=1)
    return float(np.median([t / cost.step_time_s(p.shape) - 1 for p, t in zip(points, times)]))
