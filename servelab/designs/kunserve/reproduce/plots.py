"""Plots of the KunServe reproduction (Figs. 12-16); matplotlib only here, Agg backend."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from servelab.reproduce.notes import DEFAULT_COST_MODEL_SHORT
from servelab.reproduce.plots import pyplot, save

plt = pyplot()

SIM_NOTE = f"simulated: {DEFAULT_COST_MODEL_SHORT}; Qwen-2.5-14B on A800-80GB (cluster A), Qwen-2.5-72B TP4 on H800 (cluster B)"
COLORS = {"vllm": "tab:blue", "vllm-pp": "tab:purple", "infercept": "tab:green", "llumnix": "tab:orange",
          "kunserve": "tab:red", "kunserve w/o restore": "tab:gray"}


_save = partial(save, note=SIM_NOTE, dpi=100, note_y=0.005, rect=(0, 0.02, 1, 1))


def _marks(ax, events) -> None:
    for t, kind, _ in events:
        if kind == "form":
            ax.axvline(t, color="red", lw=0.6, ls="--")
        elif kind == "split":
            ax.axvline(t, color="green", lw=0.6, ls=":")


def all_figures(results: dict, out: Path) -> list[str]:
    names = []
    for key, e in results["end_to_end"].items():
        names.append(timelines(key, e, out))
    names.append(slo_curves(results["end_to_end"], out))
    names.append(restore(results["restore"], out))
    names.append(extreme(results["extreme"], out))
    return names


def timelines(key: str, e: dict, out: Path) -> str:
    fig, axes = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
    kun = e["runs"]["kunserve"]
    for name, r in e["runs"].items():
        if "memory" in r:
            m = r["memory"]
            style = "-" if name == "kunserve" else ":"
            axes[0].plot(m["t"], m["demand_gb"], style, color=COLORS.get(name), lw=0.8, label=f"{name} KV demand")
            axes[0].plot(m["t"], m["kv_capacity_gb"], style, color="black" if name == "kunserve" else "gray", lw=0.8,
                         label=f"{name} KV capacity")
        tl = r["timeline"]
        axes[1].plot(tl["t"], [v if v is not None else float("nan") for v in tl["mean_ttft_s"]],
                     color=COLORS.get(name), lw=0.8, label=name)
        axes[2].plot(tl["t"], tl["throughput_tok_s"], color=COLORS.get(name), lw=0.8, label=name)
    for ax in axes:
        _marks(ax, kun["events"])
    axes[0].set_ylabel("GB (cluster)")
    axes[1].set_ylabel("mean TTFT (s)")
    axes[1].set_yscale("log")
    axes[2].set_ylabel("output tok/s")
    axes[2].set_xlabel("time (s); red dashes: drop, green dots: restore done")
    axes[0].legend(fontsize=6)
    axes[1].legend(fontsize=6)
    axes[0].set_title(f"Fig. 12: {key}, {e['rate']:.2f} req/s base")
    return _save(fig, out / f"fig12_{key}.png")


def slo_curves(e2e: dict, out: Path) -> str:
    fig, axes = plt.subplots(1, len(e2e), figsize=(3.2 * len(e2e), 3), squeeze=False)
    for ax, (key, e) in zip(axes[0], e2e.items()):
        s = e["slo"]
        for name, v in s["violation"].items():
            ax.plot(s["scales"], v, marker=".", color=COLORS.get(name), label=name)
        ax.axvline(e["typical_scale"], color="gray", ls=":")
        ax.set_title(key, fontsize=8)
        ax.set_xlabel("SLO scale (x best baseline P50)")
    axes[0][0].set_ylabel("SLO violation (share)")
    axes[0][0].legend(fontsize=6)
    return _save(fig, out / "fig13_slo.png")


def restore(r: dict, out: Path) -> str:
    fig, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for name, run in r["runs"].items():
        tl = run["timeline"]
        axes[0].plot(tl["t"], [v if v is not None else float("nan") for v in tl["mean_ttft_s"]],
                     color=COLORS.get(name), lw=0.8, label=name)
        if "memory" in run and name != "vllm":
            axes[1].plot(run["memory"]["t"], run["memory"]["kv_capacity_gb"], color=COLORS.get(name), lw=0.8,
                         label=f"{name} KV capacity")
    _marks(axes[0], r["runs"]["kunserve"]["events"])
    axes[0].set_yscale("log")
    axes[0].set_ylabel("mean TTFT (s)")
    axes[1].set_ylabel("KV capacity (GB)")
    axes[1].set_xlabel("time (s)")
    axes[0].legend(fontsize=6)
    axes[1].legend(fontsize=6)
    axes[0].set_title("Fig. 15: two bursts, with and without restore")
    return _save(fig, out / "fig15_restore.png")


def extreme(r: dict, out: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, run in r["runs"].items():
        m = run["memory"]
        ax.plot(m["t"], m["demand_gb"], color=COLORS.get(name), lw=0.8, label=f"{name} KV demand")
        ax.plot(m["t"], m["kv_capacity_gb"], color=COLORS.get(name), lw=0.8, ls="--", label=f"{name} KV capacity")
    ax.axvspan(r["burst_from_s"], r["burst_to_s"], color="gray", alpha=0.15)
    ax.set_xlabel("time (s); shaded: repeated bursts")
    ax.set_ylabel("GB (cluster)")
    ax.legend(fontsize=6)
    ax.set_title("Fig. 16: extreme bursts, Qwen-2.5-72B")
    return _save(fig, out / "fig16_extreme.png")
