"""``servelab reproduce dynaserve``: DynaServe's tables and figures in the simulator.

The steps run the experiments of ``experiments.py`` on the paper's setting (``setting.py``)
and measure the global scheduler; ``_write`` makes the plots under ``out_dir/dynaserve/`` and
the report ``out_dir/dynaserve.md`` (the paper's number, ours, the operating point, and for
each gap the experiment that tests its stated reason); the runner (``servelab.reproduce``)
writes ``out_dir/dynaserve.json``, times the steps and shows progress.

Order matters: the 14B capacities come first (``capacity.py``: a rate grid over
``run.seeds``, both delay rules, the paper's deployment and servelab's variants), since the
other experiments run at rates relative to DynaServe's capacity on each workload (the mean
over seeds under the paper's rule; goodput curves at 0.5-1.25x of it, scaled for the larger
models by their prefill speed; Table 4 at it; Figure 11 above it; the transfer comparison at
0.4x and 0.8x of it).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from servelab.designs.dynaserve.reproduce import capacity as cp
from servelab.designs.dynaserve.reproduce import experiments as ex
from servelab.designs.dynaserve.reproduce import setting as st
from servelab.designs.dynaserve.reproduce.paper_coloc import paper_coloc
from servelab.designs.dynaserve.reproduce.step_gap import step_gap
from servelab.designs.dynaserve.reproduce.timing import percentiles_us, queue_benchmark
from servelab.metrics.plain_json import plain
from servelab.reproduce.runner import Reproduction, Run, Step

FULL = ex.Sizes(goodput_rates={"fractions": (0.5, 0.75, 1.0, 1.25)})
REDUCED = ex.Sizes(num_requests=120, min_duration_s=45.0, max_requests=600, capacity_rel_tol=0.2,
                   capacity_hi=20.0, goodput_rates={"fractions": (0.5, 1.0, 1.5)},
                   models=("14B",), chunks=(256, 512, 2048), table1_requests=120,
                   split_fractions=(-0.25, 0.0, 0.3, 0.6), split_requests=120, sigmas=(0.0, 100.0),
                   queue_sizes=(10, 100), queue_repeats=100, timing_runs=1, anchor_rel_tol=0.25,
                   gap_workloads=("azure-code",))
# every step and claim row on sizes so small the numbers mean nothing (~20 CPU-s a seed, against
# ~780 reduced): a check that the command runs here (the README check at --fast sizes, the tests)
SMOKE = ex.Sizes(num_requests=30, min_duration_s=5.0, max_requests=60, capacity_rel_tol=0.6, capacity_hi=10.0,
                 goodput_rates={"fractions": (1.0,)}, models=("14B",), capacity_workloads=("azure-code",),
                 chunks=(256,), table1_requests=20, split_fractions=(0.0, 0.3), split_requests=20,
                 sigmas=(0.0, 100.0), queue_sizes=(10,), queue_repeats=10, grid=(0.8, 1.0, 1.25),
                 anchor_rel_tol=0.6, variant_workloads=("azure-code",), gap_workloads=("azure-code",),
                 coloc_gap_workloads=("hybrid",))
# the hybrid workload's DynaServe number where the paper's deployment has none: servelab's defaults
HYBRID_VARIANTS = {"servelab defaults": st.DYNASERVE_VARIANTS["servelab defaults"]}
CDF_POINTS_MS = [float(x) for x in range(0, 301, 10)]


def _start(run: Run) -> None:
    if run.options.get("smoke"):
        run.sizes = SMOKE
    setting = run.options.get("setting", st.Setting())
    run.results.update({"reduced": run.reduced, "smoke": bool(run.options.get("smoke")), "seed": run.seed, "seeds": list(run.seeds), "setting": plain(dataclasses.asdict(setting)),
                        "sizes": plain(dataclasses.asdict(run.sizes)), "full_sizes": plain(dataclasses.asdict(FULL)),
                        "cdf_points_ms": CDF_POINTS_MS})


def _steps(run: Run) -> list[Step]:
    setting, sizes, seed, res = run.options.get("setting", st.Setting()), run.sizes, run.seed, run.results
    seeds = list(run.seeds)

    def cap() -> dict:
        """DynaServe's capacity per workload (the paper's rule), colocation's where it has none
        (below the grid): the rate the later experiments are placed relative to."""
        coloc = {r["workload"]: r["capacity_rps"] for r in res["capacity"] if r["system"] == "coloc"}
        return {r["workload"]: {**r, "capacity_rps": r["capacity_rps"] or coloc.get(r["workload"])}
                for r in res["capacity"] if r["system"] == "dynaserve"}

    return [
        Step("capacity (Fig. 9)", lambda _: _grid(setting, sizes, seeds, sizes.capacity_workloads, True), "grid"),
        Step("capacity rows", lambda _: cp_rows(res["grid"]), "capacity"),
        Step("goodput (Fig. 8)", lambda _: _goodput(setting, sizes, seed, cap()), "goodput"),
        Step("hybrid (Table 2)", lambda _: _grid(setting, sizes, seeds, ("hybrid",), False, HYBRID_VARIANTS),
             "hybrid_grid"),
        Step("hybrid rows", lambda _: cp_rows(res["hybrid_grid"]), "hybrid"),
        Step("Table 1", lambda _: ex.table1(setting, sizes, seed), "table1"),
        Step("step times vs Table 1", lambda _: step_times(), "step_times"),
        Step("split ratio (Fig. 5)", lambda _: ex.split_sweep(setting, sizes, seed), "split_sweep"),
        Step("prediction error (Table 4)",
             lambda _: ex.prediction_error(_rate_of(cap(), "mini-reasoning"), setting, sizes, seed), "prediction_error"),
        Step("SLO-aware batching (Fig. 11)",
             lambda _: ex.slo_batching("burstgpt", 1.2 * _rate_of(cap(), "burstgpt"), setting, sizes, seed,
                                       CDF_POINTS_MS), "slo_batching"),
        Step("chunked vs bulk transfer",
             lambda _: ex.transfer_modes(_rate_of(cap(), "mini-reasoning"), setting, sizes, seed), "transfer"),
        Step("scheduler time", lambda _: _overhead(setting, sizes, seed, cap()), "overhead"),
        Step("gap: planned vs simulated step time", lambda _: step_gap(setting, sizes, seeds, res["grid"]),
             "step_gap"),
        Step("gap: per-step overhead off", lambda _: _gap_overhead(setting, sizes, seeds, res["grid"]),
             "gap_overhead"),
        Step("gap: the paper's colocation (hybrid)", lambda _: paper_coloc(setting, sizes, seeds, res["hybrid_grid"]),
             "paper_coloc"),
    ]


def _write(run: Run) -> dict:
    from servelab.designs.dynaserve.reproduce import plots
    from servelab.designs.dynaserve.reproduce.report import write_report

    run.results["figures"] = [f"{run.stem}/{f}" for f in plots.all_figures(run.results, run.fig_dir())]
    write_report(run.results, run.report_path)
    return run.results


REPRODUCTION = Reproduction("dynaserve", {"full": FULL, "reduced": REDUCED}, _steps, _write, start=_start,
                            json_name="{stem}.json", default_seeds=3)


def _rate_of(cap: dict, workload: str) -> float:
    row = cap.get(workload)
    return row["capacity_rps"] if row and row["capacity_rps"] else 1.0


def _grid(setting: st.Setting, sizes: ex.Sizes, seeds: list[int], workloads, variants: bool,
          extra: dict | None = None) -> list[dict]:
    """Every system on each workload; servelab's variants where ``variants`` and the workload is
    one of ``sizes.variant_workloads``, else only ``extra``'s variants."""
    return [cp.workload_capacities(wl, "14B", setting, sizes, seeds,
                                   st.DYNASERVE_VARIANTS if variants and wl in sizes.variant_workloads else extra,
                                   coloc_variants=variants and wl in sizes.variant_workloads) for wl in workloads]


def cp_rows(grid: list[dict]) -> list[dict]:
    """The grid results as one row per (workload, system) under the paper's rule (the mean
    over seeds), the shape the tables, plots and later steps read."""
    rows = []
    for g in grid:
        for system in st.SYSTEMS:
            r = g[system]
            row = {"workload": g["workload"], "system": system, "capacity_rps": r["median"]["interval"]["mean"],
                   "capacity_p99_rule_rps": r["p99"]["interval"]["mean"],
                   "chunk": r["tuned_chunk"]["median"] if system == "coloc" else None,
                   "goodput_at_capacity": _goodput_at_capacity(r)}
            if system == "coloc":
                row["tuning"] = [{"chunk": c["chunk"], "capacity_rps": c["median"]["interval"]["mean"],
                                  "capacity_p99_rule_rps": c["p99"]["interval"]["mean"]} for c in g["coloc_chunks"]]
                row["tuning"] += [{"chunk": int(c), "capacity_rps": None, "anchor_rps": a}
                                  for c, a in r["anchors"].items() if int(c) not in {t["chunk"] for t in row["tuning"]}]
            rows.append(row)
    return rows


def _goodput_at_capacity(row: dict) -> float | None:
    """Mean over seeds of the goodput of the probe at each seed's capacity (paper's rule)."""
    vals = []
    for run in row["runs"]:
        rate = run["median"]["rps"]
        vals += [p["goodput_tokens_per_s"] for p in run["probes"] if rate is not None and p["rate"] == rate]
    return float(np.mean(vals)) if vals else None


def _goodput(setting, sizes, seed, cap) -> list[dict]:
    rows = []
    for model in sizes.models:
        speed = st.model_speed(model)
        for wl in sizes.capacity_workloads:
            base = _rate_of(cap, wl) * speed
            rates = [round(f * base, 3) for f in sizes.goodput_rates["fractions"]]
            rows += ex.goodput_curve(wl, model, rates, setting, sizes, seed, tune_rate=round(base, 3))
    return rows


def _overhead(setting, sizes, seed, cap) -> dict:
    """Decision CPU time in runs at each workload's DynaServe capacity, and the isolated
    benchmark over queue sizes. The machine is shared (other processes' time slices leave
    this one's caches cold), so each workload runs ``timing_runs`` times (the same
    simulation: decisions and results are identical) and each percentile is the median over
    the runs; every run's p99 is kept in the results."""
    import os

    runs = []
    load_before = os.getloadavg()[0]
    for wl in sizes.capacity_workloads:
        rate = _rate_of(cap, wl)
        specs = st.workload(wl, rate, ex._n(rate, sizes), seed, setting)
        timed = [st.run("dynaserve", specs, "14B", setting, detail=True) for _ in range(sizes.timing_runs)]
        stats = [percentiles_us(r["decision_us"]) for r in timed]
        decision = {k: (stats[0][k] if k == "count" else float(np.median([s[k] for s in stats]))) for k in stats[0]}
        plans = [percentiles_us(r["schedule_us"]) for r in timed]
        plan = {k: (plans[0][k] if k == "count" else float(np.median([s[k] for s in plans]))) for k in plans[0]}
        r = timed[0]
        q = r["queue_at_decision"]
        feedback = [float(t["resync_us"].sum() / max(len(t["decision_us"]), 1)) for t in timed]
        runs.append({"workload": wl, "rate": rate, "decision_us": decision, "runs": len(timed), "schedule_us": plan,
                     "decision_p99_us_per_run": [s.get("p99") for s in stats],
                     "feedback_us_per_request": float(np.median(feedback)),
                     "queue_median": float(np.median(q)), "queue_max": int(q.max()),
                     "split_kinds": r["split_kinds"]})
    bench = queue_benchmark(sizes.queue_sizes, repeats=sizes.queue_repeats, seed=seed)
    return {"runs": runs, "benchmark": bench, "nice": os.nice(0), "load_avg_1min": [load_before, os.getloadavg()[0]]}


def _gap_overhead(setting, sizes, seeds, grid: list[dict]) -> list[dict]:
    """Gap test: the capacities of tuned colocation and DynaServe with the cost model's per-step
    CPU overhead turned off (``cpu_overhead="off"``) against the default (measured) overhead,
    on ``sizes.gap_workloads``, the same seeds and grid rules."""
    off = dataclasses.replace(setting, cpu_overhead="off")
    by = {g["workload"]: g for g in grid}
    rows = []
    for wl in sizes.gap_workloads:
        g = by.get(wl)
        if g is None:
            continue
        coloc, _ = cp.tuned_coloc(wl, "14B", off, sizes, seeds)
        dyna = cp.grid_capacity("dynaserve", wl, "14B", coloc["rates"], off, sizes, seeds)
        measured = [("paper", g["dynaserve"])]
        off_rows = [("paper", dyna)]
        defaults = g["variants"].get("servelab defaults")
        if defaults is not None:  # the paper's deployment has no capacity here: the variant that has one
            measured.append(("servelab defaults", defaults))
            off_rows.append(("servelab defaults", cp.grid_capacity(
                "dynaserve", wl, "14B", coloc["rates"], off, sizes, seeds,
                dyna=st.DYNASERVE_VARIANTS["servelab defaults"][0], label="servelab defaults")))
        for overhead, c, ds in (("measured", g["coloc"], measured), ("off", coloc, off_rows)):
            for config, d in ds:
                rows.append({"workload": wl, "cpu_overhead": overhead, "dynaserve_config": config,
                             **{rule: {"coloc": c[rule]["interval"], "dynaserve": d[rule]["interval"],
                                       "coloc_chunk": c["tuned_chunk"][rule],
                                       "ratio": cp.ratio_interval(d, c, rule)} for rule in ("median", "p99")}})
    return rows


def step_times() -> list[dict]:
    """The step times that decide colocation's TBT on Table 1's shapes (14B, A100, default
    cost model): one chunk of each size beside a batch of decodes at the shape's context."""
    from servelab.catalog.instance import InstanceSpec
    from servelab.core.plan import StepShape
    from servelab.costmodel.build import build_cost_model

    model, tp = st.MODELS["14B"]
    cost = build_cost_model(InstanceSpec(st.GPU, model, tp=tp), st.Setting().cost)
    rows = []
    for shape, prompt, output, decodes in (("P8192/D32", 8192, 32, 16), ("P2048/D512", 2048, 512, 64),
                                           ("P219/D1467", 219, 1467, 128)):
        ctx = prompt + output // 2
        for chunk in (0, 256, 512, 2048):
            n = min(chunk, prompt)  # a chunk halfway through the prompt, attending to what came before
            step = StepShape(prefill_tokens=(n,) if n else (), prefill_context=(min(prompt, prompt // 2 + n),) if n else (),
                             num_decodes=decodes, decode_context_sum=decodes * ctx, decode_context_max=ctx)
            rows.append({"shape": shape, "chunk": chunk, "chunk_tokens": n, "num_decodes": decodes, "context": ctx,
                         "step_ms": 1e3 * cost.step_time_s(step)})
    return rows
