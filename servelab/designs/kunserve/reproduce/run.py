"""``servelab reproduce kunserve``: KunServe's claims in the simulator.

The steps calibrate each workload's base rate (vLLM's mean KV demand at the paper's "under
60%"), run the five systems on it (Figs. 12/13, and the 72B cluster), the ablation (Fig. 14),
restore on a long run with two bursts (Fig. 15), repeated extreme bursts (Fig. 16), time the
drop plan up to 1,024 instances and run the gap tests; ``_write`` makes the plots under
``out_dir/kunserve/`` and ``out_dir/kunserve.md``, and the runner (``servelab.reproduce``)
writes ``out_dir/kunserve.json``, times the steps and shows progress.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from servelab.designs.kunserve.drop_plan import time_drop_plan
from servelab.designs.kunserve.reproduce import experiments as ex
from servelab.designs.kunserve.reproduce import setting as st
from servelab.metrics.plain_json import plain
from servelab.reproduce.runner import Reproduction, Run, Step


FULL = ex.Sizes()
REDUCED = ex.Sizes(duration_s=150.0, bursts=((40.0, 100.0),), long_duration_s=300.0,
                   long_bursts=((50.0, 90.0), (190.0, 230.0)), rate_probes=4, workloads=("longbench",),
                   num_instances_a=4, extreme_repeats=3, plan_sizes=(8, 1024))
RATE_RANGES = {"burstgpt": (4.0, 160.0), "sharegpt": (2.0, 80.0), "longbench": (0.5, 16.0),
               "decode-heavy": (0.5, 40.0)}
MEMORY_BOUND_FACTOR = 3  # decode-heavy at its calibrated base throttles the KV only when the rate triples (gap test)
SLO_SCALES = tuple(float(s) for s in range(1, 11))
TYPICAL_SCALE = {"burstgpt": 5.0, "sharegpt": 5.0, "longbench": 10.0}
ABLATION = {"vllm": "kunserve:drop=false", "+drop": "kunserve:coordinated=false,former=tokens",
            "+coordinated": "kunserve:former=tokens", "+lookahead": "kunserve"}


def _clusters(sizes: ex.Sizes) -> tuple[st.Hardware, st.Hardware]:
    return dataclasses.replace(st.CLUSTER_A, num_instances=sizes.num_instances_a), st.CLUSTER_B


def _start(run: Run) -> None:
    hw_a, hw_b = _clusters(run.sizes)
    run.results.update({"reduced": run.reduced, "seed": run.seed, "sizes": dataclasses.asdict(run.sizes),
                        "clusters": {"A": dataclasses.asdict(hw_a), "B": dataclasses.asdict(hw_b)}})


def _steps(run: Run) -> list[Step]:
    sizes, seed, res = run.sizes, run.seed, run.results
    hw_a, hw_b = _clusters(sizes)

    def lb() -> dict:
        e2e = res["end_to_end"]
        return e2e.get("longbench-14B") or next(iter(e2e.values()))

    def headroom_rate() -> float:
        return res["gap_headroom"]["rate"]

    return [
        Step("drop-plan time", lambda _: [time_drop_plan(n) for n in sizes.plan_sizes], "plan_time"),
        Step("Eq. 1 fit", lambda _: _eq1_fits(hw_a, hw_b), "eq1"),
        *[Step(f"end to end {wl} 14B", lambda _, wl=wl: _end_to_end(wl, hw_a, sizes, seed), ("end_to_end", f"{wl}-14B"))
          for wl in sizes.workloads],
        Step("end to end longbench 72B", lambda _: _end_to_end("longbench", hw_b, sizes, seed),
             ("end_to_end", "longbench-72B")),
        Step("ablation (Fig. 14)", lambda _: _ablation(lb()["rate"], hw_a, sizes, seed), "ablation"),
        Step("extreme bursts (Fig. 16)", lambda _: _extreme(res["end_to_end"]["longbench-72B"]["rate"], hw_b, sizes,
                                                            seed), "extreme"),
        Step("gap: microbatches per step", lambda _: _gap_microbatches(lb()["rate"], hw_a, sizes, seed),
             "gap_microbatches"),
        Step("gap: deeper burst", lambda _: _gap_deeper(lb()["rate"], hw_a, sizes, seed), "gap_deeper_burst"),
        Step("gap: compute headroom", lambda _: _gap_headroom(hw_a, sizes, seed), "gap_headroom"),
        Step("restore (Fig. 15)", lambda _: _restore(headroom_rate(), hw_a, sizes, seed), "restore"),
        Step("ablation, decode-heavy (memory-bound)",
             lambda _: _ablation(headroom_rate(), hw_a, sizes, seed, "decode-heavy", MEMORY_BOUND_FACTOR),
             "ablation_memory_bound"),
        Step("PP throughput at saturation", lambda _: _pp_throughput(hw_a, seed), "pp_throughput"),
    ]


def _write(run: Run) -> dict:
    from servelab.designs.kunserve.reproduce import plots
    from servelab.designs.kunserve.reproduce.report import write_report

    run.results["figures"] = [f"{run.stem}/{f}" for f in plots.all_figures(run.results, run.fig_dir())]
    clean = plain(_strip_raw(run.results))
    write_report(clean, run.report_path)
    return clean


def _to_json(results: dict) -> dict:
    return _short_series(plain(_strip_raw(results)))


REPRODUCTION = Reproduction("kunserve", {"full": FULL, "reduced": REDUCED}, _steps, _write, start=_start,
                            json_name="{stem}.json", to_json=_to_json)


def _eq1_fits(hw_a: st.Hardware, hw_b: st.Hardware) -> list[dict]:
    from servelab.catalog.instance import InstanceSpec
    from servelab.designs.kunserve.eq1 import fit_eq1
    from servelab.simulator.hardware import model_for_spec

    rows = []
    for hw in (hw_a, hw_b):
        eq = fit_eq1(model_for_spec(InstanceSpec(hw.gpu, hw.model, tp=hw.tp)).cost)
        rows.append({"cluster": hw.name, "model": hw.model} | dataclasses.asdict(eq))
    return rows


def _end_to_end(wl: str, hw: st.Hardware, sizes: ex.Sizes, seed: int) -> dict:
    lo, hi = RATE_RANGES[wl]
    scale = hw.num_instances / 8 if hw.tp == 1 else hw.num_instances * 4 / 8 * 0.4
    cal = ex.calibrate_rate(wl, hw, sizes, seed, lo * scale, hi * scale)
    specs = st.workload(wl, cal["rate"], sizes.duration_s, sizes.bursts, seed)
    runs = {name: ex.run_system(name, specs, hw, sizes) for name in st.SYSTEMS}
    slo = ex.slo_violation(runs, SLO_SCALES, st.BASELINES)
    return {"workload": wl, "hardware": hw.label, "rate": cal["rate"], "calibration": cal["probes"],
            "num_requests": len(specs), "runs": runs, "slo": slo, "typical_scale": TYPICAL_SCALE[wl]}


def _ablation(rate: float, hw: st.Hardware, sizes: ex.Sizes, seed: int, lengths: str = "longbench",
              factor: int = 2) -> dict:
    specs = st.workload(lengths, rate, sizes.duration_s, sizes.bursts, seed, factor=factor)
    runs = {name: ex.run_system(name, specs, hw, sizes, spec=spec) for name, spec in ABLATION.items()}
    return {"rate": rate, "workload": lengths, "factor": factor, "runs": runs}


def _restore(rate: float, hw: st.Hardware, sizes: ex.Sizes, seed: int) -> dict:
    """A long run with two bursts, with and without restore. On the decode-heavy lengths of the
    headroom gap test: with the paper's prompt-heavy lengths our groups stay compute-bound and
    never fall to the restore threshold between the bursts (a first run), so restore is not
    exercised there."""
    wl = "decode-heavy"
    specs = st.workload(wl, rate, sizes.long_duration_s, sizes.long_bursts, seed, factor=MEMORY_BOUND_FACTOR)
    systems = {"vllm": "kunserve:drop=false", "kunserve": "kunserve", "kunserve w/o restore": "kunserve:restore=false"}
    runs = {name: ex.run_system(name, specs, hw, sizes, spec=spec) for name, spec in systems.items()}
    return {"rate": rate, "workload": wl, "bursts": sizes.long_bursts, "factor": MEMORY_BOUND_FACTOR, "runs": runs}


def _extreme(rate: float, hw: st.Hardware, sizes: ex.Sizes, seed: int) -> dict:
    """From the first burst on, the burst is replayed back to back (the rate stays doubled)."""
    start = sizes.bursts[0][0]
    end = start + sizes.extreme_repeats * (sizes.bursts[0][1] - sizes.bursts[0][0])
    specs = st.workload("longbench", rate, end + 60.0, ((start, end),), seed)
    runs = {name: ex.run_system(name, specs, hw, sizes, spec=spec)
            for name, spec in {"vllm": "kunserve:drop=false", "kunserve": "kunserve:restore=false"}.items()}
    out = {"rate": rate, "burst_from_s": start, "burst_to_s": end, "runs": runs}
    for name, r in runs.items():
        mem = r["memory"]
        t, dem, cap = (np.array(mem[k]) for k in ("t", "demand_gb", "kv_capacity_gb"))
        forms = [e[0] for e in r["events"] if e[1] == "form"]
        settle = max(forms) + 1.0 if forms else start
        over = np.nonzero((t >= max(start, settle)) & (dem > cap))[0]
        out[name] = {"memory_limit_s": float(t[over[0]]) if len(over) else None,
                     "kv_capacity_start_gb": float(cap[0]), "kv_capacity_max_gb": float(cap.max()),
                     "num_forms": len(forms)}
    return out


def _gap_microbatches(rate: float, hw: st.Hardware, sizes: ex.Sizes, seed: int) -> list[dict]:
    specs = st.workload("longbench", rate, sizes.duration_s, sizes.bursts, seed)
    rows = []
    for overlap in (True, False):
        for m in (2, 4, 8):
            r = ex.run_system("kunserve", specs, hw, sizes,
                              spec=f"kunserve:num_microbatches={m},overlap={str(overlap).lower()}")
            rows.append({"num_microbatches": m, "overlap": overlap,
                         "bubble_share": r.get("pipeline", {}).get("bubble_share"),
                         "ttft_s": r["ttft_s"], "tpot_s": r["tpot_s"]})
    return rows


def _gap_deeper(rate: float, hw: st.Hardware, sizes: ex.Sizes, seed: int) -> list[dict]:
    rows = []
    for factor in (2, 3, 4):
        specs = st.workload("longbench", rate, sizes.duration_s, sizes.bursts, seed, factor=factor)
        for name in ("vllm", "kunserve"):
            r = ex.run_system(name, specs, hw, sizes)
            rows.append({"factor": factor, "system": name, "ttft_s": r["ttft_s"], "tpot_s": r["tpot_s"],
                         "num_preemptions": r["num_preemptions"], "mean_demand_share": r.get("mean_demand_share")})
    return rows


def _gap_headroom(hw: st.Hardware, sizes: ex.Sizes, seed: int) -> dict:
    """Decode-heavy requests (1K in / 1.5K out): KV fills while decode steps leave compute idle."""
    lo, hi = RATE_RANGES["decode-heavy"]
    cal = ex.calibrate_rate("decode-heavy", hw, sizes, seed, lo * hw.num_instances / 8, hi * hw.num_instances / 8)
    rows = []
    for factor in (2, 3):
        specs = st.workload("decode-heavy", cal["rate"], sizes.duration_s, sizes.bursts, seed, factor=factor)
        for name in ("vllm", "infercept", "llumnix", "kunserve"):
            r = ex.run_system(name, specs, hw, sizes)
            rows.append({"factor": factor, "system": name, "ttft_s": r["ttft_s"], "tpot_s": r["tpot_s"],
                         "num_preemptions": r["num_preemptions"], "forms": sum(1 for e in r["events"] if e[1] == "form"),
                         "mean_demand_share": r.get("mean_demand_share")})
    return {"rate": cal["rate"], "rows": rows}


def _pp_throughput(hw: st.Hardware, seed: int) -> list[dict]:
    """Saturated throughput (every request at time 0), DP against the static pipelines."""
    from servelab.core.request import RequestSpec

    rng = np.random.default_rng(seed)
    rows = []
    for wl in ("burstgpt", "longbench"):
        ln = st.LENGTHS[wl]
        n = 100 * hw.num_instances if wl == "burstgpt" else 25 * hw.num_instances
        p = st._lognormal(rng, n, ln.mean_in, ln.sigma, ln.max_in)
        o = st._lognormal(rng, n, ln.mean_out, ln.sigma, ln.max_out)
        specs = [RequestSpec(i, 0.0, int(a), int(b)) for i, (a, b) in enumerate(zip(p, o))]
        row = {"workload": wl, "num_requests": n}
        for name, spec in (("vllm", None), ("vllm-pp", None), ("vllm-pp drained", "vllm-pp:overlap=false")):
            r = ex.run_system(name.split()[0], specs, hw, ex.Sizes(), spec=spec)
            row[name] = r["throughput_tok_s"]
            row[f"{name} bubble"] = r.get("pipeline", {}).get("bubble_share")
        row["pp_vs_dp"] = row["vllm-pp"] / row["vllm"] - 1.0
        row["pp_drained_vs_dp"] = row["vllm-pp drained"] / row["vllm"] - 1.0
        rows.append(row)
    return rows


def _short_series(value):
    """The JSON's memory timelines (every run's, sampled each ``sample_s``) to 4 significant
    digits: seconds and GB need no more, and at full precision they made the file 2 MB."""
    if isinstance(value, dict):
        return {k: ({s: [float(f"{x:.4g}") for x in xs] for s, xs in v.items()} if k == "memory" else _short_series(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_short_series(v) for v in value]
    return value


def _strip_raw(value):
    if isinstance(value, dict):
        return {k: _strip_raw(v) for k, v in value.items() if k != "raw"}
    if isinstance(value, list):
        return [_strip_raw(v) for v in value]
    return value
