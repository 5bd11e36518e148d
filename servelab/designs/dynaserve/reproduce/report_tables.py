"""Tables of the DynaServe report: pure formatting of the results dict (no simulation)."""

from __future__ import annotations

from servelab.designs.dynaserve.reproduce.experiments import mean, ratio
from servelab.reproduce.claims import markdown_table

SYSTEM_NAMES = {"coloc": "PD coloc.", "disagg": "PD disagg.", "dynaserve": "DynaServe"}
PAPER_TABLE1 = {  # shape -> system -> (MFU G1, MFU G2, HBM G1, HBM G2, p99 TBT ms, rps, attainment %)
    "P8192/D32": {"disagg": (43.24, 0.19, 4.83, 5.77, 58.09, 0.83, 100.0),
                  "coloc": (38.94, 38.94, 39.67, 40.03, 352.93, 1.49, 1.73)},
    "P2048/D512": {"disagg": (30.59, 7.93, 1.17, 94.83, 65.11, 2.56, 99.83),
                   "coloc": (21.26, 21.26, 94.23, 95.7, 336.81, 2.83, 84.09)},
    "P219/D1467": {"disagg": (2.09, 14.34, 0.0, 96.27, 74.47, 1.68, 99.95),
                   "coloc": (13.98, 13.98, 95.2, 95.33, 162.67, 2.86, 94.46)},
}


def fmt(v, digits: int = 2, suffix: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and v != v:
        return "n/a"
    return f"{v:.{digits}f}{suffix}"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(markdown_table(header, rows))


def table1(rows: list[dict]) -> str:
    out = []
    for r in rows:
        paper = PAPER_TABLE1.get(r["shape"], {}).get(r["system"])
        inst = r["instances"]
        ours = (100 * inst[0]["mfu"], 100 * inst[1]["mfu"], 100 * inst[0]["kv_use"], 100 * inst[1]["kv_use"])
        p = (lambda i: fmt(paper[i], 2)) if paper else (lambda i: "-")
        out.append([r["shape"], SYSTEM_NAMES[r["system"]], fmt(r["rate"], 2),
                    f"{fmt(ours[0], 1)} / {fmt(ours[1], 1)} ({p(0)} / {p(1)})",
                    f"{fmt(ours[2], 1)} / {fmt(ours[3], 1)} ({p(2)} / {p(3)})",
                    fmt(1e3 * r["tbt_p50_s"], 0), f"{fmt(1e3 * r['tbt_p99_s'], 0)} ({p(4)})",
                    f"{fmt(r['saturated_rps'], 2)} ({p(5)})", f"{fmt(100 * r['attainment'], 1)} ({p(6)})"])
    return md_table(["shape", "system", "rate (req/s)", "MFU % inst 0 / 1 (paper)", "KV use % inst 0 / 1 (paper)",
                     "p50 TBT ms", "p99 TBT ms (paper)", "throughput req/s (paper)",
                     "attainment % (paper)"], out)


def capacity_rows(rows: list[dict]) -> dict[str, dict[str, dict]]:
    by: dict[str, dict[str, dict]] = {}
    for r in rows:
        by.setdefault(r["workload"], {})[r["system"]] = r
    return by


def capacity_table(rows: list[dict]) -> str:
    out = []
    for wl, sys in capacity_rows(rows).items():
        c, d, y = (sys.get(k, {}).get("capacity_rps") for k in ("coloc", "disagg", "dynaserve"))
        tuning = ", ".join(f"{t['chunk']}: {fmt(t['capacity_rps'], 2)}" for t in sys.get("coloc", {}).get("tuning", []))
        out.append([wl, f"{fmt(c, 2)} (chunk {sys.get('coloc', {}).get('chunk')})", fmt(d, 2), fmt(y, 2),
                    fmt(ratio(y, c), 2), fmt(ratio(y, d), 2), tuning,
                    " / ".join(fmt(sys.get(k, {}).get("goodput_at_capacity"), 0)
                               for k in ("coloc", "disagg", "dynaserve"))])
    return md_table(["workload", "PD coloc. req/s", "PD disagg. req/s", "DynaServe req/s", "vs coloc.",
                     "vs disagg.", "coloc. chunk tuning (chunk: req/s)",
                     "goodput tok/s at capacity (coloc / disagg / DynaServe)"], out)


def capacity_ratios(rows: list[dict]) -> dict[str, list[float | None]]:
    by = capacity_rows(rows)
    return {"coloc": [ratio(s.get("dynaserve", {}).get("capacity_rps"), s.get("coloc", {}).get("capacity_rps"))
                      for s in by.values()],
            "disagg": [ratio(s.get("dynaserve", {}).get("capacity_rps"), s.get("disagg", {}).get("capacity_rps"))
                       for s in by.values()]}


def goodput_ratios(rows: list[dict]) -> list[dict]:
    """Per (model, workload): the largest goodput ratio over the rates, and peak-to-peak."""
    out = []
    keys = list(dict.fromkeys((r["model"], r["workload"]) for r in rows))
    for model, wl in keys:
        mine = [r for r in rows if r["model"] == model and r["workload"] == wl]
        by_rate: dict[float, dict[str, float]] = {}
        for r in mine:
            by_rate.setdefault(r["rate"], {})[r["system"]] = r["goodput_tokens_per_s"]
        row = {"model": model, "workload": wl}
        for base in ("coloc", "disagg"):
            pairs = [(rate, ratio(g.get("dynaserve"), g.get(base))) for rate, g in by_rate.items()]
            pairs = [(rate, x) for rate, x in pairs if x is not None]
            best = max(pairs, key=lambda p: p[1], default=(None, None))
            peak = ratio(max((g.get("dynaserve", 0) for g in by_rate.values()), default=None),
                         max((g.get(base, 0) for g in by_rate.values()), default=None))
            row[f"max_vs_{base}"], row[f"max_vs_{base}_rate"], row[f"peak_vs_{base}"] = best[1], best[0], peak
        out.append(row)
    return out


def goodput_table(rows: list[dict]) -> str:
    out = []
    for g in goodput_ratios(rows):
        out.append([g["model"], g["workload"], f"{fmt(g['max_vs_coloc'], 2)} at {fmt(g['max_vs_coloc_rate'], 2)}",
                    fmt(g["peak_vs_coloc"], 2), f"{fmt(g['max_vs_disagg'], 2)} at {fmt(g['max_vs_disagg_rate'], 2)}",
                    fmt(g["peak_vs_disagg"], 2)])
    return md_table(["model", "workload", "max goodput ratio vs coloc. (at req/s)", "peak / peak vs coloc.",
                     "max ratio vs disagg. (at req/s)", "peak / peak vs disagg."], out)


def split_table(rows: list[dict]) -> str:
    out = [[r["split"], fmt(r["decode_fraction"], 2), fmt(r["requests_per_s"], 3), fmt(r["busy_0"], 2),
            fmt(r["busy_1"], 2), fmt(1e3 * r["tbt_p99_s"], 0)] for r in rows]
    return md_table(["split", "decode share on instance 0", "throughput req/s", "busy inst 0", "busy inst 1",
                     "p99 TBT ms"], out)


def sigma_table(rows: list[dict]) -> str:
    base = rows[0]["goodput_tokens_per_s"] if rows else None
    out = [[fmt(r["sigma"], 0), fmt(r["goodput_tokens_per_s"], 0),
            fmt(100 * (r["goodput_tokens_per_s"] / base - 1) if base else None, 1, " %"),
            fmt(100 * r["attainment"], 1)] for r in rows]
    return md_table(["sigma (tokens)", "goodput tok/s", "change vs sigma 0", "attainment %"], out)


def overhead_table(overhead: dict) -> str:
    out = [[r["workload"], fmt(r["rate"], 2), fmt(r["decision_us"].get("p50"), 0), fmt(r["decision_us"].get("p99"), 0),
            fmt(r["decision_us"].get("max"), 0), fmt(r["feedback_us_per_request"], 0),
            f"{fmt(r.get('schedule_us', {}).get('p50'), 0)} / {fmt(r.get('schedule_us', {}).get('p99'), 0)}",
            f"{fmt(r['queue_median'], 0)} / {r['queue_max']}"] for r in overhead["runs"]]
    table = md_table(["workload (in a run at DynaServe's capacity)", "req/s", "decision p50 us", "decision p99 us",
                      "max us", "calibration us per request", "batch planner us per step p50 / p99 (Algorithm 2)",
                      "requests queued or running (median / max)"], out)
    n = max((r.get("runs", 1) for r in overhead["runs"]), default=1)
    if n > 1:
        per_run = "; ".join(f"{r['workload']} " + " / ".join(fmt(p, 0) for p in r["decision_p99_us_per_run"])
                            for r in overhead["runs"])
        table = (f"Each workload's run repeated {n} times (the same simulation); each column is the median over "
                 f"the runs. Every run's p99 (us): {per_run}.\n\n" + table)
    bench = [[str(b["queue"]), fmt(b["p50"], 0), fmt(b["p99"], 0), fmt(b["max"], 0)] for b in overhead["benchmark"]]
    return table + "\n\nIsolated benchmark (`timing.queue_benchmark`), both timelines preloaded:\n\n" + md_table(
        ["running requests per instance", "decision p50 us", "p99 us", "max us"], bench)


def summary_ratios(rows: list[dict]) -> dict:
    r = capacity_ratios(rows)
    vals = {k: [x for x in v if x is not None] for k, v in r.items()}
    return {f"{k}_{stat}": (f(v) if v else None) for k, v in vals.items()
            for stat, f in (("min", min), ("max", max), ("mean", mean))}
