"""The report's test 'The gap to vLLM at the best split, by GPU time' (``vllm_gap``): every
GPU-second of each run split into step work and idle by where it falls, the gap to vLLM
split exactly into those terms, and one AlignedServe mechanism removed at a time.

The hypotheses are printed with the numbers they were formed from (the split-cost test's busy
shares, ``open_split``), before the table; verdicts are read from per-seed paired values and
their 95% t intervals ('holds' where the refuting result did not appear)."""

from __future__ import annotations

import numpy as np

from servelab.designs.alignedserve.reproduce.gap_rows import interval_text, is_above, is_below, row_matching, seeds_of
from servelab.reproduce.stats import t_interval

P_D = ("DistServe", "AlignedServe", "AlignedServe, greedy join", "AlignedServe, no KV wait",
       "AlignedServe, no starvation bound", "AlignedServe, FCFS pool")
# term -> label; each a share of the system's GPU time (GPUs x its makespan)
TERMS = (("extra_work", "extra step work"), ("prefill_after", "prefill GPUs idle after the prompts"),
         ("decode_fill", "decode GPUs idle before their first step"), ("kv_wait", "KV waits"),
         ("other_idle", "other idle between steps"), ("decode_tail", "decode GPUs idle after their last step"),
         ("vllm_idle", "less vLLM's own idle"))


def terms(row: dict, vllm: dict) -> dict:
    """``row``'s gap to ``vllm`` (same requests): 1 - tokens/s ratio, split into ``TERMS``."""
    gpus = row["num_instances"]
    total = gpus * row["makespan_s"]
    v_work = vllm["mixed_work_s"]
    v_idle = vllm["num_instances"] * vllm["makespan_s"] - v_work
    work = row.get("prefill_work_s", 0.0) + row.get("decode_work_s", 0.0)
    kv = row.get("kv_wait_s") or 0.0
    other = row.get("prefill_fill_s", 0.0) + row.get("prefill_other_idle_s", 0.0) + row.get("decode_other_idle_s", 0.0) - kv
    return {"gap": 1.0 - vllm["makespan_s"] / row["makespan_s"], "extra_work": (work - v_work) / total,
            "prefill_after": row.get("prefill_tail_s", 0.0) / total, "decode_fill": row.get("decode_fill_s", 0.0) / total,
            "kv_wait": kv / total, "other_idle": other / total, "decode_tail": row.get("decode_tail_s", 0.0) / total,
            "vllm_idle": -v_idle / total}


def _prior_terms(res: dict, k: int, label: str) -> list[tuple[float, ...]]:
    """Per seed of the split-cost test (``open_split``), ``label`` at ``k`` prefill GPUs against vLLM
    from the busy shares: (tokens/s over vLLM, extra step work, prefill GPUs idle, decode GPUs
    idle, vLLM's own idle), the last four as shares of the system's GPU time."""
    rows, gpus = res.get("open_split") or [], res["sizes"]["num_gpus"]
    out = []
    for s in seeds_of(rows):
        v = row_matching(rows, seed=s, label="vLLM", num_prefill=None)
        a = row_matching(rows, seed=s, label=label, num_prefill=k)
        if not v or not a:
            continue
        total = gpus * a["makespan_s"]
        w_v, w_a = v["busy_all"] * gpus * v["makespan_s"], a["busy_all"] * total
        out.append((v["makespan_s"] / a["makespan_s"], (w_a - w_v) / total,
                    k * a["makespan_s"] * (1 - a["busy_by_role"]["prefill"]) / total,
                    (gpus - k) * a["makespan_s"] * (1 - a["busy_by_role"]["decode"]) / total,
                    (gpus * v["makespan_s"] - w_v) / total))
    return out


def _prior(res: dict, k: int) -> str:
    """The numbers the hypotheses were formed from (before the step ran): ``_prior_terms``' means."""
    parts = []
    for label in ("DistServe", "AlignedServe"):
        vals = _prior_terms(res, k, label)
        if vals:
            m = np.mean(vals, axis=0)
            parts.append(f"{label} {m[0]:.2f} of vLLM = 1 - extra step work {m[1]:.2f} - prefill GPUs idle {m[2]:.2f} "
                         f"- decode GPUs idle {m[3]:.2f} + vLLM's own idle {m[4]:.2f}")
    return ("; ".join(parts) + f" (means over {len(seeds_of(res.get('open_split') or []))} seeds)") if parts else "n/a"


def _prior_table(res: dict) -> list[str]:
    """The split-cost test's runs as GPU time, every split (an accounting of its busy shares, not a test)."""
    rows = res.get("open_split") or []
    ks = sorted({r["num_prefill"] for r in rows if r["num_prefill"] is not None})
    out = ["| prefill GPUs | system | tokens/s over vLLM | extra step work | prefill GPUs idle | decode GPUs idle | "
           "vLLM's own idle |", "|---|---|---|---|---|---|---|"]
    for k in ks:
        for label in ("DistServe", "AlignedServe"):
            vals = np.array(_prior_terms(res, k, label))
            if len(vals):
                out.append(f"| {k} | {label} | " + " | ".join(interval_text(vals[:, i]) for i in range(5)) + " |")
    return out


def _pair(rows, seeds, label, fn) -> list[float]:
    out = []
    for s in seeds:
        v, a = row_matching(rows, seed=s, label="vLLM"), row_matching(rows, seed=s, label=label)
        if v and a:
            out.append(fn(a, v, s))
    return out


def _over(rows, seeds, num: str, den: str) -> list[float]:
    """Per seed, ``num``'s tokens/s over ``den``'s."""
    out = []
    for s in seeds:
        a, b = row_matching(rows, seed=s, label=num), row_matching(rows, seed=s, label=den)
        if a and b and b["decode_tok_s"]:
            out.append(a["decode_tok_s"] / b["decode_tok_s"])
    return out


def _intro(res: dict, k: int, setting: str) -> list[str]:
    """The test's question, the numbers its hypotheses were formed from, and what refutes each."""
    return [f"**The gap to vLLM at the best split, by GPU time (the split-cost test above: AlignedServe at its best "
           f"split, {k} prefill GPUs, 0.68 of vLLM; the paper 1.32x).** Where does AlignedServe lose time against "
           "vLLM: prefill queueing on the prefill GPUs, KV waits, rows per decode iteration, switch iterations, "
           "starvation releases? Every GPU-second of a run is step work or idle, and both systems make the same "
           "tokens, so 1 - (tokens/s over vLLM) = (extra step work + the system's idle - vLLM's idle) / (GPUs x the "
           "system's makespan) exactly; idle splits by where it falls (a prefill GPU after its last prompt; a "
           "decode GPU before its first step, paused for joining KV, between steps otherwise, after its last "
           f"step). Formed from the split-cost test's busy shares at {k} prefill GPUs, before this run: "
           f"{_prior(res, k)}. Hypotheses and what refutes each: (H1) DistServe's gap is the split's own idle: prefill "
           f"GPUs idle once the prompts are in (the {k} prefill GPUs set the pace until then), decode GPUs idle before "
           "their first and after their last step, less vLLM's idle; refuted if the prefill GPUs are under 90% busy "
           "until their last prompt, or if those idle terms make under half of DistServe's gap (interval below 0.5); "
           "(H2) AlignedServe's loss beyond DistServe is its join rule's rows: refuted if the greedy join's (rows as "
           "DistServe's) interval over DistServe lies below 0.95; (H3) KV waits cost their GPU time and no more: "
           "predicted no KV wait / AlignedServe = 1 / (1 - KV waits' share); refuted where measured - predicted "
           "excludes 0; (H4) starvation releases and (H5) alignment with its switch iterations (FCFS batches from "
           "the same pool) cost nothing here: each "
           "refuted where the variant over AlignedServe lies wholly outside 0.97-1.03. **Simulated**, Fig. 7's 95%-short "
           f"mix, OPT-6.7B, {setting}; terms are shares of the system's GPU time (means over seeds):"]


def vllm_gap_lines(res: dict) -> list[str]:
    rows = res.get("open_vllm")
    if not rows:
        if not res.get("open_split"):
            return []
        from servelab.designs.alignedserve.reproduce.vllm_gap import SEEDS, best_split

        k = best_split(res["sizes"]["num_gpus"])
        setting = (f"{res['sizes']['num_requests'] // 2} requests at time 0, {res['sizes']['num_gpus']} GPUs, split-kv, "
                   f"{SEEDS} seeds")
        return (_intro(res, k, setting) + ["", "The split-cost test's runs as GPU time (its busy shares, every split; "
                "an accounting, not a test):", ""] + _prior_table(res)
                + ["", "Verdicts: not run (the step 'gap tested: the gap to vLLM by GPU time' has no results in this "
                   "render): (H1) to (H5) are hypotheses, untested.", ""])
    seeds = seeds_of(rows)
    k = next(r["num_prefill"] for r in rows if r["num_prefill"] is not None)
    out = _intro(res, k, f"{rows[0]['num_requests']} requests at time 0, {rows[0]['num_instances']} GPUs, split-kv, "
                         f"seeds {seeds}")
    out += ["", "| system | tokens/s over vLLM | 1 - that | " + " | ".join(lab for _, lab in TERMS)
            + " | rows/iter | prefill busy until last prompt | TTFT / first->second mean (s) | starved |",
            "|---|---|---|" + "---|" * (len(TERMS) + 4)]
    table = {}
    for label in P_D:
        per = _pair(rows, seeds, label, lambda a, v, s: terms(a, v))
        if not per:
            continue
        table[label] = per
        ratio = _pair(rows, seeds, label, lambda a, v, s: a["decode_tok_s"] / v["decode_tok_s"])
        pick = [row_matching(rows, seed=s, label=label) for s in seeds]
        mean = {t: float(np.mean([p[t] for p in per])) for t in ("gap", *[t for t, _ in TERMS])}
        out.append(f"| {label} | {interval_text(ratio)} | {mean['gap']:.3f} | "
                   + " | ".join(f"{mean[t]:+.3f}" for t, _ in TERMS)
                   + f" | {np.mean([p['rows'] for p in pick]):.1f} | "
                   f"{np.mean([p['prefill_busy_until_done'] for p in pick]):.0%} | "
                   f"{np.mean([p['ttft_mean_s'] for p in pick]):.2f} / {np.mean([p['second_token_mean_s'] for p in pick]):.2f} | "
                   f"{_starved(pick)} |")
    return out + [""] + _verdicts(rows, seeds, table)


def _starved(pick) -> str:
    vals = [p.get("num_starved") for p in pick]
    return "n/a" if any(v is None for v in vals) else f"{np.mean(vals):.0f}"


def _verdicts(rows, seeds, table) -> list[str]:
    parts = []
    ds = table.get("DistServe")
    if ds:
        busy = [row_matching(rows, seed=s, label="DistServe")["prefill_busy_until_done"] for s in seeds]
        idle = [p["prefill_after"] + p["decode_fill"] + p["decode_tail"] + p["vllm_idle"] for p in ds]
        share = [x / p["gap"] if p["gap"] > 0 else float("nan") for x, p in zip(idle, ds)]
        iv = t_interval(share)
        parts.append(f"(H1) prefill GPUs busy until their last prompt {np.mean(busy):.0%} (DistServe); the split's idle "
                     f"makes {interval_text(share)} of DistServe's gap (extra step work "
                     f"{np.mean([p['extra_work'] for p in ds]):+.3f} of its GPU time): "
                     + ("refuted (the prefill GPUs do not set the pace)" if np.mean(busy) < 0.9 else
                        "refuted (the split's idle makes under half the gap)" if is_below(iv, 0.5) else
                        "holds" if is_above(iv, 0.5) else "inconclusive (the interval holds 0.5)"))
    greedy = _over(rows, seeds, "AlignedServe, greedy join", "DistServe")
    if greedy:
        iv = t_interval(greedy)
        parts.append(f"(H2) greedy join over DistServe {interval_text(greedy)}, AlignedServe over DistServe "
                     f"{interval_text(_over(rows, seeds, 'AlignedServe', 'DistServe'))}: "
                     + ("refuted (rows are not AlignedServe's whole loss beyond DistServe)" if is_below(iv, 0.95)
                        else "holds" if is_above(iv, 0.95) else "inconclusive (the interval holds 0.95)"))
    nowait, pred = _over(rows, seeds, "AlignedServe, no KV wait", "AlignedServe"), []
    for s in seeds:
        a = row_matching(rows, seed=s, label="AlignedServe")
        pred.append(1.0 / (1.0 - (a.get("kv_wait_s") or 0.0) / (a["num_instances"] * a["makespan_s"])))
    if nowait:
        d = t_interval([m - p for m, p in zip(nowait, pred)])
        parts.append(f"(H3) no KV wait / AlignedServe {interval_text(nowait)}, predicted from the waits "
                     f"{interval_text(pred)}, measured - predicted {d.format('{:+.2f}')}: "
                     + ("refuted" if d.excludes(0.0) else "holds" if d.high - d.low <= 0.1
                        else "inconclusive (the interval is wider than +-0.05)"))
    for tag, label in (("H4", "AlignedServe, no starvation bound"), ("H5", "AlignedServe, FCFS pool")):
        vals = _over(rows, seeds, label, "AlignedServe")
        if vals:
            iv = t_interval(vals)
            parts.append(f"({tag}) {label.split(', ', 1)[1]} / AlignedServe {interval_text(vals)}: "
                         + ("refuted" if is_below(iv, 0.97) or is_above(iv, 1.03) else
                            "holds" if is_above(iv, 0.95) and is_below(iv, 1.05) else
                            "inconclusive (the interval reaches past 0.95-1.05)"))
    aligned = table.get("AlignedServe")
    if aligned:
        mean = {t: float(np.mean([p[t] for p in aligned])) for t, _ in TERMS}
        order = sorted((t for t, _ in TERMS if t != "vllm_idle"), key=lambda t: -mean[t])
        names = dict(TERMS)
        parts.append("AlignedServe's gap to vLLM by size: " + ", ".join(f"{names[t]} {mean[t]:+.3f}" for t in order)
                     + f", {names['vllm_idle']} {mean['vllm_idle']:+.3f}")
    return ["Verdicts: " + "; ".join(parts) + ".", ""]

