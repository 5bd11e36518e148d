"""What ``servelab validate --base-url`` writes: per-request CSV, CDF plots (each replay and
the simulator, side by side), JSON and a markdown summary (measured against a server, and
simulated with the step model fitted to it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from servelab.validate.remote_validate import METRICS, RemoteValidation
from servelab.validate.report import fmt_s, pct, write_csv

NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "end-to-end latency"}


def request_rows(v: RemoteValidation) -> list[dict]:
    rows = []
    for i, p in enumerate(v.planned):
        row = {"request_id": p.index, "arrival_s": p.arrival_s, "prompt_tokens": p.prompt_len,
               "output_tokens": p.output_len}
        for m in METRICS:
            for k, rep in enumerate(v.replays):
                row[f"replay{k + 1}_{m}_s"] = rep[i][m]
            row[f"sim_{m}_s"] = v.sim[i][m]
        rows.append(row)
    return rows


def plot_cdfs(path: Path, v: RemoteValidation, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    sides = [(f"server, replay {k + 1} (measured)", rep, "-") for k, rep in enumerate(v.replays)]
    sides.append(("simulator (fitted step model)", v.sim, "--"))
    for ax, m in zip(axes, METRICS):
        for label, rows, style in sides:
            values = np.sort([r[m] for r in rows if r[m] is not None]) * 1e3
            if len(values):
                ax.step(values, np.arange(1, len(values) + 1) / len(values), style, where="post", label=label)
        ax.set_xlabel(f"{NAMES[m]} (ms)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("CDF of requests")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(v: RemoteValidation) -> str:
    m = v.metrics
    lines = [f"# Simulator vs {v.options.base_url} (measured server, simulated with the fitted step model)", "",
             f"- workload: {m['workload']}, {m['num_requests']} requests, arrival times kept",
             f"- server limits: {v.limits.describe()}",
             f"- simulator: policy `{m['policy']}`, cost model `{v.options.cost_model}`; request overhead "
             f"(TTFT no step explains, from the calibration) added to each TTFT and e2e: "
             f"{1e3 * m.get('request_overhead_s', 0.0):.1f} ms",
             f"- replays: {len(v.replays)}, durations {', '.join(f'{d:.1f} s' for d in v.durations_s)}, failed "
             f"requests {m['failed']}; simulator unfinished {m['sim_unfinished']}",
             "- 1-min load average (sampled every second) during each replay: "
             + ", ".join(_load_text(x) for x in m.get("load") or []) + "; during the calibration: "
             + ("-" if m.get("calibration_load") is None else f"{m['calibration_load']:.1f}")
             + (" (the replays ran at the same load: the noise is comparable)" if m.get("same_load") else
                " (the replays ran at different loads: their difference is not the noise of one condition, and "
                "no error is judged against it)" if m.get("same_load") is False else ""), "",
             "| metric | sim error vs replay 1: median / p90 | sim bias (median) | replay 2 vs replay 1 (noise): "
             "median / p90 | inside noise |", "|---|---:|---:|---:|---|"]
    for k in METRICS:
        s = m["sim_vs_replay"][0][k]
        n = m["noise"][0][k] if m["noise"] else None
        inside = m["inside_noise"][k]
        lines.append(f"| {NAMES[k]} | {pct(s['median'])} / {pct(s['p90'])} | {_signed(s['bias_median'])} | "
                     + (f"{pct(n['median'])} / {pct(n['p90'])}" if n else "- (one replay)")
                     + f" | {'-' if inside is None else ('yes' if inside else 'no')} |")
    dist, dnoise = m["distribution"][0], (m["distribution_noise"] or [None])[0]
    lines += ["", "Distributions (independent of which request the server took first): |sim - replay 1| / replay 1 "
              "at p50 and p90, next to |replay 2 - replay 1| / replay 1.", "",
              "| metric | sim p50 / p90 error | noise p50 / p90 |", "|---|---:|---:|"]
    for k in METRICS:
        lines.append(f"| {NAMES[k]} | {pct(dist[k][50])} / {pct(dist[k][90])} | "
                     + (f"{pct(dnoise[k][50])} / {pct(dnoise[k][90])}" if dnoise else "-") + " |")
    if m.get("drift"):
        sc, sd = m["scaled_vs_replay"][0], m["scaled_distribution"][0]
        lines += ["", f"Drift probes before the replays: the server ran at {m['drift']['ratio']:.2f}x the fitted "
                  "model's step times; the simulator with every coefficient scaled by that:", "",
                  "| metric | scaled sim error vs replay 1: median / p90 | p50 error |", "|---|---:|---:|"]
        for k in METRICS:
            lines.append(f"| {NAMES[k]} | {pct(sc[k]['median'])} / {pct(sc[k]['p90'])} | {pct(sd[k][50])} |")
    lines += ["", "| metric | replay 1 median | simulator median |", "|---|---:|---:|"]
    for k in METRICS:
        real = [r[k] for r in v.replays[0] if r[k] is not None]
        sim = [r[k] for r in v.sim if r[k] is not None]
        lines.append(f"| {NAMES[k]} | {fmt_s(float(np.median(real)) if real else None)} | "
                     f"{fmt_s(float(np.median(sim)) if sim else None)} |")
    return "\n".join(lines) + "\n"


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _load_text(x: dict | None) -> str:
    return "-" if not x else f"mean {x['mean']:.1f} ({x['min']:.1f}-{x['max']:.1f})"


def write_remote(folder: Path, v: RemoteValidation) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"csv": write_csv(folder / "requests.csv", request_rows(v)),
             "cdf": plot_cdfs(folder / "cdf.png", v, f"{v.metrics['workload']} against {v.options.base_url}: "
                              f"measured replays vs simulator")}
    paths["json"] = folder / "validate.json"
    paths["json"].write_text(json.dumps({"metrics": v.metrics, "base_url": v.options.base_url,
                                         "cost_model": str(v.options.cost_model)}, indent=2))
    paths["md"] = folder / "validate.md"
    paths["md"].write_text(markdown(v))
    return paths
