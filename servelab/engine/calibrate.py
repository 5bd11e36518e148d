"""Calibration: time real engine steps over a grid of shapes and fit a ``LinearCostModel``.

Each grid point is one step shape (a prefill chunk with or without cached context, a batch
of decodes at a context length, prefill + decodes mixed, or a dense padded batch). The
step runs through ``ModelRunner`` exactly as the executor would run it, over a paged cache
filled with random K/V at scattered blocks (a step's cost does not depend on KV values, and
skipping the real prefills keeps calibration short). Each point is warmed up once, then timed
once per round for ``repeats`` rounds, every round in its own shuffled order, and the median
over the rounds is the sample (``time_interleaved``). Why rounds: on a shared machine load
comes in bursts of a second or more; timing a point's repeats back to back let one burst
inflate every repeat of the few points it hit, and with them the fit's small-token factors
(back-to-back compact calibrations on the shared VM predicted a 1-row decode between 5.6 and
10.6 ms and a 3-row decode cheaper than a 1-row one: docs/fidelity.md). Interleaved, a burst
costs each point it hits one round of ``repeats``, which the median drops.
A decode point is run once more right before each timed run (``in_streak``): a serving run's
decodes come in streaks, each after a decode of the same batch, and timed after whatever the
shuffle put before it (a 384-token prefill, say) the same 1-row decode cost 1.09-1.18x what
it costs in a streak (bench-30m, CPU time, 2026-11-27), which the fit then charged every run's
1-row decodes (docs/fidelity.md item 7: predicted 9.6-14.5% too slow, 91-94% of the steps).
``fit_linear_cost_model`` fits the coefficients; swap time per block is timed separately
(the fit skips steps with no rows).

The saved JSON is what ``servelab simulate --cost-model FILE.json`` loads, so the simulator
then predicts this machine. ``meta`` records the machine, model, dtype and grid.
"""

from __future__ import annotations

import datetime
import os
import platform
import random
import statistics
import time
from pathlib import Path
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from servelab.core.errors import UserError
from servelab.core.plan import PaddedBatch, StepShape
from servelab.costmodel.fitting import FitError
from servelab.costmodel.linear import LinearCostModel, fit_linear_cost_model


@dataclass(frozen=True, slots=True)
class CalibrationGrid:
    """Shapes to time. Prefill chunks: every (tokens, cached context) pair; decodes: every
    (rows, context) pair; skewed decodes: (rows, short context, long context) with one long
    row among short ones (separates the context sum from the iteration bubble); mixed: one
    prefill chunk beside each decode count at ``mixed_context``; padded: decode batches
    (rows, context) and prefill batches (rows, row_tokens)."""

    prefill_tokens: tuple[int, ...] = (16, 64, 192)
    prefill_cached: tuple[int, ...] = (0, 256)
    decode_rows: tuple[int, ...] = (1, 4, 16, 32)
    decode_context: tuple[int, ...] = (64, 256, 512)
    decode_skewed: tuple[tuple[int, int, int], ...] = ((8, 64, 512), (16, 64, 1024), (32, 128, 1024))
    mixed_prefill: int = 64
    mixed_decodes: tuple[int, ...] = (4, 16)
    mixed_context: int = 256
    padded_decode: tuple[tuple[int, int], ...] = ((8, 128), (16, 384))
    padded_prefill: tuple[tuple[int, int], ...] = ((4, 32), (4, 96))
    repeats: int = 3
    swap_blocks: int = 16  # blocks per swap timing (0 skips it)

    def __post_init__(self) -> None:
        sizes = (*self.prefill_tokens, *self.decode_rows, *self.decode_context, self.mixed_prefill,
                 *self.mixed_decodes, self.mixed_context, *(v for p in self.padded_decode for v in p),
                 *(v for p in self.padded_prefill for v in p), *(v for p in self.decode_skewed for v in p))
        if any(v < 1 for v in sizes) or any(v < 0 for v in self.prefill_cached):
            raise ValueError(f"calibration grid sizes must be >= 1 (cached context >= 0): {self}")
        if self.repeats < 1 or self.swap_blocks < 0:
            raise ValueError("repeats must be >= 1 and swap_blocks >= 0")


REDUCED_GRID = CalibrationGrid(prefill_tokens=(8, 32), prefill_cached=(0, 32), decode_rows=(1, 4, 8),
                               decode_context=(16, 64), decode_skewed=((4, 16, 96),), mixed_prefill=16,
                               mixed_decodes=(4,), mixed_context=32,
                               padded_decode=((4, 32),), padded_prefill=((2, 16),), repeats=2, swap_blocks=4)


@dataclass(frozen=True, slots=True)
class _Point:
    """One step to time: chunks as (tokens, start_pos) pairs, optionally padded."""

    chunks: tuple[tuple[int, int], ...]
    padding: PaddedBatch | None = None

    @property
    def shape(self) -> StepShape:
        decodes = [start + 1 for n, start in self.chunks if n == 1 and start > 0]
        prefills = [(n, start + n) for n, start in self.chunks if not (n == 1 and start > 0)]
        return StepShape(tuple(n for n, _ in prefills), tuple(c for _, c in prefills), len(decodes), sum(decodes),
                         max(decodes, default=0), self.padding)

    @property
    def max_end(self) -> int:
        return max(max(n + s for n, s in self.chunks), self.padding.context_tokens if self.padding else 0)


def grid_points(grid: CalibrationGrid) -> list[_Point]:
    points = [_Point(((n, cached),)) for n in grid.prefill_tokens for cached in grid.prefill_cached]
    points += [_Point(((1, ctx - 1),) * rows) for rows in grid.decode_rows for ctx in grid.decode_context]
    points += [_Point(((1, short - 1),) * (rows - 1) + ((1, long - 1),)) for rows, short, long in grid.decode_skewed]
    points += [_Point(((grid.mixed_prefill, 0),) + ((1, grid.mixed_context - 1),) * k) for k in grid.mixed_decodes]
    points += [_Point(((1, ctx - 1),) * rows, PaddedBatch(rows, 1, ctx)) for rows, ctx in grid.padded_decode]
    points += [_Point(tuple((max(1, tokens - 3 * i), 0) for i in range(rows)), PaddedBatch(rows, tokens, tokens))
               for rows, tokens in grid.padded_prefill]
    return points


def time_interleaved(steps: Sequence[Callable[[], None]], repeats: int, *, seed: int = 0,
                     clock: Callable[[], float] = time.perf_counter,
                     progress: Callable[[int, int], None] | None = None,
                     streak: Sequence[bool] = ()) -> list[float]:
    """Median seconds of each step over ``repeats`` rounds after one warm-up run of each; every
    round times every step once, in a seeded shuffled order (so a burst of load from other
    processes lands on one round of several steps, not on every repeat of one). A step whose
    ``streak`` flag is set runs once untimed right before each timed run, so it is timed after
    itself, as a run's decode follows the previous decode of its batch."""
    for step in steps:
        step()
    rng = random.Random(seed)
    times: list[list[float]] = [[] for _ in steps]
    order = list(range(len(steps)))
    for r in range(repeats):
        rng.shuffle(order)
        for k, i in enumerate(order):
            if i < len(streak) and streak[i]:
                steps[i]()
            t0 = clock()
            steps[i]()
            times[i].append(clock() - t0)
            if progress is not None:
                progress(r * len(steps) + k + 1, repeats * len(steps))
    return [statistics.median(t) for t in times]


def time_point(runner, point: _Point, repeats: int, rng_order: Sequence[int],
               clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of the step over ``repeats`` runs after one warm-up (by ``clock``: wall
    time, or ``time.process_time`` to time in CPU seconds on a shared machine)."""
    return time_interleaved([step_of(runner, point, rng_order)], repeats, clock=clock)[0]


def step_of(runner, point: _Point, rng_order: Sequence[int]) -> Callable[[], None]:
    """A callable that runs the point's step once through ``runner`` (its blocks taken from
    ``rng_order``, so every point reads scattered blocks, as after churn)."""
    from servelab.engine.runner import SeqChunk

    block_size = runner.kv_cache.block_size
    chunks, used = [], 0
    for rid, (n, start) in enumerate(point.chunks):
        width = -(-max(start + n, point.max_end) // block_size)
        table = list(rng_order[used:used + width])
        used += width
        chunks.append(SeqChunk(rid, [3 + rid % 50] * n, start, table))
    pad = point.padding

    def step() -> None:
        if pad is None:
            runner.run(chunks)
        else:
            runner.run_padded(chunks, pad.num_rows, pad.row_tokens, pad.context_tokens)

    return step


def in_streak(point: _Point) -> bool:
    """Whether ``time_steps`` times the point after itself: a ragged step of decodes only, the
    step a serving run makes many times in a row (a padded or prefill step is timed after
    whatever the shuffle put before it, as before: those kinds met their goals, docs/fidelity.md)."""
    return point.padding is None and all(n == 1 and start > 0 for n, start in point.chunks)


def _blocks_needed(points: list[_Point], block_size: int) -> int:
    return max(len(p.chunks) * -(-p.max_end // block_size) for p in points)


def time_swap_per_block(cache, num_blocks: int, repeats: int, clock: Callable[[], float] = time.perf_counter
                        ) -> float:
    """Seconds per block of a swap out and back in (half the round trip per direction)."""
    pairs = [(i, i) for i in range(num_blocks)]
    cache.swap_out(pairs)
    cache.swap_in(pairs)
    t0 = clock()
    for _ in range(repeats):
        cache.swap_out(pairs)
        cache.swap_in(pairs)
    return (clock() - t0) / (2 * repeats * num_blocks)


def device_identity() -> tuple[str, str]:
    """(hardware name, peak FLOP/s or "" when unknown) of the device steps run on. A CUDA GPU
    in the catalog gives its dense BF16 peak; a CPU's peak is not known, so MFU is left out."""
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        from servelab.catalog.gpus import GPUS

        key = name.upper().replace("NVIDIA ", "")
        peaks = {spec.peak_flops for gpu, spec in GPUS.items() if gpu.split("-")[0] in key.split()}
        return name, str(peaks.pop()) if len(peaks) == 1 else ""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        name = next(line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"CPU: {name} ({os.cpu_count()} cores)", ""


def machine_meta() -> dict[str, str]:
    import torch

    hardware, peak_flops = device_identity()
    return {"hardware": hardware, "peak_flops": peak_flops,
            "machine": platform.machine(), "processor": platform.processor() or platform.machine(),
            "cpu_count": str(os.cpu_count()), "torch_threads": str(torch.get_num_threads()),
            "torch": torch.__version__, "date": datetime.date.today().isoformat()}


MAX_BLOCK_SIZE = 4096  # tokens per KV block; vLLM uses 16, and the grid's contexts are a few thousand


def time_steps(loaded, points: Sequence[_Point], repeats: int, *, block_size: int = 16, seed: int = 0,
               clock: Callable[[], float] = time.perf_counter, decode_kernel: str = "split-kv",
               progress: Callable[[int, int], None] | None = None, num_host_blocks: int = 0) -> tuple[list[float], Any]:
    """Seconds of each point's step (``time_interleaved``) over a fresh paged cache of random
    K/V at scattered blocks; returns (times, the cache)."""
    import torch

    from servelab.engine.kv_cache import PagedKVCache
    from servelab.engine.runner import ModelRunner

    c = loaded.config
    dtype = loaded.model.embed_tokens.weight.dtype
    num_blocks = _blocks_needed(list(points), block_size) + 1
    cache = PagedKVCache(c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim, dtype=dtype,
                         device=loaded.model.embed_tokens.weight.device, num_host_blocks=num_host_blocks)
    gen = torch.Generator().manual_seed(seed)
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen).to(dtype))
    order = torch.randperm(num_blocks, generator=gen).tolist()  # scattered blocks, as after churn
    runner = ModelRunner(loaded.model, cache, decode_kernel=decode_kernel)
    times = time_interleaved([step_of(runner, p, order) for p in points], repeats, seed=seed, clock=clock,
                             progress=progress, streak=[in_streak(p) for p in points])
    return times, cache


def cpu_kernels(weight) -> dict[str, str]:
    """The kernels a step's attention runs on the CPU for this dtype (``prefill_kernels``,
    ``attention.cpu_split_bmm``), recorded with the fit: its prefill and decode terms hold for
    them only. Empty off the CPU (CUDA runs SDPA and the matmul log-sum-exp splits)."""
    from servelab.engine.attention import cpu_split_bmm
    from servelab.engine.prefill_kernels import cpu_prefill_kernel

    if weight.device.type != "cpu":
        return {}
    return {"prefill_kernel": cpu_prefill_kernel(weight.dtype),
            "decode_split_kernel": "bmm" if cpu_split_bmm(weight.dtype) else "flash"}


def calibrate(loaded, grid: CalibrationGrid = CalibrationGrid(), *, block_size: int = 16, seed: int = 0,
              progress: Callable[[int, int], None] | None = None, clock: Callable[[], float] = time.perf_counter,
              decode_kernel: str = "split-kv", attention_kernel: str | None = None,
              ) -> tuple[LinearCostModel, FitError, list[tuple[StepShape, float]]]:
    """Time every grid point on ``loaded`` (a ``LoadedModel``); returns (model, fit error, samples).

    Ragged steps run ``decode_kernel`` (the engine's default unless told), recorded in
    ``meta["attention_kernel"]`` (on the CPU also the dtype's prefill and split kernels,
    ``cpu_kernels``): with ``split-kv`` a decode costs its own context (the bubble
    term fits near 0), with ``padded`` rows x longest (the bubble term carries it). The fit's
    attention term follows ``attention_kernel`` when given (``auto`` keeps both terms, to
    compare), else the kernel that ran (``costmodel.linear``)."""
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise UserError(f"block_size must be in [1, {MAX_BLOCK_SIZE}] tokens, got {block_size}")

    from servelab.engine.kv_cache import bytes_per_block

    c = loaded.config
    dtype = loaded.model.embed_tokens.weight.dtype
    points = grid_points(grid)
    times, cache = time_steps(loaded, points, grid.repeats, block_size=block_size, seed=seed, clock=clock,
                              decode_kernel=decode_kernel, progress=progress, num_host_blocks=grid.swap_blocks)
    samples = [(p.shape, t) for p, t in zip(points, times)]
    kv_per_token = bytes_per_block(c.num_layers, 1, c.num_kv_heads, c.head_dim, dtype)
    meta = {**machine_meta(), "model": str(getattr(loaded, "path", "?")), "dtype": str(dtype).removeprefix("torch."),
            "num_params": str(sum(p.numel() for p in loaded.model.parameters())), "block_size": str(block_size),
            "attention_kernel": decode_kernel, **cpu_kernels(loaded.model.embed_tokens.weight),
            "grid": repr(grid), "source": "servelab calibrate (measured wall-clock engine steps)"
            if clock is time.perf_counter else f"servelab calibrate (engine steps timed by {clock.__name__})"}
    kernel = attention_kernel or decode_kernel
    model, error = fit_linear_cost_model(samples, kv_bytes_per_token=kv_per_token, meta=meta, attention_kernel=kernel)
    if grid.swap_blocks:
        model = replace(model, c_swap_block=time_swap_per_block(cache, grid.swap_blocks, grid.repeats, clock))
    return model, error, samples
