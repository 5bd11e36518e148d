"""``servelab reproduce multibin``: every Multi-Bin Batching figure, its plot and one markdown report.

The steps run the experiments of ``experiments`` (full paper sizes, or a reduced size that
finishes in well under a minute) and draw the plots under ``out_dir/multibin/``; ``_write``
writes ``out_dir/multibin.md``; the runner (``servelab.reproduce``) times every step (CPU),
shows progress and writes ``out_dir/multibin.json``. Options (Python callers and tests):
``gsm8k_path`` (default: the shared data folder) and ``model`` (the linear service model).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from servelab.core.request import RequestSpec
from servelab.designs.multibin.binning import quantile_edges
from servelab.designs.multibin.reproduce import experiments as ex
from servelab.designs.multibin.reproduce import plots as plots
from servelab.designs.multibin.reproduce import readme
from servelab.designs.multibin.reproduce.report import write_report
from servelab.designs.multibin.service_models import DEFAULT_LINEAR, LinearServiceModel
from servelab.designs.multibin.theory import analyze
from servelab.paths import gsm8k_path
from servelab.reproduce.runner import ReadmeHooks, Reproduction, Run, Step

GSM8K_PATH = gsm8k_path()


@dataclass(frozen=True)
class Sizes:
    fig3_requests: int = 128_000
    fig3_seeds: int = 10
    fig4_requests: int = 128_000
    fig4_seeds: int = 10
    fig8_requests: int = 200_000
    fig8_seeds: int = 10
    fig6_requests: int = 20_000
    fig6_seeds: int = 5
    fig7_token_requests: int | None = None  # None: every GSM8K request
    crosscheck_requests: int = 600


FULL = Sizes()
REDUCED = Sizes(12_800, 2, 12_800, 2, 20_000, 2, 3_000, 1, 800, 300)


def _gsm8k_path(run: Run) -> Path:
    path = run.options.get("gsm8k_path")
    return Path(path) if path is not None else GSM8K_PATH


def _model(run: Run) -> LinearServiceModel:
    return run.options.get("model") or DEFAULT_LINEAR


def _start(run: Run) -> None:
    path = _gsm8k_path(run)
    if not path.is_file():
        raise FileNotFoundError(f"GSM8K not found at {path}; pass gsm8k_path=... (the shared data folder)")
    run.results.update({"reduced": run.reduced, "seed": run.seed, "sizes": asdict(run.sizes), "model": _model(run)})


def _steps(run: Run) -> list[Step]:
    sizes, seed, r, model = run.sizes, run.seed, run.results, _model(run)
    seeds = lambda n: range(seed, seed + n)  # noqa: E731
    data: dict = {}

    def theory(_: Run) -> None:
        r["theory_uniform"] = analyze("uniform", batch_size=128, k_max=8, eps=0.5, arrival_rate=1.0)
        r["theory_exp"] = analyze("exponential", mu=0.1, batch_size=200, k_max=8, arrival_rate=2.0)

    def load(_: Run) -> None:
        table = data["table"] = _load_gsm8k(_gsm8k_path(run))
        r["gsm8k"] = {"num_requests": len(table.num_output_tokens),
                      "mean_output": float(table.num_output_tokens.mean()),
                      "max_output": int(table.num_output_tokens.max())}

    def figure7(_: Run) -> dict:
        out = ex.figure7(data["table"].num_output_tokens, model, seed=seed,
                         token_level_requests=sizes.fig7_token_requests, estimates=r["estimators"]["out_of_fold"])
        out["num_all"] = len(data["table"].num_output_tokens)
        return out

    return [
        Step("theory", theory),
        Step("figure 3", lambda _: ex.figure3(num_requests=sizes.fig3_requests, seeds=seeds(sizes.fig3_seeds)), "fig3"),
        Step("figure 4", lambda _: ex.figure4(num_requests=sizes.fig4_requests, seeds=seeds(sizes.fig4_seeds)), "fig4"),
        Step("figure 8", lambda _: ex.figure8(num_requests=sizes.fig8_requests, seeds=seeds(sizes.fig8_seeds)), "fig8"),
        Step("GSM8K load + BPE tokenise", load),
        Step("length estimators", lambda _: _estimators(data["table"], seed), "estimators"),
        Step("figure 6", lambda _: ex.figure6(data["table"].num_output_tokens, model,
                                              num_requests=sizes.fig6_requests, seeds=seeds(sizes.fig6_seeds)), "fig6"),
        Step("figure 7", figure7, "fig7"),
        Step("token-level cross-check", lambda _: ex.crosscheck_token_level(num_requests=sizes.crosscheck_requests,
                                                                           seed=seed), "crosscheck"),
        Step("plots", lambda _: _plots(r, run.fig_dir(), run.reduced), "plots"),
    ]


def _write(run: Run) -> dict:
    write_report(run.results, run.report_path)
    return run.results


REPRODUCTION = Reproduction("multibin", {"full": FULL, "reduced": REDUCED}, _steps, _write, start=_start,
                            json_name="{stem}.json",
                            readme=ReadmeHooks(readme.summarize, readme.explain, readme.notes))


def _load_gsm8k(path: Path):
    from servelab.workloads import parsed_files

    return parsed_files.length_dataset("gsm8k", path)  # parsed once per process (also by gsm8k specs)


def _estimators(table, seed: int) -> dict:
    """Held-out accuracy of the estimators on GSM8K, and 5-fold out-of-fold predictions for Figure 7."""
    from servelab.estimators import evaluate, make_estimator, split

    specs = [RequestSpec(i, 0.0, int(p), int(o), prompt_text=t) for i, (p, o, t) in
             enumerate(zip(table.num_prompt_tokens, table.num_output_tokens, table.prompt_texts))]
    train, test = split(specs, 0.2, np.random.default_rng(seed))
    train_out = [s.num_output_tokens for s in train]
    reports = {}
    for name, params in (("ridge", {}), ("noisy", {"mode": "multiplicative", "scale": 0.3, "seed": seed}),
                         ("oracle", {})):
        est = make_estimator(name, **params).fit(train)
        reports[name] = {k: evaluate(est, test, quantile_edges(train_out, k)) for k in (2, 4, 8)}
    baseline = _Constant(int(np.median(train_out)))
    reports["train median"] = {k: evaluate(baseline, test, quantile_edges(train_out, k)) for k in (2, 4, 8)}
    folds = np.random.default_rng(seed).permutation(len(specs)) % 5
    oof = np.zeros(len(specs), dtype=np.int64)
    for f in range(5):
        est = make_estimator("ridge").fit([s for s, g in zip(specs, folds) if g != f])
        idx = np.flatnonzero(folds == f)
        oof[idx] = est.predict_many([specs[i] for i in idx])
    noisy = make_estimator("noisy", mode="multiplicative", scale=0.3, seed=seed).predict_many(specs)
    return {"reports": reports, "num_train": len(train), "num_test": len(test),
            "out_of_fold": {"ridge (5-fold)": oof, "noisy ×e^N(0,0.3)": noisy}}


class _Constant:
    """Baseline predictor: the training median for everyone."""

    def __init__(self, value: int) -> None:
        self.value = value

    def predict_many(self, specs) -> np.ndarray:
        return np.full(len(specs), self.value, dtype=np.int64)


def _plots(r: dict, fig_dir: Path, reduced: bool) -> dict:
    sub = "simulated (batch-level queue sim, no cost model)" + (" — reduced size" if reduced else "")
    lin = r["model"]
    sub6 = f"simulated: linear model {lin.intercept_s}s + {lin.per_token_s}s/token (placeholder for Fig. 5 fit)"
    return {
        "fig3": plots.plot_figure3(r["fig3"], fig_dir / "fig3_throughput_uniform.png", sub),
        "fig4": plots.plot_figure4(r["fig4"], fig_dir / "fig4_latency_uniform.png", sub),
        "fig8_rate": plots.plot_rate_panels(r["fig8"]["sweep"], fig_dir / "fig8_exponential_vs_rate.png",
                                            f"Fig. 8: Exp(μ=0.1), B=200 vs λ — {sub}", lat_ylim=1e4,
                                            unit="unit time"),
        "fig8_k": plots.plot_figure8_vs_k(r["fig8"], fig_dir / "fig8_exponential_vs_k.png", sub),
        "fig6": plots.plot_rate_panels(r["fig6"]["sweep"], fig_dir / "fig6_gsm8k_8servers.png",
                                       f"Fig. 6: GSM8K, B=8, 8 servers, oracle bins — {sub6}", lat_ylim=300),
        "fig7": plots.plot_figure7(r["fig7"], fig_dir / "fig7_gsm8k_burst.png", sub6),
    }
