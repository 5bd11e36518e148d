"""``servelab reproduce alignedserve``: run the experiments, write the json, plots and report.

``run_reproduction(out_dir, reduced=..., seed=..., progress=...)`` writes
``out_dir/alignedserve.md``, ``out_dir/alignedserve/results.json`` and the plots under
``out_dir/alignedserve/``, and returns the results dict. The report is generated from the
results alone (never edited by hand).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from servelab.designs.alignedserve.reproduce import experiments as ex
from servelab.designs.alignedserve.reproduce import motivation
from servelab.designs.alignedserve.reproduce.report import write_report

FULL = ex.Sizes()
REDUCED = ex.Sizes(num_gpus=4, num_requests=400, app_requests=300, models=("OPT-2.7B",), short_shares=(0.7, 0.95),
                   long_lengths=(2000, 10000), applications=("ShareGPT-like", "LongBench-like (arXiv)", "Azure conv"),
                   dfs_searches=500)


def run_reproduction(out_dir: Path, *, reduced: bool = False, seed: int = 0, progress: bool = False,
                     sizes: ex.Sizes | None = None, engine: bool = True) -> dict:
    out_dir = Path(out_dir)
    fig_dir = out_dir / "alignedserve"
    fig_dir.mkdir(parents=True, exist_ok=True)
    sizes = sizes if sizes is not None else (REDUCED if reduced else FULL)
    say = print if progress else (lambda _msg: None)
    timings: dict[str, float] = {}
    results: dict = {"reduced": reduced, "seed": seed, "sizes": {k: (list(v) if isinstance(v, tuple) else v)
                                                                 for k, v in vars(sizes).items()}}

    def step(name, fn):
        t0 = time.process_time()
        value = fn()
        timings[name] = time.process_time() - t0
        say(f"[alignedserve] {name}: {timings[name]:.1f} s CPU")
        return value

    results["fig1"] = step("Fig. 1 (simulated)", motivation.fig1_simulated)
    results["fig3"] = step("Fig. 3 (simulated)", motivation.fig3_simulated)
    if engine:
        results["engine"] = step("Figs. 1/3 trend on the CPU engine", motivation.engine_measured)
    results["dfs"] = step("Density First Search timing", lambda: ex.dfs_timing(sizes, seed))
    results["fig7"] = step("Figs. 7/9 synthetic mixes", lambda: ex.fig7_synthetic(sizes, seed))
    results["fig8"] = step("Figs. 8/10 application workloads", lambda: ex.fig8_applications(sizes, seed))
    results["fig11"] = step("Fig. 11, batch switch, pool, Fig. 15", lambda: ex.fig11_and_overheads(sizes, seed))
    results["fig12"] = step("Fig. 12 long lengths", lambda: ex.fig12_long_lengths(sizes, seed))
    results["fig13"] = step("Fig. 13 vs FCFS", lambda: ex.fig13_vs_fcfs(sizes, seed))
    results["fig14"] = step("Fig. 14 ablation", lambda: ex.fig14_ablation(sizes, seed))
    results["gap_bubble"] = step("gap: bubble kernel", lambda: ex.gap_bubble(sizes, seed))
    results["gap_pool"] = step("gap: pool depth", lambda: ex.gap_pool_depth(sizes, seed))
    results["gap_gating"] = step("gap: batch gating", lambda: ex.gap_gating(sizes, seed))
    results["timings_cpu_s"] = timings
    results["total_cpu_s"] = sum(timings.values())
    (fig_dir / "results.json").write_text(json.dumps(results, indent=1, default=_default))
    from servelab.designs.alignedserve.reproduce import plots

    results["plots"] = plots.all_figures(results, fig_dir)
    write_report(results, out_dir / "alignedserve.md")
    return results


def _default(x):
    if hasattr(x, "item"):
        return x.item()
    return str(x)
