"""docs/ray.md from a ``bench_results.BenchResult``: tables only, every number from the run."""

from __future__ import annotations

from servelab.engine.ray_backend.bench_results import BenchResult

_TRANSPORTS = {"inprocess": "in-process copy (one process, two caches)", "object_store": "Ray object store",
               "gloo": "torch.distributed gloo (send/recv)", "auto": "auto (the faster of the two per size)"}
_MEASURED = ("inprocess", "object_store", "gloo")


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"


def _transfers(r: BenchResult) -> list[str]:
    sizes = sorted({t["bytes"] for t in r.transfers})
    by = {(t["transport"], t["bytes"]): t["median_s"] for t in r.transfers}
    lines = ["| KV size | blocks | " + " | ".join(f"{_TRANSPORTS[k]} ms" for k in _MEASURED) + " |",
             "|---:|---:|" + "---:|" * len(_MEASURED)]
    blocks = {t["bytes"]: t["blocks"] for t in r.transfers}
    for b in sizes:
        lines.append(f"| {_size(b)} | {blocks[b]} | " + " | ".join(_ms(by[(k, b)]) for k in _MEASURED) + " |")
    lines += ["", "Straight-line fit over the sizes (time = fixed + bytes / bandwidth):", "",
              "| transport | fixed ms | bandwidth GB/s |", "|---|---:|---:|"]
    for k, (lat, bw) in r.fits.items():
        lines.append(f"| {_TRANSPORTS[k]} | {lat * 1e3:.2f} | {bw / 1e9:.2f} |")
    gloo_wins = [b for b in sizes if by[("gloo", b)] < by[("object_store", b)]]
    store_wins = [b for b in sizes if by[("object_store", b)] <= by[("gloo", b)]]
    lines += ["", f"gloo was faster at {', '.join(_size(b) for b in gloo_wins) or 'no size'}; the object store at "
              f"{', '.join(_size(b) for b in store_wins) or 'no size'}. The default transport `auto` sends a "
              f"transfer under {_size(r.gloo_max_bytes)} by gloo and a larger one through the store "
              "(`RayConfig.gloo_max_bytes`); either can be forced (`kv_transport=\"gloo\"` / `\"object_store\"`). "
              "KV parked in the driver's host pool always goes through the store (the pool holds object refs)."]
    from_store = next((b for i, b in enumerate(sizes) if all(x in store_wins for x in sizes[i:])), None)
    agrees = from_store is not None and all(b < r.gloo_max_bytes for b in gloo_wins) and from_store >= r.gloo_max_bytes
    lines += ["", f"In this run the store was faster from {_size(from_store) if from_store else 'no size'} upward; "
              f"the {_size(r.gloo_max_bytes)} threshold {'agrees with' if agrees else '**does not match**'} this run "
              "(under contention from other sessions the order of the two at small sizes changes between runs)."]
    return lines


def _steps(r: BenchResult) -> list[str]:
    s = r.steps
    return [
        "| | in process (2 instances, serialised) | Ray (2 actors) |", "|---|---:|---:|",
        f"| steps | {s['num_steps_inprocess']} | {s['num_steps_ray']} |",
        f"| step time p50, ms (in process: the forward pass; Ray: compute inside the actor) | "
        f"{s['inprocess_step_ms_p50']:.2f} | {s['ray_compute_ms_p50']:.2f} |",
        f"| step round trip seen by the driver p50, ms | - | {s['ray_round_trip_ms_p50']:.2f} |",
        f"| actor-boundary overhead per step (round trip - compute) p50 / p90, ms | - | "
        f"{s['overhead_ms_p50']:.2f} / {s['overhead_ms_p90']:.2f} |",
        f"| driver CPU per step, ms | {s['driver_cpu_ms_per_step_inprocess']:.2f} | "
        f"{s['driver_cpu_ms_per_step_ray']:.2f} |",
        f"| wall time of the run, s | {s['wall_s_inprocess']:.2f} | {s['wall_s_ray']:.2f} |",
        f"| same greedy tokens | | {'yes' if s['same_tokens'] else '**no**'} |",
        f"| calibrated model's step time / compute measured in the actor, p50 | | "
        f"{s['model_over_compute_p50']:.2f} |",
    ]


def _e2e(r: BenchResult) -> list[str]:
    lines = ["| policy (2 instances) | run | completed | TTFT mean / p50 ms | TPOT mean ms | e2e mean / p99 s | "
             "makespan s |", "|---|---|---:|---:|---:|---:|---:|"]
    names = {"inprocess": "engine, in process (measured)", "ray": "engine, Ray actors (measured)",
             "sim": "simulator, calibrated (simulated)"}
    for row in r.e2e:
        for key in ("inprocess", "ray", "sim"):
            x = row[key]
            lines.append(f"| {row['policy']} | {names[key]} | {x['completed']:.0f}/{x['arrived']:.0f} | "
                         f"{_ms(x['ttft_mean_s'])} / {_ms(x['ttft_p50_s'])} | {_ms(x['tpot_mean_s'])} | "
                         f"{x['e2e_mean_s']:.2f} / {x['e2e_p99_s']:.2f} | {x['duration_s']:.2f} |")
    lines += ["", "Ratios (e2e mean): Ray / in process and simulator / Ray; and, to test where a simulator gap "
              "comes from, over the Ray runs' own steps: the calibrated model's time for each step's shape / "
              "the compute measured in the actor (1.00: the step model is exact; the simulator then misses only "
              "the actor boundary's overhead, last column, and the transfers):", "",
              "| policy | Ray / in process | simulator / Ray | model / measured step, p50 | overhead per step "
              "p50, ms |", "|---|---:|---:|---:|---:|"]
    for row in r.e2e:
        ray, local, sim = row["ray"]["e2e_mean_s"], row["inprocess"]["e2e_mean_s"], row["sim"]["e2e_mean_s"]
        lines.append(f"| {row['policy']} | {ray / local:.2f}x | {sim / ray:.2f}x | "
                     f"{row['model_over_compute_p50']:.2f} | {row['overhead_ms_p50']:.2f} |")
    return lines


def render(r: BenchResult, command: str) -> str:
    m, z = r.meta, r.size
    head = [
        "# The engine cluster on Ray (measured)", "",
        f"Written by `{command}` ({r.wall_s:.0f} s wall, {r.cpu_s:.0f} CPU-s in the driver process); "
        "do not edit by hand.", "",
        f"Machine: {m['hardware']}, torch {m['torch']}, {m['date']}; other sessions shared the cores, so "
        "times are medians. Model: "
        f"`{r.model}` (float32, KV {r.kv_bytes_per_token} bytes per token, block 16). Placement as Ray saw it: "
        f"{r.placement.get('device')}, {r.placement.get('num_cpus')} CPU and {r.placement.get('num_gpus')} GPU per "
        f"actor, {r.placement.get('threads')} torch thread(s) each; the driver runs 1 thread.", "",
        "## KV transfer time vs size (measured)", "",
        f"Actor 0 to actor 1 through `export_kv` / `import_kv` (what a hand-off or a Move does), median of "
        f"{z.transfer_repeats} after a warm-up, the three taking turns in each repeat; the in-process column "
        "copies between two caches in one process.",
        "",
    ]
    steps = ["", "## Per-step overhead of the actor boundary (measured)", "",
             f"{z.requests} GSM8K requests, all at t=0, outputs capped at {z.max_output} tokens, `vllm` on two "
             "instances. In process the two instances take turns on one thread; on Ray each actor has its own "
             "process and the driver waits in `ray.wait` for whichever step ends first.", ""]
    e2e = ["", "## End-to-end latency on GSM8K: engine in process, engine on Ray, simulator", "",
           f"`gsm8k:n={z.requests},rate={z.rate}` (Poisson arrivals), outputs capped at {z.max_output} tokens "
           f"(EOS ignored, so every run does the same work), median of {z.e2e_repeats} run(s) per engine row "
           "(the two engines take turns). "
           f"Simulator: the linear cost model calibrated on this machine (`servelab calibrate`, grid {z.grid}) for "
           "every instance, one step at a time per instance (the simulator's instances run in parallel, as the "
           "Ray actors do), KV links fitted to the `auto` transfers above (the faster of the two per size).", ""]
    notes = ["", "## Reading it", "",
             "- In process, instances take turns on one thread, so two instances are slower than two machines; "
             "on Ray they run side by side (one core each here), which is what the simulator assumes.",
             "- A Ray step costs its compute plus the overhead above (serialising the step's chunks and tokens, "
             "the actor call, the driver's wait); it matters most for short decode steps.",
             "- Not measured here: a multi-node Ray cluster; consecutive group steps do not overlap on the engine "
             "(the next is decided when this one's tokens are back), only the microbatches inside a step.", ""]
    from servelab.engine.ray_backend.bench_pipeline import render_overlap, render_pipeline

    pipe = render_pipeline(r.pipeline, z.transfer_repeats, r.steps.get("overhead_ms_p50"))
    pipe += render_overlap(getattr(r, "pipeline_overlap", []), z.transfer_repeats)
    return "\n".join(head + _transfers(r) + steps + _steps(r) + pipe + e2e + _e2e(r) + notes)
