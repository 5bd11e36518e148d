"""The report's section 'Gap reasons tested (issue 25)': the six reasons the report had only
explained, each with what its numbers would look like were it wrong and the verdict the
runs of ``open_gaps`` (and, for the rows of w/o prefetch, ``fig14_gap``'s runs) give.

Verdicts are read from per-seed paired differences and their 95% t intervals; a verdict
says 'holds' (the refuting result did not appear), 'refuted' or 'inconclusive' (the seeds
cannot tell), never more than the interval allows.
"""

from __future__ import annotations

import numpy as np

from servelab.designs.alignedserve.reproduce import setting as st
from servelab.designs.alignedserve.reproduce.gap_rows import (interval_text, is_above, is_below, row_matching,
                                                              rows_matching, seeds_of)
from servelab.designs.alignedserve.reproduce.report_app_gaps import (fig8_app_lines, fig11_distserve_lines,
                                                                    fig15_threshold_lines)
from servelab.designs.alignedserve.reproduce.report_prefetch_gaps import fig14_link_lines, rows_without_prefetch_lines
from servelab.designs.alignedserve.reproduce.report_fig13_rows import fig13_mixing_lines
from servelab.designs.alignedserve.reproduce.report_fig15_wait import fig15_join_lines
from servelab.designs.alignedserve.reproduce.report_vllm_gap import vllm_gap_lines
from servelab.reproduce.stats import t_interval


def open_gap_lines(res: dict) -> list[str]:
    out = []
    for fn in (_split, fig8_app_lines, vllm_gap_lines, _fig13, fig13_mixing_lines, _fig11, fig11_distserve_lines, _fig15,
               fig15_join_lines, fig15_threshold_lines, fig14_link_lines, rows_without_prefetch_lines):
        out += fn(res)
    if not out:
        return []
    return ["## Gap reasons tested (issue 25)", "",
            "Reasons the report above had only explained, each run as an experiment that could refute it "
            "(`open_gaps.py`): the property each reason names is varied in a controlled workload, and the "
            "numbers that would show the reason wrong are stated before the table. **Simulated**, profile cost "
            "model, 8 x H100, OPT models; 95% t intervals over seeds, paired by seed.", ""] + out


def _ratio(rows, s, a, ka, b, kb) -> float:
    """Seed ``s``: system ``a`` at ``ka`` prefill GPUs over ``b`` at ``kb`` (None: a mixed system)."""
    x, y = row_matching(rows, seed=s, label=a, num_prefill=ka), row_matching(rows, seed=s, label=b, num_prefill=kb)
    return x["decode_tok_s"] / y["decode_tok_s"] if x and y and y["decode_tok_s"] else float("nan")


def _split_intro(half: int, n: int, gpus: int, seeds: list[int]) -> list[str]:
    return ["**Figs. 7/8 against vLLM and FastGen: the P/D split's cost.** Stated reason: AlignedServe and "
            "DistServe split the GPUs into prefill and decode; at time 0 the prefill GPUs idle once the prompts are "
            "in, so a split system decodes on part of the server while vLLM and FastGen decode on all of it, and "
            "AlignedServe's ratio over vLLM is its ratio over DistServe times DistServe's over vLLM. Two tests. "
            "(1) If idle GPU time is the split's whole cost, DistServe over vLLM equals their busy shares' ratio "
            "(the whole server's step time over GPUs x makespan; same work per busy second); refuted where the "
            "per-seed difference's interval lies more than 0.05 off 0. (2) If the split's cost is separate from "
            "AlignedServe's mechanisms, AlignedServe over DistServe does not depend on the split, so moving the "
            "split moves AlignedServe over vLLM as it moves DistServe over vLLM: predicted AlignedServe / vLLM at k "
            f"prefill GPUs = (AlignedServe / DistServe at {half}, the paper's half) x (DistServe / vLLM at k); "
            "refuted where the measured - predicted interval excludes 0, inconclusive where it is wider than +-0.1. "
            f"Fig. 7's 95%-short mix, OPT-6.7B, {n} requests at time 0, {gpus} GPUs, seeds {seeds}, split-kv:", "",
            "| prefill GPUs | DistServe busy: prefill / decode / all | vLLM busy | DistServe / vLLM | predicted from "
            "busy shares | AlignedServe / DistServe | AlignedServe / vLLM | predicted (test 2) | AlignedServe / "
            "FastGen |", "|---|---|---|---|---|---|---|---|---|"]


def _split_point(rows, seeds, k: int, half: int) -> tuple[str, str, str | None]:
    """One split's table row and its verdicts under tests (1) and (2) (None at the half itself)."""
    ds = [row_matching(rows, seed=s, label="DistServe", num_prefill=k) for s in seeds]
    vl = [row_matching(rows, seed=s, label="vLLM", num_prefill=None) for s in seeds]
    dv = [_ratio(rows, s, "DistServe", k, "vLLM", None) for s in seeds]
    pred1 = [d["busy_all"] / v["busy_all"] for d, v in zip(ds, vl)]
    av = [_ratio(rows, s, "AlignedServe", k, "vLLM", None) for s in seeds]
    pred2 = [_ratio(rows, s, "AlignedServe", half, "DistServe", half) * x for s, x in zip(seeds, dv)]
    role = {q: np.mean([d["busy_by_role"].get(q, np.nan) for d in ds]) for q in ("prefill", "decode")}
    line = (f"| {k} | {role['prefill']:.0%} / {role['decode']:.0%} / {np.mean([d['busy_all'] for d in ds]):.0%} "
            f"| {np.mean([v['busy_all'] for v in vl]):.0%} | {interval_text(dv)} | {interval_text(pred1)} | "
            f"{interval_text([_ratio(rows, s, 'AlignedServe', k, 'DistServe', k) for s in seeds])} | {interval_text(av)} | "
            f"{interval_text(pred2) if k != half else 'n/a'} | "
            f"{interval_text([_ratio(rows, s, 'AlignedServe', k, 'FastGen (sarathi)', None) for s in seeds])} |")
    d1 = t_interval([a - b for a, b in zip(dv, pred1)])
    v1 = (f"{k} prefill GPUs: measured - predicted {d1.format('{:+.2f}')}: "
          + ("refuted (idle time is not the split's whole cost)" if is_above(d1, 0.05) or is_below(d1, -0.05)
             else "holds"))
    if k == half:
        return line, v1, None
    d2 = t_interval([a - b for a, b in zip(av, pred2)])
    return line, v1, (f"{k} prefill GPUs: measured - predicted {d2.format('{:+.2f}')}: "
                      + ("refuted (AlignedServe's mechanisms cost differently under another split)"
                         if d2.excludes(0.0) else "holds" if d2.high - d2.low <= 0.2
                         else "inconclusive (the interval is wider than +-0.1)"))


def _split(res: dict) -> list[str]:
    rows = res.get("open_split")
    if not rows:
        return []
    seeds, ks = seeds_of(rows), sorted({r["num_prefill"] for r in rows if r["num_prefill"] is not None})
    half = max(ks)
    out = _split_intro(half, rows[0]["num_requests"], res["sizes"]["num_gpus"], seeds)
    points = [_split_point(rows, seeds, k, half) for k in ks]
    out += [p[0] for p in points]

    def over(a, k, b):
        return [_ratio(rows, s, a, k, b, None) for s in seeds]
    best = max(ks, key=lambda k: np.mean(over("AlignedServe", k, "vLLM")))
    dbest = max(ks, key=lambda k: np.mean(over("DistServe", k, "vLLM")))
    out += ["", "Verdicts: (1) idle GPU time as the split's cost: " + "; ".join(p[1] for p in points)
            + ". (2) the gap to vLLM follows the split: " + "; ".join(p[2] for p in points if p[2])
            + f". DistServe's best split here is {dbest} prefill GPUs, {interval_text(over('DistServe', dbest, 'vLLM'))} of "
            "vLLM" + (": no static split removes the split's cost at time 0"
                      if is_below(t_interval(over("DistServe", dbest, "vLLM")), 1.0) else "")
            + f". AlignedServe's best split here is {best} "
            f"prefill GPUs, where it is {interval_text(over('AlignedServe', best, 'vLLM'))} of vLLM and "
            f"{interval_text(over('AlignedServe', best, 'FastGen (sarathi)'))} of FastGen (the paper: 1.32x and 1.85x).", ""]
    return out


def _fig13(res: dict) -> list[str]:
    rows = res.get("open_fig13")
    if not rows:
        return []
    seeds = seeds_of(rows)
    f13 = {(r["workload"], r["batching"]): r["share_under_30ms"] for r in res.get("fig13", [])}
    ours = "; ".join(f"{w} {f13[(w, 'prefix-aware')]:.0%} / {f13[(w, 'FCFS')]:.0%}"
                     for w in dict.fromkeys(k[0] for k in f13) if (w, "FCFS") in f13)
    out = [f"**Fig. 13 (forward passes under 30 ms, prefix-aware / FCFS: ours {ours or 'n/a'}; the paper "
           "> 90% / < 10%).** Stated reason: under the split-KV kernel a decode step costs the sum of its rows' "
           "contexts, so FCFS's mixed batches cost the mean context and alignment only gathers the long rows into "
           "slow steps; the paper's FCFS < 10% needs a kernel where the longest row bounds the step (padded) and "
           "a long row (>= 1K tokens) in nearly every FCFS step. Would-be refutations: under split-kv prefix-aware "
           "ahead of FCFS by more than 5 points (interval above +0.05); under padded, FCFS's steps that hold a long "
           "row not mostly over 30 ms, or prefix-aware not ahead of FCFS where long rows are common (the higher "
           f"long share). Fig. 7's mix (long requests 1-8K tokens) at two long shares, OPT-13B, "
           f"{rows[0]['num_requests']} requests at time 0, seeds {seeds}:", "",
           "| long share | kernel | batching | under 30 ms | steps holding a long row | under 30 ms: steps with / "
           "without a long row | step p50 ms |", "|---|---|---|---|---|---|---|"]
    verdicts, flags = [], {"split": [], "slows": [], "ahead": []}
    for p in sorted({r["long_share"] for r in rows}):
        for kernel in ("split-kv", "padded"):
            for b in ("prefix-aware", "FCFS"):
                got = rows_matching(rows, long_share=p, kernel=kernel, batching=b)
                out.append(f"| {p:.0%} | {kernel} | {b} | {interval_text([r['under30_all'] for r in got])} | "
                           f"{np.mean([r['share_long_steps'] for r in got]):.0%} | "
                           f"{np.nanmean([r['under30_long'] for r in got]):.0%} / "
                           f"{np.nanmean([r['under30_short'] for r in got]):.0%} | "
                           f"{np.mean([r['step_p50_ms'] for r in got]):.1f} |")
            diff = t_interval([row_matching(rows, seed=s, long_share=p, kernel=kernel, batching="prefix-aware")["under30_all"]
                               - row_matching(rows, seed=s, long_share=p, kernel=kernel, batching="FCFS")["under30_all"]
                               for s in seeds])
            if kernel == "split-kv":
                gain = is_above(diff, 0.05)
                flags["split"].append(not gain)
                verdicts.append(f"{p:.0%} long, split-kv: prefix-aware - FCFS {diff.format('{:+.2f}')} ("
                                + ("refuted: alignment speeds split-KV steps" if gain else "holds") + ")")
            else:
                text, slows, ahead = _fig13_padded(rows, seeds, p, diff, p == max(r["long_share"] for r in rows))
                flags["slows"].append(slows)
                flags["ahead"] += [ahead] if ahead is not None else []
                verdicts.append(text)
    top = max(r["long_share"] for r in rows)
    fl = np.mean([r["share_long_steps"] for r in rows_matching(rows, long_share=top, kernel="padded", batching="FCFS")])
    pa = np.mean([r["share_long_steps"] for r in rows_matching(rows, long_share=top, kernel="padded", batching="prefix-aware")])
    kernel_half = all(flags["split"]) and all(flags["slows"])
    overall = ("the kernel half of the reason holds (no gain under split-kv; under padded a long row slows its step)"
               if kernel_half else "the kernel half of the reason is refuted where marked")
    overall += (", but it is not the whole reason: under padded prefix-aware is not ahead of FCFS by the paper's "
                "margin either" if not all(flags["ahead"]) else ", and under padded prefix-aware is ahead")
    out += ["", "Verdicts: " + "; ".join(verdicts) + f". Overall: {overall}. At {top:.0%} long requests {fl:.0%} "
            "of FCFS's padded steps "
            f"and {pa:.0%} of prefix-aware's hold a long row: the paper's > 90% / < 10% needs prefix-aware steps "
            "nearly free of long rows while nearly every FCFS step holds one. "
            + ("Measured here, alignment does not keep long rows out of the steps: a decode GPU's running rows mix "
               "batches, hence prefix ranges, in most iterations (the batch-switch share's test above, not refuted "
               "there: the Candidate Requests Buffer runs dry and the old batch's long outputs stay), so the kernel "
               "alone cannot give the paper's split. " if pa >= fl - 0.1 else
               "Measured here, prefix-aware's steps hold fewer long rows than FCFS's. ")
            + "ShareGPT's stand-in (log-normal, median 180 tokens) has fewer long requests than either mix.", ""]
    return out


def _fig13_padded(rows, seeds, p: float, diff, top: bool) -> tuple[str, bool, bool | None]:
    """Under padded at long share ``p``: whether a long row slows an FCFS step (under 30 ms at least 30
    points less often than a step without one) and, at the top share, whether prefix-aware leads FCFS by
    the paper's margin (refuted where the lead's interval stays under 0.5; the paper: > 0.8)."""
    fc = rows_matching(rows, long_share=p, kernel="padded", batching="FCFS")
    slow, fast = np.nanmean([r["under30_long"] for r in fc]), np.nanmean([r["under30_short"] for r in fc])
    mix = t_interval([row_matching(rows, seed=s, long_share=p, kernel="padded", batching="prefix-aware")["share_long_steps"]
                      - row_matching(rows, seed=s, long_share=p, kernel="padded", batching="FCFS")["share_long_steps"]
                      for s in seeds])
    slows = slow <= fast - 0.3
    ahead = None if not top else not is_below(diff, 0.5)
    text = (f"{p:.0%} long, padded: FCFS steps under 30 ms with / without a long row {slow:.0%} / {fast:.0%} ("
            + ("a long row slows the step: holds" if slows else "refuted: a long row does not slow the step")
            + f"); prefix-aware - FCFS {diff.format('{:+.2f}')}, share of steps holding a long row, prefix-aware "
            f"- FCFS {mix.format('{:+.2f}')}")
    if ahead is None:
        return text + " (the lead is tested at the highest long share)", slows, None
    return text + (" (prefix-aware leads: holds)" if ahead else " (refuted: prefix-aware does not lead by the "
                   "paper's margin" + (", its steps hold long rows about as often)" if not is_below(mix, -0.1)
                                       else ")")), slows, ahead


def _fig11(res: dict) -> list[str]:
    rows = res.get("open_fig11")
    if not rows:
        return []
    seeds = seeds_of(rows)
    lb = next((r.get("release_share_under_5ms") for r in res.get("fig11", [])
               if r["label"] == "AlignedServe" and r["workload"].startswith("LongBench")), None)
    out = [f"**Fig. 11 (ours LongBench-like {lb if lb is not None else float('nan'):.0%} of joining KV on the decode "
           "GPU within 5 ms of the schedule decision; the paper > 95% of iterations scheduled within 5 ms).** "
           "Stated reason: a request's KV is too "
           "large to cross its link in 5 ms: NVLink from a prefill GPU's buffer when prefetched, PCIe from the "
           "pool otherwise (arXiv prompts run to thousands of tokens). Test: every move onto a decode GPU against "
           "two predictions from its bytes on its link: (A) the move alone (the stated reason), (B) the move behind "
           "the moves of its burst (same source, destination and start) that landed before it, the link carrying "
           "one at a time (the next hypothesis, should A fail). A prediction is refuted where the measured share's "
           "interval lies more than 0.1 off it. Prompts within 10% of each length (0: LongBench-like lengths), "
           f"outputs 64-128, OPT-6.7B, {rows[0]['num_requests']} requests at time 0 (LongBench-like "
           f"{row_matching(rows, prompt=0).get('num_requests', 'n/a')}), seeds {seeds}:", "",
           "| prompt tokens | variant | one KV alone: NVLink / PCIe ms | prefetched | moves per burst (p50) | within "
           "5 ms | (A) alone | (B) behind its burst |", "|---|---|---|---|---|---|---|---|"]
    verdicts = {"A": [], "B": []}
    for prompt in sorted({r["prompt"] for r in rows}, key=lambda p: (p == 0, p)):
        for label in ("AlignedServe", "w/o P"):
            got = rows_matching(rows, prompt=prompt, label=label)
            if not got:
                continue
            meas = [r["moves_under_5ms"] for r in got]
            name = f"{prompt} tokens, {label}" if prompt else "LongBench-like"
            times = f"{got[0]['nvlink']:.1f} / {got[0]['pcie']:.1f}" if prompt else "n/a"
            out.append(f"| {prompt or 'LongBench-like'} | {label} | {times} | "
                       f"{np.mean([r['prefetched_share'] for r in got]):.0%} | "
                       f"{np.mean([r['burst_p50'] for r in got]):.1f} | {interval_text(meas)} | "
                       f"{np.mean([r['alone_under_5ms'] for r in got]):.2f} | "
                       f"{np.mean([r['serial_under_5ms'] for r in got]):.2f} |")
            for k, key in (("A", "alone_under_5ms"), ("B", "serial_under_5ms")):
                d = t_interval([m - r[key] for m, r in zip(meas, got)])
                off = is_below(d, -0.1) or is_above(d, 0.1)
                verdicts[k].append(f"{name} {d.format('{:+.2f}')}" + (" (refuted)" if off else ""))
    ok = {k: not any("refuted" in v for v in vs) for k, vs in verdicts.items()}
    out += ["", "Verdicts, measured - predicted: (A) size alone: " + "; ".join(verdicts["A"])
            + (": holds" if ok["A"] else ": refuted where marked") + ". (B) size behind its burst: "
            + "; ".join(verdicts["B"]) + (": holds" if ok["B"] else ": refuted where marked") + "."]
    arx = res.get("open_fig11_arxiv")
    run = next((r for r in res.get("fig11", []) if r["label"] == "AlignedServe"
                and r["workload"].startswith("LongBench") and "router" in r), None)
    if arx and run:
        pref = run["router"]["num_prefetched"] / max(1, run["num_requests"])
        pred = pref * arx["share_nvlink_5ms"] + (1 - pref) * arx["share_pcie_5ms"]
        out += ["", f"The claim's own run (Fig. 11 step, LongBench-like, seed 0): prompts p50 {arx['prompt_p50']:.0f} "
                f"tokens, {arx['share_nvlink_5ms']:.0%} of them small enough to cross NVLink alone in 5 ms and "
                f"{arx['share_pcie_5ms']:.0%} PCIe; {pref:.0%} were prefetched, so size alone would allow about "
                f"{pred:.0%} within 5 ms against {run.get('release_share_under_5ms', float('nan')):.0%} measured."]
    return out + [""]


def _fig15(res: dict) -> list[str]:
    rows = res.get("open_fig15")
    if not rows:
        return []
    seeds, spreads = seeds_of(rows), sorted({r["spread"] for r in rows}, reverse=True)
    out = ["**Fig. 15 LongBench (the wait before decoding stays above the paper's 2.54 s below capacity).** Stated "
           "reason: requests of sparse prefix ranges wait for a batch (Density First Search cuts the dense ranges "
           "first; a request whose range stays thin waits until its range fills or, with the bound, for 10 s). "
           "Varied: the arXiv prompts' distance from their median, scaled (1: as sampled; 2: twice as spread; "
           f"0.1: the same requests crowded into a few ranges), each at {rows[0]['load']:.0%} of DistServe's "
           "offline rate on its own lengths. Refuted if AlignedServe's wait without the starvation bound is not "
           "longer on the sparsest lengths than on the densest (the per-seed ratio with its interval not above 1). "
           f"OPT-6.7B, {rows[0]['num_requests']} requests, Poisson arrivals, seeds {seeds}:", "",
           "| spread | others within 256 tokens (median) | rate req/s | system | first->second wait mean (s) | p99 (s) "
           "| starved | tok/s |", "|---|---|---|---|---|---|---|---|"]
    for f in spreads:
        for label in ("AlignedServe, no starvation bound", "AlignedServe", "DistServe"):
            got = rows_matching(rows, spread=f, label=label)
            st = [r["num_starved"] for r in got if r.get("num_starved") is not None]
            starved = f"{np.mean(st):.0f}" if st else "n/a"
            out.append(f"| {f:g} | {np.mean([r['neighbours'] for r in got]):.0f} | "
                       f"{np.mean([r['rate'] for r in got]):.2f} | {label} | "
                       f"{interval_text([r['second_token_mean_s'] for r in got])} | "
                       f"{np.mean([r['first_gap_p99_s'] for r in got]):.2f} | {starved} | "
                       f"{np.mean([r['decode_tok_s'] for r in got]):.0f} |")
    lab = "AlignedServe, no starvation bound"
    ratio = t_interval([row_matching(rows, seed=s, spread=spreads[0], label=lab)["second_token_mean_s"]
                        / row_matching(rows, seed=s, spread=spreads[-1], label=lab)["second_token_mean_s"] for s in seeds])
    verdict = ("holds" if is_above(ratio, 1.0) else "refuted: the wait is no longer on sparse lengths"
               if is_below(ratio, 1.0) else "inconclusive: the seeds cannot tell")
    dense = t_interval([row_matching(rows, seed=s, spread=spreads[-1], label=lab)["second_token_mean_s"] for s in seeds])
    above = ("; with every request crowded into a few ranges (spread " f"{spreads[-1]:g}) the wait without the bound "
             f"is still {dense.format('{:.2f}', ' s')}, " + ("above the paper's 2.54 s: sparse ranges are not what "
                                                              "keeps the wait above the paper's (refuted; this reading "
                                                              "was chosen after the run)" if is_above(dense, 2.54)
                                                              else "not above the paper's 2.54 s"))
    out += ["", f"Verdict: wait without the bound, spread {spreads[0]:g} / spread {spreads[-1]:g}: "
            f"{ratio.format('{:.2f}', 'x')}: {verdict}{above}.", ""]
    return out
