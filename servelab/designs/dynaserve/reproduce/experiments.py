"""The paper's experiments, one function each, on the setting of ``setting.py``.

Every function returns plain rows (dicts) for the report; each row names its operating
point (workload, model, rate, system, chunk). Rates are Poisson request rates (req/s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from servelab.designs.dynaserve import metrics as dm
from servelab.designs.dynaserve.reproduce import setting as st
from servelab.metrics.capacity import capacity_search


@dataclass(frozen=True)
class Sizes:
    num_requests: int = 600  # per run (capacity probes, goodput points), at least
    min_duration_s: float = 180.0  # and enough to span this much arrival time
    max_requests: int = 2500
    capacity_rel_tol: float = 0.05
    capacity_hi: float = 40.0
    goodput_rates: dict | None = None  # {"fractions": multiples of DynaServe's 14B capacity} (FULL / REDUCED)
    models: tuple[str, ...] = ("14B", "32B", "72B")
    capacity_workloads: tuple[str, ...] = ("azure-code", "burstgpt", "arxiv", "mini-reasoning")
    chunks: tuple[int, ...] = st.CHUNKS
    table1_requests: int = 400
    split_fractions: tuple[float, ...] = (-0.5, -0.25, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)
    split_requests: int = 400
    sigmas: tuple[float, ...] = (0.0, 10.0, 50.0, 100.0)
    queue_sizes: tuple[int, ...] = (0, 10, 100, 250)
    queue_repeats: int = 300
    timing_runs: int = 3  # runs per workload for the scheduler time; each percentile is their median
    # x the anchor (capacity.py); the walk starts at 1.0, so the low end costs only a system far below the anchor
    grid: tuple[float, ...] = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.32, 1.45, 1.6)
    anchor_rel_tol: float = 0.15  # the anchor's bisection (one seed, coarse: it only places the grid)
    variant_workloads: tuple[str, ...] = ("azure-code", "mini-reasoning")  # where the variants are measured
    gap_workloads: tuple[str, ...] = ("azure-code", "burstgpt")  # the overhead-off gap test
    # the paper-colocation gap test's capacities with a per-step cost added: Table 2's workload and
    # Fig. 9's most prefill-heavy (paper_coloc.py)
    coloc_gap_workloads: tuple[str, ...] = ("hybrid", "azure-code")


CAPACITY_LO = 0.05


def capacity(system: str, workload: str, model: str, setting: st.Setting, sizes: Sizes, seed: int,
             chunk: int = 2048, **dyna) -> dict:
    """Highest Poisson rate that passes (``metrics.capacity_pass``), by bisection."""
    probes: list[dict] = []

    def at_rate(rate: float) -> float:
        specs = st.workload(workload, rate, _n(rate, sizes), seed, setting)
        row = st.run(system, specs, model, setting, chunk=chunk, **dyna)
        probes.append({"rate": rate, **{k: row[k] for k in ("attainment", "delay_p99_s", "goodput_tokens_per_s",
                                                             "requests_per_s", "passes_capacity", "cpu_s")}})
        return 1.0 if row["passes_capacity"] else 0.0

    res = capacity_search(at_rate, lo=CAPACITY_LO, hi=sizes.capacity_hi, target_attainment=1.0,
                          rel_tol=sizes.capacity_rel_tol)
    rate = res.capacity_rate
    good = max((p for p in probes if p["passes_capacity"]), key=lambda p: p["rate"], default=None)
    return {"system": system, "workload": workload, "model": model, "chunk": chunk if system == "coloc" else None,
            "capacity_rps": rate, "status": res.status, "goodput_at_capacity": good["goodput_tokens_per_s"] if good
            else None, "num_probes": res.num_probes, "probes": probes, "cpu_s": sum(p["cpu_s"] for p in probes)}


def tuned_coloc_capacity(workload: str, model: str, setting: st.Setting, sizes: Sizes, seed: int) -> dict:
    """PD colocation with its chunk tuned over ``sizes.chunks``: the best capacity, and all."""
    rows = [capacity("coloc", workload, model, setting, sizes, seed, chunk=c) for c in sizes.chunks]
    best = max(rows, key=lambda r: (r["capacity_rps"] or 0.0, -(r["chunk"] or 0)))
    return {**best, "tuning": [{"chunk": r["chunk"], "capacity_rps": r["capacity_rps"]} for r in rows]}


def goodput_curve(workload: str, model: str, rates: list[float], setting: st.Setting, sizes: Sizes, seed: int,
                  tune_rate: float) -> list[dict]:
    """Goodput of the three systems over ``rates``; colocation's chunk is tuned for this model
    and workload (the best goodput over ``sizes.chunks`` at ``tune_rate``)."""
    specs = st.workload(workload, tune_rate, _n(tune_rate, sizes), seed, setting)
    chunk = max(sizes.chunks, key=lambda c: (st.run("coloc", specs, model, setting, chunk=c)["goodput_tokens_per_s"],
                                             -c))
    rows = []
    for rate in rates:
        specs = st.workload(workload, rate, _n(rate, sizes), seed, setting)
        for system in st.SYSTEMS:
            r = st.run(system, specs, model, setting, chunk=chunk)
            rows.append({"workload": workload, "model": model, "rate": rate, **_scalars(r)})
    return rows


def _n(rate: float, sizes: Sizes) -> int:
    return st.num_requests(rate, sizes.num_requests, sizes.min_duration_s, sizes.max_requests)


def _scalars(row: dict) -> dict:
    return {k: v for k, v in row.items() if isinstance(v, (int, float, str, bool)) or v is None}


def table1(setting: st.Setting, sizes: Sizes, seed: int) -> list[dict]:
    """Sec. 2.4: three fixed shapes at saturation, 14B on two A100s, colocation (chunk 2048,
    vLLM's default, as the paper) vs 1P1D disaggregation, DynaServe added. Saturation, per
    system: an overloading burst gives its service rate (requests over its busiest
    instance's time); it then runs at 1.25x that, long enough to reach a steady state, and
    is measured over the second half of the arrivals."""
    rows = []
    for prompt, output in ((8192, 32), (2048, 512), (219, 1467)):
        name = f"P{prompt}/D{output}"
        shape = f"prompt=fixed({prompt}),output=fixed({output})"
        burst = _shape_specs(shape, 50.0, sizes.table1_requests, seed, setting)
        for system in st.SYSTEMS:
            rate = round(1.25 * st.run(system, burst, "14B", setting, chunk=2048)["bottleneck_rps"], 3)
            specs = _shape_specs(shape, rate, _n(rate, sizes), seed, setting)
            r = st.run(system, specs, "14B", setting, chunk=2048, detail=True, saturated=True)
            rows.append({"shape": name, "rate": rate, "system": system, "instances": r["instances"],
                         **{k: r[k] for k in ("tbt_p50_s", "tbt_p99_s", "saturated_rps", "attainment",
                                              "token_share_within", "ttft_p50_s")}})
    return rows


def _shape_specs(shape: str, rate: float, n: int, seed: int, setting: st.Setting):
    from servelab.paths import default_data_dir
    from servelab.workloads.spec import parse_workload
    from servelab.estimators.base import with_predictions
    from servelab.estimators.oracle import NoisyOracleConfig, NoisyOracleEstimator

    specs = parse_workload(f"poisson:rate={rate},n={n},{shape}", default_data_dir(), seed)
    return with_predictions(specs, NoisyOracleEstimator(NoisyOracleConfig("additive", setting.prediction_sigma, seed)))


def split_sweep(setting: st.Setting, sizes: Sizes, seed: int) -> list[dict]:
    """Figure 5: P1024/D1024 on two instances, every request split at ``P + f * D`` with the
    first part on instance 0 (as the paper's GPU-1), fed faster than any split serves (1.2x
    the dynamic router's service rate from a burst): throughput over the second half of the
    arrivals and each instance's busy share there; plus the dynamic router."""
    shape = "prompt=fixed(1024),output=fixed(1024)"
    burst = _shape_specs(shape, 50.0, sizes.split_requests, seed, setting)
    rate = round(1.2 * st.run("dynaserve", burst, "14B", setting)["bottleneck_rps"], 3)
    specs = _shape_specs(shape, rate, _n(rate, sizes), seed, setting)
    rows = []
    for f in sizes.split_fractions:
        r = st.run("dynaserve", specs, "14B", setting, detail=True, saturated=True, split="fixed",
                   decode_fraction=f, pairing="fixed")
        rows.append(_split_row(f"{f:+.2f}", f, rate, r))
    r = st.run("dynaserve", specs, "14B", setting, detail=True, saturated=True)
    rows.append(_split_row("dynamic", r["decode_share_alpha"], rate, r))
    return rows


def _split_row(label: str, fraction: float, rate: float, r: dict) -> dict:
    busy = [i["busy_fraction"] for i in r["instances"]]
    return {"split": label, "decode_fraction": fraction, "rate": rate, "requests_per_s": r["saturated_rps"],
            "busy_0": busy[0], "busy_1": busy[1], "tbt_p99_s": r["tbt_p99_s"],
            "split_kinds": r["split_kinds"]}


def prediction_error(rate: float, setting: st.Setting, sizes: Sizes, seed: int) -> list[dict]:
    """Table 4: P219 / D~N(1467, sigma), the scheduler told 1467 for every request."""
    rows = []
    for sigma in sizes.sigmas:
        specs = st.workload("mini-reasoning", rate, _n(rate, sizes), seed, setting, fixed_prediction=1467,
                            output_sigma=sigma)
        r = st.run("dynaserve", specs, "14B", setting)
        rows.append({"sigma": sigma, "rate": rate, **_scalars(r)})
    return rows


def slo_batching(workload: str, rate: float, setting: st.Setting, sizes: Sizes, seed: int,
                 cdf_points_ms: list[float]) -> list[dict]:
    """Figure 11: DynaServe with and without SLO-aware batching (then a fixed 2048-token
    prefill budget, vLLM's default chunk), same requests: token share within the SLO, CDF."""
    specs = st.workload(workload, rate, _n(rate, sizes), seed, setting)
    rows = []
    for aware in (True, False):
        r = st.run("dynaserve", specs, "14B", setting, detail=True, slo_aware=aware)
        rows.append({"slo_aware": aware, "workload": workload, "rate": rate,
                     "cdf": dm.tbt_cdf(r["table"], cdf_points_ms), **_scalars(r)})
    return rows


def transfer_modes(capacity: float, setting: st.Setting, sizes: Sizes, seed: int) -> list[dict]:
    """Chunked vs bulk KV transfer on Mini-Reasoning, every split streaming (decode-phase
    splits included, the paper's design) or none: non-overlapped transfer per request, at a
    light load (0.4x DynaServe's capacity: memory never binds) and a heavy one (0.8x), where
    servelab's variant (``default``: stream prompt-phase splits only) runs too."""
    rows = []
    for load, share, modes in (("light", 0.4, ("bulk", "chunked")), ("heavy", 0.8, ("bulk", "chunked", "default"))):
        rate = round(share * capacity, 3)
        specs = st.workload("mini-reasoning", rate, _n(rate, sizes), seed, setting)
        for mode in modes:
            params = {"bulk": {"stream_kv_tokens": 0}, "chunked": {"stream_decode_splits": True},
                      "default": {"stream_decode_splits": False}}[mode]
            r = st.run("dynaserve", specs, "14B", setting, detail=True, **params)
            gaps = r["non_overlapped_s"]
            rows.append({"mode": mode, "load": load, "rate": rate, "num_split": int(len(gaps)),
                         "non_overlapped_mean_ms": float(gaps.mean() * 1e3) if len(gaps) else None,
                         "non_overlapped_total_s": float(gaps.sum()),
                         "kv_use_max": max(i["kv_use"] for i in r["instances"]), **_scalars(r)})
    return rows


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b > 0 or not math.isfinite(a):
        return None
    return a / b


def mean(values: list[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.mean(v)) if v else None
