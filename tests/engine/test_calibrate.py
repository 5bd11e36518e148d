"""Calibration on the tiny model: a reduced grid gives a loadable cost model with sane numbers."""

from __future__ import annotations

import math

from servelab.core.plan import StepShape
from servelab.costmodel.linear import COEFFICIENTS, LinearCostModel
from servelab.engine.calibrate import REDUCED_GRID, calibrate, grid_points
from servelab.engine.loader import load_checkpoint


def test_reduced_grid_fits_a_loadable_model(make_checkpoint, tmp_path):
    loaded = load_checkpoint(make_checkpoint())
    model, error, samples = calibrate(loaded, REDUCED_GRID, block_size=4)
    assert len(samples) == len(grid_points(REDUCED_GRID))
    assert all(t > 0 for _, t in samples)
    for name in COEFFICIENTS:
        value = getattr(model, name)
        assert math.isfinite(value) and value >= 0, name
    assert model.c_swap_block > 0 and model.kv_bytes_per_token > 0
    assert error.num_samples == len(samples) and math.isfinite(error.median_rel_error)
    path = tmp_path / "cost.json"
    model.save(path)
    again = LinearCostModel.load(path)
    shape = StepShape(num_decodes=4, decode_context_sum=200, decode_context_max=50)
    assert again.step_time_s(shape) == model.step_time_s(shape) > 0
    assert again.meta["dtype"] == "float32" and again.fit == model.fit


def test_grid_shapes_match_what_the_runtime_reports():
    points = grid_points(REDUCED_GRID)
    decode = next(p for p in points if p.padding is None and len(p.chunks) == 4 and p.chunks[0] == (1, 15))
    assert decode.shape == StepShape(num_decodes=4, decode_context_sum=64, decode_context_max=16)
    chunk = next(p for p in points if p.chunks == ((8, 32),))
    assert chunk.shape == StepShape(prefill_tokens=(8,), prefill_context=(40,))


def test_a_burst_of_load_hits_one_round_not_every_repeat_of_a_step():
    """Regression (docs/fidelity.md, multibin x1 at 19.4%): repeats timed back to back let one
    burst of load from other processes inflate every repeat of the steps it hit. Timed in
    shuffled rounds, a burst as long as three steps costs each step at most one round of three,
    and the median drops it."""
    from servelab.engine.calibrate import time_interleaved

    cost = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    now, calls = [0.0], [0]

    def step_of(i):
        def step():
            calls[0] += 1
            burst = 14 <= calls[0] < 17  # three steps in the second round (6 warm-ups, 6 in the first)
            now[0] += cost[i] * (3.0 if burst else 1.0)
        return step

    times = time_interleaved([step_of(i) for i in range(len(cost))], 3, clock=lambda: now[0])
    assert times == cost
    assert calls[0] == len(cost) * 4  # one warm-up and three rounds each
