"""The capacity parts of the DynaServe report (``capacity.py``'s grid over seeds): both delay
rules side by side with their intervals, servelab's variants against the paper's deployment,
the router's own statistics at capacity, and the colocation gap with the step times that
decide it. Pure formatting of the results dict."""

from __future__ import annotations

import numpy as np

from servelab.designs.dynaserve.reproduce.report_tables import fmt, md_table

RULES = {"median": "median delay <= 2 s (Sarathi-Serve's, the paper's)", "p99": "P99 delay <= 2 s (stricter)"}
PAPER = {"vs_coloc": (1.15, 3.07, 2.37), "vs_disagg": (1.09, 1.67, 1.37)}  # min, max, mean (Fig. 9)
# The last report before this one (docs/reproduction/dynaserve.md at 1a3a5fb: roofline cost model without
# per-step overhead, P99 delay rule, bisection on seed 0, load-based pairing, colocation least-loaded)
BEFORE_VS_COLOC = "0.79-0.97x, mean 0.90x"
PAPER_P99_TBT_MS = {"P8192/D32": 352.93, "P2048/D512": 336.81, "P219/D1467": 162.67}  # coloc. (Table 1)


def ci(iv: dict | None, digits: int = 2) -> str:
    """``1.02 [0.95, 1.09]`` (mean and 95% t interval over seeds); ``1.02 (1 seed)``."""
    if not iv or iv.get("mean") is None:
        return "n/a"
    if iv.get("low") is None:
        return f"{fmt(iv['mean'], digits)} ({iv.get('n', 0)} seed)"
    return f"{fmt(iv['mean'], digits)} [{fmt(iv['low'], digits)}, {fmt(iv['high'], digits)}]"


def cap(row: dict, rule: str) -> str:
    """A system's capacity under ``rule``: mean [CI], or "< lowest grid rate" when every seed
    failed the whole grid (no value to average)."""
    iv = row[rule]["interval"]
    if iv.get("mean") is None and row[rule]["censored"] and all(c == "bottom" for c in row[rule]["censored"]):
        return f"< {fmt(row['rates'][0])} (below the grid)"
    return ci(iv)


def verdict(iv: dict | None, paper_low: float) -> str:
    """Whether the interval supports the paper's claim (above its smallest reported ratio),
    refutes it (below 1 or below it), or cannot tell."""
    if not iv or iv.get("low") is None:
        return "no interval"
    if iv["low"] >= paper_low:
        return "reached"
    if iv["high"] < 1.0:
        return "lower than the baseline"
    if iv["high"] < paper_low:
        return "not reached"
    return "undecided"


def seed_mean_interval(grid: list[dict], rule: str, key: str) -> dict:
    """The mean over workloads of a ratio, per seed, with its t interval over the seeds."""
    from servelab.designs.dynaserve.reproduce.capacity import _interval

    per = [g["ratios"][rule][key]["per_seed"] for g in grid]
    if not per:
        return {}
    seeds = [[p[i] for p in per] for i in range(len(per[0]))]
    return _interval([float(np.mean(s)) if all(v is not None for v in s) else None for s in seeds])


def claims_rows(results: dict) -> list[list[str]]:
    grid = results["grid"]
    rows = []
    for key, name in (("vs_coloc", "PD coloc."), ("vs_disagg", "PD disagg.")):
        lo, hi, mean = PAPER[key]
        for rule in RULES:
            have = [g for g in grid if g["ratios"][rule][key]["mean"] is not None]
            below = [g["workload"] for g in grid if g["dynaserve"][rule]["interval"]["mean"] is None]
            if len(have) == len(grid):
                means = [g["ratios"][rule][key]["mean"] for g in have]
                overall = seed_mean_interval(grid, rule, key)
                ours = f"{fmt(min(means))}-{fmt(max(means))}x, mean {ci(overall)}: {verdict(overall, lo)}"
            else:
                ours = "; ".join(f"{g['workload']} {ci(g['ratios'][rule][key])}x: "
                                 f"{verdict(g['ratios'][rule][key], lo)}" for g in have) or "no ratio"
            if below:
                ours += f"; DynaServe below the grid on {', '.join(below)}"
            rows.append([f"capacity vs {name}, 14B, 4 workloads (Fig. 9), {rule} delay rule",
                         f"{lo}-{hi}x, mean {mean}x", ours,
                         f"the paper's deployment; grid over {len(results['seeds'])} seeds, 95% t interval"])
    for rule in RULES:  # servelab's defaults where the variants ran
        parts = []
        for g in grid:
            d = g["variants"].get("servelab defaults")
            if d is not None:
                from servelab.designs.dynaserve.reproduce.capacity import ratio_interval

                parts.append(f"{g['workload']}: vs coloc. {ci(ratio_interval(d, g['coloc'], rule))}x "
                             f"({verdict(ratio_interval(d, g['coloc'], rule), PAPER['vs_coloc'][0])}), vs disagg. "
                             f"{ci(ratio_interval(d, g['disagg'], rule))}x")
        if parts:
            rows.append([f"capacity, servelab's defaults (variant), {rule} delay rule", "1.15-3.07x / 1.09-1.67x",
                         "; ".join(parts), "load pairing, 10% headroom, context charge, bulk decode splits"])
    return rows


def capacity_section(results: dict) -> str:
    out = []
    for rule, text in RULES.items():
        rows = []
        for g in results["grid"] + results.get("hybrid_grid", []):
            r = g["ratios"][rule]
            rows.append([g["workload"], f"{cap(g['coloc'], rule)} (chunk {g['coloc']['tuned_chunk'][rule]})",
                         cap(g["disagg"], rule), cap(g["dynaserve"], rule),
                         f"{ci(r['vs_coloc'])}: {verdict(r['vs_coloc'], PAPER['vs_coloc'][0])}",
                         f"{ci(r['vs_disagg'])}: {verdict(r['vs_disagg'], PAPER['vs_disagg'][0])}",
                         _censored(g, rule)])
        out += [f"**Rule: {text}.**", "", md_table(
            ["workload", "PD coloc. req/s", "PD disagg. req/s", "DynaServe req/s", "DynaServe / coloc.",
             "DynaServe / disagg.", "at the grid's edge"], rows), ""]
    return "\n".join(out)


def _censored(g: dict, rule: str) -> str:
    notes = []
    for system in ("coloc", "disagg", "dynaserve"):
        c = [x for x in g[system][rule]["censored"] if x]
        if c:
            notes.append(f"{system}: {', '.join(c)}")
    return "; ".join(notes) or "-"


def variants_section(results: dict) -> str:
    rows = []
    for g in results["grid"]:
        bases = g.get("variant_bases", {})
        for name, v in g["variants"].items():
            base = bases.get(name, "paper")
            ref = {"paper": g["dynaserve"], "coloc": g["coloc"]}.get(base) or g["variants"][base]
            label = {"paper": "paper's deployment", "coloc": "coloc. round-robin"}.get(base, base)
            rows.append([g["workload"], name, label, *(f"{cap(v, rule)} vs {cap(ref, rule)}; "
                                                       f"ratio {ci(g['ratios'][rule][f'{name} vs base'])}"
                                                       for rule in RULES)])
    if not rows:
        return "No variants were measured.\n"
    return md_table(["workload", "variant", "compared with",
                     "capacity req/s, variant vs compared; ratio (median rule)", "same (P99 rule)"], rows)


def policy_section(results: dict) -> str:
    """DynaServe's own statistics (``policy_reports["router"]`` of each run's summary) at
    each seed's capacity under the paper's rule, averaged over the seeds."""
    rows = []
    for g in results["grid"] + results.get("hybrid_grid", []):
        reps = []
        for run in g["dynaserve"]["runs"]:
            rate = run["median"]["rps"]
            reps += [p["router_report"] for p in run["probes"] if p["rate"] == rate and p.get("router_report")]
        if not reps:
            rows.append([g["workload"]] + ["n/a"] * 6)
            continue

        def avg(get) -> float | None:
            vals = [get(r) for r in reps if get(r) is not None]
            return float(np.mean(vals)) if vals else None

        share = {k: avg(lambda r, k=k: r["split_share"][k]) for k in ("inside_prompt", "at_prompt_end",
                                                                        "in_decode", "none")}
        rows.append([g["workload"], " / ".join(fmt(100 * v if v is not None else None, 0) for v in share.values()),
                     fmt(avg(lambda r: r["mean_split_tokens"]), 0), fmt(avg(lambda r: r["mean_split_fraction"])),
                     fmt(avg(lambda r: r["mean_decode_share_alpha"])),
                     f"{fmt(avg(lambda r: r['kv_streamed']), 0)} / {fmt(avg(lambda r: r['kv_bulk']), 0)}",
                     f"{fmt(avg(lambda r: r['decision_time_us'].get('p50')), 0)} / "
                     f"{fmt(max(r['decision_time_us'].get('p99', 0) for r in reps), 0)}"])
    return md_table(["workload", "split share % (inside prompt / at prompt end / in decode / none)",
                     "mean split point (tokens)", "mean split / predicted total", "decode share on alpha",
                     "KV streamed / bulk (requests per run)", "decision us p50 (mean) / p99 (worst seed)"], rows)


def coloc_gap(results: dict) -> str:
    gap = results.get("gap_overhead", [])
    lines = []
    for wl, config in dict.fromkeys((r["workload"], r.get("dynaserve_config", "paper")) for r in gap):
        by = {r["cpu_overhead"]: r for r in gap if r["workload"] == wl and r.get("dynaserve_config", "paper") == config}
        m, o = by.get("measured"), by.get("off")
        name = {"paper": "DynaServe (the paper's deployment)"}.get(config, f"DynaServe ({config})")
        if m and o:
            lines.append(f"{wl}: {name} / coloc. {ci(m['median']['ratio'])} with the measured overhead "
                         f"({ci(m['median']['dynaserve'])} vs {ci(m['median']['coloc'])} req/s, chunk "
                         f"{m['median']['coloc_chunk']}), {ci(o['median']['ratio'])} without it "
                         f"({ci(o['median']['dynaserve'])} vs {ci(o['median']['coloc'])} req/s, chunk "
                         f"{o['median']['coloc_chunk']})")
    tuning = []
    for g in results["grid"]:
        per = ", ".join(f"{c['chunk']}: {ci(c['median']['interval'])} / {ci(c['p99']['interval'])}"
                        for c in g["coloc_chunks"])
        anchors = ", ".join(f"{c}: {fmt(a)}" for c, a in g["coloc"]["anchors"].items())
        tuning.append(f"{g['workload']}: grid {per} (anchors, one seed: {anchors})")
    steps = results.get("step_times", [])
    table = md_table(["Table 1 shape", "decodes x context", "chunk", "step ms (simulated)",
                      "paper's coloc. p99 TBT ms (measured, chunk 2048)"],
                     [[s["shape"], f"{s['num_decodes']} x {s['context']}", f"{s['chunk']} ({s['chunk_tokens']} tokens)",
                       fmt(s["step_ms"], 1), fmt(PAPER_P99_TBT_MS.get(s["shape"]), 1) if s["chunk"] == 2048 else ""]
                      for s in steps])
    small = [s["step_ms"] for s in steps if s["chunk"] == 256]
    big = [s["step_ms"] for s in steps if s["chunk"] == 2048 and s["chunk_tokens"] == 2048]
    if small and max(small) < 100:
        why = (f"a 256-token chunk beside these decodes takes {fmt(min(small), 0)}-{fmt(max(small), 0)} ms, under "
               "the 100 ms SLO, while a 2048-token one takes " + "-".join(fmt(x, 0) for x in (min(big), max(big)))
               + " ms, about the paper's colocation tails: the interference is there at vLLM's default chunk "
               "(Table 1's pattern holds), and chunk tuning removes it in our cost model, which is why the tuned "
               "colocation keeps its capacity")
    else:
        why = "even a 256-token chunk beside these decodes breaks the 100 ms SLO, so chunk tuning cannot remove it"
    return (
        "**Capacity vs PD colocation, and how it moved with the profile cost model.** The paper's reason for its "
        "2.37x: colocation suffers prefill-decode interference, long chunks stalling decodes, which chunk tuning "
        "does not remove. Before this run (roofline cost model without per-step overhead, the P99 delay rule, "
        f"one seed's bisection, servelab's variant of DynaServe, colocation least-loaded) the ratio was "
        f"{BEFORE_VS_COLOC}; the claims table gives it now. Test 1, the chunk (capacity req/s under the median / P99 rule, mean [95% CI] over the "
        "seeds): " + "; ".join(tuning) + ". Test 2, the step times that decide the TBT SLO (simulated: profile "
        "cost model, A100-80GB, Qwen-2.5-14B, a chunk halfway through the prompt beside a decode batch; the "
        "decode counts are illustrative) next to the paper's measured colocation tails:\n\n" + table + "\n\n"
        + why[0].upper() + why[1:] + ". Test 3, the per-step CPU overhead the profile model "
        "adds (measured vLLM scheduling, sampling and output processing per step): "
        + ("; ".join(lines) if lines else "not run") + ". Remaining untested: the paper's own vLLM 0.7.2 "
        "colocation (its scheduler and chunking details), which we replace by `sarathi` behind round-robin.\n")


def deployment_gap(results: dict) -> str:
    """What each of servelab's additions does to the paper's deployment, from the variants'
    grids (the experiment that tests why the paper's deployment reaches less here)."""
    parts = []
    for g in results["grid"]:
        if not g["variants"]:
            continue
        bases = g.get("variant_bases", {})
        paper, defaults = g["dynaserve"], g["variants"].get("servelab defaults")
        alone, needed = [], []
        for name, v in g["variants"].items():
            r = g["ratios"]["median"][f"{name} vs base"]
            better = _better(v, g["dynaserve"] if bases.get(name) == "paper" else defaults, r)
            if bases.get(name) == "paper" and name != "servelab defaults" and better:
                alone.append(name)
            drop = g["ratios"]["median"][f"{name} vs base"]
            lost = (v["median"]["interval"]["mean"] is None and defaults["median"]["interval"]["mean"] is not None) \
                or (drop.get("high") is not None and drop["high"] < 1.0)
            if bases.get(name) == "servelab defaults" and lost:
                needed.append(name.replace("defaults without ", ""))
        grid = results["sizes"]["grid"]
        att = _attainment_at_anchor(paper, grid), _attainment_at_anchor(defaults, grid)
        parts.append(f"{g['workload']}: the paper's deployment {cap(paper, 'median')} req/s, servelab's defaults "
                     f"{cap(defaults, 'median') if defaults else 'n/a'} (requests meeting the TBT SLO at the anchor "
                     f"rate, mean over seeds: {fmt(100 * att[0] if att[0] is not None else None, 1)}% vs "
                     f"{fmt(100 * att[1] if att[1] is not None else None, 1)}%); alone on the paper's deployment, "
                     f"{', '.join(alone) or 'no addition'} raises the capacity; removed from the defaults, "
                     f"{', '.join(needed) or 'none'} lowers it")
    if not parts:
        return ""
    return ("**The paper's deployment against servelab's additions (median rule).** " + "; ".join(parts) + ". "
            "The reason tested: with no headroom Algorithm 2 plans every mixed step to the 100 ms SLO itself, and "
            "its profile table (one chunk from scratch, the mean decode context) only approximates the simulated "
            "step, so a mixed step can land just over 100 ms; a request with fewer than 100 gaps may not exceed "
            "the SLO once, so the attainment (in parentheses) falls below 99% while the instances still have room, "
            "and the leave-one-out rows say which additions remove it. The headroom and the context charge (a late chunk of a long prompt also reads "
            "its earlier context, which the table does not time) remove those misses; the pairing and the "
            "transfer mode act on load balance and memory instead (the variants table).\n")


def _better(a: dict | None, b: dict | None, r: dict | None) -> bool:
    """``a``'s capacity above ``b``'s: the ratio's interval above 1, or ``b`` below the grid where ``a`` is not."""
    if a is None or b is None:
        return False
    ma, mb = a["median"]["interval"]["mean"], b["median"]["interval"]["mean"]
    if ma is not None and mb is None:
        return True
    if r is None:
        r = ratio_of(a, b)
    return bool(r and r.get("low") is not None and r["low"] > 1.0)


def ratio_of(a: dict, b: dict) -> dict:
    from servelab.designs.dynaserve.reproduce.capacity import ratio_interval

    return ratio_interval(a, b, "median")


def _attainment_at_anchor(row: dict | None, grid: list[float]) -> float | None:
    """Mean over seeds of the attainment of the probe at the anchor's rate (where every walk starts)."""
    if row is None:
        return None
    anchor = row["rates"][min(range(len(grid)), key=lambda j: abs(grid[j] - 1.0))]
    vals = [p["attainment"] for run in row["runs"] for p in run["probes"] if p["rate"] == anchor]
    return float(np.mean(vals)) if vals else None
