"""Plots of the AlignedServe reproduction; matplotlib only here, Agg backend."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from servelab.reproduce.plots import pyplot, save

plt = pyplot()


_save = partial(save, dpi=110)


def all_figures(results: dict, out: Path) -> list[str]:
    return [fig1(results["fig1"], out / "fig1_step_vs_generated.png"),
            fig7(results["fig7"], out / "fig7_throughput.png"),
            fig13(results["fig13"], out / "fig13_forward_cdf.png"),
            pool(results["fig11"], out / "pool_occupancy.png")]


def fig1(r: dict, path: Path) -> str:
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for row in r["rows"]:
        ax.plot(r["generated"], row["step_ms"], label=row["mix"])
    ax.set_xlabel("generated tokens")
    ax.set_ylabel("decode step (ms)")
    ax.set_title(f"Fig. 1, simulated: {r['model']} on {r['gpu']}, batch 64", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def fig7(rows: list[dict], path: Path) -> str:
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for label in dict.fromkeys(r["label"] for r in rows):
            pts = [(r["short_share"], r["decode_tok_s"]) for r in rows if r["model"] == model and r["label"] == label]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_title(f"Fig. 7, simulated: {model}", fontsize=9)
        ax.set_xlabel("share of short requests")
        ax.set_ylabel("decoding throughput (tok/s)")
        ax.legend(fontsize=7)
    return _save(fig, path)


def fig13(rows: list[dict], path: Path) -> str:
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for r in rows:
        ax.plot([p[0] for p in r["cdf_ms"]], [p[1] for p in r["cdf_ms"]], label=f"{r['workload']}, {r['batching']}")
    ax.axvline(30, color="grey", ls=":")
    ax.set_xlabel("decode iteration forward time (ms)")
    ax.set_ylabel("CDF")
    ax.set_title("Fig. 13, simulated: OPT-13B", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def pool(rows: list[dict], path: Path) -> str:
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for r in rows:
        if r["label"] == "AlignedServe" and r.get("pool_samples"):
            ax.step([t for t, _ in r["pool_samples"]], [b / 2**30 for _, b in r["pool_samples"]], where="post",
                    label=r["workload"])
    ax.set_xlabel("time (s)")
    ax.set_ylabel("KV pool occupancy (GiB)")
    ax.set_title("Pool occupancy, simulated: OPT-6.7B", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)
