"""Issue 25: why turning GPU prefetch off did not cost what its KV pauses predict under the
per-seq and padded kernels (seed 0 before this test: w/o P 1.03x and 1.30x of AlignedServe,
predicted from the pauses 0.90x and 0.95x).

Hypotheses, the quantity that separates them and the result that would refute each (runs:
``fig14_gap``'s, Azure conv's lengths sampled per seed, every kernel, paired by seed):

- **Schedule sensitivity**: a run's throughput moves by several percent under any small
  change (which request joins which batch cascades to the makespan), so one seed's ratio is
  mostly that; the control is a change no mechanism gives an effect (one more output token on
  one request of 1,200). Refuted if w/o P's per-seed ratios spread more than twice the
  control's (the spread is then prefetch's own), or if its interval lies off the pauses'
  prediction (a systematic effect beyond the pauses).
- **Padding shrinks** (without prefetch joins arrive later, so a batch's rows stay closer in
  length and the longest row pads less): the iteration bubble (decode time over the same
  iterations with each one's context spread evenly). Refuted if w/o P's bubble factor
  (1 + AlignedServe's bubble) / (1 + w/o P's) is not above 1 where w/o P is faster.
- **Rows per iteration change** (later joins, fuller or emptier iterations): refuted if the
  rows factor (w/o P's rows / AlignedServe's) holds 1.
- **Join order** (the mixed-iteration share: iterations holding more than one batch):
  refuted if its change holds 0.
- **The pauses alone**: with decode iterations that never wait for joining KV, prefetch has
  no pause to save; refuted if w/o P / AlignedServe without waits is off 1.

Throughput splits per seed into rows x iteration speed x busy share, and iteration speed
into the bubble factor x the speed of the same iterations with even contexts (what their KV
reads cost), so the factor whose interval lies off 1 is where the ratio comes from.
"""

from __future__ import annotations

import numpy as np

from servelab.designs.alignedserve.reproduce.fig14_gap import SHAM, pause_gap
from servelab.reproduce.stats import t_interval

LABELS = ("AlignedServe", "w/o P", SHAM, "AlignedServe, no KV wait", "w/o P, no KV wait")


def factors(a: dict, p: dict) -> dict:
    """``p`` over ``a`` (two runs on the same requests): throughput, and its factors rows,
    iteration speed (= bubble x even-context speed) and busy share; the mixed-iteration share's
    and KV wait's changes; the pauses' prediction of the throughput ratio."""
    speed = a["decode_ms"] / p["decode_ms"]
    bubble = (1 + a["iteration_bubble"]) / (1 + p["iteration_bubble"])
    return {"tput": p["decode_tok_s"] / a["decode_tok_s"], "rows": p["decode_rows"] / a["decode_rows"],
            "speed": speed, "bubble": bubble, "even": speed / bubble, "busy": p["busy"] / a["busy"],
            "mixed_pts": 100 * (p["switch_share"] - a["switch_share"]),
            "kv_wait_s": p["kv_wait_total_s"] - a["kv_wait_total_s"],
            "predicted": 1 - (p["kv_wait_total_s"] - a["kv_wait_total_s"]) / (p["decode_gpus"] * p["makespan_s"])}


def per_kernel(rows: list[dict]) -> dict[str, dict]:
    """Per kernel: the per-seed factors of w/o P, of the control and of w/o P without KV waits,
    each over its AlignedServe run; the seeds' spread of log throughput ratios; the correlation
    over seeds of w/o P's log ratio with its log bubble factor."""
    by = {(r["kernel"], r["seed"], r["label"]): r for r in rows}
    out = {}
    for kernel in dict.fromkeys(r["kernel"] for r in rows):
        seeds = [s for s in sorted({r["seed"] for r in rows if r["kernel"] == kernel})
                 if all((kernel, s, lab) in by for lab in LABELS)]
        if not seeds:
            continue
        nop = [factors(by[(kernel, s, "AlignedServe")], by[(kernel, s, "w/o P")]) for s in seeds]
        ctl = [factors(by[(kernel, s, "AlignedServe")], by[(kernel, s, SHAM)]) for s in seeds]
        nowait = [factors(by[(kernel, s, "AlignedServe, no KV wait")], by[(kernel, s, "w/o P, no KV wait")])
                  for s in seeds]
        log_t = np.log([f["tput"] for f in nop])
        log_b = np.log([f["bubble"] for f in nop])
        corr = (float(np.corrcoef(log_t, log_b)[0, 1]) if len(seeds) > 2 and np.std(log_t) > 0 and np.std(log_b) > 0
                else float("nan"))
        out[kernel] = {
            "seeds": seeds,
            "nop": {k: t_interval([f[k] for f in nop]) for k in nop[0]},
            "control": t_interval([f["tput"] for f in ctl]),
            "nowait": t_interval([f["tput"] for f in nowait]),
            "sd_nop": _sd_log([f["tput"] for f in nop]), "sd_control": _sd_log([f["tput"] for f in ctl]),
            "corr_bubble": corr, "pause_gap": pause_gap(rows, kernel),
            "per_seed": [(s, f["tput"], f["predicted"], c["tput"]) for s, f, c in zip(seeds, nop, ctl)],
        }
    return out


def _sd_log(ratios: list[float]) -> float:
    """The seeds' standard deviation of log ratios (0.05: about 5% either way)."""
    return float(np.std(np.log(ratios), ddof=1)) if len(ratios) > 1 else float("nan")


def verdicts(k: dict) -> list[str]:
    """The premise's and the hypotheses' verdicts for one kernel's ``per_kernel`` entry."""
    nop, out = k["nop"], []
    faster = nop["tput"].low > 1
    out.append("premise, w/o P faster than AlignedServe: " + nop["tput"].format("{:.2f}")
               + (": holds" if faster else ": does not hold over these seeds"))
    wide = k["sd_nop"] > 2 * k["sd_control"]
    out.append(f"schedule sensitivity: seeds' spread w/o P {k['sd_nop']:.3f} vs control {k['sd_control']:.3f} and "
               f"measured - predicted {k['pause_gap'].format('{:+.2f}')}: "
               + ("refuted (the spread is prefetch's own)" if wide else
                  "refuted (a systematic effect beyond the pauses)" if k["pause_gap"].excludes(0.0) else
                  "not refuted (one perturbation moves a run as much; the mean is the pauses' prediction)"))
    corr = k["corr_bubble"]
    tracks = np.isfinite(corr) and corr >= 0.7
    out.append("padding shrinks: bubble factor " + nop["bubble"].format("{:.3f}") + ", correlation of the ratio "
               "with it over seeds " + (f"{corr:+.2f}" if np.isfinite(corr) else "n/a (no bubble)") + ": "
               + ("not refuted" if faster and nop["bubble"].low > 1 else
                  "refuted as a systematic gain (w/o P is not faster)" if not faster else
                  "refuted (padding does not shrink)")
               + ("; per seed the ratio follows the bubble factor, so padding is the channel of the seeds' spread"
                  if tracks else ""))
    out.append("rows change: rows factor " + nop["rows"].format("{:.3f}") + (": not refuted" if nop["rows"].excludes(1.0)
                                                                            else ": refuted (holds 1)"))
    out.append("join order: mixed-iteration share change " + nop["mixed_pts"].format("{:+.1f}", " points")
               + (": not refuted" if nop["mixed_pts"].excludes(0.0) else ": refuted (holds 0)"))
    out.append("the pauses alone: without KV waits w/o P / AlignedServe " + k["nowait"].format("{:.3f}")
               + (": refuted (prefetch acts without pauses)" if k["nowait"].excludes(1.0) else ": not refuted"))
    off = [name for key, name in (("rows", "rows"), ("bubble", "bubble factor"), ("even", "even-context speed"),
                                  ("busy", "busy share")) if nop[key].excludes(1.0)]
    out.append("factors whose interval lies off 1: " + (", ".join(f"{n} {nop[key].mean:.3f}" for key, n in
                                                                 (("rows", "rows"), ("bubble", "bubble factor"),
                                                                  ("even", "even-context speed"), ("busy", "busy share"))
                                                                 if n in off) or "none"))
    return out


def prefetch_kernel_lines(res: dict) -> list[str]:
    rows = res.get("gap_fig14")
    if not rows or not any(r["label"] == SHAM for r in rows):
        return []
    table = per_kernel(rows)
    if not table:
        return []
    first = next(iter(table.values()))
    out = ["", "**Gap test: what turning prefetch off does under each kernel (before this test, seed 0 alone: "
           "w/o P 1.03x of AlignedServe per-seq and 1.30x padded, against 0.90x and 0.95x predicted from the KV "
           "pauses).** Hypotheses and what refutes each: (1) schedule sensitivity, one seed's ratio is mostly how far "
           "any small change moves a run: the control reruns AlignedServe with one more output token on one request; "
           "refuted if w/o P's per-seed ratios spread more than twice the control's, or their difference from the "
           "pauses' prediction excludes 0; (2) padding shrinks (later joins keep batches closer in length): refuted "
           "if w/o P is faster without a bubble factor (1 + AlignedServe's bubble) / (1 + w/o P's) above 1; (3) rows "
           "per iteration change: refuted if the rows factor holds 1; (4) join order: refuted if the mixed-iteration "
           "share's change holds 0; (5) the pauses alone: refuted if, with decode iterations that never wait for "
           "joining KV, w/o P / AlignedServe is off 1. Throughput ratio = rows x iteration speed x busy share "
           "(up to the prefill's first tokens); speed = bubble factor x even-context speed (the same iterations' "
           f"KV reads). **Simulated**, Azure conv's lengths sampled per seed, {rows[0]['model']}, "
           f"{rows[0]['num_requests']} requests at time 0, 8 x H100, seeds {first['seeds']}, paired by seed, "
           "95% t intervals:", "",
           "| kernel | w/o P / AlignedServe | predicted from the pauses | control / AlignedServe | seeds' spread "
           "(sd of log ratio), w/o P / control | no KV wait: w/o P / AlignedServe | rows | iteration speed | bubble "
           "factor | even-context speed | busy share | mixed share change (points) | KV wait change (s) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for kernel, k in table.items():
        n = k["nop"]
        out.append(f"| {kernel} | {n['tput'].format('{:.2f}')} | {n['predicted'].format('{:.2f}')} | "
                   f"{k['control'].format('{:.2f}')} | {k['sd_nop']:.3f} / {k['sd_control']:.3f} | "
                   f"{k['nowait'].format('{:.2f}')} | {n['rows'].mean:.3f} | {n['speed'].mean:.3f} | "
                   f"{n['bubble'].mean:.3f} | {n['even'].mean:.3f} | {n['busy'].mean:.3f} | "
                   f"{n['mixed_pts'].format('{:+.1f}')} | {n['kv_wait_s'].mean:+.1f} |")
    out += ["", "Per seed, w/o P / AlignedServe (predicted from the pauses; control / AlignedServe):", ""]
    for kernel, k in table.items():
        out.append(f"- {kernel}: " + ", ".join(f"seed {s} {t:.2f} ({p:.2f}; {c:.2f})" for s, t, p, c in k["per_seed"]))
    out += ["", "Verdicts:", ""]
    for kernel, k in table.items():
        out.append(f"- {kernel}: " + "; ".join(verdicts(k)) + ".")
    faster = [kn for kn, k in table.items() if k["nop"]["tput"].low > 1]
    above = [kn for kn, k in table.items() if k["pause_gap"].low > 0]
    more_rows = [kn for kn, k in table.items() if k["nop"]["rows"].low > 1]
    out += ["", f"Reading: over {len(first['seeds'])} seeds w/o P is faster than AlignedServe under "
            + (", ".join(faster) if faster else "no kernel") + "; it loses less than its KV pauses predict under "
            + (", ".join(above) or "no kernel (by the intervals)") + "; it runs more rows per iteration than "
            "AlignedServe under " + (", ".join(more_rows) or "no kernel")
            + " (the rows factor), which pays back part of what the pauses cost."]
    return out
