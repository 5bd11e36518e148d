"""Plots of the DynaServe reproduction (Figs. 5, 8, 9, 11); matplotlib only here, Agg backend."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from servelab.reproduce.plots import pyplot, save

plt = pyplot()

SIM_NOTE = "simulated: profile cost model (A100 operator tables + vLLM step overhead), Qwen-2.5 on A100-80GB, 2 instances"
COLORS = {"coloc": "tab:blue", "disagg": "tab:green", "dynaserve": "tab:red"}
LABELS = {"coloc": "PD colocation (sarathi, DP=2)", "disagg": "PD disaggregation (1P1D)", "dynaserve": "DynaServe"}


_save = partial(save, note=SIM_NOTE, dpi=110)


def all_figures(results: dict, out: Path) -> list[str]:
    return [split_ratio(results["split_sweep"], out), goodput(results["goodput"], out),
            capacity(results["grid"] + results.get("hybrid_grid", []), out),
            tbt_cdf(results["slo_batching"], results["cdf_points_ms"], out)]


def split_ratio(rows: list[dict], out: Path) -> str:
    fixed = sorted((r["decode_fraction"], r) for r in rows if r["split"] != "dynamic")
    fig, ax = plt.subplots(figsize=(7, 3.8))
    xs = [f for f, _ in fixed]
    ax.plot(xs, [r["requests_per_s"] for _, r in fixed], "o-", color="black", label="throughput (req/s)")
    ax2 = ax.twinx()
    ax2.plot(xs, [r["busy_0"] for _, r in fixed], "s--", color="tab:blue", label="instance 0 busy")
    ax2.plot(xs, [r["busy_1"] for _, r in fixed], "^--", color="tab:orange", label="instance 1 busy")
    ax2.set_ylabel("busy share")
    dyn = [r for r in rows if r["split"] == "dynamic"]
    if dyn and dyn[0]["decode_fraction"] is not None:
        ax.plot([dyn[0]["decode_fraction"]], [dyn[0]["requests_per_s"]], "*", ms=14, color="tab:red",
                label="dynamic (mean split)")
    ax.set_xlabel("decode share on instance 0 (negative: split inside the prompt)")
    ax.set_ylabel("req/s")
    ax.set_title("Fig. 5: P1024/D1024, fixed split, 14B")
    ax.legend(fontsize=7, loc="upper left")
    ax2.legend(fontsize=7, loc="lower right")
    return _save(fig, out / "fig5_split_ratio.png")


def goodput(rows: list[dict], out: Path) -> str:
    models = sorted({r["model"] for r in rows}, key=lambda m: int(m[:-1]))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(len(models), len(workloads), figsize=(3.4 * len(workloads), 2.8 * len(models)),
                             squeeze=False)
    for i, model in enumerate(models):
        for j, wl in enumerate(workloads):
            ax = axes[i][j]
            for system, color in COLORS.items():
                pts = sorted((r["rate"], r["goodput_tokens_per_s"]) for r in rows
                             if r["model"] == model and r["workload"] == wl and r["system"] == system)
                if pts:
                    ax.plot(*zip(*pts), "o-", color=color, label=LABELS[system], ms=3)
            ax.set_title(f"{wl}, {model}", fontsize=9)
            ax.set_xlabel("Poisson rate (req/s)", fontsize=8)
            ax.set_ylabel("goodput (tok/s)", fontsize=8)
    axes[0][0].legend(fontsize=6)
    return _save(fig, out / "fig8_goodput.png")


def capacity(grid: list[dict], out: Path) -> str:
    """Mean capacity over the seeds with its 95% interval, both delay rules (solid: median, the
    paper's; hatched: P99)."""
    workloads = [g["workload"] for g in grid]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.13
    for k, system in enumerate(COLORS):
        for j, rule in enumerate(("median", "p99")):
            ivs = [g[system][rule]["interval"] for g in grid]
            vals = [iv["mean"] or 0.0 for iv in ivs]
            err = [[(iv["mean"] - iv["low"]) if iv["low"] is not None else 0.0 for iv in ivs],
                   [(iv["high"] - iv["mean"]) if iv["high"] is not None else 0.0 for iv in ivs]]
            xs = [x + (2 * k + j - 2.5) * width for x in range(len(workloads))]
            ax.bar(xs, vals, width, yerr=err, capsize=2, color=COLORS[system], hatch="//" if j else None,
                   alpha=0.6 if j else 1.0, label=f"{LABELS[system]}, {rule} delay rule")
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("serving capacity (req/s)")
    ax.set_title("Fig. 9 / Table 2: serving capacity, 14B, mean and 95% CI over seeds\n(>= 99% of requests with "
                 "P99 TBT <= 100 ms; median (paper) or P99 scheduling delay <= 2 s)", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    return _save(fig, out / "fig9_capacity.png")


def tbt_cdf(rows: list[dict], points_ms: list[float], out: Path) -> str:
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for r in rows:
        label = "with SLO-aware batching" if r["slo_aware"] else "without (fixed 2048-token budget)"
        ax.plot(points_ms, r["cdf"], label=label, color="tab:red" if r["slo_aware"] else "tab:gray")
    ax.axvline(100, ls=":", color="black")
    ax.set_xlabel("time between tokens (ms)")
    ax.set_ylabel("share of tokens")
    ax.set_title(f"Fig. 11: TBT CDF, {rows[0]['workload']} at {rows[0]['rate']:.2f} req/s, 14B", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, out / "fig11_tbt_cdf.png")
