"""Measure the Ray backend and write docs/ray.md (measured on this machine; simulated beside it).

    python -m servelab.engine.ray_backend.bench [--reduced] [--model DIR] [--out docs/ray.md]

1. KV transfer time vs size between two instance actors, through the exact executor path the
   mover uses (``export_kv`` on the source, ``import_kv`` on the destination): Ray's object
   store vs torch.distributed gloo, next to an in-process copy between two caches.
2. Per-step overhead of the actor boundary: the same workload on two instances in process
   and on Ray; each Ray step's round trip seen by the driver vs its compute in the actor.
3. The activation hand-off between two pipeline stages in two actors (KunServe's group
   step on Ray: ``bench_pipeline``), by object ref and through the driver.
4. End-to-end latency of vllm x2, distserve (1P1D) and dynaserve x2 on a small GSM8K
   workload: the engine in process, the engine on Ray, and the simulator with this machine's
   calibrated linear cost model (``servelab calibrate``) and a link fitted to the measured
   transfers of the default ``auto`` transport (per token, so the catalog model's KV size
   does not change it).

Default model: the ``bench-30m`` preset (random weights, tokenizer trained on GSM8K), made in
a temporary folder. Every actor and the driver run one torch thread.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from servelab.engine.ray_backend.bench_results import BenchResult, BenchSize
from servelab.engine.sampling import SamplingParams

POLICIES = ("vllm", "distserve", "dynaserve")
TRANSPORTS = ("inprocess", "object_store", "gloo")  # "auto" picks one of the last two by size
GREEDY = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
FULL = BenchSize((1, 4, 16, 64, 256, 512), 96, 9, 16, 2.0, 48, 2, "default")
REDUCED = BenchSize((1, 8, 64), 16, 3, 6, 2.0, 16, 1, "reduced")


def kv_transfers(engine, loaded, size: BenchSize, out: BenchResult) -> None:
    """Median time to move n blocks from actor 0 to actor 1, per transport, and in process.
    The transports take turns within each repeat, so a busy moment hits all of them alike."""
    from servelab.engine.kv_cache import PagedKVCache

    cluster, _ = engine.build(lambda spec: GREEDY)
    src, dst = cluster.drivers[0].executor, cluster.drivers[1].executor
    c, kv = loaded.config, engine.kv_config
    caches = [PagedKVCache(c.num_layers, kv.num_gpu_blocks, kv.block_size, c.num_kv_heads, c.head_dim,
                           dtype=engine.kv_dtype) for _ in range(2)]
    engine.ray_workers._init_gloo()
    block_bytes = engine.kv_bytes_per_token * kv.block_size

    def move(transport: str, ids: list[int]) -> float:
        t0 = time.perf_counter()
        if transport == "inprocess":
            caches[1].write_blocks(ids, caches[0].read_blocks(ids))
        else:
            src.transport = dst.transport = transport
            dst.import_kv(ids, src.export_kv(ids))
        return time.perf_counter() - t0

    for n in size.transfer_blocks:
        ids = list(range(n))
        times: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
        for rep in range(size.transfer_repeats + 1):
            for transport in TRANSPORTS:
                elapsed = move(transport, ids)
                if rep:  # the first round warms up
                    times[transport].append(elapsed)
        for transport in TRANSPORTS:
            out.transfers.append({"transport": transport, "blocks": n, "bytes": n * block_bytes,
                                  "median_s": statistics.median(times[transport])})
    by = {(r["transport"], r["bytes"]): r["median_s"] for r in out.transfers}
    sizes = sorted({r["bytes"] for r in out.transfers})
    series = {t: [by[(t, b)] for b in sizes] for t in TRANSPORTS}
    series["auto"] = [min(by[("object_store", b)], by[("gloo", b)]) for b in sizes]  # what auto aims at
    for transport, times in series.items():
        slope, intercept = np.polyfit(sizes, times, 1)
        out.fits[transport] = (max(float(intercept), 0.0), 1.0 / max(float(slope), 1e-15))


def _run_ray(engine, specs, params):
    """(result, steps) of one Ray run: steps are (round trip, actor compute, shape) per step."""
    cluster, states = engine.build(lambda s: params[s.request_id])
    res = cluster.run(specs)
    steps = [t for d in cluster.drivers for t in d.executor.step_times]
    return engine.result_of(cluster, states, res.wall_s), steps, cluster


def _model_error(steps, cost) -> float:
    """Median over steps of the cost model's time / the compute measured in the actor."""
    return float(np.median([cost.step_time_s(shape) / compute for _, compute, shape in steps]))


def step_overhead(engine_ray, engine_local, specs, params, cost, out: BenchResult) -> None:
    """The same requests on two instances in process and on Ray: step times, driver CPU."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    local = engine_local.run(specs, params)
    local_cpu, local_wall = time.process_time() - cpu0, time.perf_counter() - wall0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    res, times, cluster = _run_ray(engine_ray, specs, params)
    ray_cpu, ray_wall = time.process_time() - cpu0, time.perf_counter() - wall0
    rtt = np.array([a for a, _, _ in times])
    compute = np.array([b for _, b, _ in times])
    local_steps = local.collector.steps.duration_s
    out.steps = {
        "num_steps_inprocess": int(len(local_steps)), "num_steps_ray": len(times),
        "inprocess_step_ms_p50": float(np.median(local_steps) * 1e3),
        "ray_compute_ms_p50": float(np.median(compute) * 1e3),
        "ray_round_trip_ms_p50": float(np.median(rtt) * 1e3),
        "overhead_ms_p50": float(np.median(rtt - compute) * 1e3),
        "overhead_ms_p90": float(np.percentile(rtt - compute, 90) * 1e3),
        "driver_cpu_ms_per_step_inprocess": local_cpu / max(len(local_steps), 1) * 1e3,
        "driver_cpu_ms_per_step_ray": ray_cpu / max(len(times), 1) * 1e3,
        "wall_s_inprocess": local_wall, "wall_s_ray": ray_wall,
        "same_tokens": local.outputs() == res.outputs(),
        "model_over_compute_p50": _model_error(times, cost),
        "polls": cluster.clock.num_polls,
    }


def _latency(summary) -> dict:
    return {"ttft_mean_s": summary.ttft.mean, "ttft_p50_s": summary.ttft.p50, "tpot_mean_s": summary.tpot.mean,
            "e2e_mean_s": summary.e2e.mean, "e2e_p99_s": summary.e2e.p99, "completed": summary.num_completed,
            "arrived": summary.num_arrived, "duration_s": summary.duration_s}


def _median_rows(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def simulated(policy: str, specs, cost, link_fit, kv_bytes_per_token: float, cfg) -> dict:
    """The simulator on the same requests: calibrated steps, the measured link per token."""
    from servelab.cluster.presets import cluster_for
    from servelab.costmodel.links import LinkSpec
    from servelab.metrics import RequestTable, summarize
    from servelab.simulator import Simulation

    group = {"max_num_seqs": cfg.max_num_seqs, "max_batch_tokens": cfg.max_batch_tokens, "block_size": cfg.block_size}
    probe = Simulation(specs, cluster_for(policy, num_instances=2, **group), cost_model=cost)
    scale = probe.instances[0].kv_bytes_per_token / kv_bytes_per_token  # catalog KV bytes per engine KV byte
    latency, bandwidth = link_fit
    link = LinkSpec(bandwidth_bytes_per_s=bandwidth * scale, latency_s=latency)
    res = Simulation(specs, cluster_for(policy, num_instances=2, link=link, **group), cost_model=cost).run()
    return _latency(summarize(RequestTable.from_requests(res.requests), res.collector))


def end_to_end(loaded, cfg, workers, specs, params, cost, out: BenchResult, repeats: int) -> None:
    from servelab.engine.cluster import EngineCluster

    for policy in POLICIES:
        runs = {"inprocess": [], "ray": []}
        local = EngineCluster(loaded, policy, cfg, num_instances=2)
        remote = EngineCluster(loaded, policy, cfg, num_instances=2, backend="ray", ray_workers=workers)
        steps, overheads = [], []
        for _ in range(repeats):  # the two backends take turns, so a busy moment hits both
            runs["inprocess"].append(_latency(local.run(specs, params).summary))
            res, times, _ = _run_ray(remote, specs, params)
            runs["ray"].append(_latency(res.summary))
            steps += times
        sim = simulated(policy, specs, cost, out.fits["auto"], out.kv_bytes_per_token, cfg)
        out.e2e.append({"policy": policy, "inprocess": _median_rows(runs["inprocess"]),
                        "ray": _median_rows(runs["ray"]), "sim": sim,
                        "model_over_compute_p50": _model_error(steps, cost),
                        "overhead_ms_p50": float(np.median([a - b for a, b, _ in steps]) * 1e3)})
        print(f"  {policy}: done", flush=True)


def _model(path: str | None, tmp: str) -> Path:
    if path is not None:
        return Path(path)
    from servelab.engine.tiny_model import BENCH_30M, make_tiny_model

    return Path(make_tiny_model(Path(tmp) / "bench-30m", **BENCH_30M))


def run(size: BenchSize, model: str | None, seed: int = 0) -> BenchResult:
    from servelab.api import DEFAULT_DATA_DIR
    from servelab.engine.bench_policies import tokenized_workload
    from servelab.engine.calibrate import REDUCED_GRID, CalibrationGrid, calibrate, machine_meta
    from servelab.engine.cluster import EngineCluster, EngineConfig
    from servelab.engine.loader import load_checkpoint
    from servelab.engine.ray_backend import RayConfig
    from servelab.engine.ray_backend.launch import start_ray

    torch.set_num_threads(1)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_checkpoint(_model(model, tmp), dtype="float32")
        print("calibrating the cost model (in process, 1 thread)", flush=True)
        cost, _, _ = calibrate(loaded, REDUCED_GRID if size.grid == "reduced" else CalibrationGrid())
        start_ray(RayConfig())
        cfg = EngineConfig(kv_budget_bytes=size.kv_budget_mb << 20, block_size=16, max_batch_tokens=2048,
                           max_num_seqs=32, seed=seed)
        engine = EngineCluster(loaded, "vllm", cfg, num_instances=2, backend="ray")
        out = BenchResult(size, machine_meta(), "bench-30m" if model is None else str(model),
                          int(engine.kv_bytes_per_token), {}, gloo_max_bytes=RayConfig().gloo_max_bytes)
        print("KV transfers", flush=True)
        kv_transfers(engine, loaded, size, out)
        out.placement = dict(engine.ray_workers.placement)
        specs = tokenized_workload(f"gsm8k:n={size.requests},rate={size.rate}", loaded.tokenizer, DEFAULT_DATA_DIR,
                                   seed, size.max_output)
        params = {s.request_id: replace(GREEDY, max_tokens=s.num_output_tokens) for s in specs}
        print("per-step overhead", flush=True)
        burst = [replace(s, arrival_time_s=0.0) for s in specs]
        step_overhead(engine, EngineCluster(loaded, "vllm", cfg, num_instances=2), burst, params, cost, out)
        print("pipeline stage hand-off", flush=True)
        from servelab.engine.ray_backend.bench_pipeline import pipeline_handoff, pipeline_overlap

        out.pipeline = pipeline_handoff(engine, size.transfer_repeats)
        out.pipeline_overlap = pipeline_overlap(engine, size.transfer_repeats)
        print("end to end", flush=True)
        end_to_end(loaded, cfg, engine.ray_workers, specs, params, cost, out, size.e2e_repeats)
        engine.close()
    out.wall_s, out.cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
    return out


def main(argv: list[str] | None = None) -> None:
    from servelab.engine.ray_backend.bench_report import render

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reduced", action="store_true", help="small sizes (a quick check, not for the docs)")
    ap.add_argument("--model", default=None, help="checkpoint folder (default: bench-30m made in a temp folder)")
    ap.add_argument("--out", default="docs/ray.md")
    args = ap.parse_args(argv)
    size = REDUCED if args.reduced else FULL
    result = run(size, args.model)
    command = "python -m servelab.engine.ray_backend.bench" + (" --reduced" if args.reduced else "") + \
        (f" --model {args.model}" if args.model else "") + (f" --out {args.out}" if args.out != "docs/ray.md" else "")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(render(result, command))
    print(f"wrote {args.out} ({result.wall_s:.0f} s wall, {result.cpu_s:.0f} CPU-s in the driver)")


if __name__ == "__main__":
    main()
