"""The gap sections of the DynaServe report: each states a gap, the paper's reason for the
effect, and what our experiment testing that reason found, with its numbers."""

from __future__ import annotations

from servelab.designs.dynaserve.reproduce import report_tables as rt
from servelab.designs.dynaserve.reproduce.experiments import ratio
from servelab.designs.dynaserve.reproduce.report_tables import fmt


def gap_sections(results: dict) -> str:
    from servelab.designs.dynaserve.reproduce.report_capacity import coloc_gap, deployment_gap
    from servelab.designs.dynaserve.reproduce.paper_coloc import text as paper_coloc_text
    from servelab.designs.dynaserve.reproduce.step_gap import text as step_gap_text

    return "\n".join([deployment_gap(results), step_gap_text(results), coloc_gap(results),
                      paper_coloc_text(results), _vs_disagg(results),
                      _table1(results), _fig11(results),
                      _transfer(results), _overhead(results), _split(results)])


def _vs_disagg(results: dict) -> str:
    s = rt.summary_ratios(results["capacity"])
    by = rt.capacity_rows(results["capacity"])
    per = "; ".join(f"{wl} {fmt(ratio(v.get('dynaserve', {}).get('capacity_rps'), v.get('disagg', {}).get('capacity_rps')))}x"
                    for wl, v in by.items())
    t1 = [r for r in results["table1"] if r["system"] == "disagg"]
    imb = "; ".join(f"{r['shape']}: MFU {fmt(100 * r['instances'][0]['mfu'], 1)}% / "
                    f"{fmt(100 * r['instances'][1]['mfu'], 1)}%, KV {fmt(100 * r['instances'][0]['kv_use'], 1)}% / "
                    f"{fmt(100 * r['instances'][1]['kv_use'], 1)}%" for r in t1)
    return (
        f"**Capacity vs PD disaggregation: {fmt(s['disagg_min'])}-{fmt(s['disagg_max'])}x (paper 1.09-1.67x): "
        f"{per}.** The paper's reason: 1P1D leaves one instance under-used whenever prefill and decode work are "
        "not balanced. Test: the per-instance utilisation of 1P1D at saturation (Table 1 shapes, prefill "
        f"instance / decode instance): {imb}; one side idles while the other limits the rate, as the paper says. "
        "Two instances can at most double one instance's rate, so a ratio near 2 means 1P1D runs on one "
        "instance's worth of the bottleneck resource: the prefill instance on the prompt-heavy traces (our "
        "profile model's 14B prefill is compute-bound and the Azure/arXiv prompts are long against their outputs), "
        "the decode instance's rows and KV on mini-reasoning. The paper's smaller ratios suggest its workloads "
        "were closer to balanced for 1P1D than ours are on this cost model.\n")


def _table1(results: dict) -> str:
    rows = {(r["shape"], r["system"]): r for r in results["table1"]}
    over = [r["shape"] for r in results["table1"] if r["system"] == "disagg" and r["tbt_p99_s"] > 0.1]
    parts = []
    for shape in rt.PAPER_TABLE1:
        c, d = rows.get((shape, "coloc")), rows.get((shape, "disagg"))
        if c and d:
            parts.append(f"{shape}: p99 TBT coloc. {fmt(1e3 * c['tbt_p99_s'], 0)} ms vs disagg. "
                         f"{fmt(1e3 * d['tbt_p99_s'], 0)} ms, throughput {fmt(c['saturated_rps'])} vs "
                         f"{fmt(d['saturated_rps'])} req/s")
    return (
        "**Table 1 (absolute numbers differ; the pattern is the test).** Our A100 profile model is faster than the "
        "paper's vLLM 0.7.2 measurements, so rates and TBTs are not comparable one to one; each system runs at "
        "1.25x its own service rate. The paper's claims are that colocation with vLLM's 2048-token chunk breaks "
        "the TBT SLO on all three shapes while 1P1D keeps it, and that 1P1D loses throughput to idle instances: "
        + "; ".join(parts) + "." + (" Where 1P1D's p99 TBT exceeds the SLO here (" + ", ".join(over) + ") it is "
        "the first gap: the decode instance, full at saturation, takes a handed-off request only when memory "
        "frees, so queueing that colocation shows as TTFT appears in 1P1D between the first and second token."
        if over else "") + "\n")


def _fig11(results: dict) -> str:
    slo = {r["slo_aware"]: r for r in results["slo_batching"]}
    on, off = slo[True], slo[False]
    return (
        f"**SLO-aware batching (Fig. 11).** Without it (a fixed 2048-token prefill budget per step), "
        f"{fmt(100 * off['token_share_within'], 1)}% of tokens arrive within 100 ms (p99 TBT "
        f"{fmt(1e3 * off['tbt_p99_s'], 0)} ms, {fmt(100 * off['attainment'], 1)}% of requests meet the SLO); with "
        f"it {fmt(100 * on['token_share_within'], 1)}% (p99 {fmt(1e3 * on['tbt_p99_s'], 0)} ms, "
        f"{fmt(100 * on['attainment'], 1)}%). The paper's reason for its 52% is PD interference under pressure "
        "(its rate and workload are not given); ours, at 1.2x DynaServe's capacity on burstgpt, "
        + ("shows the same effect" if on["token_share_within"] > off["token_share_within"] else
           "does not show the effect at this rate") + ": without the budget, 2048-token chunks land next to "
        f"decodes and the p99 TBT reaches {fmt(1e3 * off['tbt_p99_s'], 0)} ms. How "
        "many tokens miss depends on how often prefill waits, which is workload- and rate-specific.\n")


def _transfer(results: dict) -> str:
    rows = results["transfer"]
    light = {r["mode"]: r for r in rows if r["load"] == "light"}
    heavy = {r["mode"]: r for r in rows if r["load"] == "heavy"}
    lb, lc = light.get("bulk", {}), light.get("chunked", {})
    hb, hc, hd = heavy.get("bulk", {}), heavy.get("chunked", {}), heavy.get("default", {})
    cut = _cut(lb, lc)
    return (
        "**Chunked KV transfer.** Non-overlapped transfer: from each split request's hand-off on its first "
        "instance to its KV landing on the second, summed. At light load (mini-reasoning at "
        f"{fmt(lb.get('rate'))} req/s), bulk {fmt(lb.get('non_overlapped_total_s'), 3)} s "
        f"({fmt(lb.get('non_overlapped_mean_ms'), 3)} ms per request) and chunked "
        f"{fmt(lc.get('non_overlapped_total_s'), 3)} s ({fmt(lc.get('non_overlapped_mean_ms'), 3)} ms): chunking "
        f"removes {fmt(100 * cut if cut is not None else None, 1)}%, the paper's mechanism (the paper: 94%). It "
        "has a cost the paper does not discuss, which our cluster layer makes visible: the destination reserves "
        "the whole KV when the first chunk starts, so a split in the decode phase holds the second instance's "
        f"memory for the first instance's whole decode phase. At {fmt(hb.get('rate'))} req/s the peak KV use is "
        f"{fmt(100 * hc.get('kv_use_max', 0), 1)}% chunked against {fmt(100 * hb.get('kv_use_max', 0), 1)}% bulk "
        f"(non-overlapped {fmt(hc.get('non_overlapped_total_s'), 3)} s against "
        f"{fmt(hb.get('non_overlapped_total_s'), 3)} s; attainment {fmt(100 * hc.get('attainment', 0), 1)}% "
        f"against {fmt(100 * hb.get('attainment', 0), 1)}%)" + _memory_note(hb, hc) + ". The paper's deployment (our main configuration) streams every split; servelab's variant "
        "streams only splits inside the prompt (their KV is large and on the TTFT path; a decode-phase hand-off "
        "copies a few hundred tokens in under a millisecond over NVLink, far inside the 100 ms TBT budget): "
        f"{fmt(hd.get('non_overlapped_total_s'), 3)} s at that load, attainment "
        f"{fmt(100 * hd.get('attainment', 0), 1)}% (its capacity effect: the variants table, 'bulk decode splits').\n")


def _memory_note(bulk: dict, chunked: dict) -> str:
    b, c = bulk.get("non_overlapped_total_s"), chunked.get("non_overlapped_total_s")
    if b is not None and c is not None and c > b:
        return "; here hand-offs waited for memory at the destination, so streaming lost its advantage"
    return ("; memory does not bind yet at this load (the router also keeps parts off an instance whose KV was "
            "over 90% full after its last step)")


def _cut(bulk: dict, chunked: dict) -> float | None:
    b, c = bulk.get("non_overlapped_total_s"), chunked.get("non_overlapped_total_s")
    return 1 - c / b if b and c is not None else None


def _overhead(results: dict) -> str:
    runs = results["overhead"]["runs"]
    bench = results["overhead"]["benchmark"]
    worst = max((r["decision_us"].get("p99", 0) for r in runs), default=0)
    verdict = "meets" if worst < 100 else "misses"
    n = max((r.get("runs", 1) for r in runs), default=1)
    repeated = f" (median of {n} runs each: the machine is shared)" if n > 1 else ""
    load = results["overhead"].get("load_avg_1min")
    where = (f" (this process at nice {results['overhead'].get('nice')}, 1-minute load average "
             f"{' -> '.join(fmt(x, 1) for x in load)} on the shared 2-core machine: a decision preempted by another "
             "process resumes with cold caches, so its CPU time grows with the load; "
             "`scripts/dynaserve_decision_time.py` measures the same runs at high priority: "
             "docs/benchmarks/dynaserve_decision_time.md)") if load else ""
    plans = [r["schedule_us"].get("p99") for r in runs if r.get("schedule_us")]
    plan = (f" Algorithm 2's batch planner (the local scheduler's `schedule`, once per step) takes p99 "
            f"{fmt(max(plans), 0)} us per step in the same runs." if plans else "")
    return (
        f"**Scheduler time.** In runs at capacity{repeated}{where} the decision's p99 is {fmt(worst, 0)} us: it "
        f"{verdict} the 100 us goal.{plan} A decision is the pair choice (both timelines brought to now), at most six probes of "
        "the two instances' work (arithmetic on the work already laid into their passes) and queuing both "
        "parts (one O(log passes) probe each for where they land); laying parts into the passes and the "
        "once-a-second calibration against the real queues run after steps, off the decision path (their "
        "per-request share is in the table). The isolated benchmark shows the cost does not grow with the queue (p50 "
        + ", ".join(f"{fmt(b['p50'], 0)} us at {b['queue']}" for b in bench) + "). The paper's 13.7-17.5 ms "
        "is for a C++ scheduler in a proxy; ours is Python in the simulator's process.\n")


def _split(results: dict) -> str:
    split = [r for r in results["split_sweep"] if r["split"] != "dynamic"]
    if not split:
        return ""
    best = max(split, key=lambda r: r["requests_per_s"])
    pd = next((r for r in split if abs(r["decode_fraction"]) < 1e-9), None)
    dyn = next((r for r in results["split_sweep"] if r["split"] == "dynamic"), None)
    return (
        f"**Fig. 5.** The best fixed split moves {fmt(best['decode_fraction'])} of the decode to the first "
        f"instance ({fmt(best['requests_per_s'], 3)} req/s, busy {fmt(best['busy_0'])} / {fmt(best['busy_1'])}) "
        f"against {fmt(pd['requests_per_s'] if pd else None, 3)} req/s for plain disaggregation "
        f"({fmt(ratio(best['requests_per_s'], pd['requests_per_s']) if pd else None)}x); the paper's peak is near "
        "0.3. The reason the paper gives, balancing the two instances' execution time, is what the busy shares "
        f"show. The dynamic router reaches {fmt(dyn['requests_per_s'] if dyn else None, 3)} req/s with a mean "
        f"decode share of {fmt(dyn['decode_fraction'] if dyn else None)} on its first instance.\n")
