"""``servelab reproduce bucketserve``: BucketServe's offline, online, breakdown and overhead figures.

``run_reproduction(out_dir, reduced=..., seed=..., progress=...)`` runs the experiments of
``bucketserve_experiments`` (the paper's setting in the simulator), the bucketing-overhead
benchmark (measured wall time) and the padding analysis of the bisection buckets, writes the
plots and ``out_dir/bucketserve.md`` (the paper's numbers next to ours) and returns the
numbers, also saved as ``out_dir/bucketserve.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from servelab.designs.bucketserve.buckets import BucketingConfig, BucketManager
from servelab.designs.bucketserve.overhead import overhead_grid
from servelab.designs.bucketserve.padding import compare_boundaries
from servelab.designs.bucketserve.reproduce import experiments as ex
from servelab.designs.bucketserve.reproduce import plots as plots
from servelab.designs.bucketserve.reproduce.report import write_report


@dataclass(frozen=True)
class Sizes:
    offline_requests: int = 1000
    batch_sizes: tuple[int, ...] = (8, 16, 32, 64, 128)
    offline_workloads: tuple[str, ...] = ("alpaca", "longbench", "mixed")
    online_requests: int = 1000
    alpaca_rates: tuple[float, ...] = (4, 8, 12, 16, 20, 24, 32, 40)
    mixed_rates: tuple[float, ...] = (1, 2, 3, 4, 5, 6, 8, 10)
    online_batch: int = 128  # max_num_seqs of the P/D instances online
    static_online_batch: int = 32
    breakdown_rates: tuple[float, ...] = (4, 8, 16, 32)
    overhead_queued: tuple[int, ...] = (10, 100, 1000, 10_000)
    overhead_buckets: tuple[int, ...] = (1, 4, 16, 64, 256, 1024)
    overhead_repeats: int = 200
    padding_samples: int = 4096


FULL = Sizes()
REDUCED = Sizes(150, (16, 64), ("alpaca", "mixed"), 150, (4, 16, 32), (1, 4, 8), 128, 32, (8, 32),
                (10, 1000), (1, 64, 1024), 30, 512)


def run_reproduction(out_dir: Path, *, reduced: bool = False, seed: int = 0, progress: bool = False,
                     setting: ex.Setting = ex.Setting(), sizes: Sizes | None = None) -> dict:
    """Run every BucketServe experiment; write plots, ``bucketserve.md`` and ``bucketserve.json``.

    ``sizes`` overrides the FULL / REDUCED presets (tests use a tiny one).
    """
    out_dir = Path(out_dir)
    fig_dir = out_dir / "bucketserve"
    fig_dir.mkdir(parents=True, exist_ok=True)
    sizes = sizes if sizes is not None else (REDUCED if reduced else FULL)
    say = print if progress else (lambda _msg: None)
    timings: dict[str, float] = {}
    results: dict = {"reduced": reduced, "seed": seed, "setting": asdict(setting), "sizes": asdict(sizes)}

    def step(name, fn):
        t0 = time.perf_counter()
        value = fn()
        timings[name] = time.perf_counter() - t0
        say(f"[bucketserve] {name}: {timings[name]:.1f} s")
        return value

    results["offline"] = step("offline", lambda: _offline(sizes, setting, seed))
    results["online"] = step("online", lambda: _online(sizes, setting, seed))
    results["breakdown"] = step("breakdown", lambda: _breakdown(sizes, setting, seed))
    results["overhead"] = step("overhead", lambda: overhead_grid(sizes.overhead_queued, sizes.overhead_buckets,
                                                                 seed=seed, repeats=sizes.overhead_repeats))
    results["padding"] = step("padding", lambda: _padding(sizes, setting, seed))
    results["timings_s"] = timings
    files = plots.offline(results["offline"], list(sizes.offline_workloads), fig_dir)
    files += plots.online(results["online"], ["alpaca", "mixed"], fig_dir)
    files += [plots.breakdown(results["breakdown"], fig_dir), plots.overhead(results["overhead"], fig_dir)]
    results["figures"] = [f"bucketserve/{f}" for f in files]
    (out_dir / "bucketserve.json").write_text(json.dumps(results, indent=1, default=float))
    write_report(results, out_dir / "bucketserve.md")
    return results


def _offline(sizes: Sizes, setting: ex.Setting, seed: int) -> list[dict]:
    rows = []
    for wl in sizes.offline_workloads:
        workload = ex.offline_workload(wl, sizes.offline_requests, setting, seed)
        for bs in sizes.batch_sizes:
            for system in ex.SYSTEMS:
                rows.append({"workload": wl, **ex.run(system, workload, bs, setting)})
    return rows


def _online(sizes: Sizes, setting: ex.Setting, seed: int) -> list[dict]:
    rows = []
    for wl, rates in (("alpaca", sizes.alpaca_rates), ("mixed", sizes.mixed_rates)):
        for rate in rates:
            workload = ex.online_workload(wl, sizes.online_requests, rate, setting, seed)
            for system in ex.SYSTEMS:
                bs = sizes.static_online_batch if system == "static" else sizes.online_batch
                rows.append({"workload": wl, "client_rps": rate, **ex.run(system, workload, bs, setting)})
    return rows


def _breakdown(sizes: Sizes, setting: ex.Setting, seed: int) -> list[dict]:
    rows = []
    for rate in sizes.breakdown_rates:
        workload = ex.online_workload("alpaca", sizes.online_requests, rate, setting, seed)
        r = ex.run("bucketserve", workload, sizes.online_batch, setting)
        transfer = r["transfer_mean_s"]
        bucketing = r["bucketing_wall_s"] / max(r["num_finished"], 1)  # wall time spread per request
        rows.append({"client_rps": rate, "prefill_s": r["prefill_phase_mean_s"], "transfer_s": transfer,
                     "decode_s": max(r["decode_phase_mean_s"] - transfer, 0.0), "bucketing_s": bucketing,
                     "bucketing_wall_s": r["bucketing_wall_s"], "makespan_s": r["makespan_s"],
                     "num_decisions": r["bucketing"].get("num_decisions", 0),
                     "overhead_frac": r["bucketing_wall_s"] / r["makespan_s"]})
    return rows


def _padding(sizes: Sizes, setting: ex.Setting, seed: int) -> list[dict]:
    """Bisection buckets from a high-load queue vs Eq. 4 and the exact optimum, per workload."""
    rows = []
    for wl in ("alpaca", "longbench", "mixed"):
        rng = np.random.default_rng(seed)
        prompts = ex.length_source(wl, setting).sample(sizes.padding_samples, rng).num_prompt_tokens
        manager = BucketManager(BucketingConfig(4096, min_width=16))
        for key, length in enumerate(prompts[:512].tolist()):
            manager.add(key, min(int(length), 4096), float(key))
        manager.adjust(32)  # a high-load queue: 512 queued, N_max = m = 32
        report = compare_boundaries(prompts, manager.edges(), 4096)
        rows.append({"workload": wl, "mean_prompt": float(prompts.mean()), "p50_prompt": float(np.median(prompts)),
                     "p99_prompt": float(np.quantile(prompts, 0.99)), **asdict(report)})
    return rows
