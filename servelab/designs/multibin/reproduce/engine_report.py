"""Markdown report and plot for ``multibin_engine`` (Figures 5 and 7 measured on our engine).

``write_engine_report(out_dir, result)`` writes ``out_dir/multibin_engine.md`` and
``out_dir/multibin/fig5_fig7_engine.png`` from the results of ``servelab reproduce multibin-engine``
(``engine_run``); ``summary_json`` is what its ``multibin_engine.json`` holds.
Every number is labelled measured (engine wall clock) or simulated (which simulator, which
cost model).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servelab.designs.multibin.reproduce.engine_summary import PAPER_FIG7_GAIN


def gain(rows: list[dict], key: str) -> float:
    """Throughput of the largest k over the smallest k, minus one."""
    return rows[-1][key] / rows[0][key] - 1.0


def _fig5_lines(r: dict) -> list[str]:
    f5 = r["fig5"]
    m = f5["fit"].model
    tokens = np.asarray(f5["tokens"])
    times = np.asarray(f5["times_s"])
    lines = ["## Figure 5: batch service time vs output tokens (measured)", "",
             f"One padded batch of {r['batch_size']} GSM8K prompts (prompt tokens "
             f"{', '.join(map(str, f5['batch_prompt_tokens']))}), every output forced to n tokens with EOS ignored, "
             f"policy `multibin` with one bin; time = the engine run's wall clock (one warm-up batch first).", "",
             "| n (output tokens) | measured batch time (s), each run | fitted (s) |", "|---|---|---|"]
    for n in sorted(set(tokens.tolist())):
        runs = times[tokens == n]
        lines.append(f"| {n} | {', '.join(f'{t:.3f}' for t in runs)} | {float(m.request_time_s(n)):.3f} |")
    lines += ["", f"Fitted line: **time = {m.intercept_s * 1e3:.1f} ms + {m.per_token_s * 1e3:.2f} ms x n** "
              f"(R² = {f5['fit'].r2:.5f}, {f5['fit'].num_points} points; mean |relative error| "
              f"{f5['mean_abs_rel_error']:.2%}, max {f5['max_abs_rel_error']:.2%}). "
              f"intercept / per-token = {m.intercept_s / m.per_token_s:.1f} tokens "
              f"(the placeholder `DEFAULT_LINEAR` has 2.0).", ""]
    return lines


def _fig7_lines(r: dict) -> list[str]:
    rows = r["fig7"]
    lines = ["## Figure 7 (reduced): all requests at t = 0, one instance, B = "
             f"{r['batch_size']}, oracle bins", "",
             f"{r['num_requests']} GSM8K train requests (seeded sample, seed {r['seed']}), output = reference answer "
             f"length in the checkpoint tokenizer's tokens, capped at {r['max_tokens']} (mean "
             f"{r['mean_output_tokens']:.1f}, max {r['max_output_tokens']}, total {r['total_output_tokens']} tokens). "
             "Bins: equal-mass quantiles of these lengths (ties on whole token counts make some bins unequal, hence "
             "partial batches). Simulated columns: the fitted Figure 5 line in the token-level simulator (`multibin` "
             "policy, `LinearStepCost`) and in the queue simulator (`simulate_batches`), and the token-level simulator "
             "with this machine's calibrated per-step `LinearCostModel` (which, unlike the line, charges per row and "
             "per context token).", "",
             "| k | batches (partial) | engine req/s (measured) | engine tok/s (measured) | gain vs k=1 | engine time (s) "
             "| padding waste | token-level sim, line (tok/s) | gain | queue sim, line (tok/s) | gain "
             "| token-level sim, calibrated (tok/s) | gain |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base = rows[0]
    for row in rows:
        lines.append(
            f"| {row['k']} | {row['num_batches']} ({row['num_partial']}) | {row['engine_req_s']:.3f} | "
            f"{row['engine_tok_s']:.1f} | {row['engine_tok_s'] / base['engine_tok_s'] - 1:+.1%} | "
            f"{row['engine_duration_s']:.1f} | {row['padding_waste']:.0%} | " + _pair(row, base, "token_sim_tok_s")
            + _pair(row, base, "queue_sim_tok_s") + _pair(row, base, "calibrated_sim_tok_s"))
    k_lo, k_hi = rows[0]["k"], rows[-1]["k"]
    calibrated = (f", token-level simulator with the calibrated step costs {gain(rows, 'calibrated_sim_tok_s'):+.1%}"
                  if base["calibrated_sim_tok_s"] is not None else "")
    best = max(rows, key=lambda row: row["engine_tok_s"])
    lines += ["", f"k={k_lo} -> k={k_hi}: measured {gain(rows, 'engine_tok_s'):+.1%}, token-level simulator "
              f"{gain(rows, 'token_sim_tok_s'):+.1%}, queue simulator {gain(rows, 'queue_sim_tok_s'):+.1%}"
              f"{calibrated}; best measured k={best['k']} "
              f"({best['engine_tok_s'] / base['engine_tok_s'] - 1:+.1%}). Paper: k=1 -> k=32 +{PAPER_FIG7_GAIN:.0%} "
              "(all 7473 requests, Phi-3.5-mini on an A100).", ""]
    full = r["full_size_line"]
    lines += [f"For scale: the queue simulator with the measured line on all {full['num_requests']} GSM8K requests "
              "(the paper's size, same tokenizer) gives " + ", ".join(
                  f"k={k} {t / full['tok_s'][0] - 1:+.1%}" for k, t in zip(full["ks"][1:], full["tok_s"][1:]))
              + " over k=1 (simulated).", ""]
    cal = r.get("calibrated")
    if cal:
        lines += [f"Calibrated step cost (`servelab calibrate` default grid, {r['calibration_wall_s']:.0f} s; fit "
                  f"{cal['fit_error']}): c_step {cal['c_step_s'] * 1e3:.1f} ms, c_token {cal['c_token_s'] * 1e3:.2f} ms, "
                  f"c_row {cal['c_row_s'] * 1e3:.2f} ms, c_decode_ctx {cal['c_decode_ctx_s'] * 1e6:.2f} us, "
                  f"c_prefill_attn {cal['c_prefill_attn_s'] * 1e6:.2f} us.", ""]
    return lines


def _pair(row: dict, base: dict, key: str) -> str:
    if row[key] is None:
        return "- | - |"
    return f" {row[key]:.1f} | {row[key] / base[key] - 1:+.1%} |"


def format_engine_report(r: dict) -> str:
    head = ["# Multi-Bin Batching on our engine: Figures 5 and 7 (measured)", "",
            f"Made by `{r['command']}` (Python: `servelab.designs.multibin.reproduce.engine_run`).", "",
            f"**Measured on our PyTorch engine on CPU ({r['threads']} torch thread, shared machine) with a "
            f"random-weight {r['num_params'] / 1e6:.1f}M-parameter checkpoint ({r['model']}), not Phi-3.5-mini on "
            "an A100.** Absolute times say nothing about the paper's; only the shape of the line and gains between k "
            "values compare. Wall time: Figure 5 "
            f"{r['fig5_wall_s']:.0f} s, Figure 7 {r['fig7_wall_s']:.0f} s.", "",
            "![engine](multibin/fig5_fig7_engine.png)", ""]
    return "\n".join(head + _fig5_lines(r) + _fig7_lines(r))


def plot_engine(r: dict, path: Path) -> None:
    from servelab.reproduce.plots import pyplot, save

    fig, (a, b) = pyplot().subplots(1, 2, figsize=(10, 4))
    f5, m = r["fig5"], r["fig5"]["fit"].model
    a.scatter(f5["tokens"], f5["times_s"], label="measured")
    xs = np.linspace(0, max(f5["tokens"]), 50)
    a.plot(xs, m.request_time_s(xs), label=f"fit {m.intercept_s * 1e3:.0f} ms + {m.per_token_s * 1e3:.1f} ms/tok")
    a.set(xlabel="output tokens per request (batch of 8)", ylabel="batch time (s)", title="Fig. 5 on our engine")
    a.legend()
    ks = [row["k"] for row in r["fig7"]]
    for key, label in (("engine_tok_s", "engine (measured)"), ("token_sim_tok_s", "sims, fitted line"),
                       ("calibrated_sim_tok_s", "token-level sim, calibrated")):
        if r["fig7"][0][key] is None:
            continue
        b.plot(ks, [row[key] for row in r["fig7"]], marker="o", label=label)
    b.set(xscale="log", xlabel="k (bins)", ylabel="output tokens/s", title=f"Fig. 7, {r['num_requests']} requests")
    b.set_xticks(ks, [str(k) for k in ks])
    b.legend()
    save(fig, path, dpi=110)


def summary_json(r: dict) -> dict:
    """The numbers ``multibin_report`` quotes in ``multibin.md`` (read back from ``multibin_engine.json``)."""
    m, f5 = r["fig5"]["fit"].model, r["fig5"]
    keys = ("k", "engine_tok_s", "engine_req_s", "token_sim_tok_s", "queue_sim_tok_s", "calibrated_sim_tok_s",
            "num_batches", "num_partial")
    return {"command": r["command"], "model": r["model"], "num_params": r["num_params"], "threads": r["threads"],
            "num_requests": r["num_requests"], "seed": r["seed"], "batch_size": r["batch_size"],
            "fit": {"intercept_s": m.intercept_s, "per_token_s": m.per_token_s, "r2": f5["fit"].r2,
                    "num_points": f5["fit"].num_points, "tokens": sorted(set(f5["tokens"])),
                    "mean_abs_rel_error": f5["mean_abs_rel_error"], "max_abs_rel_error": f5["max_abs_rel_error"]},
            "fig7": [{k: row[k] for k in keys} for row in r["fig7"]], "full_size_line": r["full_size_line"],
            "reduced": r.get("reduced", False), "timings_cpu_s": r.get("timings_cpu_s", {})}  # the next run's ETA


def write_engine_report(out_dir: Path, result: dict) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_engine(result, out_dir / "multibin" / "fig5_fig7_engine.png")
    path = out_dir / "multibin_engine.md"
    path.write_text(format_engine_report(result) + "\n", encoding="utf-8")
    return path
