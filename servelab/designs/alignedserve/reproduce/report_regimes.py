"""The report's headline-grid section (``regimes.py``): premise next to result, each
comparison named, every decode kernel, intervals over seeds."""

from __future__ import annotations

from servelab.designs.alignedserve.reproduce import regimes

COMPARISONS = (  # (variant AlignedServe is divided by, what the ratio measures)
    ("vLLM", "same GPUs and load, one mixed instance per GPU (includes the P/D split's own cost)"),
    ("DistServe", "the system AlignedServe is built on, same P/D split: all of AlignedServe's mechanisms"),
    ("AlignedServe, FCFS pool", "alignment's own share (same pool, join rule and prefetch, FCFS batches)"),
    ("AlignedServe, greedy join", "the paper's join rule against the rule before issue 25"),
    ("AlignedServe, one for one", "the paper's join rule (refill released blocks up to the batch threshold) "
     "against one join per completion"),
    ("AlignedServe w/o prefetch", "GPU-prefetch-for-GPU (iterations wait for PCIe instead of NVLink)"),
    ("AlignedServe, 90% threshold", "gap test: the paper's 40% block threshold against batches of up to 90% "
     "of a decode GPU (if AlignedServe's rows and switch share are set by its batch size, this variant has more "
     "rows, a lower switch share and a ratio below 1)"),
    ("AlignedServe, min batch 128", "gap test: the evaluation's minimum batch 36 against the 128 of the paper's "
     "text (a running batch under the minimum fills as blocks allow; if that sets rows per iteration, "
     "this variant has more rows and, where rows pay, a ratio below 1)"),
)


def regime_lines(res: dict) -> list[str]:
    rows = res.get("regimes")
    if not rows:
        return []
    cells = regimes.summarise(rows)
    first = rows[0]
    out = ["## Headline grid (issue 25): the premise, every comparison, every decode kernel", "",
           f"**Simulated**: profile cost model on H100-80GB, {first['model']}, {first['num_gpus']} GPUs, "
           f"{first['num_requests']} requests at time 0 per seed ({regimes.POISSON}: "
           f"{regimes.POISSON_FACTOR * first['num_requests']} requests, "
           f"{regimes.POISSON_FACTOR * first['num_requests'] / regimes.POISSON_RATE:g} s of arrivals), "
           f"seeds {_seeds(cells)}; intervals are 95% t "
           "intervals over seeds. AlignedServe runs the paper's join rule (after completions the released blocks "
           "are refilled up to the batch's block threshold, 40% of the decode GPU; a batch under 36 fills as "
           "blocks allow), per-subtree starvation stamps (10 s), and decode iterations that wait for joining "
           "KV. The kernel is the cost model's `--attention-kernel`; no GPU was lent to this task, so there is "
           "no measured-profile column.", "",
           "Each ratio is AlignedServe's decoding throughput over one comparison, per seed:", ""]
    out += [f"- over **{lab}**: {why}" for lab, why in COMPARISONS]
    out += ["", "| workload | kernel | AlignedServe tok/s | " + " | ".join(f"over {lab}" for lab, _ in COMPARISONS) +
            " |", "|---|---|---|" + "---|" * len(COMPARISONS)]
    for c in cells:
        ratios = [c["ratios"][lab].format("{:.2f}") if lab in c["ratios"] else "n/a" for lab, _ in COMPARISONS]
        out.append(f"| {c['workload']} | {c['kernel']} | {c['tput']['AlignedServe'].format('{:.0f}')} | "
                   + " | ".join(ratios) + " |")
    caps = {k: regimes.offline_capacity(rows, k) for k in dict.fromkeys(r["kernel"] for r in rows)}
    out += ["", f"Premise of the sustained load ({regimes.POISSON}): DistServe's offline request rate on the same "
            "lengths is " + ", ".join(f"{v:.0f} req/s under {k}" for k, v in caps.items()) +
            f", so {regimes.POISSON_RATE:g} req/s is " + ", ".join(f"{regimes.POISSON_RATE / v:.1f}x" for v in
                                                                     caps.values()) + " its capacity."]
    out += ["", "**Gap test: is a ratio set by the makespan's tail?** Prefix-aligned batching leaves the requests "
            "of sparse ranges (long prompts) for last, in small block-limited batches; offline throughput "
            "(tokens / makespan) charges that tail. The same ratios over the time to the first 90% of output "
            "tokens: if a loss is the tail's, it shrinks here; if it stays, the tail is not its reason.", "",
            "| workload | kernel | " + " | ".join(f"over {lab}, first 90%" for lab in ("DistServe",
            "AlignedServe, FCFS pool")) + " |", "|---|---|---|---|"]
    for c in cells:
        f = c["first90"]
        out.append(f"| {c['workload']} | {c['kernel']} | " + " | ".join(
            f[lab].format("{:.2f}") if lab in f else "n/a" for lab in ("DistServe", "AlignedServe, FCFS pool")) + " |")
    out += ["", _tail_reading(cells)]
    out += ["", "The premise beside each result (means over seeds): pool depth at each batch cut as the pool's "
            "KV blocks over the block threshold (Density First Search narrows only above 1.0), its median over "
            "cuts and over the requests cut (many small cuts, of starved subtrees and of the drained end, hold few "
            "requests, so the per-cut median understates where most requests were batched), the share of cuts and "
            "of requests cut above it, the batch-switch share in both readings (iterations whose running requests "
            "come from more than one batch / iterations after which requests of another batch joined, Algorithm 2's "
            "case 2 happening), rows per decode iteration, the median batch span, requests "
            "released by the starvation bound, requests an idle decode GPU took over from another's candidate batch "
            "(pool empty), the time decode iterations waited for joining KV, and the decode GPUs' "
            "busy share (their time in steps over the makespan); what the join rule fills: a cut batch's blocks "
            "over the threshold (p50) and the decode GPU's used blocks at an iteration (p50, of all its blocks; the "
            "threshold is 40%).", "",
            "| workload | kernel | variant | depth at cut p50, per cut / per request | cuts / requests over threshold "
            "| switch share: mixed / joins | rows/iter | "
            "decode iteration ms | batch span | starved | taken over | KV wait (s) | busy | batch / threshold | "
            "GPU blocks used |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        for lab, p in c["premise"].items():
            if not p:
                continue
            if "depth_p50" not in p:  # DistServe: its decode iterations only
                out.append(f"| {c['workload']} | {c['kernel']} | {lab} | n/a | n/a | n/a | {p['decode_rows']:.1f} | "
                           f"{p['decode_ms']:.2f} | n/a | n/a | n/a | n/a | {_pct(p.get('busy'))} | n/a | n/a |")
                continue
            out.append(f"| {c['workload']} | {c['kernel']} | {lab} | {p['depth_p50']:.2f} / {p['depth_req_p50']:.2f} | "
                       f"{p['share_over']:.0%} / {p['req_over']:.0%} | "
                       f"{p['switch']:.1%} / {p['switch_joins']:.1%} | {p['rows']:.1f} | {_ms(p.get('decode_ms'))} | "
                       f"{p['span']:.0f} | {p['starved']:.0f} | {p['stolen']:.0f} | {p['kv_wait_s']:.2f} | "
                       f"{_pct(p.get('busy'))} | {p['fill']:.2f} | "
                       f"{_pct(p['used'])} |")
    out += ["", _reading(cells), "", _premise_reading(cells), ""]
    return out


def _premise_reading(cells: list[dict]) -> str:
    """Premise, then claim, at each point: is the pool deep where most requests are batched (over half of
    them cut from a pool above the threshold), and what AlignedServe gains over DistServe and over its own
    FCFS pool there."""
    parts = []
    for c in cells:
        p = c["premise"].get("AlignedServe") or {}
        if "req_over" not in p:
            continue
        deep = "deep" if p["req_over"] > 0.5 else "shallow"
        claim = "; ".join(f"over {lab} {c['ratios'][lab].format('{:.2f}')}" for lab in ("DistServe", "AlignedServe, FCFS pool")
                          if lab in c["ratios"])
        parts.append(f"{c['workload']}, {c['kernel']}: {p['req_over']:.0%} of requests cut above the threshold "
                     f"(per-request depth p50 {p['depth_req_p50']:.2f}, per cut {p['depth_p50']:.2f}): {deep}; {claim}")
    return ("Premise check, then the claim, at each point (AlignedServe's own cuts; 'deep' where over half of the "
            "requests were cut from a pool holding more than the threshold): " + "; ".join(parts) + ".")


def _seeds(cells: list[dict]) -> str:
    by = {}
    for c in cells:
        by.setdefault(tuple(c["seeds"]), []).append(c["kernel"])
    return "; ".join(f"{list(s)} under {', '.join(dict.fromkeys(k))}" for s, k in by.items())


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _ms(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _reading(cells: list[dict]) -> str:
    """The verdicts the grid supports, from its numbers (a ratio counts only when its whole
    interval is past 1.0); AlignedServe / DistServe = (FCFS pool / DistServe) x alignment."""
    parts = []
    for c in cells:
        r = c["ratios"]
        parts.append(f"{c['workload']}, {c['kernel']}: the pool without alignment (FCFS pool / DistServe) "
                     f"{c['pool_share'].mean:.2f}x")
        for lab, word in (("AlignedServe, FCFS pool", "alignment"), ("DistServe", "AlignedServe vs DistServe")):
            if lab not in r:
                continue
            iv = r[lab]
            verdict = "gain" if iv.excludes(1.0) and iv.mean > 1 else (
                "loss" if iv.excludes(1.0) else "no difference the seeds can resolve")
            parts.append(f"{c['workload']}, {c['kernel']}: {word} {iv.mean:.2f}x ({verdict})")
    return "Reading: " + "; ".join(parts) + "."


def _tail_reading(cells: list[dict]) -> str:
    """The tail test's verdict per cell, over DistServe: a loss (interval below 1) the first 90% lifts to
    1.0 or above is the tail's; one that rises by more than 0.05 is partly the tail's."""
    parts = []
    for c in cells:
        full, f90 = c["ratios"].get("DistServe"), c["first90"].get("DistServe")
        if full is None or f90 is None or full.mean >= 1.0 or not full.excludes(1.0):  # losses the seeds resolve
            continue
        gain = f90.mean - full.mean
        verdict = ("the tail explains it" if f90.mean >= 1.0 else "the tail explains part of it" if gain > 0.05
                   else "the tail is not its reason")
        parts.append(f"{c['workload']}, {c['kernel']}: {full.mean:.2f}x -> {f90.mean:.2f}x ({verdict})")
    return ("Reading (losses over DistServe, whole run -> first 90%): " + "; ".join(parts) + ".") if parts else ""
