"""Plots for ``servelab reproduce multibin`` (matplotlib, Agg backend, imported only when plotting)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servelab.reproduce.plots import pyplot, save


def plot_figure3(res: dict, path: Path, subtitle: str) -> str:
    plt = pyplot()
    sweep = res["sweep"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, k in enumerate(sweep.ks):
        line, = ax.plot(sweep.rates, sweep.throughput[i], "o-", ms=3, label=f"k={k} simulated")
        ax.axhline(res["theory"][i], color=line.get_color(), ls="--", lw=0.8)
    ax.axhline(res["c_max"], color="k", ls=":", lw=1, label="c_max (Eq. 5)")
    ax.set(xlabel="arrival rate λ (requests / unit time)", ylabel="throughput (requests / unit time)",
           title=f"Fig. 3: U(1,20), B=128; dashed = Theorem 4.2\n{subtitle}")
    ax.legend(fontsize=7)
    return save(fig, path)


def plot_figure4(res: dict, path: Path, subtitle: str) -> str:
    plt = pyplot()
    one, inf = res["one_server"], res["infinite"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, k in enumerate(one.ks):
        line, = ax.plot(one.rates, one.latency[i], "o-", ms=3, label=f"k={k} simulated, 1 server")
        ax.plot(inf.rates, inf.latency[i], "x", color=line.get_color(), label=f"k={k} simulated, ∞ servers")
        ax.plot(one.rates, res["theory"][i], "--", color=line.get_color(), lw=0.8, label=f"k={k} Lemma 5.1")
    ax.set(xlabel="arrival rate λ (requests / unit time)", ylabel="mean latency (unit time)", yscale="log",
           title=f"Fig. 4: latency vs λ, U(1,20), B=128\n{subtitle}")
    ax.legend(fontsize=6, ncol=2)
    return save(fig, path)


def plot_rate_panels(sweep, path: Path, title: str, *, lat_ylim: float | None = None, unit: str = "s") -> str:
    """Throughput and latency against the arrival rate; ``unit`` is the time unit of the
    service times (seconds for GSM8K's linear model, the queue model's unit time for Fig. 8)."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for i, k in enumerate(sweep.ks):
        a.plot(sweep.rates, sweep.throughput[i], "o-", ms=3, label=f"k={k}")
        b.plot(sweep.rates, sweep.latency[i], "o-", ms=3, label=f"k={k}")
    a.set(xlabel=f"arrival rate λ (requests / {unit})", ylabel=f"throughput (requests / {unit})", title="throughput")
    b.set(xlabel=f"arrival rate λ (requests / {unit})", ylabel=f"mean latency ({unit})", title="latency",
          yscale="log")
    if lat_ylim:
        b.set_ylim(top=lat_ylim)
    a.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    return save(fig, path)


def plot_figure8_vs_k(res: dict, path: Path, subtitle: str) -> str:
    plt = pyplot()
    sweep = res["sweep"]
    ks = np.array(sweep.ks)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(ks, res["saturated"], "o-", label="simulated (saturated)")
    a.plot(ks, res["exact"], "s--", label="B / E[service] (Eq. 2, numeric)")
    a.plot(ks, res["bound"], "^:", label="Corollary A.1.1 lower bound")
    a.set(xlabel="bins k", ylabel="throughput (requests / unit time)", title="saturated throughput vs k")
    a.legend(fontsize=7)
    for ri, rate in enumerate(sweep.rates):
        if rate in (2, 4, 6, 8):
            b.plot(ks, sweep.latency[:, ri], "o-", ms=3, label=f"λ={rate}")
    b.set(xlabel="bins k", ylabel="mean latency (unit time)", yscale="log", title="latency vs k")
    b.legend(fontsize=7)
    fig.suptitle(f"Fig. 8: Exp(μ=0.1), B=200, Lemma A.1 boundaries\n{subtitle}", fontsize=9)
    return save(fig, path)


def plot_figure7(res: dict, path: Path, subtitle: str) -> str:
    plt = pyplot()
    ks = np.array(res["ks"])
    x = np.arange(len(ks))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(x - 0.3, res["fast"], 0.2, label=f"queue sim, all {res['num_all']} requests")
    ax.bar(x - 0.1, res["token_level"], 0.2, label=f"token-level sim, {res['num_token_level']} requests")
    for j, (name, values) in enumerate(res["estimated"].items()):
        ax.bar(x + 0.1 + 0.2 * j, values, 0.2, label=f"queue sim, {name} lengths")
    ax.axhline(res["fast"][0] * 1.7, color="k", ls=":", lw=1, label="paper: k=1 × 1.70 at k=32")
    ax.set_xticks(x, [str(k) for k in ks])
    ax.set(xlabel="bins k", ylabel="output tokens / s",
           title=f"Fig. 7: GSM8K, all at t=0, 1 server, B=8\n{subtitle}")
    ax.set_ylim(0, 1.35 * max(res["fast"][0] * 1.7, float(np.max(res["fast"]))))
    ax.legend(fontsize=6, loc="upper left", ncol=2)
    return save(fig, path)
