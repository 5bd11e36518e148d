"""The report's P99 TPOT gap test: is a long P99 TPOT decoding, or the wait before it?

Built from Figs. 8/10's runs (every system, TPOT split by ``latency.split``, AlignedServe's
own pool-wait statistic from its router) and ``experiments.gap_tpot`` (AlignedServe whose
decode iterations never wait for joining KV)."""

from __future__ import annotations

from servelab.designs.alignedserve.reproduce.report_claims import _f, _tpot_ratios


def tpot_gap_lines(res: dict) -> list[str]:
    f8 = res.get("fig8", [])
    if not f8 or "tpot_from_first_p99_ms" not in f8[0]:
        return []
    extra = {r["workload"]: r for r in res.get("gap_tpot", [])}
    out = ["", "**P99 TPOT (the paper: baselines 1.74-3.05x above AlignedServe; ours before this test down to "
           "0.0018x).** Hypothesis: the wait in the host pool between prefill and joining a decode batch was "
           "counted in TPOT. The paper's P99 TPOT \"characterizes the latency of each decoding iteration\" "
           "(Section 4.3) and its pool wait \"deteriorates the TTFT\" (Fig. 15); our prefill emits the first token, "
           "so that wait lies between the first and the second token. The split per request: TPOT from the first "
           "token (the definition before this test), TPOT from the second token (the first a decode iteration "
           "makes; now the definition for every system and every table), the first-to-second-token wait, "
           "AlignedServe's own pool wait (its router: KV into the pool -> on a decode GPU, `policy_reports` "
           "`pool_wait_s`), the P99 of every gap between decode tokens, and the top 1% of requests by the old "
           "TPOT: their median output length and the share of their time that was the first wait. The hypothesis "
           "is refuted where that share is small or the TPOT from the second token stays near the old one. "
           f"**Simulated**, {f8[0]['model']}, {f8[0]['num_requests']} requests at time 0, {f8[0]['num_gpus']} GPUs, "
           "default (split-kv) kernel:", "",
           "| workload | system | P99 TPOT from 1st token (ms) | P99 TPOT from 2nd token (ms) | first->second "
           "wait p50 / p99 (s) | pool wait p50 / p99 (s) | P99 decode gap (ms) | top 1% by old TPOT: output "
           "tokens, wait share | KV wait total (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for w in dict.fromkeys(r["workload"] for r in f8):
        rows = [r for r in f8 if r["workload"] == w] + ([extra[w]] if w in extra else [])
        for r in rows:
            rt = r.get("router", {})
            pw = rt.get("pool_wait_s", {})
            out.append(f"| {w} | {r['label']} | {r['tpot_from_first_p99_ms']:.1f} | {r['tpot_p99_ms']:.1f} | "
                       f"{_f(r['first_gap_p50_s'])} / {_f(r['first_gap_p99_s'])} | "
                       f"{_f(pw.get('p50')) + ' / ' + _f(pw.get('p99')) if pw else 'n/a'} | "
                       f"{r['decode_gap_p99_ms']:.1f} | {r['top1_output_tokens']:.0f}, {r['top1_first_gap_share']:.0%} | "
                       f"{_f(rt.get('kv_wait_total_s'), '{:.1f}') if rt else 'n/a'} |")
    new, old = _tpot_ratios(f8 + res["fig7"]), _tpot_ratios(f8 + res["fig7"], "tpot_from_first_p99_ms")
    mine = {r["workload"]: r for r in f8 if r["label"] == "AlignedServe"}
    dist = {r["workload"]: r for r in f8 if r["label"] == "DistServe"}
    verdict = "; ".join(
        f"{w}: AlignedServe {m['tpot_from_first_p99_ms']:.0f} -> {m['tpot_p99_ms']:.1f} ms, its top 1% "
        f"{m['top1_output_tokens']:.0f} tokens long with {m['top1_first_gap_share']:.0%} of their time the wait"
        for w, m in mine.items())
    kv = "; ".join(f"{w}: {mine[w]['tpot_p99_ms']:.1f} -> {e['tpot_p99_ms']:.1f} ms (DistServe "
                   f"{dist[w]['tpot_p99_ms']:.1f})" for w, e in extra.items() if w in mine and w in dist)
    held = [w for w, m in mine.items() if m["top1_first_gap_share"] >= 0.5 and m["tpot_from_first_p99_ms"] >= 2 * m["tpot_p99_ms"]]
    verdict += (f". The hypothesis holds on {len(held)} of {len(mine)} workloads" + (f" (not on {', '.join(w for w in mine if w not in held)})"
                if len(held) < len(mine) else "") + " (top 1% at least half wait, P99 TPOT at least halved without it)")
    out += ["", f"Reading (from the numbers above): {verdict}. Baseline / AlignedServe P99 TPOT over Figs. 7-10: "
            f"{_f(min(old), '{:.3g}x')} - {_f(max(old), '{:.3g}x')} from the first token, "
            f"{_f(min(new), '{:.3g}x')} - {_f(max(new), '{:.3g}x')} from the second. What is left once the wait is "
            "out, tested by decode iterations that never wait for joining KV (AlignedServe, no KV wait), P99 TPOT "
            f"from the second token: {kv}. The first-to-second wait itself is TTFT's in the paper (Fig. 15's "
            "claim row); at time 0 every request queues somewhere: DistServe before prefill and "
            "for decode memory, AlignedServe in the pool."]
    return out


def fig15_gap_lines(res: dict) -> list[str]:
    rows = res.get("gap_fig15")
    if not rows:
        return []
    out = ["", "**Fig. 15 (the paper's mean TTFT 1.49 s ShareGPT, 2.54 s LongBench; ours at time 0 the "
           "first-to-second-token wait, several times that).** Hypothesis: at time 0 the wait is the offline "
           "queue, which in AlignedServe sits in the pool (DistServe's sits before prefill). Test: the same "
           "lengths as a Poisson process at a share of DistServe's offline request rate on them (its capacity); "
           "refuted if AlignedServe's wait stays long below capacity. **Simulated**, "
           f"{rows[0]['model']}, {rows[0]['num_requests']} requests, {rows[0]['num_gpus']} GPUs, split-kv:", "",
           "| workload | load (of DistServe's capacity) | rate req/s | system | TTFT mean (s) | first->second "
           "mean / p99 (s) | tok/s | P99 TPOT from 2nd token (ms) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['workload']} | {r['load']:.0%} | {r['rate']:.1f} | {r['label']} | {r['ttft_mean_s']:.2f} | "
                   f"{r['second_token_mean_s']:.2f} / {_f(r['first_gap_p99_s'])} | {r['decode_tok_s']:.0f} | "
                   f"{r['tpot_p99_ms']:.1f} |")
    def ttft(r):  # the paper's TTFT: our TTFT plus the first-to-second-token wait
        return r["ttft_mean_s"] + r["second_token_mean_s"]

    t0 = {r["workload"]: r for r in res.get("fig11", []) if r["label"] == "AlignedServe, no starvation bound"}
    parts = []
    for w in dict.fromkeys(r["workload"] for r in rows):
        nob = sorted((r for r in rows if r["workload"] == w and r["label"] == "AlignedServe, no starvation bound"),
                     key=lambda r: r["load"])
        bound = {r["load"]: r for r in rows if r["workload"] == w and r["label"] == "AlignedServe"}
        paper = PAPER_TTFT_S.get(w)
        low = nob[0]
        verdict = ("the offline queue explains the gap" if paper and ttft(low) <= paper else
                   "the wait stays above the paper's below capacity: the queue is not the whole reason")
        parts.append(f"{w}: " + (f"at time 0 {ttft(t0[w]):.2f} s, " if w in t0 else "") + ", ".join(
            f"at {r['load']:.0%} load {ttft(r):.2f} s (with the 10 s bound {ttft(bound[r['load']]):.2f} s)"
            for r in nob if r["load"] in bound) + f", the paper {_f(paper)} s: {verdict}")
    out += ["", "Reading (AlignedServe's TTFT as the paper counts it, TTFT + first->second wait, without the "
            "starvation bound as in Fig. 15): " + "; ".join(parts) + ". Where the bound shortens the wait below "
            "capacity, requests of sparse prefix ranges waiting for a batch are its reason. The paper states no "
            "load for Fig. 15."]
    return out


PAPER_TTFT_S = {"ShareGPT-like": 1.49, "LongBench-like (arXiv)": 2.54}  # Fig. 15's means
