"""The residual gap to vLLM-PP at the faithful point: with the dispatcher that removes the gap of
``gap_pp``'s H1 (``dispatch=kv+compute``, called *KunServe* here), KunServe's P99 TTFT stays about
1.1x vLLM-PP's. Three candidate reasons, read from where the worst requests wait (``waits``: in
every phase KunServe is a single instance, *no group* and *burst, no group*, its P99 TTFT was above
vLLM-PP's on the same arrivals, even before the burst where memory plays no part), each with the
experiment that could refute it, its predictions fixed before the run:

R1, the DP phase: the residual lies in the arrivals KunServe serves as data-parallel single
instances (before its first group's exchange lands), where vLLM-PP's pairs already pool two
GPUs' step budget, and pipelines serve a prompt sooner than DP does even with memory to spare.
Predicts, on a majority of seeds: (a) most of KunServe's worst 1% arrived while it was DP;
(b) DP with memory unbound (vLLM, 4x the KV) has a higher P99 TTFT than vLLM-PP over those same
arrivals (the burst before the drop): the pipelines' advantage there is not memory; (c) over the
arrivals while KunServe is pipelined its P99 is within ``CLOSE`` of vLLM-PP's.

R2, the prompt cut between microbatches: vLLM-PP's token-chunking former cuts a prompt's chunk
between the two microbatches of a step, so its halves run on both stages at once and its
prefill ends sooner than on one GPU (a DP instance) or than vLLM's virtual engines allow (a
request bound to one engine). Predicts: (a) vLLM-PP's prefill span (first scheduled to first
token) at P50 below KunServe's over the burst's DP arrivals; (b) vLLM-PP with whole rows per
microbatch (``former=rows``: the prompt not cut) has a P99 TTFT at or above KunServe's
(KunServe / it <= 1 + ``CLOSE``, mean and a majority of seeds): the residual closes.

R3, KunServe's lookahead former: with every instance paired from t=0 (vLLM-PP's configuration,
KunServe's groups) the P99 was 1.31x vLLM-PP's in the previous run; if KunServe's lookahead
former (a step's share of the whole queue's cost) is what slows its pipelines, the same
configuration with vLLM-PP's token chunking closes at least half of that gap (mean, and lower
on a majority of seeds).

R3 on the residual itself (a second step, ``run_tokens``, added after R3 held on the t=0
configuration; its prediction fixed before it ran): the reactive KunServe (kv+compute) with token
chunking closes at least half of its P99 gap to vLLM-PP (mean, and lower on a majority of seeds).

Runs: the faithful rate, every seed's arrivals (same lengths and bursts), the systems of
``SYSTEMS`` (``KV_SCALE``: the 4x-KV DP run, as the premise check's ceiling).
"""

from __future__ import annotations

import numpy as np

from servelab.designs.kunserve.reproduce import experiments as ex
from servelab.designs.kunserve.reproduce import setting as st
from servelab.designs.kunserve.reproduce import waits
from servelab.designs.kunserve.reproduce.gap_pp import nested_get
from servelab.designs.kunserve.reproduce.gaps import _T0

KUN, PP, PP_ROWS, T0, T0_TOKENS, DP4 = ("kunserve kv+compute", "vllm-pp", "vllm-pp, prompt not cut",
                                        "kunserve pipelined from t=0", "kunserve pipelined from t=0, token chunking",
                                        "vllm, 4x KV")
SYSTEMS = {KUN: "kunserve:dispatch=kv+compute", PP: "vllm-pp", PP_ROWS: "vllm-pp:former=rows", T0: _T0,
           T0_TOKENS: _T0 + ",former=tokens", DP4: "kunserve:drop=false"}
KV_SCALE = {DP4: 4.0}
KUN_TOKENS = "kunserve kv+compute, token chunking"
DP_PHASES = ("no group", "burst, no group")
CLOSE = 0.05  # within 5%: a ratio this close to 1 is read as no gap
MAJORITY = 2 / 3


def spans(raw: dict, phases: np.ndarray) -> dict:
    """Per phase: P50 / P99 of queueing and of the prefill span (first scheduled to first token)
    of the requests arriving in it; and over all requests."""
    ttft, queue = raw["ttft"], raw["queue"]
    ok = ~np.isnan(ttft)
    out = {}
    for name in (*waits.BASE_PHASES, "all"):
        sel = ok if name == "all" else ok & (phases == name)
        if not sel.any():
            out[name] = None
            continue
        pre = ttft[sel] - queue[sel]
        out[name] = {"n": int(sel.sum()), "queue_p50_s": float(np.percentile(queue[sel], 50)),
                     "queue_p99_s": float(np.percentile(queue[sel], 99)),
                     "prefill_p50_s": float(np.percentile(pre, 50)), "prefill_p99_s": float(np.percentile(pre, 99))}
    return out


def _hook(runs: dict, summaries: dict, bursts, horizon_s: float) -> None:
    """Phases from KunServe's run (``waits``), each run's phase table and span percentiles."""
    waits.attach(runs, summaries, KUN, bursts, horizon_s)
    ref = runs.get(KUN)
    if ref is None:
        return
    sp = waits.phase_spans(ref["events"] + ref.get("exchange_events", []), bursts, horizon_s)
    for name, run in runs.items():
        raw = run.get("raw")
        if raw is not None:
            summaries[name]["spans"] = spans(raw, waits.label(raw["arrival"], sp))


def run(rate: float, hw: st.Hardware, sizes: ex.Sizes) -> dict:
    from servelab.designs.kunserve.reproduce.points import _summary

    tasks = [dict(system=name, specs=st.workload("decode-heavy", rate, sizes.duration_s, sizes.bursts, s), hw=hw,
                  sizes=sizes, spec=spec, kv_scale=KV_SCALE.get(name, 1.0))
             for s in sizes.seeds for name, spec in SYSTEMS.items()]
    done = iter(ex.run_many(tasks))
    seeds = []
    for s in sizes.seeds:
        runs = {name: next(done) for name in SYSTEMS}
        summaries = {k: _summary(r) for k, r in runs.items()}
        _hook(runs, summaries, sizes.bursts, sizes.duration_s)
        seeds.append({"seed": s, "runs": summaries})
    return {"rate": rate, "workload": "decode-heavy", "systems": SYSTEMS, "kv_scale": KV_SCALE, "seeds": seeds}


def run_tokens(rate: float, hw: st.Hardware, sizes: ex.Sizes) -> dict:
    """The reactive KunServe (kv+compute) with token chunking on every seed's arrivals."""
    from servelab.designs.kunserve.reproduce.points import _summary

    spec = SYSTEMS[KUN] + ",former=tokens"
    tasks = [dict(system=KUN_TOKENS, specs=st.workload("decode-heavy", rate, sizes.duration_s, sizes.bursts, s), hw=hw,
                  sizes=sizes, spec=spec) for s in sizes.seeds]
    return {"rate": rate, "spec": spec, "seeds": [{"seed": s, "run": _summary(r)}
                                                  for s, r in zip(sizes.seeds, ex.run_many(tasks))]}


def tokens_verdict(block: dict, tokens: dict | None) -> dict | None:
    """R3 on the residual: the reactive KunServe's P99 with token chunking against its own and vLLM-PP's."""
    if not tokens:
        return None
    by_seed = {s["seed"]: s["runs"] for s in block["seeds"]}
    rows = [(by_seed[t["seed"]][KUN]["ttft_s"]["99"], t["run"]["ttft_s"]["99"], by_seed[t["seed"]][PP]["ttft_s"]["99"])
            for t in tokens["seeds"] if t["seed"] in by_seed]
    if not rows:
        return None
    gap = float(np.mean([k - p for k, _, p in rows]))
    cut = float(np.mean([k - t for k, t, _ in rows]))
    ok = _maj([t < k for k, t, _ in rows]) and gap > 0 and cut >= 0.5 * gap
    return {"rows": rows, "gap_s": gap, "cut_s": cut, "verdict": "holds" if ok else "refuted"}


def _maj(vals) -> bool | None:
    known = [v for v in vals if v is not None]
    return None if not known else sum(known) >= MAJORITY * len(known)


def _lt(a, b):
    return None if a is None or b is None else a < b


def seed_numbers(s: dict) -> dict:
    """One seed's numbers behind each prediction."""
    r = s["runs"]
    ph = {name: r[name].get("phases") or {} for name in r}
    worst = ph[KUN].get("worst_total") or 0
    dp_worst = sum((ph[KUN].get(p) or {}).get("worst", 0) for p in DP_PHASES)
    p99 = {name: r[name]["ttft_s"]["99"] for name in r}
    return {"p99": p99,
            "worst_dp": dp_worst / worst if worst else None,
            "burst_p99": {name: nested_get(ph[name], "burst, no group", "p99_ttft_s") for name in r},
            "pipelined_p99": {name: nested_get(ph[name], "pipelined", "p99_ttft_s") for name in r},
            "burst_prefill_p50": {name: nested_get(r[name], "spans", "burst, no group", "prefill_p50_s") for name in r},
            "burst_queue_p99": {name: nested_get(r[name], "spans", "burst, no group", "queue_p99_s") for name in r}}


def verdicts(block: dict) -> dict:
    rows = [seed_numbers(s) for s in block["seeds"]]
    r1 = {"a": _maj([None if x["worst_dp"] is None else x["worst_dp"] > 0.5 for x in rows]),
          "b": _maj([_lt(x["burst_p99"][PP], x["burst_p99"][DP4]) for x in rows]),
          "c": _maj([None if x["pipelined_p99"][KUN] is None or not x["pipelined_p99"][PP] else
                     x["pipelined_p99"][KUN] / x["pipelined_p99"][PP] <= 1 + CLOSE for x in rows])}
    ratio_rows = [x["p99"][KUN] / x["p99"][PP_ROWS] for x in rows]
    r2 = {"a": _maj([_lt(x["burst_prefill_p50"][PP], x["burst_prefill_p50"][KUN]) for x in rows]),
          "b": _maj([v <= 1 + CLOSE for v in ratio_rows]) and float(np.mean(ratio_rows)) <= 1 + CLOSE}
    gap = [x["p99"][T0] - x["p99"][PP] for x in rows]
    cut = [x["p99"][T0] - x["p99"][T0_TOKENS] for x in rows]
    r3 = {"a": _maj([c > 0 for c in cut]) and float(np.mean(gap)) > 0 and float(np.mean(cut)) >= 0.5 * float(np.mean(gap))}
    out = {"rows": rows, "kun_over_pp": [x["p99"][KUN] / x["p99"][PP] for x in rows], "kun_over_pp_rows": ratio_rows,
           "t0_gap_s": gap, "t0_cut_s": cut}
    for name, preds in (("r1", r1), ("r2", r2), ("r3", r3)):
        known = [v for v in preds.values() if v is not None]
        out[name] = preds | {"verdict": "untested" if not known else ("holds" if all(known) else "refuted")}
    return out
