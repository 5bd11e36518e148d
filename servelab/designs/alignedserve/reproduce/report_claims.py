"""The report's claims: the claims table (split-KV, full sizes), the same claims under each
``--attention-kernel`` at reduced sizes (``kernels.figure_claims``), and the batch-switch gap
test (``kernels.switch_gap``)."""

from __future__ import annotations

import numpy as np

from servelab.costmodel.attention import KERNELS
from servelab.designs.alignedserve.reproduce import kernels as kn


def _ratio(rows, key, num_label, den_label, **match) -> float | None:
    def pick(label):
        for r in rows:
            if r["label"] == label and all(r.get(k) == v for k, v in match.items()):
                return r[key]
        return None
    a, b = pick(num_label), pick(den_label)
    return a / b if a and b else None


def _f(x, fmt="{:.2f}") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not np.isfinite(x)) else fmt.format(x)


def claim_rows(res: dict) -> list[tuple[str, str, str, str]]:
    """(claim, paper, ours, operating point) from the figures' rows (``res``: the main results,
    or one kernel's ``figure_claims``; the Density First Search row only where ``dfs`` is)."""
    f7 = res["fig7"]
    m0 = f7[0]["model"]
    top = max(r["short_share"] for r in f7)
    r7 = [_ratio(f7, "decode_tok_s", "AlignedServe", b, model=m0, short_share=top)
          for b in ("vLLM", "DistServe", "FastGen (sarathi)")]
    f8 = res["fig8"]
    apps = list(dict.fromkeys(r["workload"] for r in f8))
    best8 = {a: max((_ratio(f8, "decode_tok_s", "AlignedServe", b, workload=a) or 0)
                    for b in ("vLLM", "DistServe", "FastGen (sarathi)")) for a in apps}
    tp = _tpot_ratios(f8 + f7)
    tp0 = _tpot_ratios(f8 + f7, "tpot_from_first_p99_ms")
    f11 = {(r["workload"], r["label"]): r for r in res["fig11"]}
    share = {w: f11[(w, "AlignedServe")]["router"]["switch_share"] for w, lab in f11 if lab == "AlignedServe"}
    joins = {w: f11[(w, "AlignedServe")]["router"].get("switch_event_share") for w in share}
    f13 = {(r["workload"], r["batching"]): r for r in res["fig13"]}
    f14 = {r["label"]: r["decode_tok_s"] for r in res["fig14"]}
    rows = [
        ("Fig. 7: throughput at 95% short, OPT-2.7B, vs vLLM / DistServe / FastGen", "1.32x / 1.35x / 1.85x",
         " / ".join(_f(x, "{:.2f}x") for x in r7), f"{m0}, {top:.0%} short, {res['sizes']['num_requests']} requests"),
        ("Figs. 8: best throughput ratio over any baseline", "up to 1.98x (LongBench), 1.35x (ShareGPT), 1.98x (Azure)",
         "; ".join(f"{a} {_f(v, '{:.2f}x')}" for a, v in best8.items()), "OPT-6.7B, all at t=0"),
        ("Figs. 9-10: P99 TPOT, baseline / AlignedServe", "1.74-3.05x lower",
         (f"{_f(min(tp), '{:.3g}x')} - {_f(max(tp), '{:.3g}x')}" if tp else "n/a") + (
             f" (TPOT from the first token, the pool wait inside: {_f(min(tp0), '{:.3g}x')} - {_f(max(tp0), '{:.3g}x')})"
             if tp0 else ""), "every workload and baseline above; TPOT from the second token (the first a decode "
         "iteration makes), every system alike"),
        ("Fig. 11: iterations scheduled within 5 ms (AlignedServe) / DistServe hand-offs over 10 ms",
         "> 95% / 80%", _fig11_claim(res["fig11"]), "OPT-6.7B, ShareGPT-like and LongBench-like"),
        ("Fig. 13: forward passes under 30 ms, prefix-aware / FCFS", "> 90% / < 10%",
         "; ".join(f"{w}: {f13[(w, 'prefix-aware')]['share_under_30ms']:.0%} / {f13[(w, 'FCFS')]['share_under_30ms']:.0%}"
                   for w in dict.fromkeys(k[0] for k in f13)), "OPT-13B"),
        ("Fig. 14: throughput without prefetch / without prefetch and batching (Azure conv)", "-14.73% / further -28.51%",
         f"{_f(f14['w/o P'] / f14['AlignedServe'] - 1, '{:+.1%}')} / {_f(f14['w/o P&B'] / f14['w/o P'] - 1, '{:+.1%}')}",
         "OPT-6.7B, Azure conv"),
        ("Batch-switch iterations", "<= 8.61% (ShareGPT), 12.37% (LongBench)",
         "; ".join(f"{w}: {v:.1%}" + (f" (iterations after which another batch joined: {joins[w]:.1%})"
                                       if joins[w] is not None else "") for w, v in share.items()),
         "OPT-6.7B; mixed iterations (the paper's wording), in brackets Algorithm 2's case 2 happening"),
        ("Fig. 15: mean TTFT without starvation handling", "1.49 s (ShareGPT), 2.54 s (LongBench)",
         "; ".join(f"{w}: TTFT {f11[(w, 'AlignedServe, no starvation bound')]['ttft_mean_s']:.2f} s, pool wait "
                   f"(first to second token) {f11[(w, 'AlignedServe, no starvation bound')]['second_token_mean_s']:.2f} s"
                   for w in share), "OPT-6.7B"),
    ]
    dfs = res.get("dfs")
    if dfs:
        rows.append(("Density First Search with 100,000 requests (**measured**, CPU time)", "< 1 ms (goal)",
                     f"p50 {dfs['p50_ms']:.3f} ms, p99 {dfs['p99_ms']:.3f} ms", f"{dfs['num_requests']} requests, "
                     f"threshold {dfs['max_blocks']} blocks (40% of OPT-13B on H100), this machine"))
    return rows


def _claims(res: dict) -> list[str]:
    out = ["## Claims", "", "| claim | paper | ours | operating point |", "|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in claim_rows(res)]
    return out + [""]


def _tpot_ratios(rows: list[dict], key: str = "tpot_p99_ms") -> list[float]:
    """Each baseline's P99 TPOT over AlignedServe's at the same point (``key``: which TPOT)."""
    out = []
    for r in rows:
        if r["label"] == "AlignedServe":
            continue
        point = {k: r.get(k) for k in ("model", "short_share", "workload") if k in r}
        mine = [x for x in rows if x["label"] == "AlignedServe" and all(x.get(k) == v for k, v in point.items())]
        if mine and key in r and mine[0].get(key, 0) > 0:
            out.append(r[key] / mine[0][key])
    return out


def _fig11_claim(rows: list[dict]) -> str:
    parts = []
    for r in rows:
        if r["label"] == "AlignedServe":
            parts.append(f"{r['workload']}: decision {_f(r['decision_share_under_5ms'], '{:.0%}')}, KV on the decode "
                         f"GPU within 5 ms {_f(r['release_share_under_5ms'], '{:.0%}')}")
        elif r["label"] == "DistServe":
            parts.append(f"DistServe hand-offs over 10 ms {_f(r['handoff_share_over_10ms'], '{:.0%}')}")
    return "; ".join(parts)




def kernel_claim_lines(res: dict) -> list[str]:
    """Each claim under every decode kernel, at the same reduced sizes (one column per kernel)."""
    runs = {k: res[f"claims_{k}"] for k in KERNELS if res.get(f"claims_{k}")}
    if not runs:
        return []
    sz = next(iter(runs.values()))["sizes"]
    table = {k: claim_rows(v) for k, v in runs.items()}
    first = next(iter(table.values()))
    out = ["## Claims under each decode kernel (item 6; reduced sizes)", "",
           f"**Simulated**, the same claims rerun under every `--attention-kernel` of the cost model at reduced sizes "
           f"so the extra kernels stay cheap: {sz['models'][0]} for Fig. 7 at {sz['short_shares'][0]:.0%} short, "
           f"{sz['num_requests']} synthetic and {sz['app_requests']} application requests (the main table: "
           f"{res['sizes']['num_requests']} and {res['sizes']['app_requests']}), {sz['num_gpus']} GPUs, seed "
           f"{res['seed']}. The split-kv column is rerun at these sizes too, so the columns differ in the kernel "
           "alone. No GPU was lent to this task: no measured-profile column.", "",
           "| claim | paper | " + " | ".join(f"ours, {k}" for k in table) + " |", "|---|---|" + "---|" * len(table)]
    for i, (claim, paper, _, _) in enumerate(first):
        out.append(f"| {claim} | {paper} | " + " | ".join(rows[i][2] for rows in table.values()) + " |")
    return out + [""]


def switch_gap_lines(res: dict) -> list[str]:
    rows = res.get("gap_switch")
    if not rows:
        return []
    out = ["", "**Batch-switch share (ours 50-80%, the paper <= 8.61% / 12.37%).** The paper counts \"the fraction "
           "of iterations that contain requests from different batches\" (Section 4.4), as we do (an iteration whose "
           "running requests carry more than one batch id; the other reading is tested below). Hypothesis: under the "
           "paper's join rule a new batch enters as the running batch's completions release blocks (about one for one "
           "while rows hold steady); were completions in "
           "join order, R running rows would hold one batch only while the last R joins came from one batch of B, "
           "a share of about min(1, R / B) (the 'R/B' column; a batch's dynamic joins from the pool make it longer than "
           "B, so the share can lie below), higher when output lengths vary (an old batch's long requests linger); "
           "the paper's share would then need batches about 12x its rows per iteration. The test "
           "caps the decode GPU's rows (R) at the same batch cut (B), and gives every request the same output "
           f"length ({kn.CONSTANT_OUTPUT} tokens: completions in join order). The hypothesis is refuted if the share "
           "does not fall with R / B. "
           f"**Simulated**, {rows[0]['model']}, AlignedServe preset, {rows[0]['num_requests']} requests at time 0, "
           "default (split-kv) kernel:", "",
           "| workload | decode row cap | rows/iter R | batch size B | min(1, R/B) | switch share | "
           "joins per iteration | cuts over threshold | tok/s |", "|---|---|---|---|---|---|---|---|---|"]
    all_rows, rows = rows, [r for r in rows if not r.get("variant")]
    for r in rows:
        out.append(f"| {r['workload']} | {r['row_cap'] or 'preset'} | {r['rows']:.1f} | {r['batch_size_mean']:.1f} | "
                   f"{r['floor']:.1%} | {r['switch_share']:.1%} | {r['joins_per_iteration']:.2f} | "
                   f"{r['share_over_threshold']:.0%} | {r['decode_tok_s']:.0f} |")
    need = [0.0861 * r["batch_size_mean"] for r in rows if r["row_cap"] is None and not r.get("variant")]
    out += ["", "Reading (from the numbers above): " + "; ".join(
        f"{r['workload']}, cap {r['row_cap'] or 'preset'}: share {r['switch_share']:.1%} at R/B {r['floor']:.2f}"
        for r in rows) + ". At R/B = share, the paper's 8.61% at our preset's batch sizes would mean about "
        + ", ".join(f"{x:.1f}" for x in need) + " rows per iteration; the preset runs "
        + ", ".join(f"{r['rows']:.1f}" for r in rows if r["row_cap"] is None and not r.get("variant"))
        + " (and rows are what a decode iteration's throughput is made of: the tok/s column)."]
    return out + _switch_definition_lines(all_rows)


def _switch_definition_lines(rows: list[dict]) -> list[str]:
    """The two readings of a batch switch, and the test of why the mixed share is high."""
    if not any("switch_event_share" in r for r in rows):
        return []
    out = ["", "**What the paper counts, and why ours is high.** Section 4.4 asks \"how many iterations that the batch "
           "switch is occurring\" and answers with \"the fraction of iterations that contain requests from different "
           "batches\"; Section 3.4 calls the moment requests of the Candidate Batch Buffer join the running batch "
           "(case 2) \"the very time when the scheduler switches one batch to another\". Requests the scheduler pulls "
           "from the pool into the Candidate Requests Buffer (dynamic scheduling) belong to the running batch in both "
           "(ours carry its batch id). Both readings are printed: **mixed** (an iteration whose running requests carry "
           "more than one batch id), **joins** (an iteration after which requests of another batch joined: case 2 "
           "happening), and, of the mixed iterations, the median share of rows outside the largest batch. Hypothesis "
           "for the mixed share: the Candidate Requests Buffer runs dry (no evictions while the decode GPU holds ~40% "
           "of its blocks; dynamic joins bounded by the buffer's 16 per batch), so case 2 starts at the running batch's "
           "first completions and the old batch's longer outputs stay until they finish. Test: dynamic joins unbounded "
           "(`requests_buffer=1000`: pool requests in the running batch's range keep joining as that batch); refuted if "
           "the mixed share does not fall.", "",
           "| workload | variant | switch share: mixed | joins | rows outside the largest batch (p50, mixed) | "
           "rows/iter | tok/s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["row_cap"] is not None or "switch_event_share" not in r:
            continue
        out.append(f"| {r['workload']} | {r.get('variant') or 'preset'} | {r['switch_share']:.1%} | "
                   f"{r['switch_event_share']:.1%} | {r['minority_p50']:.0%} | {r['rows']:.1f} | {r['decode_tok_s']:.0f} |")
    base = {r["workload"]: r for r in rows if r["row_cap"] is None and not r.get("variant")}
    parts = []
    for r in rows:
        b = base.get(r["workload"])
        if not r.get("variant") or b is None:
            continue
        fell = r["switch_share"] < b["switch_share"] - 0.05
        parts.append(f"{r['workload']}: mixed {b['switch_share']:.1%} -> {r['switch_share']:.1%} "
                     f"({'not refuted' if fell else 'refuted'}), throughput {r['decode_tok_s'] / b['decode_tok_s']:.2f}x")
    out += ["", "Reading (from the numbers above): under the joins reading the preset's share is "
            + ", ".join(f"{w} {b['switch_event_share']:.1%}" for w, b in base.items())
            + " (the paper: <= 8.61% ShareGPT, 12.37% LongBench); " + "; ".join(parts) + "."]
    return out
