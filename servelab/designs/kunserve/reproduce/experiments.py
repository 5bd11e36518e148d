"""The reproduction's runs: one system on one workload, and the metrics the paper plots.

``run_system`` returns plain numbers (JSON-ready): TTFT / TPOT percentiles, timelines in
windows (mean TTFT by arrival, output throughput), the memory timeline (KV used, demanded,
available, parameter bytes) with drop / restore marks when the system has a monitor,
pipeline bubble share, KV-exchange time and stall, drop-plan times, and how requests ended.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from servelab.designs.kunserve.reproduce import setting as st
from servelab.designs.kunserve.reproduce.trigger_trace import group_ends
from servelab.reproduce.jobs import map_in_processes
from servelab.metrics import RequestTable
from servelab.simulator import Simulation

GB = 1e9
PCTS = (50, 90, 99, 99.9)


@dataclass(frozen=True)
class Sizes:
    duration_s: float = 300.0
    bursts: tuple[tuple[float, float], ...] = ((60.0, 150.0),)
    long_duration_s: float = 640.0
    long_bursts: tuple[tuple[float, float], ...] = ((100.0, 160.0), (400.0, 460.0))
    # the long run's load between its bursts: (from_s, rate multiplier) segments (setting.with_load)
    long_load: tuple[tuple[float, float], ...] = ((200.0, 0.5), (380.0, 1.0))
    rate_probes: int = 5
    window_s: float = 10.0
    workloads: tuple[str, ...] = ("burstgpt", "sharegpt", "longbench")
    num_instances_a: int = 8
    extreme_repeats: int = 4
    plan_sizes: tuple[int, ...] = (8, 64, 256, 1024)
    seeds: tuple[int, ...] = (0, 1, 2)


def _pct(x: np.ndarray) -> dict:
    x = x[~np.isnan(x)]
    if not len(x):
        return {str(p): None for p in PCTS}
    return {str(p): float(np.percentile(x, p)) for p in PCTS}


def run_system(system: str, specs: Sequence, hw: st.Hardware, sizes: Sizes, spec: str | None = None,
               kv_scale: float = 1.0, cost=None) -> dict:
    """One run, reduced to plain numbers; with ``bursts`` in ``sizes`` the premise check of
    ``premise.premise_check`` is in ``out["check"]``. ``kv_scale`` multiplies every instance's
    KV blocks (compute unchanged): the memory-unbound ceiling of the premise check. ``cost``:
    ``CostOptions`` for every instance (None: the defaults)."""
    from servelab.designs.kunserve.reproduce import tpot_split, trigger_trace
    from servelab.designs.kunserve.reproduce.premise import premise_check

    spec = spec or st.SYSTEMS[system]
    t0 = time.process_time()
    sim = Simulation(list(specs), st.cluster(spec, hw), cost_model=cost)
    if kv_scale != 1.0:
        for d in sim.driver.drivers:
            d.runtime.resize(int(kv_scale * d.runtime.blocks.num_gpu_blocks))
    res = sim.run()
    cpu = time.process_time() - t0
    table = RequestTable.from_requests(res.requests)
    ttft, tpot = table.ttft_s, table.tpot_s
    status = [r.status.value for r in res.requests]
    out = {"system": system, "spec": spec, "num_requests": len(specs), "cpu_s": cpu,
           "finished": status.count("finished"), "rejected": status.count("rejected"),
           "aborted": status.count("aborted"), "conserved": res.conserved,
           "ttft_s": _pct(ttft), "tpot_s": _pct(tpot), "makespan_s": res.makespan_s,
           "throughput_tok_s": res.num_output_tokens / max(res.makespan_s, 1e-9),
           "num_preemptions": int(sum(r.num_preemptions for r in res.requests)),
           "last_arrival_s": float(max((s.arrival_time_s for s in specs), default=0.0))}
    out["check"] = premise_check(res, table, sizes.bursts, st.token_budget(hw))
    worst = np.argsort(-np.nan_to_num(ttft, nan=np.inf))[:max(1, len(ttft) // 100)]
    out["worst_arrivals_s"] = sorted(float(a) for a in table.arrival_s[worst])  # the worst 1% of TTFT
    out["timeline"] = _timelines(table, sizes.window_s)
    out["raw"] = {"ttft": ttft, "tpot": tpot, "arrival": table.arrival_s, "queue": table.queueing_s}
    router = sim.router
    if hasattr(router, "timeline") and router.timeline:
        tl = np.array(router.timeline)
        out["memory"] = {"t": tl[:, 0].tolist(), "used_gb": (tl[:, 1] / GB).tolist(),
                         "demand_gb": (tl[:, 2] / GB).tolist(), "kv_capacity_gb": (tl[:, 3] / GB).tolist(),
                         "params_gb": (tl[:, 4] / GB).tolist()}
        w = np.diff(tl[:, 0], append=tl[-1, 0])
        out["mean_demand_share"] = float(np.sum(tl[:, 2] / tl[:, 3] * w) / max(np.sum(w), 1e-9))
        out["drops"] = [{k: v for k, v in d.items()} for d in router.drops if d["groups"]]
    log = sim.driver.reconfig.events_log
    out["trigger_trace"] = trigger_trace.trace(router, log, table.arrival_s, ttft, table.queueing_s, table.request_id)
    out["raw"]["gap_bins"] = tpot_split.binned(res.requests, log, float(res.makespan_s))
    out["fill"] = _fill_after_drop(res.collector.steps, log, st.token_budget(hw), out["last_arrival_s"])
    out["dispatch"] = _dispatch(res, log, router, table, hw, sizes, out["last_arrival_s"])
    out["events"] = [(t, k, d) for t, k, d in log if k in ("form", "split", "merge", "fail", "restore", "restored")]
    out["exchange_events"] = [(t, k, {"group": d["group"]}) for t, k, d in log if k == "exchanged"]
    ex = [d for _, k, d in log if k == "exchanged"]
    out["exchange"] = {"num": len(ex), "seconds": [d["seconds"] for d in ex], "stall_s": sum(d["stall_s"] for d in ex),
                       "num_requests": sum(d["num_requests"] for d in ex), "gb": sum(d["bytes"] for d in ex) / GB}
    groups = list(res.pipeline.values())
    if groups:
        out["pipeline"] = {"num_groups": len(groups), "steps": sum(g["steps"] for g in groups),
                           "bubble_share": _weighted_bubble(groups),
                           "activation_wait_s": sum(g["activation_wait_s"] for g in groups),
                           "single_microbatch_share": sum(g.get("single_microbatch_steps", 0) for g in groups)
                           / max(1, sum(g["steps"] for g in groups))}
        out["pipelined_throughput_tok_s"] = _throughput_in(table, [(g["formed_s"], g["ended_s"] or res.makespan_s)
                                                                   for g in groups])
    if hasattr(router, "report"):
        rep = router.report()
        out["router"] = {k: v for k, v in rep.items() if k != "drops"}
    return out


def run_many(tasks: Sequence[dict]) -> list[dict]:
    """``run_system(**task)`` for each task, in order, over ``SERVELAB_REPRO_JOBS`` worker
    processes (``servelab.reproduce.jobs``): every run is deterministic and independent (its
    arrivals are in the task), so the results are the same as in one process."""
    return map_in_processes(_run_task, tasks)


def _run_task(task: dict) -> dict:
    return run_system(**task)


def _fill_after_drop(steps, log, budget: int, until_s: float) -> dict | None:
    """Token budget used by pipeline groups' steps and by single instances' steps from the first
    drop to the last arrival (time-weighted; a group's budget is its stages x the instance's):
    where the dispatcher sends work after a drop shows as a full group beside idle singles."""
    forms = [(t, d["group"], len(d["members"])) for t, k, d in log if k == "form"]
    if not forms or not len(steps):
        return None
    ends = group_ends(log)
    spans = []  # (group id, from, to, stages)
    for t, gid, n in forms:
        later = [e for e in ends.get(gid, []) if e > t]
        spans.append((gid, t, min(later) if later else np.inf, n))
    start = np.asarray(steps.start_s)
    iid = np.asarray(steps.instance_id)
    stages = np.ones(len(start))
    for gid, a, b, n in spans:
        stages[(iid == gid) & (start >= a) & (start < b)] = n
    fill = np.minimum(np.asarray(steps.num_tokens) / (budget * stages), 1.0)
    dur = np.asarray(steps.duration_s)
    window = (start >= forms[0][0]) & (start < until_s)
    out = {}
    for name, sel in (("group", window & (stages > 1)), ("single", window & (stages == 1))):
        w = float(np.sum(dur[sel]))
        out[name] = float(np.sum(fill[sel] * dur[sel]) / w) if w > 0 else None
    out["first_form_s"] = forms[0][0]
    return out


def _dispatch(res, log, router, table, hw: st.Hardware, sizes: Sizes, last_arrival_s: float) -> dict:
    """``dispatch_probe`` from the first group formed to the last arrival, and over the first burst."""
    from servelab.designs.kunserve.reproduce import dispatch_probe

    def probe(window):
        return dispatch_probe.measure(res.collector.steps, log, getattr(router, "placed", None), table.request_id,
                                      table.arrival_s, table.queueing_s, table.ttft_s, st.token_budget(hw),
                                      hw.num_instances, window)

    forms = [t for t, k, _ in log if k == "form"]
    out = {"after_first_group": probe((min(forms), last_arrival_s))} if forms else {}
    if sizes.bursts:
        out["burst"] = probe(tuple(sizes.bursts[0]))
    return out


def _weighted_bubble(groups: list[dict]) -> float:
    """Bubble share of every group, weighted by its steps (idle stage time / stage time)."""
    shares = [(g["bubble_share"], g["steps"]) for g in groups if g["steps"]]
    return float(sum(x * n for x, n in shares) / sum(n for _, n in shares)) if shares else 0.0


def _timelines(table: RequestTable, window_s: float) -> dict:
    arrival = table.arrival_s
    end = float(np.nanmax(table.finish_s)) if len(table) else 0.0
    edges = np.arange(0.0, end + window_s, window_s)
    idx = np.digitize(arrival, edges) - 1
    ttft = table.ttft_s
    mean_ttft = [float(np.nanmean(ttft[idx == k])) if np.any((idx == k) & ~np.isnan(ttft)) else None
                 for k in range(len(edges) - 1)]
    tok, _ = np.histogram(table.token_times_s, bins=edges)
    return {"t": edges[:-1].tolist(), "mean_ttft_s": mean_ttft, "throughput_tok_s": (tok / window_s).tolist()}


def _throughput_in(table: RequestTable, spans: list[tuple[float, float]]) -> float:
    times = table.token_times_s
    n = sum(int(np.sum((times >= a) & (times < b))) for a, b in spans)
    total = sum(b - a for a, b in spans)
    return n / total if total > 0 else 0.0


def slo_violation(runs: dict[str, dict], scales: Sequence[float], baselines: Sequence[str]) -> dict:
    """Share of requests over ``scale`` x the best baseline's P50 in TTFT or TPOT."""
    best_ttft = min(runs[b]["ttft_s"]["50"] for b in baselines if b in runs)
    best_tpot = min(runs[b]["tpot_s"]["50"] for b in baselines if b in runs)
    out = {}
    for name, r in runs.items():
        ttft, tpot = r["raw"]["ttft"], r["raw"]["tpot"]
        row = []
        for s in scales:
            bad = (np.nan_to_num(ttft, nan=np.inf) > s * best_ttft) | (np.nan_to_num(tpot, nan=0.0) > s * best_tpot)
            row.append(float(np.mean(bad)))
        out[name] = row
    return {"scales": list(scales), "best_p50_ttft_s": best_ttft, "best_p50_tpot_s": best_tpot, "violation": out}
