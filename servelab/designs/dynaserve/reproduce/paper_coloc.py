"""Gap test: why the paper's chunked-prefill colocation is weaker than ours.

The paper reports DynaServe at 2.37x colocation's capacity (Fig. 9) and colocation below
1P1D on the hybrid workload (Table 2: 4.6 vs 5.9 req/s); our tuned colocation is stronger
than DynaServe. Each candidate reason, and the experiment that could refute it:

1. *The engine's step time* (model/GPU speed, vLLM's per-step overhead at the paper's batch
   sizes): our cost model's time for the steps the paper measured, against the paper's own
   numbers (``step_check``): Table 1's p50 TBT of decode-dominated steps (decode counts by
   Little's law: throughput x output length x p50 TBT per decoding GPU; context = prompt +
   half the output) and Fig. 6's Llama-3.1-8B LCU point (a 512-token chunk beside 29
   decodes at context 1024 reaches 50 ms). If the paper's steps were much slower than ours,
   a fixed cost per step (``delta``) would shrink the tuned chunk's prefill rate.
2. *The chunk* (the paper tuned 256-2048; Table 1 used vLLM's default 2048) and *the TBT SLO
   binding at the tuned chunk*: hybrid at the paper's colocation capacity (4.6 req/s) and at
   ours, every chunk, with the mixed steps' times (p50/p99, share over 100 ms), their rows and
   tokens, beside the attainment (``operating_points``). A chunk whose mixed steps sit near
   100 ms is one a slightly slower engine pushes over: the same runs at 1.15x every step.
3. *The capacity rule*: each probe is also judged by Sarathi-Serve's own rule (P99 TBT over
   all tokens <= 100 ms, median delay <= 2 s) beside ours (99% of requests with per-request
   P99 TBT <= 100 ms).
4. *What the gap needs*: the capacities of tuned colocation, 1P1D and DynaServe (servelab's
   defaults, the configuration with capacity on hybrid) with a fixed cost per step added to
   every step of every system: the paper's measured excess (item 1) and 30 ms, the cost that
   halves the prefill rate of a 256-token chunk (``capacity_with_delta``).
Routing (round-robin vs least-loaded) is tested by the variants table.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from servelab.designs.dynaserve.reproduce import capacity as cp
from servelab.designs.dynaserve.reproduce import experiments as ex
from servelab.designs.dynaserve.reproduce import handoff_gap as hg
from servelab.designs.dynaserve.reproduce import setting as st

PAPER_HYBRID = {"coloc": 4.6, "disagg": 5.9, "dynaserve": 7.4}  # Table 2, req/s
BIG_DELTA_S = 0.030
SCALE = 1.15
# (what the paper measured, model, decodes, context, prefill tokens, the paper's ms); decodes by Little's law
PAPER_STEPS = (
    ("Table 1 P8192/D32, 1P1D decode GPU, p50 TBT", "Qwen-2.5-14B", max(1, round(0.83 * 32 * 0.0227)), 8208, 0, 22.70),
    ("Table 1 P2048/D512, 1P1D decode GPU, p50 TBT", "Qwen-2.5-14B", round(2.56 * 512 * 0.0470), 2304, 0, 47.00),
    ("Table 1 P219/D1467, 1P1D decode GPU, p50 TBT", "Qwen-2.5-14B", round(1.68 * 1467 * 0.05063), 952, 0, 50.63),
    ("Table 1 P2048/D512, coloc. (per GPU), p50 TBT", "Qwen-2.5-14B", round(2.83 / 2 * 512 * 0.04686), 2304, 0, 46.86),
    ("Table 1 P219/D1467, coloc. (per GPU), p50 TBT", "Qwen-2.5-14B", round(2.86 / 2 * 1467 * 0.04799), 952, 0, 47.99),
    ("Fig. 6 LCU point, Llama-3.1-8B, 512-token chunk", "Llama-3.1-8B", 29, 1024, 512, 50.0),
)


def step_check(setting: st.Setting) -> list[dict]:
    from servelab.catalog.instance import InstanceSpec
    from servelab.core.plan import StepShape
    from servelab.costmodel.build import build_cost_model

    rows = []
    for label, model, n, ctx, chunk, paper_ms in PAPER_STEPS:
        cost = build_cost_model(InstanceSpec(st.GPU, model, tp=1), setting.cost)
        shape = StepShape(prefill_tokens=(chunk,) if chunk else (), prefill_context=(chunk,) if chunk else (),
                          num_decodes=n, decode_context_sum=n * ctx, decode_context_max=ctx)
        ours = 1e3 * cost.step_time_s(shape)
        rows.append({"label": label, "model": model, "decodes": n, "context": ctx, "chunk": chunk,
                     "ours_ms": ours, "paper_ms": paper_ms, "excess_ms": paper_ms - ours,
                     "pure": "coloc." not in label})  # a colocation p50 TBT mixes in prompt-chunk steps
    return rows


def _configs(deltas: Sequence[float], chunks: Sequence[int]) -> list[tuple[str, int, float, float]]:
    out = [(f"chunk {c}", c, 1.0, 0.0) for c in chunks]
    for c in (256, 512):
        out.append((f"chunk {c}, every step x{SCALE}", c, SCALE, 0.0))
        for d in deltas:
            out.append((f"chunk {c}, +{d * 1e3:.0f} ms per step", c, 1.0, d))
    return out


def step_stats(row: dict, slo_s: float) -> dict:
    """The mixed steps (a prompt chunk beside other rows) of one run recorded step by step."""
    s = row["steps"]
    dur, tok, rows = np.asarray(s.duration_s), np.asarray(s.num_tokens), np.asarray(s.num_rows)
    m = tok > rows
    ms = dur[m] * 1e3
    out = {"mixed_steps": int(m.sum()), "mixed_ms_p50": float(np.percentile(ms, 50)) if len(ms) else None,
           "mixed_ms_p99": float(np.percentile(ms, 99)) if len(ms) else None,
           "mixed_over_slo": float(np.mean(ms > 1e3 * slo_s)) if len(ms) else None,
           "rows_per_mixed": float(rows[m].mean()) if len(ms) else None,
           "tokens_per_mixed": float(tok[m].mean()) if len(ms) else None}
    tbt = row.get("tbt_p99_s")
    out["passes_global"] = bool(tbt is not None and tbt <= slo_s and row["delay_p50_s"] is not None
                                and row["delay_p50_s"] <= 2.0 and row["num_requests"] > 0)
    return out


def operating_points(setting: st.Setting, sizes: ex.Sizes, seeds: Sequence[int], hybrid_grid: list[dict],
                     deltas: Sequence[float]) -> list[dict]:
    g = next((g for g in hybrid_grid if g["workload"] == "hybrid"), None)
    ours = g["coloc"]["median"]["interval"]["mean"] if g else None
    rates = [("the paper's coloc. capacity", PAPER_HYBRID["coloc"])]
    if ours:
        rates.append(("our tuned coloc. capacity", round(ours, 2)))
    chunks = tuple(sorted(set(sizes.chunks) | {1024}))
    out = []
    for where, rate in rates:
        for label, chunk, scale, delta in _configs(deltas, chunks):
            adj = dataclasses.replace(setting, step_scale=scale, step_delta_s=delta)
            per_seed = []
            for seed in seeds:
                specs = st.workload("hybrid", rate, ex._n(rate, sizes), seed, setting)
                r = st.run("coloc", specs, "14B", adj, chunk=chunk, steps=True)
                per_seed.append({"attainment": r["attainment"], "tbt_p99_ms": 1e3 * r["tbt_p99_s"],
                                 "delay_p50_s": r["delay_p50_s"], "passes": r["passes_capacity"],
                                 **step_stats(r, setting.tbt_slo_s)})
            out.append({"where": where, "rate": rate, "config": label, "chunk": chunk, "scale": scale,
                        "delta_s": delta, "seeds": per_seed, **_pool(per_seed)})
    return out


def _pool(per_seed: list[dict]) -> dict:
    keys = ("attainment", "tbt_p99_ms", "delay_p50_s", "mixed_ms_p50", "mixed_ms_p99", "mixed_over_slo",
            "rows_per_mixed", "tokens_per_mixed")
    out = {k: (float(np.mean([p[k] for p in per_seed if p[k] is not None]))
               if any(p[k] is not None for p in per_seed) else None) for k in keys}
    out["passes"] = sum(bool(p["passes"]) for p in per_seed)
    out["passes_global"] = sum(bool(p["passes_global"]) for p in per_seed)
    return out


def capacity_with_delta(setting: st.Setting, sizes: ex.Sizes, seeds: Sequence[int], deltas: Sequence[float],
                        workload: str = "hybrid") -> list[dict]:
    rows = []
    for d in deltas:
        adj = dataclasses.replace(setting, step_delta_s=d)
        coloc, _ = cp.tuned_coloc(workload, "14B", adj, sizes, seeds)
        disagg_anchor = cp.anchor("disagg", workload, "14B", adj, sizes, seeds[0]) or ex.CAPACITY_LO
        disagg = cp.grid_capacity("disagg", workload, "14B", cp.grid_rates(disagg_anchor, sizes), adj, sizes, seeds)
        dyna = cp.grid_capacity("dynaserve", workload, "14B", coloc["rates"], adj, sizes, seeds,
                                dyna=st.DYNASERVE_VARIANTS["servelab defaults"][0], label="servelab defaults")
        rows.append({"workload": workload, "delta_s": d, "coloc": coloc, "disagg": disagg, "dynaserve": dyna,
                     "ratio_vs_coloc": cp.ratio_interval(dyna, coloc, "median"),
                     "coloc_vs_disagg": cp.ratio_interval(coloc, disagg, "median")})
    return rows


def paper_coloc(setting: st.Setting, sizes: ex.Sizes, seeds: Sequence[int], hybrid_grid: list[dict]) -> dict:
    check = step_check(setting)
    pure = max(math.ceil(max(r["excess_ms"] for r in check if r["pure"])), 1) / 1e3
    loose = max(math.ceil(max(r["excess_ms"] for r in check)), 1) / 1e3
    deltas = tuple(sorted({pure, loose, BIG_DELTA_S}))
    capacity = [r for wl in sizes.coloc_gap_workloads
                for r in capacity_with_delta(setting, sizes, seeds, (0.0,) + deltas, wl)]
    return {"step_check": check, "delta_pure_s": pure, "delta_loose_s": loose,
            "points": operating_points(setting, sizes, seeds, hybrid_grid, deltas), "capacity": capacity,
            "handoff": hg.handoff_gap(setting, sizes, seeds, hg.rates_for(capacity), (0.0, loose, BIG_DELTA_S))}


def text(results: dict) -> str:
    from servelab.designs.dynaserve.reproduce.report_capacity import cap, ci
    from servelab.designs.dynaserve.reproduce.report_tables import fmt, md_table

    res = results.get("paper_coloc")
    if not res:
        return ""
    n = len(results.get("seeds", [])) or 1
    check = "; ".join(f"{r['label']} ({r['decodes']} decodes x {r['context']}"
                      + (f" + {r['chunk']}-token chunk" if r["chunk"] else "") + f"): ours {fmt(r['ours_ms'], 1)} ms, "
                      f"paper {fmt(r['paper_ms'], 1)} ms" for r in res["step_check"])
    pct = lambda x: fmt(100 * x if x is not None else None, 1)  # noqa: E731
    rows = [[f"{p['where']} ({fmt(p['rate'])})", p["config"], pct(p["attainment"]), fmt(p["tbt_p99_ms"], 0),
             f"{fmt(p['mixed_ms_p50'], 0)} / {fmt(p['mixed_ms_p99'], 0)}", pct(p["mixed_over_slo"]),
             f"{fmt(p['rows_per_mixed'], 1)} / {fmt(p['tokens_per_mixed'], 0)}", fmt(p["delay_p50_s"], 2),
             f"{p['passes']} / {p['passes_global']} of {n}"] for p in res["points"]]
    caps = "; ".join(
        f"{c.get('workload', 'hybrid')} +{fmt(1e3 * c['delta_s'], 0)} ms: coloc. {cap(c['coloc'], 'median')} (chunk {c['coloc']['tuned_chunk']['median']}; "
        f"at vLLM's default chunk 2048, Sec. 2.4's configuration: {fmt(c['coloc']['anchors'].get('2048'))}, one seed), "
        f"1P1D {cap(c['disagg'], 'median')}, DynaServe (servelab defaults) {cap(c['dynaserve'], 'median')}; "
        f"DynaServe / coloc. {ci(c['ratio_vs_coloc'])}x, coloc. / 1P1D {ci(c['coloc_vs_disagg'])}x"
        for c in res["capacity"])
    return (
        "**Why the paper's colocation is weaker than ours (hybrid, the workload with the paper's absolute numbers: "
        "Table 2 coloc. 4.6, 1P1D 5.9, DynaServe 7.4 req/s).** Candidates and the experiments that could refute "
        "them (`reproduce/paper_coloc.py`). (1) *The engine's step time* (GPU/model speed, per-step overhead at the "
        "paper's batch sizes): our cost model's time for the steps the paper itself measured (decode counts by "
        "Little's law from Table 1's throughput, output length and p50 TBT): " + check + ". The paper's pure "
        f"steps (1P1D decode GPU, Fig. 6) exceed ours by at most {fmt(1e3 * res['delta_pure_s'], 0)} ms; the "
        f"colocation p50s (which include prompt-chunk steps, so they bound it loosely) by at most "
        f"{fmt(1e3 * res['delta_loose_s'], 0)} ms. Both are tested below as a fixed cost added to every step, "
        f"with {fmt(1e3 * BIG_DELTA_S, 0)} ms beside them. (2) *The chunk and whether the TBT "
        "SLO binds*, (3) *the capacity rule*: colocation on hybrid at the paper's colocation capacity and at ours, "
        f"{n} seeds (means), every step recorded; 'mixed' steps carry a prompt chunk; passes under our rule "
        "(99% of requests with per-request P99 TBT <= 100 ms, median delay <= 2 s) / Sarathi-Serve's (P99 TBT over "
        "all tokens <= 100 ms, median delay <= 2 s):\n\n"
        + md_table(["rate (req/s)", "colocation", "requests meeting SLO %", "P99 TBT ms (all tokens)",
                    "mixed step ms p50 / p99", "mixed steps > 100 ms %", "rows / tokens per mixed step",
                    "median delay s", "passes (ours / Sarathi's rule)"], rows)
        + "\n\n(4) *What the gap needs*: the capacities on hybrid (grid, median rule) with a fixed cost added to "
        "every step of every system: " + caps + ". Routing: round-robin vs least-loaded, the variants table "
        "('coloc least-loaded'). " + _verdict(res) + "\n\n" + hg.text(res.get("handoff"), BIG_DELTA_S) + "\n")


def _verdict(res: dict) -> str:
    """What the rows above decide, read off them."""
    from servelab.designs.dynaserve.reproduce.report_tables import fmt

    caps = res["capacity"]
    # the paper's ratio to reach: Table 2's on hybrid, Fig. 9's smallest elsewhere
    need = {c.get("workload", "hybrid"): (1.61 if c.get("workload", "hybrid") == "hybrid" else 1.15) for c in caps}
    ratios = [f"{c.get('workload', 'hybrid')} +{fmt(1e3 * c['delta_s'], 0)} ms {fmt(c['ratio_vs_coloc'].get('mean'))}x"
              for c in caps]
    reached = [c for c in caps if (c["ratio_vs_coloc"].get("low") or 0) >= need[c.get("workload", "hybrid")]]
    tuned = [p for p in res["points"] if p["where"].startswith("our") and p["scale"] == 1.0 and p["delta_s"] == 0.0
             and p["chunk"] == caps[0]["coloc"]["tuned_chunk"]["median"]]
    differ = sum(p["passes"] != p["passes_global"] for p in res["points"])
    head = (f"At our capacity the tuned chunk's mixed steps reach p99 {fmt(tuned[0]['mixed_ms_p99'], 0)} ms, "
            f"{fmt(100 - tuned[0]['mixed_ms_p99'], 0)} ms under the SLO: a slightly slower engine pushes that chunk "
            "over and colocation falls back to a smaller, less efficient one. " if tuned else "")
    return (head + "DynaServe / coloc. at the per-step costs tested: " + ", ".join(ratios)
            + ("; the paper's ratio (hybrid: Table 2's 1.61x; azure-code: Fig. 9's smallest, 1.15x) is reached by the "
               "interval at none of them" if not reached else
               "; the paper's ratio is reached by the interval at " + ", ".join(
                   f"{c.get('workload', 'hybrid')} +{fmt(1e3 * c['delta_s'], 0)} ms" for c in reached))
            + f". The two capacity rules disagree on {differ} of {len(res['points'])} operating points.")
