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
    # the CPU kernels of the dtype that ran travel with the fit (float32: matmul tiles, flash splits)
    assert (again.meta["prefill_kernel"], again.meta["decode_split_kernel"]) == ("matmul-tiles", "flash")


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


def test_decode_points_are_timed_after_themselves():
    """Regression (docs/fidelity.md item 7, vllm x1 1-row decodes predicted 14.5% too slow): a
    step costs more right after a different step (measured on bench-30m: a 1-row decode after
    a 384-token prefill 1.09-1.18x its cost in a streak), and a run's decodes come in streaks.
    A ``streak`` step is timed right after an untimed run of itself; the others as before."""
    from servelab.engine.calibrate import time_interleaved

    warm, cold = [1.0, 2.0, 3.0], [1.5, 3.0, 4.5]
    now, last = [0.0], [None]

    def step_of(i):
        def step():
            now[0] += warm[i] if last[0] == i else cold[i]
            last[0] = i
        return step

    steps = [step_of(i) for i in range(3)]
    times = time_interleaved(steps, 3, clock=lambda: now[0], streak=[True, False, True])
    assert times[0] == warm[0] and times[2] == warm[2]
    assert times[1] == cold[1]  # not in a streak: after whatever the shuffle put before it


def test_only_ragged_decode_points_run_in_a_streak():
    from servelab.core.plan import PaddedBatch
    from servelab.engine.calibrate import _Point, in_streak

    assert in_streak(_Point(((1, 127),))) and in_streak(_Point(((1, 15),) * 4))
    assert not in_streak(_Point(((64, 0),)))  # prefill
    assert not in_streak(_Point(((64, 0), (1, 255))))  # prefill beside a decode
    assert not in_streak(_Point(((1, 127),) * 2, PaddedBatch(2, 1, 128)))  # padded


def test_compact_grid_covers_the_one_row_decodes_fidelity_runs_make():
    """Regression (docs/fidelity.md item 7): the fidelity workloads' 1-row decodes sit at
    contexts 1-536 (prompts <= 256-512, outputs <= 24). With 1-row decodes timed only at 64 and
    512 the fit over-predicted them 5-10% at 16-256; the grid needs one at each end and one
    inside."""
    from servelab.validate.calibration import COMPACT_GRID

    contexts = sorted(p.shape.decode_context_sum for p in grid_points(COMPACT_GRID)
                      if p.padding is None and p.shape.num_decodes == 1 and not p.shape.prefill_tokens)
    assert len(contexts) >= 3
    assert contexts[0] <= 16 and contexts[-1] >= 512 and any(64 <= c <= 256 for c in contexts)
