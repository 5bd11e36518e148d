"""The report's gap verdicts (issue 25): every headline outside the paper's range, its stated
reason and the experiment that could have refuted it, read from the numbers.

- throughput under AlignedServe / DistServe below 1: split into rows per iteration, iteration
  speed and decode-GPU busy time (decode tokens/s = busy x GPUs x rows / iteration time, so the
  three multiply to the ratio up to the prefill's first tokens), then the join rule (greedy
  join), the pool cut (90% threshold) and the P/D split (vLLM over DistServe) each tested;
- alignment's own share per decode kernel (over the FCFS pool), with its per-iteration part;
- the P99 TPOT range at both ends (``gaps.gap_tpot_range``);
- prefetch where the buffer has room (``gaps.gap_prefetch``).
"""

from __future__ import annotations

import math

from servelab.designs.alignedserve.reproduce import regimes
from servelab.designs.alignedserve.reproduce.report_claims import _f
from servelab.designs.alignedserve.reproduce.report_join import join_lines

PAPER_TPOT = (1.74, 3.05)
DECOMPOSED = ("AlignedServe", "AlignedServe, greedy join", "AlignedServe, one for one", "AlignedServe, FCFS pool", "AlignedServe, 90% threshold",
              "AlignedServe, min batch 128")


def gap_verdict_lines(res: dict) -> list[str]:
    out = ["## Gap verdicts (issue 25): each headline outside the paper's range, tested", ""]
    out += _throughput_lines(res)
    out += join_lines(res)
    out += _alignment_lines(res)
    out += _tpot_range_lines(res)
    out += _prefetch_lines(res)
    return out


def _factors(p: dict, d: dict) -> tuple[float, float, float] | None:
    """(rows, iteration speed, busy) of premise ``p`` over DistServe's ``d``."""
    if not p.get("decode_rows") or not d.get("decode_rows") or p.get("busy") is None or not d.get("busy"):
        return None
    return p["decode_rows"] / d["decode_rows"], d["decode_ms"] / p["decode_ms"], p["busy"] / d["busy"]


def _throughput_lines(res: dict) -> list[str]:
    rows = res.get("regimes")
    if not rows:
        return []
    cells = regimes.summarise(rows)
    out = ["**Throughput below DistServe (the paper: AlignedServe above every baseline).** Decode throughput is "
           "busy share x decode GPUs x rows per iteration / iteration time, so each variant's ratio over DistServe "
           "(same GPUs, same P/D split, same load) splits into three factors; the one far below 1 carries the loss. "
           "Stated reasons and their tests: (a) the paper's join rule (refill after completions up to the batch's "
           "block threshold, 40% of a decode GPU) holds fewer rows than DistServe: refuted if the greedy join (alignment kept, "
           "rows up to DistServe's) stays as far below DistServe; (b) the pool cut (40% of a decode GPU per batch): "
           "refuted if the 90% threshold changes nothing; (c) the P/D split's own capacity: AlignedServe and "
           "DistServe share it, so it can only set the ratio over vLLM (vLLM over DistServe printed). "
           "**Simulated**, the headline grid's runs (means over seeds, intervals over seeds):", "",
           "| workload | kernel | variant | over DistServe | rows | iteration speed | busy share | rows x speed x busy |",
           "|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for c in cells:
        d = c["premise"].get("DistServe", {})
        for lab in DECOMPOSED:
            p = c["premise"].get(lab)
            iv = c["over_distserve"].get(lab)
            f = _factors(p or {}, d)
            if iv is None or f is None:
                continue
            out.append(f"| {c['workload']} | {c['kernel']} | {lab} | {iv.format('{:.2f}')} | {f[0]:.2f} | {f[1]:.2f} | "
                       f"{f[2]:.2f} ({p['busy']:.0%} vs {d['busy']:.0%}) | {f[0] * f[1] * f[2]:.2f} |")
        verdicts.append(_throughput_verdict(c))
    vllm = "; ".join(f"{c['workload']}, {c['kernel']}: {c['over_distserve']['vLLM'].mean:.2f}x" for c in cells
                     if "vLLM" in c["over_distserve"])
    out += ["", "Reading (from the numbers above): " + "; ".join(v for v in verdicts if v) + ".",
            "", f"(c) vLLM over DistServe (the split's own cost, common to AlignedServe and DistServe): {vllm}."]
    return out + [""]


def _throughput_verdict(c: dict) -> str:
    iv = c["over_distserve"].get("AlignedServe")
    d = c["premise"].get("DistServe", {})
    f = _factors(c["premise"].get("AlignedServe", {}), d)
    if iv is None or f is None or iv.mean >= 1.0:
        return ""
    names = ("rows", "iteration speed", "busy share")
    logs = [math.log(x) for x in f]
    total = sum(x for x in logs if x < 0) or -1e-12
    main = min(range(3), key=lambda i: logs[i])
    text = (f"{c['workload']}, {c['kernel']}: AlignedServe {iv.mean:.2f}x of DistServe; factors rows {f[0]:.2f}, "
            f"speed {f[1]:.2f}, busy {f[2]:.2f}: {names[main]} carries {logs[main] / total:.0%} of the loss")
    greedy = c["over_distserve"].get("AlignedServe, greedy join")
    if greedy is not None:
        gf = _factors(c["premise"].get("AlignedServe, greedy join", {}), d)
        closes = greedy.mean >= 0.95 or greedy.excludes(1.0) and greedy.mean > 1
        text += (f"; (a) greedy join {greedy.format('{:.2f}')} of DistServe" + (f" at rows {gf[0]:.2f}" if gf else "")
                 + (": the join rule's rows explain the loss (not refuted)" if closes else
                    ": the join rule does not explain it all (refuted as the whole reason)"))
    cut = c["ratios"].get("AlignedServe, 90% threshold")
    if cut is not None:
        text += (f"; (b) over the 90% threshold {cut.format('{:.2f}')}" +
                 (": the pool cut is not the reason (refuted)" if not cut.excludes(1.0) else ": the cut matters"))
    return text


def _alignment_lines(res: dict) -> list[str]:
    rows = res.get("regimes")
    if not rows:
        return []
    cells = regimes.summarise(rows)
    out = ["**Alignment's own share per decode kernel (issue: ~1.00x under split-KV by construction, more under "
           "padded and per-sequence kernels).** AlignedServe over its FCFS-pool variant (same pool, join rule and "
           "prefetch). What alignment buys per iteration is measured without the rows confound by each run's "
           "iteration bubble (`policy_reports` `iteration_bubble`): how much longer its decode iterations took "
           "than the same iterations with each one's context spread evenly over its rows (the same KV reads, no "
           "long row); alignment's per-iteration gain is (1 + FCFS's bubble) / (1 + aligned bubble). Stated "
           "reason: under split-KV an iteration costs the sum of its contexts, which batching does not change; "
           "under per-seq and padded kernels the longest row bounds the step, which alignment shortens. Refuted if "
           "the gain differs from 1 by more than 5% under split-KV, or is not above 1 under padded:", "",
           "| workload | kernel | over FCFS pool | bubble, aligned / FCFS | per-iteration gain | rows | iteration "
           "speed | busy share |", "|---|---|---|---|---|---|---|---|"]
    verdict = {}
    for c in cells:
        a, b = c["premise"].get("AlignedServe", {}), c["premise"].get("AlignedServe, FCFS pool", {})
        iv = c["ratios"].get("AlignedServe, FCFS pool")
        f = _factors(a, b) if b.get("busy") else None
        if iv is None or f is None or "bubble" not in a or "bubble" not in b:
            continue
        gain = (1 + b["bubble"]) / (1 + a["bubble"])
        out.append(f"| {c['workload']} | {c['kernel']} | {iv.format('{:.2f}')} | {a['bubble']:.1%} / {b['bubble']:.1%} | "
                   f"{gain:.2f} | {f[0]:.2f} | {f[1]:.2f} | {f[2]:.2f} |")
        verdict.setdefault(c["kernel"], []).append((gain, iv.mean))
    parts = []
    for k, v in verdict.items():
        lo, hi = min(g for g, _ in v), max(g for g, _ in v)
        tput = f" (throughput over FCFS pool {min(t for _, t in v):.2f}-{max(t for _, t in v):.2f}x)"
        if k == "split-kv":
            ok = lo >= 0.95 and hi <= 1.05
            parts.append(f"split-kv per-iteration gain {lo:.2f}-{hi:.2f}x{tput}: " + (
                "~1.00 as the construction predicts (not refuted)" if ok else
                "departs from 1.00 (the construction's prediction is refuted here)"))
        else:
            parts.append(f"{k} per-iteration gain {lo:.2f}-{hi:.2f}x{tput}" + (
                ": alignment shortens the step (not refuted)" if lo > 1.0 else ": not above 1 everywhere"))
    out += ["", "Reading: " + "; ".join(parts) + ". Where throughput over the FCFS pool falls short of the "
            "per-iteration gain, rows or the busy share (same join rule in both) take it back."]
    return out + [""]


def _tpot_points(rows: list[dict]) -> list[tuple[float, str, str]]:
    """(baseline P99 / AlignedServe P99, baseline, point) for every baseline row of Figs. 7-10."""
    out = []
    for r in rows:
        if r["label"] == "AlignedServe":
            continue
        key = {k: r.get(k) for k in ("model", "short_share", "workload") if k in r}
        mine = [x for x in rows if x["label"] == "AlignedServe" and all(x.get(k) == v for k, v in key.items())]
        if mine and mine[0].get("tpot_p99_ms", 0) > 0:
            where = r.get("workload") or f"{r['model']} {r['short_share']:.0%} short"
            out.append((r["tpot_p99_ms"] / mine[0]["tpot_p99_ms"], r["label"], where))
    return out


def _tpot_range_lines(res: dict) -> list[str]:
    extra = res.get("gap_tpot_range")
    f8 = res.get("fig8", [])
    if not extra or not f8:
        return []
    pts = _tpot_points(f8 + res["fig7"])
    top, bottom = max(pts), min(pts)
    by = {(r["workload"], r["label"]): r for r in f8 + extra}
    for r in res.get("gap_tpot", []):
        by[(r["workload"], "AlignedServe, no KV wait")] = r
    labels = ("vLLM", "vLLM without chunked prefill", "DistServe", "AlignedServe", "AlignedServe, no KV wait",
              "AlignedServe, FCFS pool", "AlignedServe, FCFS pool, no KV wait", "AlignedServe, greedy join")
    out = [f"**P99 TPOT range (the paper {PAPER_TPOT[0]}-{PAPER_TPOT[1]}x lower for AlignedServe; before this test "
           "ours 0.502x - 12.5x).** The top end was vLLM on Azure code, the bottom end DistServe on Azure code. Stated "
           "reasons: at the top, our `vllm` runs whole prompts as prefill steps between decode iterations, so at "
           "time 0 a running request waits behind the backlog's prefills, while the paper's vLLM integrates "
           "Sarathi-Serve's chunked prefill; test: vLLM with chunked prefill (now the reproduction's vLLM) beside "
           "vLLM without it, refuted if the chunked one's P99 stays far above AlignedServe's. At the bottom, "
           "AlignedServe's iterations pause for joining KV, and an aligned batch of long requests reads more KV "
           "per iteration than a mixed batch of as many rows (split-KV: an iteration costs the sum of its "
           "contexts); tests: no KV waits, FCFS batches, both; refuted if none moves AlignedServe toward DistServe. "
           "The greedy join (rows as many as DistServe's) tests whether AlignedServe's lower P99 elsewhere is its "
           "smaller running batch. **Simulated**, Figs. 8/10's setting (OPT-6.7B, time 0, split-kv), P99 TPOT from "
           "the second token ms (decode rows per iteration):", "",
           "| workload | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    works = list(dict.fromkeys(r["workload"] for r in f8))
    for w in works:
        cells = []
        for lab in labels:
            r = by.get((w, lab))
            cells.append("n/a" if r is None else
                         f"{r['tpot_p99_ms']:.1f} ({_f(r['decode_step_ms'].get('rows_mean'), '{:.0f}')})")
        out.append(f"| {w} | " + " | ".join(cells) + " |")
    mine = {w: by[(w, "AlignedServe")]["tpot_p99_ms"] for w in works}
    chunk = {w: by[(w, "vLLM")]["tpot_p99_ms"] / mine[w] for w in works if (w, "vLLM") in by}
    plain = {w: by[(w, "vLLM without chunked prefill")]["tpot_p99_ms"] / mine[w] for w in works
             if (w, "vLLM without chunked prefill") in by}
    parts = [f"baseline / AlignedServe over Figs. 7-10 now {bottom[0]:.3g}x ({bottom[1]}, {bottom[2]}) - "
             f"{top[0]:.3g}x ({top[1]}, {top[2]})"]
    if plain:
        worst = max(plain, key=plain.get)
        parts.append(f"top: vLLM without chunked prefill / AlignedServe up to {plain[worst]:.3g}x ({worst}), with "
                     f"chunked prefill {chunk[worst]:.3g}x there: " + (
                         "no excess over the paper's range to explain" if plain[worst] <= PAPER_TPOT[1] else
                         "the prefill stall was the excess (not refuted)" if chunk[worst] <= PAPER_TPOT[1] else
                         "chunked prefill does not bring it into the paper's range (refuted as the whole reason)"))
        parts.append("vLLM with / without chunked prefill over AlignedServe per workload: " +
                     ", ".join(f"{w} {chunk[w]:.2f}x / {plain[w]:.2f}x" for w in works if w in chunk and w in plain))
    keys = ("DistServe", "AlignedServe", "AlignedServe, no KV wait", "AlignedServe, FCFS pool",
            "AlignedServe, FCFS pool, no KV wait")
    for w in works:
        if not all((w, k) in by for k in keys):
            continue
        dist, a, nk, fc, both = (by[(w, k)]["tpot_p99_ms"] for k in keys)
        if a <= 1.1 * dist:  # only where DistServe is clearly below (a small gap's shares are noise)
            continue
        gap = a - dist
        parts.append(f"bottom, {w}: AlignedServe {a:.1f} ms vs DistServe {dist:.1f}; without KV waits {nk:.1f}, FCFS "
                     f"batches {fc:.1f}, both {both:.1f}: KV waits {(a - nk) / gap:.0%} of the gap, alignment (aligned "
                     f"vs FCFS, both without waits) {(nk - both) / gap:.0%}, the rest {(both - dist) / gap:.0%}")
    greedy = {w: by[(w, "DistServe")]["tpot_p99_ms"] / by[(w, "AlignedServe, greedy join")]["tpot_p99_ms"]
              for w in works if (w, "AlignedServe, greedy join") in by and (w, "DistServe") in by}
    if greedy:
        parts.append("DistServe over AlignedServe with the greedy join (rows as DistServe's): " +
                     ", ".join(f"{w} {v:.2f}x" for w, v in greedy.items()) + " (against DistServe over AlignedServe: "
                     + ", ".join(f"{w} {by[(w, 'DistServe')]['tpot_p99_ms'] / mine[w]:.2f}x" for w in greedy) + ")")
    out += ["", "Reading (from the numbers above): " + "; ".join(parts) + "."]
    return out + [""]


def _prefetch_lines(res: dict) -> list[str]:
    rows = res.get("gap_prefetch")
    if not rows:
        return []
    out = ["**Prefetch (Figs. 11/14): where does the buffer have room?** The buffer is a prefill GPU's free HBM "
           "less the tenth kept for its prefills; a request is a few hundred of its blocks ('too big' counts requests "
           "larger than the buffer's whole room: none means size is never the reason). Stated reasons for skipped "
           "prefetches at time 0, each with the test that could refute it (refuted where skips stay): (1) the pool "
           "fills, so prefill GPUs keep KV they cannot offload: a pool large enough for the offline load's KV; "
           "(2) the requests buffer's own holds (up to 16 requests): no requests buffer; (3) the backlog's own KV "
           "on the prefill GPUs (prompts prefilled faster than their KV leaves): the same lengths as Poisson "
           "arrivals below DistServe's capacity. With room, prefetch's effect is measured against `prefetch=false`. "
           "**Simulated**, OPT-6.7B, split-kv:", "",
           "| workload | model | arrivals | variant | tok/s | P99 TPOT ms | depth at cut p50 / switch share / rows | "
           "pool peak GiB | prefetched | skipped (too big) | skipped: request / room / capacity blocks p50 | "
           "KV wait total (s) | release->landed p50 / p95 ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rt = r.get("router", {})
        sk = rt.get("prefetch_skips", {})
        out.append(f"| {r['workload']} | {r['model']} | {r['arrivals']} | {r['label']} | {r['decode_tok_s']:.0f} | "
                   f"{r['tpot_p99_ms']:.1f} | {_premise(rt)} | {_f(rt.get('pool_peak_gb'), '{:.0f}')} | "
                   f"{rt.get('num_prefetched', 0)} | {rt.get('num_prefetch_skipped', 0)} "
                   f"({sk.get('too_big', 0)}) | {sk.get('need_blocks_p50', 0):.0f} / {sk.get('room_blocks_p50', 0):.0f} / "
                   f"{sk.get('capacity_blocks', 0)} | {_f(rt.get('kv_wait_total_s'), '{:.1f}')} | "
                   f"{_f(rt.get('release_p50_ms'))} / {_f(rt.get('release_p95_ms'))} |")
    parts = []
    for key in dict.fromkeys((r["workload"], r["model"], r["arrivals"]) for r in rows):
        pair = {r["label"]: r for r in rows if (r["workload"], r["model"], r["arrivals"]) == key}
        on, off = pair.get("AlignedServe"), pair.get("w/o P")
        if on is None or off is None:
            continue
        rt = on["router"]
        made, skipped = rt.get("num_prefetched", 0), rt.get("num_prefetch_skipped", 0)
        room = made / (made + skipped) if made + skipped else float("nan")
        parts.append(f"{key[0]}, {key[1]}, {key[2]}: {room:.0%} of prefetches had room; without prefetch throughput "
                     f"{off['decode_tok_s'] / on['decode_tok_s'] - 1:+.1%}, P99 TPOT {on['tpot_p99_ms']:.1f} -> "
                     f"{off['tpot_p99_ms']:.1f} ms, KV wait {_f(on['router'].get('kv_wait_total_s'), '{:.1f}')}"
                     f" -> {_f(off['router'].get('kv_wait_total_s'), '{:.1f}')} s")
    out += ["", "Reading (the paper: -14.73% without prefetch on Azure conv): " + "; ".join(parts) + "."]
    verdicts = _prefetch_verdicts(rows)
    if verdicts:
        out += ["", "Verdicts (where time 0 skipped over a tenth of the prefetches): " + "; ".join(verdicts) + "."]
    return out + [""]


def _room(rows: list[dict], workload: str, prefix: str) -> float | None:
    """The share of prefetches that had room in AlignedServe's run at the first point whose arrivals start
    with ``prefix``."""
    for r in rows:
        if r["workload"] == workload and r["label"] == "AlignedServe" and r["arrivals"].startswith(prefix):
            rt = r["router"]
            made, skipped = rt.get("num_prefetched", 0), rt.get("num_prefetch_skipped", 0)
            return made / (made + skipped) if made + skipped else None
    return None


def _prefetch_verdicts(rows: list[dict]) -> list[str]:
    out = []
    for w in dict.fromkeys(r["workload"] for r in rows):
        base = _room(rows, w, "time 0")
        if base is None or base >= 0.9:
            continue
        tests = (("(1) full pool", _room(rows, w, "time 0, 4")), ("(2) requests buffer", _room(rows, w, "time 0, no")),
                 ("(3) backlog", _room(rows, w, "Poisson")))
        out.append(f"{w}: {base:.0%} had room at time 0; " + ", ".join(
            f"{name}: {v:.0%} with it removed ({'not refuted' if v >= 0.9 else 'refuted' if v < base + 0.2 else 'partly'})"
            for name, v in tests if v is not None))
    return out


def _premise(rt: dict) -> str:
    """Pool depth at cut (p50, blocks over the threshold), switch share and rows per iteration."""
    if not rt:
        return "n/a"
    depth = rt["pool_depth_at_cut"]["blocks_over_threshold_p10_p50_p90"][1]
    return f"{_f(depth)} / {rt['switch_share']:.0%} / {rt['rows_per_iteration_mean']:.1f}"
