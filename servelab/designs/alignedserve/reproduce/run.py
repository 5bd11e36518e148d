"""``servelab reproduce alignedserve``: the experiments in order, and what they write.

``_write`` makes the plots under ``out_dir/alignedserve/`` and ``out_dir/alignedserve.md`` (the
report is generated from the results alone, never edited by hand); the runner
(``servelab.reproduce``) writes ``out_dir/alignedserve/results.json``, times the steps and
shows progress. ``--no-engine`` leaves out the CPU-engine measurement (torch).
"""

from __future__ import annotations

from servelab.costmodel.attention import KERNELS
from servelab.designs.alignedserve.reproduce import experiments as ex
from servelab.designs.alignedserve.reproduce import (app_gaps, fig13_rows, fig14_gap, fig15_wait, gaps, kernels, motivation, open_gaps,
                                                   regimes, seeds, vllm_gap)
from servelab.reproduce.runner import Reproduction, Run, Step

FULL = ex.Sizes()
REDUCED = ex.Sizes(num_gpus=4, num_requests=400, app_requests=300, models=("OPT-2.7B",), short_shares=(0.7, 0.95),
                   long_lengths=(2000, 10000), applications=("ShareGPT-like", "LongBench-like (arXiv)", "Azure conv"),
                   dfs_searches=500, seeds=2, seeds_split_kv=2, regime_requests=200, fig14_seeds=3)


def _start(run: Run) -> None:
    run.results.update({"reduced": run.reduced, "seed": run.seed,
                        "sizes": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(run.sizes).items()}})


def _steps(run: Run) -> list[Step]:
    sizes, seed = run.sizes, run.seed
    small = kernels.claim_sizes(sizes)
    engine = [Step("Figs. 1/3 trend on the CPU engine", lambda _: motivation.engine_measured(), "engine")] \
        if run.options.get("engine", True) else []
    return [
        Step("headline grid: deep pool, every kernel, seeds", lambda _: regimes.headline_grid(sizes, seed), "regimes"),
        Step("Fig. 1 (simulated)", lambda _: motivation.fig1_simulated(), "fig1"),
        Step("Fig. 3 (simulated)", lambda _: motivation.fig3_simulated(), "fig3"),
        *engine,
        Step("Density First Search timing", lambda _: ex.dfs_timing(sizes, seed), "dfs"),
        Step("Figs. 7/9 synthetic mixes", lambda _: ex.fig7_synthetic(sizes, seed), "fig7"),
        Step("Figs. 8/10 application workloads", lambda _: ex.fig8_applications(sizes, seed), "fig8"),
        Step("Fig. 11, batch switch, pool, Fig. 15", lambda _: ex.fig11_and_overheads(sizes, seed), "fig11"),
        Step("Fig. 12 long lengths", lambda _: ex.fig12_long_lengths(sizes, seed), "fig12"),
        Step("Fig. 13 vs FCFS", lambda _: ex.fig13_vs_fcfs(sizes, seed), "fig13"),
        Step("Fig. 14 ablation", lambda _: ex.fig14_ablation(sizes, seed), "fig14"),
        *[Step(f"claims under {k} (reduced sizes)", lambda _, k=k: kernels.figure_claims(small, seed, k), f"claims_{k}")
          for k in KERNELS],
        Step("gap: bubble kernel", lambda _: ex.gap_bubble(sizes, seed), "gap_bubble"),
        Step("gap: pool depth", lambda _: ex.gap_pool_depth(sizes, seed), "gap_pool"),
        Step("gap: batch gating", lambda _: ex.gap_gating(sizes, seed), "gap_gating"),
        Step("gap: batch-switch share", lambda _: kernels.switch_gap(sizes, seed), "gap_switch"),
        Step("gap: P99 TPOT, pool wait vs decoding", lambda _: ex.gap_tpot(sizes, seed), "gap_tpot"),
        Step("gap: Fig. 15 below capacity", lambda _: ex.gap_fig15(sizes, seed), "gap_fig15"),
        Step("gap: P99 TPOT range, both ends", lambda _: gaps.gap_tpot_range(sizes, seed), "gap_tpot_range"),
        Step("gap: prefetch buffer room", lambda _: gaps.gap_prefetch(sizes, seed), "gap_prefetch"),
        Step("gap: Fig. 14 ablation, KV pauses, prefetch's mechanism, kernels", lambda _: fig14_gap.fig14_gap(sizes, seed), "gap_fig14"),
        Step("figures and gap tests over seeds", lambda _: seeds.over_seeds(sizes, seed), "seeds"),
        *[Step(label, lambda _, fn=fn: fn(sizes, seed), key) for label, fn, key in OPEN_GAP_STEPS],
    ]


# issue 25's gap reasons tested (``open_gaps``): label, experiment, results key
OPEN_GAP_STEPS = (
    ("gap tested: P/D split vs vLLM and FastGen", open_gaps.split_cost, "open_split"),
    ("gap tested: Fig. 13 long share x kernel", open_gaps.fig13_long_share, "open_fig13"),
    ("gap tested: Fig. 11 KV size", open_gaps.fig11_kv_size, "open_fig11"),
    ("gap tested: Fig. 11 arXiv KV sizes", open_gaps.arxiv_kv_sizes, "open_fig11_arxiv"),
    ("gap tested: Fig. 15 prefix-range sparsity", open_gaps.fig15_sparsity, "open_fig15"),
    ("gap tested: Fig. 14 host link speed", open_gaps.fig14_link, "open_fig14"),
    ("gap tested: the gap to vLLM by GPU time", vllm_gap.vllm_gap, "open_vllm"),
    ("gap tested: Fig. 15 LongBench wait x join rule", fig15_wait.fig15_join, "open_fig15_join"),
    ("gap tested: Fig. 13 long rows x batch mixing", fig13_rows.fig13_mixing, "open_fig13_mix"),
    ("gap tested: Fig. 8 application workloads", app_gaps.fig8_apps, "open_fig8"),
    ("gap tested: Fig. 11 DistServe iteration pauses", app_gaps.fig11_distserve, "open_fig11_ds"),
    ("gap tested: Fig. 15 LongBench block threshold", app_gaps.fig15_threshold, "open_fig15_threshold"),
)


def _write(run: Run) -> dict:
    from servelab.designs.alignedserve.reproduce import plots
    from servelab.designs.alignedserve.reproduce.report import write_report

    results = run.results
    results["total_cpu_s"] = sum(results["timings_cpu_s"].values())
    results["plots"] = plots.all_figures(results, run.fig_dir())
    write_report(results, run.report_path)
    return results


REPRODUCTION = Reproduction("alignedserve", {"full": FULL, "reduced": REDUCED}, _steps, _write, start=_start,
                            json_name="{stem}/results.json")
