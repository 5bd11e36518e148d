"""Benchmark plots: latency CDFs (TTFT, TPOT, ITL, e2e) and latency over the run.

Matplotlib is imported here only (Agg backend, files only), so the benchmark's other modules
stay light.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_results(out_dir: Path, stem: str, rows: list[dict], results) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["success"]]
    series = {"TTFT": [r["ttft_s"] for r in ok], "TPOT": [r["tpot_s"] for r in ok if r["tpot_s"] is not None],
              "ITL": [x for r in results if r.success for x in r.itl_s], "e2e": [r["e2el_s"] for r in ok]}
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.2))
    for ax, (name, values) in zip(axes, series.items()):
        values = np.sort(np.asarray(values, dtype=np.float64)) * 1000.0
        if values.size:
            ax.plot(values, np.arange(1, values.size + 1) / values.size)
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of gaps" if name == "ITL" else "fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{stem}: latency CDFs (measured by the client)")
    fig.tight_layout()
    cdf = out_dir / f"{stem}_cdf.png"
    fig.savefig(cdf, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.2))
    sent = [r["sent_s"] for r in ok]
    ax.scatter(sent, [r["e2el_s"] for r in ok], s=8, label="e2e")
    ax.scatter(sent, [r["ttft_s"] for r in ok], s=8, label="TTFT")
    ax.set_xlabel("sent at (s from start)")
    ax.set_ylabel("latency (s)")
    ax.set_title(f"{stem}: e2e latency and TTFT by send time (measured by the client)", fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    timeline = out_dir / f"{stem}_timeline.png"
    fig.savefig(timeline, dpi=110)
    plt.close(fig)
    return [cdf, timeline]
