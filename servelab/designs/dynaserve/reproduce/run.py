"""``servelab reproduce dynaserve``: DynaServe's tables and figures in the simulator.

The steps run the experiments of ``experiments.py`` on the paper's setting (``setting.py``)
and measure the global scheduler; ``_write`` makes the plots under ``out_dir/dynaserve/`` and
the report ``out_dir/dynaserve.md`` (the paper's number, ours, the operating point, and for
each gap the experiment that tests its stated reason); the runner (``servelab.reproduce``)
writes ``out_dir/dynaserve.json``, times the steps and shows progress.

Order matters: the 14B capacities come first, since the other experiments run at rates
relative to DynaServe's capacity on each workload (goodput curves at 0.5-1.25x of it,
scaled for the larger models by their prefill speed; Table 4 at it; Figure 11 above it;
the transfer comparison at 0.4x and 0.8x of it).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from servelab.designs.dynaserve.reproduce import experiments as ex
from servelab.designs.dynaserve.reproduce import setting as st
from servelab.designs.dynaserve.reproduce.timing import percentiles_us, queue_benchmark
from servelab.metrics.plain_json import plain
from servelab.reproduce.runner import Reproduction, Run, Step

FULL = ex.Sizes(goodput_rates={"fractions": (0.5, 0.75, 1.0, 1.25)})
REDUCED = ex.Sizes(num_requests=120, min_duration_s=45.0, max_requests=300, capacity_rel_tol=0.2, capacity_hi=20.0, goodput_rates={"fractions": (0.5, 1.0, 1.5)},
                   models=("14B",), chunks=(256, 2048), table1_requests=120,
                   split_fractions=(-0.25, 0.0, 0.3, 0.6), split_requests=120, sigmas=(0.0, 100.0),
                   queue_sizes=(10, 100), queue_repeats=100, timing_runs=1)
GAP_OVERHEAD_S = 0.025
CDF_POINTS_MS = [float(x) for x in range(0, 301, 10)]


def _start(run: Run) -> None:
    setting = run.options.get("setting", st.Setting())
    run.results.update({"reduced": run.reduced, "seed": run.seed, "setting": plain(dataclasses.asdict(setting)),
                        "sizes": plain(dataclasses.asdict(run.sizes)), "cdf_points_ms": CDF_POINTS_MS})


def _steps(run: Run) -> list[Step]:
    setting, sizes, seed, res = run.options.get("setting", st.Setting()), run.sizes, run.seed, run.results

    def cap() -> dict:
        return {r["workload"]: r for r in res["capacity"] if r["system"] == "dynaserve"}

    return [
        Step("capacity (Fig. 9)", lambda _: _capacities(setting, sizes, seed), "capacity"),
        Step("goodput (Fig. 8)", lambda _: _goodput(setting, sizes, seed, cap()), "goodput"),
        Step("hybrid (Table 2)", lambda _: _capacities(setting, sizes, seed, ("hybrid",)), "hybrid"),
        Step("Table 1", lambda _: ex.table1(setting, sizes, seed), "table1"),
        Step("split ratio (Fig. 5)", lambda _: ex.split_sweep(setting, sizes, seed), "split_sweep"),
        Step("prediction error (Table 4)",
             lambda _: ex.prediction_error(_rate_of(cap(), "mini-reasoning"), setting, sizes, seed), "prediction_error"),
        Step("SLO-aware batching (Fig. 11)",
             lambda _: ex.slo_batching("burstgpt", 1.2 * _rate_of(cap(), "burstgpt"), setting, sizes, seed,
                                       CDF_POINTS_MS), "slo_batching"),
        Step("chunked vs bulk transfer",
             lambda _: ex.transfer_modes(_rate_of(cap(), "mini-reasoning"), setting, sizes, seed), "transfer"),
        Step("scheduler time", lambda _: _overhead(setting, sizes, seed, cap()), "overhead"),
        Step("gap: per-step overhead", lambda _: _gap_overhead(setting, sizes, seed, res["capacity"]), "gap_overhead"),
    ]


def _write(run: Run) -> dict:
    from servelab.designs.dynaserve.reproduce import plots
    from servelab.designs.dynaserve.reproduce.report import write_report

    run.results["figures"] = [f"{run.stem}/{f}" for f in plots.all_figures(run.results, run.fig_dir())]
    write_report(run.results, run.report_path)
    return run.results


REPRODUCTION = Reproduction("dynaserve", {"full": FULL, "reduced": REDUCED}, _steps, _write, start=_start,
                            json_name="{stem}.json")


def _rate_of(cap: dict, workload: str) -> float:
    row = cap.get(workload)
    return row["capacity_rps"] if row and row["capacity_rps"] else 1.0


def _capacities(setting: st.Setting, sizes: ex.Sizes, seed: int, workloads=None) -> list[dict]:
    rows = []
    for wl in workloads or sizes.capacity_workloads:
        rows.append(_strip(ex.tuned_coloc_capacity(wl, "14B", setting, sizes, seed)))
        rows.append(_strip(ex.capacity("disagg", wl, "14B", setting, sizes, seed)))
        rows.append(_strip(ex.capacity("dynaserve", wl, "14B", setting, sizes, seed)))
    return rows


def _strip(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "probes"} | {"probes": [
        {k: p[k] for k in ("rate", "passes_capacity", "attainment", "delay_p99_s")} for p in row["probes"]]}


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
    runs = []
    for wl in sizes.capacity_workloads:
        rate = _rate_of(cap, wl)
        specs = st.workload(wl, rate, ex._n(rate, sizes), seed, setting)
        timed = [st.run("dynaserve", specs, "14B", setting, detail=True) for _ in range(sizes.timing_runs)]
        stats = [percentiles_us(r["decision_us"]) for r in timed]
        decision = {k: (stats[0][k] if k == "count" else float(np.median([s[k] for s in stats]))) for k in stats[0]}
        r = timed[0]
        q = r["queue_at_decision"]
        feedback = [float(t["resync_us"].sum() / max(len(t["decision_us"]), 1)) for t in timed]
        runs.append({"workload": wl, "rate": rate, "decision_us": decision, "runs": len(timed),
                     "decision_p99_us_per_run": [s.get("p99") for s in stats],
                     "feedback_us_per_request": float(np.median(feedback)),
                     "queue_median": float(np.median(q)), "queue_max": int(q.max()),
                     "split_kinds": r["split_kinds"]})
    bench = queue_benchmark(sizes.queue_sizes, repeats=sizes.queue_repeats, seed=seed)
    return {"runs": runs, "benchmark": bench}


def _gap_overhead(setting, sizes, seed, capacity: list[dict]) -> list[dict]:
    """Gap test: the capacities again with every step ``GAP_OVERHEAD_S`` longer, for every
    system (colocation re-tuned over its small chunks, which are the ones that survive)."""
    slow = dataclasses.replace(setting, step_overhead_s=GAP_OVERHEAD_S)
    small = dataclasses.replace(sizes, chunks=tuple(c for c in sizes.chunks if c <= 512) or sizes.chunks[:1])
    workloads = ("azure-code", "burstgpt") if len(sizes.capacity_workloads) > 1 else sizes.capacity_workloads[:1]
    by = {(r["workload"], r["system"]): r for r in capacity}
    rows = []
    for wl in workloads:
        c, d = by.get((wl, "coloc"), {}), by.get((wl, "dynaserve"), {})
        rows.append({"workload": wl, "step_overhead_s": 0.0, "coloc_rps": c.get("capacity_rps"),
                     "coloc_chunk": c.get("chunk"), "dynaserve_rps": d.get("capacity_rps"),
                     "ratio": ex.ratio(d.get("capacity_rps"), c.get("capacity_rps"))})
        coloc = ex.tuned_coloc_capacity(wl, "14B", slow, small, seed)
        dyna = ex.capacity("dynaserve", wl, "14B", slow, small, seed)
        rows.append({"workload": wl, "step_overhead_s": GAP_OVERHEAD_S, "coloc_rps": coloc["capacity_rps"],
                     "coloc_chunk": coloc["chunk"], "dynaserve_rps": dyna["capacity_rps"],
                     "ratio": ex.ratio(dyna["capacity_rps"], coloc["capacity_rps"])})
    return rows
