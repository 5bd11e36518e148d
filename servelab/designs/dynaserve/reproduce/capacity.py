"""Serving capacity on a rate grid over several seeds, under both delay rules.

Why not bisection: a capacity probe's pass/fail is not monotone in the rate for one seed
(a few requests more or less miss the TBT SLO), so one seed's bisection can land anywhere
near the edge: capacities moved up to 20% between two runs of the same code. Here:

1. *Anchor* (seed ``seeds[0]``): a coarse bisection of the cheap baselines (each
   colocation chunk, 1P1D) under the paper's rule gives each workload's scale.
2. *Grid*: rates ``anchor x fractions`` (``Sizes.grid``, ~10% apart). DynaServe and every
   variant run on colocation's grid (the same rates, so their ratio is read at equal load);
   1P1D on its own. Per seed, the walk starts at the anchor and goes up while the loose
   rule (median delay) passes, down while the strict one (P99 delay) fails: every probe
   records both rules, so one walk gives both capacities.
3. *Capacity* of one seed under one rule: the highest grid rate whose probe and every
   probe below it passed (rates below the walk's lowest probe are taken to pass). At the
   grid's top it is a lower bound (``censored``: "top"); with no pass it is below the grid
   (``censored``: "bottom", no value).
4. *Claim*: per seed the ratio of two systems' capacities, and its mean with a Student-t
   95% interval over the seeds (``stats.t_interval``); a verdict only with its interval.

The colocation chunk is tuned per workload and per rule: every chunk whose anchor is within
half of the best runs the grid, and the chunk with the highest mean capacity is colocation's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from servelab.designs.dynaserve.metrics import DELAY_RULES
from servelab.designs.dynaserve.reproduce import experiments as ex
from servelab.designs.dynaserve.reproduce import setting as st
from servelab.metrics.capacity import capacity_search
from servelab.reproduce.stats import t_interval


def anchor(system: str, workload: str, model: str, setting: st.Setting, sizes: ex.Sizes, seed: int,
           chunk: int = 2048) -> float | None:
    """A coarse capacity (median rule, one seed) that places the grid."""
    paper = dataclasses.replace(setting, delay_rule="median")

    def at_rate(rate: float) -> float:
        specs = st.workload(workload, rate, ex._n(rate, sizes), seed, paper)
        return 1.0 if st.run(system, specs, model, paper, chunk=chunk)["passes_capacity"] else 0.0

    return capacity_search(at_rate, lo=ex.CAPACITY_LO, hi=sizes.capacity_hi, target_attainment=1.0,
                           rel_tol=sizes.anchor_rel_tol).capacity_rate


def walk(system: str, workload: str, model: str, rates: Sequence[float], setting: st.Setting, sizes: ex.Sizes,
         seed: int, *, chunk: int = 2048, dyna: dict | None = None) -> dict:
    """One seed's probes on the grid ``rates`` (ascending) and its capacity under each rule."""
    probes: dict[int, dict] = {}

    def probe(i: int) -> dict:
        if i not in probes:
            rate = rates[i]
            specs = st.workload(workload, rate, ex._n(rate, sizes), seed, setting)
            r = st.run(system, specs, model, setting, chunk=chunk, **(dyna or {}))
            probes[i] = {"rate": rate, **{k: r[k] for k in ("attainment", "delay_p50_s", "delay_p99_s",
                                                             "goodput_tokens_per_s", "cpu_s")},
                         **{rule: bool(r[f"passes_{rule}"]) for rule in DELAY_RULES},
                         "router_report": r.get("router_report")}
        return probes[i]

    start = int(np.argmin([abs(f - 1.0) for f in sizes.grid]))
    i = start
    while probe(i)["median"] and i + 1 < len(rates):
        i += 1
    i = start
    while not probe(i)["p99"] and i > 0:
        i -= 1
    out = {"seed": seed, "probes": [probes[k] for k in sorted(probes)]}
    for rule in DELAY_RULES:
        out[rule] = _capacity(probes, rates, rule)
    return out


def _capacity(probes: dict[int, dict], rates: Sequence[float], rule: str) -> dict:
    best = None
    for i in sorted(probes):
        if not probes[i][rule]:
            break
        best = i
    if best is None:
        return {"rps": None, "censored": "bottom"}
    return {"rps": rates[best], "censored": "top" if best == len(rates) - 1 else None}


def grid_capacity(system: str, workload: str, model: str, rates: Sequence[float], setting: st.Setting,
                  sizes: ex.Sizes, seeds: Sequence[int], *, chunk: int = 2048, dyna: dict | None = None,
                  label: str | None = None) -> dict:
    """``walk`` for every seed, and each rule's capacities per seed with their interval."""
    runs = [walk(system, workload, model, rates, setting, sizes, s, chunk=chunk, dyna=dyna) for s in seeds]
    row: dict[str, Any] = {"system": system, "label": label or system, "workload": workload, "model": model,
                           "chunk": chunk if system == "coloc" else None, "rates": list(rates), "runs": runs,
                           "cpu_s": sum(p["cpu_s"] for r in runs for p in r["probes"])}
    for rule in DELAY_RULES:
        values = [r[rule]["rps"] for r in runs]
        row[rule] = {"per_seed": values, "censored": [r[rule]["censored"] for r in runs],
                     "interval": _interval(values)}
    return row


def _interval(values: Sequence[float | None]) -> dict:
    iv = t_interval([np.nan if v is None else v for v in values])
    return {"mean": _num(iv.mean), "low": _num(iv.low), "high": _num(iv.high), "n": iv.num_values,
            "dropped": iv.num_dropped}


def _num(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def ratio_interval(a: dict, b: dict, rule: str) -> dict:
    """Per seed ``a``'s capacity over ``b``'s (the same seeds), mean and t interval."""
    values = [ex.ratio(x, y) for x, y in zip(a[rule]["per_seed"], b[rule]["per_seed"])]
    return {"per_seed": values, **_interval(values)}


def tuned_coloc(workload: str, model: str, setting: st.Setting, sizes: ex.Sizes, seeds: Sequence[int]
                ) -> tuple[dict, list[dict]]:
    """Colocation's chunk tuning: anchors for every chunk, grids for those within half of the
    best; returns (the best chunk's grid row with ``tuning`` per rule, every chunk's row)."""
    anchors = {c: anchor("coloc", workload, model, setting, sizes, seeds[0], chunk=c) for c in sizes.chunks}
    top = max((a for a in anchors.values() if a), default=None)
    if top is None:
        top = ex.CAPACITY_LO
    rates = grid_rates(top, sizes)
    rows = [grid_capacity("coloc", workload, model, rates, setting, sizes, seeds, chunk=c, label=f"coloc {c}")
            for c, a in anchors.items() if a and a >= 0.5 * top] or [
        grid_capacity("coloc", workload, model, rates, setting, sizes, seeds, chunk=sizes.chunks[0])]
    best = {rule: max(rows, key=lambda r: (r[rule]["interval"]["mean"] or 0.0, -r["chunk"])) for rule in DELAY_RULES}
    tuned = dict(best["median"])
    tuned["tuned_chunk"] = {rule: best[rule]["chunk"] for rule in DELAY_RULES}
    for rule in DELAY_RULES:  # each rule reads its own best chunk
        tuned[rule] = best[rule][rule]
    tuned["anchors"] = {str(c): a for c, a in anchors.items()}
    tuned["label"] = "coloc"
    return tuned, rows


def grid_rates(anchor_rps: float, sizes: ex.Sizes) -> list[float]:
    return [round(anchor_rps * f, 3) for f in sizes.grid]


def workload_capacities(workload: str, model: str, setting: st.Setting, sizes: ex.Sizes, seeds: Sequence[int],
                        variants: dict[str, dict] | None = None, *, coloc_variants: bool = False) -> dict:
    """Every system on one workload: tuned colocation (round-robin), 1P1D, DynaServe in the
    paper's deployment and in each of ``variants`` (name -> (parameters, the configuration its
    ratio is taken against: "paper" or an earlier variant), on colocation's grid), and with
    ``coloc_variants`` colocation behind the least-loaded router (its best chunk)."""
    coloc, chunks = tuned_coloc(workload, model, setting, sizes, seeds)
    d_anchor = anchor("disagg", workload, model, setting, sizes, seeds[0]) or ex.CAPACITY_LO
    disagg = grid_capacity("disagg", workload, model, grid_rates(d_anchor, sizes), setting, sizes, seeds)
    dyna = grid_capacity("dynaserve", workload, model, coloc["rates"], setting, sizes, seeds, label="dynaserve")
    out = {"workload": workload, "coloc": coloc, "coloc_chunks": chunks, "disagg": disagg, "dynaserve": dyna,
           "variants": {}}
    bases = {}
    for name, (params, base) in (variants or {}).items():
        bases[name] = base
        out["variants"][name] = grid_capacity("dynaserve", workload, model, coloc["rates"], setting, sizes, seeds,
                                              dyna=params, label=name)
    if coloc_variants:
        ll = dataclasses.replace(setting, coloc_router="least_loaded")
        bases["coloc least-loaded"] = "coloc"
        out["variants"]["coloc least-loaded"] = grid_capacity(
            "coloc", workload, model, coloc["rates"], ll, sizes, seeds, chunk=coloc["tuned_chunk"]["median"],
            label="coloc least-loaded")
    against = {"paper": dyna, "coloc": coloc, **out["variants"]}
    out["variant_bases"] = bases
    out["ratios"] = {rule: {"vs_coloc": ratio_interval(dyna, coloc, rule), "vs_disagg": ratio_interval(dyna, disagg, rule),
                            **{f"{name} vs base": ratio_interval(v, against[bases[name]], rule)
                               for name, v in out["variants"].items()}}
                     for rule in DELAY_RULES}
    return out


def capacity_of(rows: dict, workload: str, system: str = "dynaserve", rule: str = "median") -> float | None:
    """Mean capacity of ``system`` on ``workload`` (for the experiments placed relative to it)."""
    row = rows.get(workload, {}).get(system)
    return row[rule]["interval"]["mean"] if row else None


def summarize(rows: Sequence[dict], key: Callable[[dict], dict]) -> dict:
    """Mean, min and max over workloads of one ratio's mean (the paper's "1.15-3.07x, mean 2.37x")."""
    means = [key(r)["mean"] for r in rows if key(r)["mean"] is not None]
    if not means:
        return {"mean": None, "min": None, "max": None}
    return {"mean": float(np.mean(means)), "min": float(min(means)), "max": float(max(means))}
