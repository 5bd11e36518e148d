"""Plots of the BucketServe reproduction (Figs. 5a-f, 6a-b); matplotlib only here, Agg backend."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from servelab.reproduce.notes import DEFAULT_COST_MODEL_SHORT
from servelab.reproduce.plots import pyplot, save

plt = pyplot()

SIM_NOTE = f"simulated: {DEFAULT_COST_MODEL_SHORT}, Llama-2-13B, 4 x A100-40GB (2 x TP2)"
COLORS = {"bucketserve": "tab:red", "distserve": "tab:blue", "uellm": "tab:green", "static": "tab:gray"}


_save = partial(save, note=SIM_NOTE, dpi=120)


def offline(rows: list[dict], workloads: list[str], out: Path) -> list[str]:
    names = []
    for metric, label, fname in (("output_tok_s", "output tokens / s", "fig5a_throughput.png"),
                                 ("gpu_busy_frac", "GPU busy fraction", "fig5b_utilisation.png")):
        fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 3.2), squeeze=False)
        for ax, wl in zip(axes[0], workloads):
            for system, color in COLORS.items():
                pts = sorted((r["batch_size"], r[metric]) for r in rows if r["workload"] == wl and r["system"] == system)
                if pts:
                    ax.plot(*zip(*pts), "o-", color=color, label=system)
            ax.set_xscale("log", base=2)
            ax.set_title(f"offline, {wl}")
            ax.set_xlabel("max batch size")
            ax.set_ylabel(label)
        axes[0][0].legend(fontsize=8)
        names.append(_save(fig, out / fname))
    return names


def online(rows: list[dict], workloads: list[str], out: Path) -> list[str]:
    names = []
    specs = (("steady_rps", "slo_attainment", "steady-state server RPS", "SLO attainment", "fig5cd_slo.png"),
             ("client_rps", "steady_rps", "client RPS", "steady-state server RPS", "fig5ef_server_vs_client.png"))
    for xkey, ykey, xlabel, ylabel, fname in specs:
        fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 3.2), squeeze=False)
        for ax, wl in zip(axes[0], workloads):
            for system, color in COLORS.items():
                pts = sorted((r[xkey], r[ykey]) for r in rows if r["workload"] == wl and r["system"] == system)
                if pts:
                    ax.plot(*zip(*pts), "o-", color=color, label=system)
            if ykey == "slo_attainment":
                ax.axhline(0.8, ls=":", color="k", lw=0.8)
            else:
                top = max(r["client_rps"] for r in rows if r["workload"] == wl)
                ax.plot([0, top], [0, top], ":", color="k", lw=0.8, label="y = x")
            ax.set_title(f"online, {wl}")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
        axes[0][0].legend(fontsize=8)
        names.append(_save(fig, out / fname))
    return names


def breakdown(rows: list[dict], out: Path) -> str:
    fig, ax = plt.subplots(figsize=(5, 3.2))
    labels = [f"{r['client_rps']:g}" for r in rows]
    bottom = [0.0] * len(rows)
    for key, color in (("prefill_s", "tab:blue"), ("transfer_s", "tab:green"), ("decode_s", "tab:orange"),
                       ("bucketing_s", "tab:red")):
        vals = [r[key] for r in rows]
        ax.bar(labels, vals, bottom=bottom, color=color, label=key[:-2])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xlabel("client RPS")
    ax.set_ylabel("mean time per request (s)")
    ax.set_title("Fig. 6a: end-to-end breakdown")
    ax.legend(fontsize=8)
    return _save(fig, out / "fig6a_breakdown.png")


def overhead(rows: list[dict], out: Path) -> str:
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for n in sorted({r["num_queued"] for r in rows}):
        pts = sorted((r["num_buckets"], r["median_s"] * 1e6) for r in rows if r["num_queued"] == n)
        ax.plot(*zip(*pts), "o-", label=f"{n} queued")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("number of buckets")
    ax.set_ylabel("median CPU time per decision (us)")
    ax.set_title("Fig. 6b: bucketing overhead (measured, CPU)")
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, "measured with time.thread_time (CPU time) on this machine", fontsize=6, color="dimgray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out / "fig6b_overhead.png", dpi=120)
    plt.close(fig)
    return "fig6b_overhead.png"
