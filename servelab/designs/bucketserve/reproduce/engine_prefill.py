"""Is a bucket prefill ragged or padded? BucketServe's own bucket batches on the real engine.

BucketServe runs on vLLM (Sec. V-A). vLLM's prefill ran a ``[batch, max_len]`` padded layout
up to v0.3 and one flattened ragged batch from v0.4 on (vllm-project/vllm#3236). This
measures what each mode costs a bucket batch on our PyTorch engine, and whether the
simulator's charge for each mode moves with it:

1. bucket batches: the batches the ``bucketserve`` policy forms on the Mixed workload in the
   simulator (online, ``rate_rps``), those with two or more rows, picked evenly over their
   Eq. 2 waste; lengths divided by ``scale`` so the CPU runs them in seconds;
2. each batch runs on the engine as one ragged step and as one dense padded step (the
   executor's two paths), median wall time of ``repeats`` runs after a warm-up; next to it
   the roofline's charge for the unscaled batch on the A100 in both modes;
3. end to end: ``num_requests`` scaled Mixed requests at t=0 on two engine instances (P/D) as
   ``bucketserve`` (ragged), ``bucketserve`` (padded) and ``distserve``: measured output tok/s.

The engine is our PyTorch engine on this machine's CPU (torch threads = 1) with a random
``preset`` checkpoint made in a temporary folder: only ratios carry over. torch is imported
here only; the simulator path never imports this module.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from servelab.core.plan import PaddedBatch, StepShape
from servelab.core.request import RequestSpec, ServiceClass
from servelab.designs.bucketserve.reproduce import experiments as ex


@dataclass(frozen=True)
class EngineSizes:
    preset: str = "bench-30m"
    scale: int = 8  # lengths divided by this on the engine
    rate_rps: float = 6.0  # Mixed online rate whose bucket batches are measured
    sim_requests: int = 400
    num_batches: int = 8
    repeats: int = 2
    num_requests: int = 32  # end-to-end offline run
    max_batch_tokens: int = 2048  # engine step limit (the simulator's 16384 / scale)


def measure(sizes: EngineSizes, setting: ex.Setting, seed: int, say: Callable[[str], None]) -> dict:
    import torch

    from servelab.engine import tiny_model
    from servelab.engine.loader import load_checkpoint

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="servelab-bs-") as tmp:
            kwargs = {"bench-30m": tiny_model.BENCH_30M, "bench-200m": tiny_model.BENCH_200M, "tiny": {}}[sizes.preset]
            folder = tiny_model.make_tiny_model(Path(tmp) / sizes.preset, **kwargs)
            loaded = load_checkpoint(folder, dtype="float32")
            batches = bucket_batches(sizes, setting, seed)
            rows = [_time_batch(loaded, b, sizes) for b in batches]
            say(f"[bucketserve]   engine: {len(rows)} bucket batches timed")
            e2e = _end_to_end(loaded, sizes, setting, seed)
    finally:
        torch.set_num_threads(old)
    return {"preset": sizes.preset, "scale": sizes.scale, "rate_rps": sizes.rate_rps, "batches": rows,
            "fit": _fits(rows), "end_to_end": e2e,
            "num_params": sum(p.numel() for p in loaded.model.parameters())}


def bucket_batches(sizes: EngineSizes, setting: ex.Setting, seed: int) -> list[tuple[int, ...]]:
    """Row lengths of the bucket batches BucketServe forms in the simulator, spread over Eq. 2 waste."""
    from servelab.simulator import Simulation

    workload = ex.online_workload("mixed", sizes.sim_requests, sizes.rate_rps, setting, seed)
    sim = Simulation(workload, ex.cluster_for("bucketserve", 128, setting))
    seen: list[tuple[int, ...]] = []
    for inst in sim.instances:
        if not hasattr(inst.policy, "_bucket_prefill"):  # the decode instance runs DistServe's decode policy
            continue
        inner = inst.policy._bucket_prefill

        def recorded(*args, _inner=inner, **kwargs):
            plan = _inner(*args, **kwargs)
            if plan is not None and len(plan.num_tokens) > 1:
                seen.append(tuple(plan.num_tokens))
            return plan

        inst.policy._bucket_prefill = recorded
    sim.run()
    if not seen:
        return []
    waste = np.array([1 - sum(b) / (len(b) * max(b)) for b in seen])
    order = np.argsort(waste, kind="stable")
    spots = np.linspace(0, len(seen) - 1, min(sizes.num_batches, len(seen))).round().astype(int)
    picks = sorted({int(order[i]) for i in spots})
    return [seen[i] for i in picks]


def _time_batch(loaded, lengths: tuple[int, ...], sizes: EngineSizes) -> dict:
    from servelab.costmodel.roofline import roofline_for
    from servelab.engine.kv_cache import PagedKVCache
    from servelab.engine.runner import ModelRunner, SeqChunk

    c = loaded.config
    scaled = [max(1, n // sizes.scale) for n in lengths]
    longest, block = max(scaled), 16
    width = -(-longest // block)
    cache = PagedKVCache(c.num_layers, width * len(scaled), block, c.num_kv_heads, c.head_dim,
                         dtype=loaded.model.embed_tokens.weight.dtype)
    runner = ModelRunner(loaded.model, cache)
    chunks = [SeqChunk(i, [5 + i % 50] * n, 0, list(range(i * width, (i + 1) * width))) for i, n in enumerate(scaled)]

    def timed(padded: bool) -> float:
        runs = []
        for _ in range(sizes.repeats + 1):  # the first run warms up
            t0 = time.perf_counter()
            if padded:
                runner.run_padded(chunks, len(chunks), longest, longest)
            else:
                runner.run(chunks)
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs[1:])

    cost = roofline_for(ex.GPU, ex.MODEL, ex.TP)
    full = max(lengths)
    sim_ragged = cost.step_time_s(StepShape(tuple(lengths), tuple(lengths)))
    pad = PaddedBatch(len(lengths), full, full)
    sim_padded = cost.step_time_s(StepShape(tuple(lengths), tuple(lengths), padding=pad))
    return {"rows": len(lengths), "real_tokens": sum(lengths), "rect_tokens": len(lengths) * full,
            "waste": 1 - sum(lengths) / (len(lengths) * full), "engine_real_tokens": sum(scaled),
            "engine_rect_tokens": len(scaled) * longest, "ragged_s": timed(False), "padded_s": timed(True),
            "sim_ragged_s": sim_ragged, "sim_padded_s": sim_padded}


def _fits(rows: list[dict]) -> dict:
    """Least-squares lines time = a + b x tokens: ragged on real tokens, padded on the rectangle;
    R^2 of each, and of the other (wrong) token count for contrast."""
    def r2(x, y):
        if len(x) < 3 or np.ptp(x) == 0:
            return None
        b, a = np.polyfit(x, y, 1)
        resid = y - (a + b * x)
        return float(1 - np.sum(resid ** 2) / np.sum((y - y.mean()) ** 2))

    if not rows:
        return {}
    real = np.array([r["engine_real_tokens"] for r in rows], float)
    rect = np.array([r["engine_rect_tokens"] for r in rows], float)
    rag = np.array([r["ragged_s"] for r in rows])
    pad = np.array([r["padded_s"] for r in rows])
    measured = pad / rag
    charged = np.array([r["sim_padded_s"] / r["sim_ragged_s"] for r in rows])
    rank = float(np.corrcoef(np.argsort(np.argsort(measured)), np.argsort(np.argsort(charged)))[0, 1]) \
        if len(rows) > 2 else None
    return {"ragged_r2_real": r2(real, rag), "ragged_r2_rect": r2(rect, rag), "padded_r2_rect": r2(rect, pad),
            "padded_r2_real": r2(real, pad), "ratio_measured_median": float(np.median(measured)),
            "ratio_charged_median": float(np.median(charged)), "ratio_rank_corr": rank,
            "padded_slower": int(np.sum(measured > 1)), "num_batches": len(rows)}


def _end_to_end(loaded, sizes: EngineSizes, setting: ex.Setting, seed: int) -> list[dict]:
    from servelab.engine.cluster import EngineCluster, EngineConfig
    from servelab.engine.sampling import SamplingParams

    rng = np.random.default_rng([seed, 7])
    lengths = ex.length_source("mixed", setting).sample(sizes.num_requests, rng)
    specs = []
    for i, (p, o) in enumerate(zip(lengths.num_prompt_tokens, lengths.num_output_tokens)):
        p, o = max(1, int(p) // sizes.scale), max(1, int(o) // sizes.scale)
        ids = tuple(int(x) for x in rng.integers(10, loaded.config.vocab_size, p))
        specs.append(RequestSpec(i, 0.0, p, o, prompt_token_ids=ids, service_class=ServiceClass.OFFLINE))
    params = {s.request_id: SamplingParams(temperature=0.0, max_tokens=s.num_output_tokens, ignore_eos=True)
              for s in specs}
    config = EngineConfig(kv_budget_bytes=64 << 20, max_batch_tokens=sizes.max_batch_tokens, max_num_seqs=32)
    out = []
    for label, spec in (("bucketserve (ragged)", "bucketserve-pd"), ("bucketserve (padded)", "bucketserve-pd:padded=true"),
                        ("distserve", "distserve")):
        t0 = time.perf_counter()
        res = EngineCluster(loaded, spec, config, num_instances=2).run(specs, params)
        wall = time.perf_counter() - t0
        done = sum(r.status.name == "FINISHED" for r in res.requests)
        if done != len(specs):
            raise RuntimeError(f"engine run {spec!r}: {done} of {len(specs)} requests finished")
        steps = res.collector.steps
        out.append({"system": label, "wall_s": wall, "output_tok_s": res.num_output_tokens / wall,
                    "padding_tokens": float(steps.num_padding_tokens.sum()), "real_tokens": float(steps.num_tokens.sum())})
    return out
