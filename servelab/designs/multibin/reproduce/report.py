"""Markdown report of ``servelab reproduce multibin``: paper numbers beside ours, a sentence on every gap."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servelab.designs.multibin.theory import format_analysis
from servelab.designs.multibin.reproduce.engine_summary import (engine_note, engine_rows, engine_section, fitted_note,
                                                        load_engine_summary)


def _pct(x: float) -> str:
    return f"{100 * x:+.2f} %"


def write_report(r: dict, path: Path) -> None:
    """Write ``multibin.md``; the engine section quotes ``multibin_engine.json`` beside it when that exists
    (written by ``servelab reproduce multibin-engine``, which needs torch and minutes of CPU)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = load_engine_summary(path.parent / "multibin_engine.json")
    parts = [_header(r, engine), _summary(r, engine), _fig3(r), _fig4(r), _fig8(r), _fig6(r), _fig7(r),
             engine_section(engine), _estimators(r), _crosscheck(r), _theory(r), _timings(r)]
    path.write_text("\n\n".join(p for p in parts if p) + "\n")


def _header(r: dict, engine: dict | None) -> str:
    m = r["model"]
    size = "REDUCED size (smoke test; not the paper's sizes)" if r["reduced"] else "full paper sizes"
    cmd = "servelab reproduce multibin" + (" --reduced" if r["reduced"] else "") + f" --seed {r['seed']}"
    return f"""# Multi-Bin Batching: reproduction

Paper: *Multi-Bin Batching for Increasing LLM Inference Throughput* (Guldogan et al.), `../shared/papers/multibin.md`.
Made by `{cmd}` (Python: `servelab.reproduce.runner.run_reproduction` with `servelab.designs.multibin.reproduce.run.REPRODUCTION`), {size}, seed {r['seed']}.
**Everything here is simulated; nothing is measured on a GPU.**{" Only the section *Figure 5 and Figure 7 on our engine (measured)* is measured, on our CPU engine." if engine else ""}

* Figures 3, 4, 8: batch-level queue simulator (`servelab/designs/multibin/queue_sim.py`): service times drawn directly from
  U(1, 20) or Exp(0.1), no model, no tokens, one server (Fig. 4 also infinite servers), Poisson arrivals.
* Figures 6, 7: GSM8K train split ({r['gsm8k']['num_requests']} requests); output length = reference answer tokenised
  with a byte-level BPE (8,000 tokens) trained on GSM8K itself (`servelab.workloads.datasets.load_gsm8k`; no model
  tokenizer can be downloaded): mean {r['gsm8k']['mean_output']:.1f}, max {r['gsm8k']['max_output']} tokens.
  Service time = linear model {m.intercept_s} s + {m.per_token_s} s/token. **The paper's fitted line (Fig. 5, Phi-3.5-mini
  on A100) is not in our copy of the text, so these two numbers are placeholders** (`DEFAULT_LINEAR`); gains between
  k values depend only on their ratio.{fitted_note(engine)}
* Figure 7 also runs on the token-level simulator (`servelab.simulator`, policy `multibin`, padded batches, cost
  model `LinearStepCost`: constant prefill and decode step times, so it is the same linear model, GPU-independent).
  The paper's Fig. 7 is a real Phi-3.5-mini run on an A100; {engine_note(engine)}
* Bins: equal-probability-mass boundaries (Eq. 3 for the uniform case, empirical quantiles of the lengths for
  GSM8K, Lemma A.1 for the exponential case). Oracle lengths unless stated.
* Values missing from the paper text that we chose: the arrival-rate grids (the plots' x-axes were lost), N = 200,000
  requests for Fig. 8 (stated in the appendix), GSM8K runs with 20,000 requests resampled from the 7,473 (Fig. 6;
  the paper does not state N), the saturation rate used for the 1 % check (5 x c_max; 3 x c_max for Fig. 8),
  the linear model above, and a 1 us max-wait so the last partial batches of the burst (Fig. 7) are served."""


def _summary(r: dict, engine: dict | None) -> str:
    f3, f8, f7 = r["fig3"], r["fig8"], r["fig7"]
    ks = list(f7["ks"])
    gain_fast = f7["fast"][-1] / f7["fast"][0] - 1
    gain_tok = f7["token_level"][-1] / f7["token_level"][0] - 1
    worst3 = float(np.max(np.abs(f3["rel_err"])))
    lat_k = r["fig6"]["sweep"]
    min_lat = lat_k.latency.min(axis=1)
    rows = [
        ("Fig. 3: c_max = B / E[l], U(1,20), B=128", "≈ 12.3", f"{f3['c_max']:.3f}",
         "the paper rounds up; 128 / 10.5 = 12.19"),
        ("Fig. 3: saturated throughput = Theorem 4.2 (k=1..5)", "agrees (plot)",
         f"max error {100 * worst3:.2f} % (need < 1 %)",
         "reached" if worst3 < 0.01 else "NOT reached: see Fig. 3 section"),
        ("Fig. 3: k=5 throughput", "\"close to c_max\"", f"{f3['saturated'][-1]:.2f} = "
         f"{100 * f3['saturated'][-1] / f3['c_max']:.0f} % of c_max",
         "Theorem 4.2 itself gives 85 % of c_max at k=5; \"close\" is the paper's word"),
        ("Fig. 4: Lemma 5.1 at low load", "good approximation", "see table (infinite servers: exact)", "-"),
        ("Fig. 8: latency vs k first falls then rises", "yes", _fig8_shape(r), "-"),
        ("Fig. 6: min latency for k in {2,4} below k=1", "yes",
         f"min latency k=1 {min_lat[0]:.2f} s, k=2 {min_lat[1]:.2f} s, k=4 {min_lat[2]:.2f} s",
         "reached" if min(min_lat[1], min_lat[2]) < min_lat[0] else "not reached"),
        (f"Fig. 7: throughput k={ks[-1]} vs k=1", "+70 % (real A100 run)", f"{_pct(gain_fast)} (queue sim, all), "
         f"{_pct(gain_tok)} (token-level, {f7['num_token_level']} req.)", _fig7_gap(gain_fast)),
        ("Abstract: up to +75 % on GSM8K, oracle", "+75 %", f"{_pct(gain_fast)} at k={ks[-1]}", _fig7_gap(gain_fast)),
    ]
    rows += engine_rows(engine)
    lines = ["## Paper vs ours", "", "| claim | paper | ours | gap |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def _fig7_gap(gain: float) -> str:
    if gain >= 0.70:
        return "reached"
    return ("not reached: our GSM8K lengths are the reference answers (mean ~94 BPE tokens, right-skewed), "
            "not Phi-3.5's generations, which are longer and more spread; a larger spread gives binning more to "
            "gain (B/E[max of 8] vs B/E[l]), and a real engine's per-batch fixed cost differs from our placeholder")


def _fig8_shape(r: dict) -> str:
    """Where latency vs k has an interior minimum (falls, then rises)."""
    sweep = r["fig8"]["sweep"]
    best = [sweep.ks[int(np.argmin(sweep.latency[:, j]))] for j in range(len(sweep.rates))]
    interior = [f"λ={rate}: best k={k}" for rate, k in zip(sweep.rates, best) if sweep.ks[0] < k < sweep.ks[-1]]
    listing = ", ".join(f"λ={rate}→k={k}" for rate, k in zip(sweep.rates, best))
    verdict = "falls then rises at " + "; ".join(interior) if interior else "no interior minimum on our grid"
    return f"{verdict} (latency-minimising k per rate: {listing})"


def _fig3(r: dict) -> str:
    f = r["fig3"]
    lines = ["## Figure 3: throughput vs arrival rate, U(1,20), B=128", "",
             f"![fig3](multibin/{r['plots']['fig3']})", "",
             f"Saturated runs at λ = {f['saturation_rate']:.1f} (5 x c_max), mean of {r['sizes']['fig3_seeds']} seeds, "
             f"{r['sizes']['fig3_requests']} requests each. Throughput = requests / (last completion - first arrival), "
             "as in the paper; the last column is B / mean service time of full batches only.", "",
             "| k | Theorem 4.2 | simulated | error | std over seeds | full batches only |", "|---|---|---|---|---|---|"]
    for i, k in enumerate(f["sweep"].ks):
        lines.append(f"| {k} | {f['theory'][i]:.4f} | {f['saturated'][i]:.4f} | {_pct(f['rel_err'][i])} | "
                     f"{f['saturated_std'][i]:.4f} | {f['full_batch'][i]:.4f} |")
    lines.append("\nThe small negative bias is the end of the trace: the last partial batch of each bin costs a "
                 "full batch's time for fewer requests, and the first batch waits to fill.")
    return "\n".join(lines)


def _fig4(r: dict) -> str:
    f = r["fig4"]
    one, inf = f["one_server"], f["infinite"]
    lines = ["## Figure 4: latency vs arrival rate, U(1,20), B=128", "", f"![fig4](multibin/{r['plots']['fig4']})", "",
             "| k | λ | Lemma 5.1 | simulated, ∞ servers | simulated, 1 server |", "|---|---|---|---|---|"]
    for i, k in enumerate(one.ks):
        for j, rate in enumerate(one.rates):
            lines.append(f"| {k} | {rate} | {f['theory'][i, j]:.2f} | {inf.latency[i, j]:.2f} | {one.latency[i, j]:.2f} |")
    lines.append("\nWith infinite servers (Assumption 5.1) the simulation matches Lemma 5.1 up to noise; with one server "
                 "it is a lower bound that is tight at low load and fails once λ approaches Throughput_k, where the "
                 "queue grows for the whole trace (latency then depends on N, so it is not a steady-state number).")
    return "\n".join(lines)


def _fig8(r: dict) -> str:
    f = r["fig8"]
    lines = ["## Figure 8: exponential service, μ = 0.1, B = 200", "",
             f"![fig8 rate](multibin/{r['plots']['fig8_rate']})", f"![fig8 k](multibin/{r['plots']['fig8_k']})", "",
             "| k | Corollary A.1.1 (lower bound) | B / E[service], Eq. 2 numeric | simulated (saturated) | "
             "sim vs numeric | full batches only |", "|---|---|---|---|---|---|"]
    for i, k in enumerate(f["sweep"].ks):
        lines.append(f"| {k} | {f['bound'][i]:.3f} | {f['exact'][i]:.3f} | {f['saturated'][i]:.3f} | "
                     f"{_pct(f['rel_err_exact'][i])} | {f['full_batch'][i]:.3f} |")
    lines.append("\nThe bound is below the exact value for every k > 1 (equal at k = 1, where it is exact); the saturated "
                 "simulation sits just under the exact value (end-of-trace partial batches). Latency vs k: "
                 + _fig8_shape(r) + ". At low rates the batch-forming wait k (B - 1) / (2λ) dominates and k = 1 is "
                 "best; as λ nears each k's capacity, more bins cut both service time and queueing, so latency first "
                 "falls with k and then rises, the shape the paper reports.")
    return "\n".join(lines)


def _fig6(r: dict) -> str:
    s = r["fig6"]["sweep"]
    lines = ["## Figure 6: GSM8K, linear service time, B = 8, 8 servers", "", f"![fig6](multibin/{r['plots']['fig6']})",
             "", "| k | max throughput (req/s) | min latency (s) | at λ |", "|---|---|---|---|"]
    for i, k in enumerate(s.ks):
        j = int(np.argmin(s.latency[i]))
        lines.append(f"| {k} | {s.throughput[i].max():.2f} | {s.latency[i, j]:.2f} | {s.rates[j]} |")
    lines.append("\nThroughput rises with k and latency first drops then climbs, as in the paper. Absolute numbers "
                 "scale with the placeholder linear model, so only the shape compares with the paper's plot.")
    return "\n".join(lines)


def _fig7(r: dict) -> str:
    f = r["fig7"]
    lines = ["## Figure 7: all requests at t = 0, one server, B = 8, max 1024 tokens, oracle lengths", "",
             f"![fig7](multibin/{r['plots']['fig7']})", "",
             "| k | queue sim (tok/s) | gain vs k=1 | token-level sim (tok/s) | queue sim on the same subset | "
             + " | ".join(f"{n} (tok/s)" for n in f["estimated"]) + " |",
             "|---|---|---|---|---|" + "---|" * len(f["estimated"])]
    for i, k in enumerate(f["ks"]):
        est = " | ".join(f"{v[i]:.1f}" for v in f["estimated"].values())
        lines.append(f"| {k} | {f['fast'][i]:.1f} | {_pct(f['fast'][i] / f['fast'][0] - 1)} | {f['token_level'][i]:.1f} | "
                     f"{f['fast_same_subset'][i]:.1f} | {est} |")
    small = (" With few requests per bin (large k on this small subset), partial batches eat the gain."
             if f["num_token_level"] < f["num_all"] else "")
    lines.append(f"\nThe token-level simulator gives the queue simulator's number to float precision on the same "
                 f"{f['num_token_level']} requests.{small} Estimated lengths: bins are equal-mass quantiles of the *estimates*; the ridge "
                 "predictions are out-of-fold (5-fold), never predicted on their own training rows.")
    return "\n".join(lines)


def _estimators(r: dict) -> str:
    e = r["estimators"]
    lines = ["## Length estimators on GSM8K (held-out split)", "",
             f"Train {e['num_train']} / held-out {e['num_test']} requests (seeded random 80/20 split). "
             "`ridge`: ridge regression on log(output tokens) from prompt length, log prompt length and a 512-bucket "
             "hashed bag of words of the question. Bin accuracy: share of held-out requests whose predicted bin "
             "(equal-mass quantile bins of the training lengths) is the true bin.", "",
             "| estimator | MAE (tokens) | RMSE | bin acc. k=2 | k=4 | k=8 |", "|---|---|---|---|---|---|"]
    for name, by_k in e["reports"].items():
        rep = by_k[4]
        lines.append(f"| {name} | {rep.mae_tokens:.1f} | {rep.rmse_tokens:.1f} | {by_k[2].bin_accuracy:.3f} | "
                     f"{rep.bin_accuracy:.3f} | {by_k[8].bin_accuracy:.3f} |")
    lines.append(f"\nMean held-out output length: {e['reports']['oracle'][4].mean_true_tokens:.1f} tokens. Chance bin "
                 "accuracy is 1/k.")
    return "\n".join(lines)


def _crosscheck(r: dict) -> str:
    lines = ["## Cross-check: token-level simulator vs queue simulator", "",
             "Same Poisson trace (U(1,20) service as whole tokens of 0.1 s, B = 16, k = 3, λ = 0.8, max-wait 50 s) "
             "through `simulate_batches` and through `servelab.simulator` (1 server: policy `multibin`; 2 servers: "
             "router `multibin` + policy `multibin_replica`) with `LinearStepCost`.", "",
             "| servers | queue-sim throughput | token-level throughput | difference | queue-sim latency | "
             "token-level latency |", "|---|---|---|---|---|---|"]
    for row in r["crosscheck"]:
        diff = row["token_throughput"] / row["fast_throughput"] - 1
        lines.append(f"| {row['servers']} | {row['fast_throughput']:.5f} | {row['token_throughput']:.5f} | "
                     f"{_pct(diff)} | {row['fast_latency']:.2f} | {row['token_latency']:.2f} |")
    lines.append("\nThroughput agrees (the router path adds a 1 ns settle per batch). Latency differs by design: the "
                 "queue simulator counts a request done when its batch ends (the paper's model), the token-level "
                 "simulator when its own last token is emitted, which is earlier for all but the longest member.")
    return "\n".join(lines)


def _theory(r: dict) -> str:
    return ("## Closed forms (`servelab analyze multibin`)\n\nUniform U(1, 20), B = 128, λ = 1, ε = 0.5:\n\n"
            + format_analysis(r["theory_uniform"]) + "\n\nExponential μ = 0.1, B = 200, λ = 2 (latency column: "
            "Lemma A.1 bound + k(B-1)/(2λ), our extension of Lemma 5.1):\n\n" + format_analysis(r["theory_exp"]))


def _timings(r: dict) -> str:
    lines = ["## Run time of each step (CPU time, shared 2-core machine)", "", "| step | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in r["timings_cpu_s"].items()]
    lines.append(f"| total | {sum(r['timings_cpu_s'].values()):.1f} |")
    return "\n".join(lines)
