"""The activation hand-off between two pipeline stages in two actors (a section of docs/ray.md).

Both actors become stages of the model (layers ``[0, L/2)`` and ``[L/2, L)``, as a KunServe
group's members do), then one group step runs as ``RayPipelineExecutor`` runs it: stage 0's
hidden state handed to stage 1 as an ``ObjectRef`` (Ray inlines small objects through the
driver, the owner; larger ones go through the object store), and, for comparison, fetched
into the driver with ``ray.get`` and sent on as a tensor. Overhead = the step's round trip
less both stages' compute in the actors (two actor calls plus the hand-off). The steps'
KV blocks hold whatever the caches held: this times the work, not the tokens.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Any

SHAPES = (("decode, 1 row", 1, 1), ("decode, 16 rows", 16, 1), ("prefill, 256 tokens", 1, 256))


def _chunks(rows: int, tokens: int, block_size: int) -> list:
    from servelab.engine.runner import SeqChunk

    per = -(-(32 + tokens) // block_size)  # 32 cached tokens before the step
    return [SeqChunk(i, [5] * tokens, 32, list(range(i * per, (i + 1) * per))) for i in range(rows)]


def _step(a, b, chunks, sampling, via_driver: bool) -> tuple[float, float]:
    import ray

    t0 = time.perf_counter()
    hidden, s0 = a.run_stage.remote(chunks, None)
    if via_driver:
        hidden = ray.get(hidden)
    _, s1 = ray.get(b.run_last_stage.remote(chunks, hidden, sampling))
    wall = time.perf_counter() - t0
    compute = ray.get(s0) + s1
    return wall - compute, compute


@contextmanager
def _two_stages(engine: Any):
    """The engine's two actors as stages of half the layers each (a KunServe group's members),
    whole again afterwards; yields both actors and the block size."""
    import ray

    a, b = engine.ray_workers.actors
    c, kv = engine.loaded.config, engine.kv_config
    half = c.num_layers // 2
    ray.get([a.become_stage.remote((0, half), kv.num_gpu_blocks),
             b.become_stage.remote((half, c.num_layers), kv.num_gpu_blocks)])
    try:
        yield a, b, kv.block_size
    finally:
        ray.get([w.reset_layers.remote() for w in (a, b)])


OVERLAP_SHAPE = ("prefill, 8 rows x 64 tokens", 8, 64)
OVERLAP_MICROBATCHES = (1, 2, 4)


def _microbatched_step(a, b, chunks, sampling, num_mb: int) -> float:
    """Wall seconds of one group step cut into ``num_mb`` microbatches, every chain submitted
    before the wait (as ``RayPipelineExecutor`` runs it)."""
    import ray

    from servelab.engine.ray_backend.layers import _deal

    t0 = time.perf_counter()
    lasts = []
    for mb in _deal(chunks, num_mb):
        hidden, _ = a.run_stage.remote(mb, None)
        lasts.append(b.run_last_stage.remote(mb, hidden, {c.request_id: sampling[c.request_id] for c in mb}))
    ray.get(lasts)
    return time.perf_counter() - t0


def pipeline_overlap(engine: Any, repeats: int) -> list[dict]:
    """Median wall time of one two-stage step per microbatch count (stages overlap in the actors)."""
    from servelab.engine.sampling import SamplingParams

    _, rows, tokens = OVERLAP_SHAPE
    out = []
    with _two_stages(engine) as (a, b, block_size):
        chunks = _chunks(rows, tokens, block_size)
        sampling = {ch.request_id: SamplingParams(temperature=0.0) for ch in chunks}
        _microbatched_step(a, b, chunks, sampling, 1)  # warm-up
        got: dict[int, list] = {m: [] for m in OVERLAP_MICROBATCHES}
        for _ in range(repeats):
            for m in OVERLAP_MICROBATCHES:  # taking turns
                got[m].append(_microbatched_step(a, b, chunks, sampling, m))
        for m in OVERLAP_MICROBATCHES:
            out.append({"microbatches": m, "wall_s": statistics.median(got[m])})
    return out


def pipeline_handoff(engine: Any, repeats: int) -> list[dict]:
    """Median overhead and compute per step shape, ref-passing vs through the driver."""
    from servelab.engine.sampling import SamplingParams

    c = engine.loaded.config
    rows_out = []
    with _two_stages(engine) as (a, b, block_size):
        for label, rows, tokens in SHAPES:
            chunks = _chunks(rows, tokens, block_size)
            sampling = {ch.request_id: SamplingParams(temperature=0.0) for ch in chunks}
            _step(a, b, chunks, sampling, False)  # warm-up
            got: dict[bool, list] = {False: [], True: []}
            for _ in range(repeats):
                for via in (False, True):  # taking turns
                    got[via].append(_step(a, b, chunks, sampling, via))
            med = {via: (statistics.median(o for o, _ in v), statistics.median(cp for _, cp in v))
                   for via, v in got.items()}
            rows_out.append({"shape": label, "rows": rows * tokens,
                             "hidden_bytes": rows * tokens * c.hidden_size * engine.loaded.model.embed_tokens.weight
                             .element_size(), "compute_s": med[False][1], "ref_overhead_s": med[False][0],
                             "driver_overhead_s": med[True][0]})
    return rows_out


def render_overlap(rows: list[dict], repeats: int) -> list[str]:
    if not rows:
        return []
    base = rows[0]["wall_s"]
    lines = ["", f"Microbatches overlapping in the two stage actors ({OVERLAP_SHAPE[0]}; one step cut into whole-row "
             f"microbatches, every chain submitted before the wait, median of {repeats}; each actor has one core's "
             "share here, so two stages can run at once):", "",
             "| microbatches | step wall ms | vs one microbatch |", "|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['microbatches']} | {r['wall_s'] * 1e3:.1f} | {base / r['wall_s']:.2f}x |")
    return lines


def render_pipeline(rows: list[dict], repeats: int, step_overhead_ms: float | None) -> list[str]:
    if not rows:
        return []
    lines = ["", "## Activation hand-off between pipeline stages in two actors (measured)", "",
             "KunServe's pipeline group on Ray (`layer_ranges=True`, `servelab.engine.ray_backend.layers`): each "
             "actor a stage of half the layers, one group step = stage 0 in actor 0, its hidden state handed to "
             "stage 1 in actor 1, which samples. `RayPipelineExecutor` passes the hidden state as an object ref "
             "(actor to actor, small objects inlined through the driver as their owner); the last column fetches "
             f"it into the driver and sends it on. Median of {repeats} after a warm-up, the two ways taking turns; "
             "overhead = the step's round trip less both stages' compute (two actor calls plus the hand-off).", "",
             "| step | hidden rows | activations | both stages' compute ms | overhead, ref passed on ms | "
             "overhead, via the driver ms |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        size = f"{r['hidden_bytes'] / 1024:.0f} KiB" if r["hidden_bytes"] >= 1024 else f"{r['hidden_bytes']} B"
        lines.append(f"| {r['shape']} | {r['rows']} | {size} | {r['compute_s'] * 1e3:.2f} | "
                     f"{r['ref_overhead_s'] * 1e3:.2f} | {r['driver_overhead_s'] * 1e3:.2f} |")
    if step_overhead_ms is not None:
        lines += ["", f"For scale: one whole-instance Ray step's overhead above is {step_overhead_ms:.2f} ms "
                  "(one actor call); a two-stage step makes two."]
    return lines
