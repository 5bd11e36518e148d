"""Figures 1 and 3: one long-context request stretches a whole decode step.

Simulated: the roofline's decode step (its iteration-bubble term) on Llama-2-7B / H100, the
paper's setting for these figures. Measured: the same trend on our CPU engine with a tiny
random Llama, whose decode attention pads every row to the longest context in the step.
"""

from __future__ import annotations

import numpy as np

from servelab.core.plan import StepShape
from servelab.costmodel.roofline import roofline_for

FIG1_MIXES = ((64, 0), (63, 1), (62, 2), (60, 4))  # (short 32-token prompts, long 4096-token prompts)


def fig1_simulated(model: str = "Llama-2-7B", gpu: str = "H100-80GB", generated=range(0, 1001, 50),
                   short: int = 32, long: int = 4096) -> dict:
    cost = roofline_for(gpu, model)
    rows = []
    for num_short, num_long in FIG1_MIXES:
        series = []
        for g in generated:
            ctx = [short + g] * num_short + [long + g] * num_long
            series.append(1e3 * cost.step_time_s(StepShape(num_decodes=len(ctx), decode_context_sum=sum(ctx),
                                                           decode_context_max=max(ctx))))
        rows.append({"mix": f"{num_short} short + {num_long} long", "num_long": num_long, "step_ms": series})
    at600 = {r["mix"]: r["step_ms"][list(generated).index(600)] for r in rows}
    base = rows[0]["step_ms"][list(generated).index(600)]
    # the test of the stated reason: the 4-long mix's total context spread evenly over its rows
    # (the same KV reads, no long row): if that costs as much, the long rows add KV reads, not a bubble
    ctx = [short + 600] * FIG1_MIXES[-1][0] + [long + 600] * FIG1_MIXES[-1][1]
    even = 1e3 * cost.step_time_s(StepShape(num_decodes=len(ctx), decode_context_sum=sum(ctx),
                                            decode_context_max=-(-sum(ctx) // len(ctx))))
    return {"model": model, "gpu": gpu, "generated": list(generated), "rows": rows, "at_600_ms": at600,
            "increase_4_long": at600[rows[-1]["mix"]] / base - 1.0, "even_600_ms": even}


def fig3_simulated(model: str = "Llama-2-7B", gpu: str = "H100-80GB", num_output: int = 128) -> dict:
    """64 groups of 64 prompts of lengths 10, 70, ..., 3790: same-length batches vs batches of
    one prompt of each length. TPOT of a batch = mean step time over its decode."""
    cost = roofline_for(gpu, model)
    lengths = [10 + 60 * k for k in range(64)]

    def tpot(ctx0: list[int]) -> float:
        steps = [cost.step_time_s(StepShape(num_decodes=len(ctx0), decode_context_sum=sum(ctx0) + g * len(ctx0),
                                            decode_context_max=max(ctx0) + g)) for g in range(num_output)]
        return float(np.mean(steps))

    aligned = [tpot([length] * 64) for length in lengths]
    mixed = tpot(lengths)
    return {"model": model, "gpu": gpu, "aligned_tpot_ms": [1e3 * a for a in aligned],
            "aligned_mean_ms": 1e3 * float(np.mean(aligned)), "mixed_mean_ms": 1e3 * mixed,
            "mixed_over_aligned": mixed / float(np.mean(aligned))}


def engine_measured(batch: int = 16, short: int = 32, long: int = 1536, max_tokens: int = 48,
                    fig3_lengths: tuple[int, ...] = (64, 256, 448, 640, 832, 1024, 1280, 1536), seed: int = 0,
                    repeats: int = 3, kernels: tuple[str, ...] = ("split-kv", "padded")) -> dict:
    """Measured on the CPU engine (a tiny random Llama, 1 thread), median wall time of pure
    decode steps, under each of the engine's decode kernels (``kernels``; split-kv is its
    default, padded reads every row to the longest context). Fig. 1: ``batch`` requests, all
    short, and with 1, 2 or 4 long prompts, each mix ``repeats`` times (mixes and kernels
    interleaved, so a slow spell of this shared machine hits all alike; the median of the
    repeats, each kept). Fig. 3: ``len(fig3_lengths)`` groups of as many prompts, run as
    same-length batches and as batches holding one prompt of each length; the mean over
    batches of their median step. ``rows`` and ``fig3`` are the first kernel's."""
    import tempfile

    import torch

    from servelab.engine.loader import load_checkpoint
    from servelab.engine.tiny_model import make_tiny_model

    import os

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            loaded = load_checkpoint(make_tiny_model(tmp, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                                                     intermediate_size=256, max_position=2048, seed=seed))
        rng = np.random.default_rng(seed)
        mixes = (0, 1, 2, 4)
        ms = {(k, n): [] for k in kernels for n in mixes}
        for _ in range(repeats):
            for num_long in mixes:
                for kernel in kernels:
                    lens = [short] * (batch - num_long) + [long] * num_long
                    ms[(kernel, num_long)].append(_batch_step_ms(loaded, lens, max_tokens, rng, kernel))
        out = {}
        for kernel in kernels:
            rows = [{"num_long": n, "decode_step_ms": float(np.median(ms[(kernel, n)])), "repeats_ms": ms[(kernel, n)]}
                    for n in mixes]
            for r in rows:
                r["vs_all_short"] = r["decode_step_ms"] / rows[0]["decode_step_ms"]
            k = len(fig3_lengths)
            aligned = [_batch_step_ms(loaded, [n] * k, max_tokens, rng, kernel) for n in fig3_lengths]
            mixed = [_batch_step_ms(loaded, list(fig3_lengths), max_tokens, rng, kernel) for _ in fig3_lengths]
            out[kernel] = {"rows": rows, "fig3": {"lengths": list(fig3_lengths), "aligned_mean_ms": float(np.mean(aligned)),
                                                  "mixed_mean_ms": float(np.mean(mixed)),
                                                  "mixed_over_aligned": float(np.mean(mixed) / np.mean(aligned))}}
        return {"batch": batch, "short": short, "long": long, "repeats": repeats, "kernels": out,
                "load_average_1min": [load_before, os.getloadavg()[0]],
                "rows": out[kernels[0]]["rows"], "fig3": out[kernels[0]]["fig3"], "device": "cpu, 1 thread"}
    finally:
        torch.set_num_threads(threads)


def _batch_step_ms(loaded, lens: list[int], max_tokens: int, rng, kernel: str = "split-kv") -> float:
    from servelab.core.request import RequestSpec
    from servelab.engine.cluster import EngineCluster, EngineConfig
    from servelab.engine.sampling import SamplingParams

    c = loaded.config
    tokens = sum(n + max_tokens + 16 for n in lens)
    cfg = EngineConfig(kv_budget_bytes=tokens * 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4, block_size=16,
                       max_batch_tokens=8192, max_num_seqs=len(lens), decode_kernel=kernel)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    specs = [RequestSpec(i, 0.0, n, max_tokens, prompt_token_ids=tuple(int(t) for t in rng.integers(5, 400, n)))
             for i, n in enumerate(lens)]
    res = EngineCluster(loaded, "vllm", cfg).run(specs, params)
    return _median_decode_ms(res, len(lens))


def _median_decode_ms(res, batch: int) -> float:
    steps = res.collector.steps
    pure = (steps.num_rows == batch) & (steps.num_tokens == batch)
    return 1e3 * float(np.median(steps.duration_s[pure]))
