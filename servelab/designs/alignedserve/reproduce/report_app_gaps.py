"""The report's tests of the gaps the audit had left untested (``app_gaps``): Figs. 8 on the
application workloads, Fig. 11's DistServe iterations over 10 ms, and Fig. 15 LongBench's
block threshold, each with the predictions fixed before its run and the verdict its per-seed
paired ratios give (95% t intervals; 'inconclusive' where the seeds cannot tell)."""

from __future__ import annotations

import numpy as np

from servelab.designs.alignedserve.reproduce.gap_rows import interval_text, is_above, is_below, row_matching, seeds_of
from servelab.reproduce.stats import t_interval

BASELINES = ("vLLM", "FastGen (sarathi)", "DistServe")


def _tok(rows, w, s, label, k) -> float:
    r = row_matching(rows, workload=w, seed=s, label=label, num_prefill=k)
    return r["decode_tok_s"] if r else float("nan")


def _per_seed(rows, w, seeds, a, ka, b, kb, key="decode_tok_s") -> list[float]:
    out = []
    for s in seeds:
        x = row_matching(rows, workload=w, seed=s, label=a, num_prefill=ka)
        y = row_matching(rows, workload=w, seed=s, label=b, num_prefill=kb)
        if x and y and y.get(key):
            out.append(x[key] / y[key])
    return out


def _half(rows) -> int:
    """The paper's half split: the prefill GPUs the greedy join ran at."""
    return next(r["num_prefill"] for r in rows if r["label"] == "AlignedServe, greedy join")


def best_over_any(rows, w, seeds, label="AlignedServe") -> list[float]:
    """Per seed, ``label`` over the slowest of vLLM, FastGen and DistServe (the paper's 'best ratio')."""
    k = _half(rows)
    return [_tok(rows, w, s, label, k) / min(_tok(rows, w, s, b, None if b != "DistServe" else k) for b in BASELINES)
            for s in seeds]


def fig8_app_lines(res: dict) -> list[str]:
    rows = res.get("open_fig8")
    if not rows:
        return []
    seeds = seeds_of(rows)
    half = _half(rows)
    split = next((r["num_prefill"] for r in rows if r["num_prefill"] not in (None, half)), half)
    out = ["**Figs. 8 on the application workloads (the best throughput ratio over any baseline: the paper up to "
           "1.98x; ours at seed 0 0.81-0.95x, no variant run on them before this test).** Stated reason, as for "
           "Fig. 7: against vLLM and FastGen the P/D split's own cost, against DistServe (same split) the paper's join "
           "rule's rows. Predictions (fixed before this run): (a) the join rule's rows: the greedy join (rows as "
           "DistServe's) over DistServe is not wholly below 0.95; refuted where its interval lies below 0.95. (b) the "
           f"split's cost: DistServe stays below vLLM at Fig. 7's best split ({split} of 8 GPUs prefill, the split-cost "
           "test's; refuted where that "
           f"interval is not below 1), and AlignedServe over vLLM there is (AlignedServe / DistServe at {half}) x (DistServe / "
           f"vLLM at {split}); refuted where measured - predicted excludes 0, inconclusive where wider than +-0.1. "
           "**Simulated**, OPT-6.7B, 8 x H100, split-kv, "
           f"{rows[0]['num_requests']} requests at time 0 per seed, seeds {seeds}; arXiv lengths sampled per seed, "
           "the Azure and Mooncake traces' length pairs sampled per seed (their replay takes the same first requests "
           "under every seed; Mooncake's prompts clipped to the lifted 16K context); rows: decode rows per iteration:", "",
           "| workload | best over any baseline | AlignedServe / DistServe (rows) | greedy join / DistServe (rows) | "
           f"greedy join, best over any baseline | DistServe / vLLM at {half} / at {split} | AlignedServe / vLLM at {split} | "
           "predicted (b) |", "|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for w in dict.fromkeys(r["workload"] for r in rows):
        best = best_over_any(rows, w, seeds)
        greedy_best = best_over_any(rows, w, seeds, "AlignedServe, greedy join")
        a_d = _per_seed(rows, w, seeds, "AlignedServe", half, "DistServe", half)
        g_d = _per_seed(rows, w, seeds, "AlignedServe, greedy join", half, "DistServe", half)
        rows_a = _per_seed(rows, w, seeds, "AlignedServe", half, "DistServe", half, "rows")
        rows_g = _per_seed(rows, w, seeds, "AlignedServe, greedy join", half, "DistServe", half, "rows")
        d_v4 = _per_seed(rows, w, seeds, "DistServe", half, "vLLM", None)
        d_vk = _per_seed(rows, w, seeds, "DistServe", split, "vLLM", None)
        a_vk = _per_seed(rows, w, seeds, "AlignedServe", split, "vLLM", None)
        pred = [x * y for x, y in zip(a_d, d_vk)]
        out.append(f"| {w} | {interval_text(best)} | {interval_text(a_d)} ({np.mean(rows_a):.2f}) | "
                   f"{interval_text(g_d)} ({np.mean(rows_g):.2f}) | {interval_text(greedy_best)} | "
                   f"{interval_text(d_v4)} / {interval_text(d_vk)} | {interval_text(a_vk)} | {interval_text(pred)} |")
        giv = t_interval(g_d)
        va = ("refuted: the greedy join stays below DistServe" if is_below(giv, 0.95) else
              "holds: the greedy join reaches DistServe" if not is_below(giv, 1.0) else
              "inconclusive: the greedy join's interval holds 0.95 but lies below 1")
        dv = t_interval(d_vk)
        diff = t_interval([m - p for m, p in zip(a_vk, pred)])
        if not is_below(dv, 1.0):
            vb = f"refuted: DistServe is not below vLLM at {split} prefill GPUs"
        elif is_below(diff, 0.0) or is_above(diff, 0.0):
            vb = f"refuted: measured - predicted {diff.format('{:+.2f}')}"
        elif diff.high - diff.low > 0.2:
            vb = f"inconclusive: measured - predicted {diff.format('{:+.2f}')}"
        else:
            vb = f"holds: measured - predicted {diff.format('{:+.2f}')}"
        verdicts.append(f"{w}: (a) {va}; (b) {vb}")
    return out + ["", "Verdicts per workload: " + ". ".join(verdicts) + ".", ""]


def fig11_distserve_lines(res: dict) -> list[str]:
    rows = res.get("open_fig11_ds")
    if not rows:
        return []
    seeds = seeds_of(rows)
    out = ["**Fig. 11: DistServe's iterations over 10 ms (the paper: 80% of DistServe's iterations take over 10 ms to "
           "schedule; the claim row above: ShareGPT-like 0%, LongBench-like 64% of hand-offs over 10 ms).** What the "
           "paper times (Section 4.4) is 'the time to schedule an iteration': after an iteration the scheduler "
           "evicts requests or adds new ones, both migrating KV, and the next iteration waits. DistServe's decode "
           "engine (its public code, read for this test) accepts requests after each iteration and copies their KV "
           "one request after another before the next iteration starts; the paper does not give the link or the KV "
           "size. The claim row timed each of our hand-offs from its start, which includes the wait for room on the "
           "decode GPU, to landing, while our DistServe's decode iterations go on. Hypothesis (stated before this "
           "run): the gap is what is timed: with DistServe's decode iterations pausing for joining KV (the same vLLM "
           "loop, `alignedserve-decode`'s wait_for_kv), the share of iteration gaps over 10 ms reaches the paper's "
           "80%; refuted where its interval lies wholly below 0.5. Read with it (stated after a seed-0 check showed "
           "under 1% of paused gaps over 10 ms): the serial pull, each iteration charged with the copies (NVLink "
           "alone, one after another) of the KV that landed for it, as DistServe copies after an iteration ends; and "
           "what our hand-offs over 10 ms are made of: refuted that they are the wait for decode memory where the "
           "copy alone on NVLink accounts for them (measured - copy alone not above 0.1). **Simulated**, OPT-6.7B, "
           f"8 x H100 (4 prefill, 4 decode), split-kv, {rows[0]['num_requests']} requests at time 0, seeds {seeds}:", "",
           "| workload | system | tok/s | iterations with joining KV | iteration gaps over 10 ms | under 5 ms | serial "
           "pull over 10 ms | hand-offs over 10 ms | copy alone over 10 ms |", "|---|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for w in dict.fromkeys(r["workload"] for r in rows):
        for label in dict.fromkeys(r["label"] for r in rows):
            got = [row_matching(rows, workload=w, seed=s, label=label) for s in seeds]
            got = [g for g in got if g]
            if not got:
                continue
            out.append(f"| {w} | {label} | {np.mean([g['decode_tok_s'] for g in got]):.0f} | "
                       f"{np.mean([g['joins_share'] for g in got]):.1%} | {interval_text([g['gap_over_10ms'] for g in got], '{:.3f}')} | "
                       f"{np.mean([g['gap_under_5ms'] for g in got]):.1%} | "
                       f"{interval_text([g['pull_over_10ms'] for g in got], '{:.3f}')} | "
                       f"{interval_text([g['handoff_over_10ms'] for g in got])} | "
                       f"{np.mean([g['copy_alone_over_10ms'] for g in got]):.2f} |")
        paused = [row_matching(rows, workload=w, seed=s, label="DistServe, pauses for joining KV") for s in seeds]
        plain = [row_matching(rows, workload=w, seed=s, label="DistServe") for s in seeds]
        iv = t_interval([p["gap_over_10ms"] for p in paused])
        v1 = ("refuted: with the pause the iteration gaps over 10 ms stay far below the paper's 80%"
              if is_below(iv, 0.5) else "holds: the paused gaps reach the paper's range" if is_above(iv, 0.5)
              else "inconclusive")
        measured = t_interval([p["handoff_over_10ms"] for p in plain])
        mem = t_interval([p["handoff_over_10ms"] - p["copy_alone_over_10ms"] for p in plain])
        if measured.mean < 0.1:
            v2 = f"hand-offs over 10 ms {measured.format('{:.3f}')}: none to explain"
        elif is_above(mem, 0.1):
            v2 = (f"the wait for decode memory holds ({mem.format('{:+.2f}')} of hand-offs over 10 ms beyond the "
                  "copy alone)")
        else:
            v2 = (f"the wait for decode memory refuted ({mem.format('{:+.2f}')}: the copy alone accounts for the "
                  "hand-offs over 10 ms)")
        verdicts.append(f"{w}: pause {iv.format('{:.3f}')}, {v1}; {v2}")
    tail = ""
    if all("refuted" in v.split(";")[0] for v in verdicts) and max(r["pull_over_10ms"] for r in rows) < 0.1:
        joins = [r["joins_share"] for r in rows if r["label"] == "DistServe, pauses for joining KV"]
        tail = (f" Under the paper's own reading (iteration gaps) our DistServe's iterations are not held by KV copies: "
                f"{min(joins):.1%}-{max(joins):.1%} of its paused iterations have KV joining them, and the serial pull "
                "exceeds 10 ms in under 10% of any system's iterations; the paper's 80% needs more time per iteration than these copies take on "
                "NVLink (a slower copy path, or scheduling work between iterations that the cost model does not "
                "time): that residual is named here, not tested.")
    return out + ["", "Verdicts: " + ". ".join(verdicts) + "." + tail, ""]


def fig15_threshold_lines(res: dict) -> list[str]:
    rows = res.get("open_fig15_threshold")
    if not rows:
        return []
    seeds = seeds_of(rows)
    ths = sorted({r["threshold"] for r in rows})
    base = ths[0]
    out = ["**Fig. 15 LongBench: the block threshold (the join-rule test above: the 90% threshold cut the wait to 0.34x "
           "on seeds 0-2, a lead its hypothesis had not named).** Hypothesis (stated before this run, on fresh seeds): "
           "the paper's 40% block threshold caps the KV a decode GPU takes from the pool (the join rule refills "
           "released blocks only up to it), so arXiv requests wait in the pool while the GPU has room, and the wait "
           "falls as the threshold rises. Predictions: the wait at 65% below the wait at 40%, and at 90% below 65% "
           "(paired per-seed ratios, intervals below 1); refuted if the 90% / 40% ratio's interval is not below 1; "
           "premise (fixed with the predictions): at 40% the decode GPU's used blocks sit near the threshold (p50 "
           "within 0.1 of it), else the cap on the GPU is not how the threshold acts; "
           "the threshold explains the gap to the paper's 2.54 s if the wait at 90% lies at or below it. "
           f"**Simulated**, arXiv lengths sampled per seed, OPT-6.7B, {rows[0]['num_requests']} requests, Poisson "
           f"arrivals at {rows[0]['load']:.0%} of DistServe's offline rate on them, no starvation bound, split-kv, "
           f"seeds {seeds}:", "",
           "| block threshold | first->second wait mean (s) | over the 40% threshold | tok/s | rows/iter | decode busy | "
           "decode GPU blocks used (p50) |", "|---|---|---|---|---|---|---|"]
    ratio = {}
    for th in ths:
        got = [row_matching(rows, seed=s, threshold=th) for s in seeds]
        ref = [row_matching(rows, seed=s, threshold=base) for s in seeds]
        ratio[th] = [g["second_token_mean_s"] / b["second_token_mean_s"] for g, b in zip(got, ref)]
        used = [g["gpu_used_p50"] for g in got if g.get("gpu_used_p50") is not None]
        out.append(f"| {th:.0%} | {interval_text([g['second_token_mean_s'] for g in got])} | "
                   f"{'n/a' if th == base else interval_text(ratio[th])} | {np.mean([g['decode_tok_s'] for g in got]):.0f} | "
                   f"{np.mean([g['rows'] for g in got]):.1f} | {np.mean([g['busy'] for g in got]):.0%} | "
                   f"{f'{np.mean(used):.0%}' if used else 'n/a'} |")
    steps = []
    for lo, hi in zip(ths, ths[1:]):
        steps.append((lo, hi, t_interval([row_matching(rows, seed=s, threshold=hi)["second_token_mean_s"]
                                          / row_matching(rows, seed=s, threshold=lo)["second_token_mean_s"] for s in seeds])))
    top = t_interval(ratio[ths[-1]])
    wait = t_interval([row_matching(rows, seed=s, threshold=ths[-1])["second_token_mean_s"] for s in seeds])
    each = "; ".join(f"{hi:.0%} / {lo:.0%} {iv.format('{:.2f}', 'x')}" for lo, hi, iv in steps)
    used0 = [row_matching(rows, seed=s, threshold=base).get("gpu_used_p50") for s in seeds]
    used0 = float(np.mean(used0)) if all(u is not None for u in used0) else float("nan")
    if not is_below(top, 1.0):
        verdict = "refuted: the highest threshold does not shorten the wait"
    elif not used0 >= base - 0.1:
        verdict = (f"holds in part: the wait falls as the threshold rises, but the premise is refuted: at {base:.0%} "
                   f"the decode GPU's used blocks p50 is {used0:.0%}, far under the threshold, so the cap on the GPU is "
                   "not reached and how the threshold lengthens the wait is left open")
    elif all(is_below(iv, 1.0) for _, _, iv in steps):
        verdict = "holds: the wait falls at each step of the threshold"
    else:
        verdict = "holds in part: the highest threshold shortens the wait, not every step of it"
    gap = (f"; at {ths[-1]:.0%} the wait {wait.format('{:.2f}', ' s')}: "
           + ("at or below the paper's 2.54 s" if not is_above(wait, 2.54) else "still above the paper's 2.54 s"))
    return out + ["", f"Verdict: {ths[-1]:.0%} / {base:.0%} {top.format('{:.2f}', 'x')} ({each}): {verdict}{gap}.", ""]
