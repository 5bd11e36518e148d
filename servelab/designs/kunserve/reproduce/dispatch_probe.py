"""Where a run's dispatcher sent work while pipeline groups existed, and what each unit's queue
waited for: the measurements that could refute the reasons given for KunServe's gap to vLLM-PP
(``gap_pp``).

From one run's steps, its reconfiguration log and the router's dispatch record (``placed``:
request id -> the unit it was sent to at arrival; None for a router that keeps none), over a
window of time:

- ``arrivals``: requests arriving in the window; ``to_groups``: the share sent to a pipeline
  group, beside ``group_gpu_share``, the groups' share of the instances (time-weighted over the
  window): a dispatcher that favours the groups sends them more than their share;
- ``by_dest[group | single]``: those arrivals' count, mean queueing (arrival to first
  scheduled) and P99 TTFT, by where they were sent;
- ``worst``: the run's worst 1% by TTFT cut by arrival before the window, sent to a group in
  it, sent to a single instance in it, after it;
- ``steps[group | single]``: that kind of unit's step seconds in the window, the seconds with
  requests queued, of which the steps used at least ``FILL_FULL`` of the unit's token budget
  (queued for compute) or less (queued for something else), of those the seconds with the
  unit's KV over ``KV_FULL`` used (queued for memory; the rest: the pipeline's passes, the
  former's choices), and the time-weighted budget used. A unit's budget is its stages x the instance's, as groups are
  configured (``FormPipeline(max_batch_tokens=...)``).

A reason that says "arrivals go to the groups and queue there behind compute while single
instances have compute to spare" predicts each of these; a number that contradicts it refutes
that part.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from servelab.designs.kunserve.reproduce.trigger_trace import group_ends

FILL_FULL = 0.9  # as the premise check's: a step at 90% of its budget leaves no room for queued work
KV_FULL = 0.95  # as the premise check's
KINDS = ("group", "single")


def group_spans(events: Sequence) -> list[tuple[int, float, float, int]]:
    """(group id, formed, ended, members) for every group in the reconfiguration log
    ``(t, kind, details)``; a group still alive at the end ends at infinity."""
    ends = group_ends(events)
    out = []
    for t, kind, d in events:
        if kind == "form":
            end = min((x for x in ends.get(d["group"], []) if x > t), default=np.inf)
            out.append((d["group"], t, end, len(d["members"])))
    return sorted(out, key=lambda s: s[1])


def _in_group(spans, unit: int | None, t: float) -> bool:
    return unit is not None and any(g == unit and a <= t < b for g, a, b, _ in spans)


def measure(steps, events: Sequence, placed: Mapping[int, int] | None, request_ids: np.ndarray,
            arrival: np.ndarray, queue: np.ndarray, ttft: np.ndarray, token_budget: int, num_instances: int,
            window: tuple[float, float]) -> dict:
    """The module docstring's numbers over ``window`` (from, to) seconds."""
    w0, w1 = window
    spans = group_spans(events)
    span_s = max(w1 - w0, 1e-9)
    gpu = sum(n * max(0.0, min(b, w1) - max(a, w0)) for _, a, b, n in spans) / (num_instances * span_s)
    out: dict = {"window_s": [w0, w1], "group_gpu_share": gpu, "steps": _step_kinds(steps, spans, token_budget, w0, w1)}
    inside = (arrival >= w0) & (arrival < w1)
    out["arrivals"] = int(inside.sum())
    worst = np.argsort(-np.nan_to_num(ttft, nan=-np.inf))[:max(1, int((~np.isnan(ttft)).sum()) // 100)]
    if placed is None:
        out.update(to_groups=None, by_dest=None, worst=None)
        return out
    dest = np.array([_in_group(spans, placed.get(int(r)), float(a)) if ok else False
                     for r, a, ok in zip(request_ids, arrival, inside)], dtype=bool)
    out["to_groups"] = float(dest[inside].mean()) if inside.any() else None
    out["by_dest"] = {}
    for kind, sel in (("group", inside & dest), ("single", inside & ~dest)):
        q, t = queue[sel], ttft[sel]
        q, t = q[~np.isnan(q)], t[~np.isnan(t)]
        out["by_dest"][kind] = {"n": int(sel.sum()), "mean_queue_s": float(q.mean()) if len(q) else None,
                                "p99_ttft_s": float(np.percentile(t, 99)) if len(t) else None}
    a = arrival[worst]
    out["worst"] = {"n": len(worst), "before": float(np.mean(a < w0)),
                    "to_group": float(np.mean(inside[worst] & dest[worst])),
                    "to_single": float(np.mean(inside[worst] & ~dest[worst])), "after": float(np.mean(a >= w1))}
    return out


def _step_kinds(steps, spans, budget: int, w0: float, w1: float) -> dict:
    start = np.asarray(steps.start_s, dtype=float)
    if not len(start):
        return {k: None for k in KINDS}
    iid = np.asarray(steps.instance_id)
    stages = np.ones(len(start))
    for gid, a, b, n in spans:
        stages[(iid == gid) & (start >= a) & (start < b)] = n
    dur = np.asarray(steps.duration_s, dtype=float)
    fill = np.minimum(np.asarray(steps.num_tokens, dtype=float) / (budget * stages), 1.0)
    queued = np.asarray(steps.num_waiting) > 0
    kv_full = np.asarray(steps.kv_used_blocks, dtype=float) > KV_FULL * np.maximum(np.asarray(steps.kv_total_blocks), 1)
    win = (start >= w0) & (start < w1)
    out = {}
    for kind, sel in (("group", win & (stages > 1)), ("single", win & (stages == 1))):
        busy = float(dur[sel].sum())
        if busy <= 0:
            out[kind] = None
            continue
        q = sel & queued
        out[kind] = {"busy_s": busy, "queued_s": float(dur[q].sum()),
                     "queued_compute_s": float(dur[q & (fill >= FILL_FULL)].sum()),
                     "queued_other_s": float(dur[q & (fill < FILL_FULL)].sum()),
                     "queued_other_kv_full_s": float(dur[q & (fill < FILL_FULL) & kv_full].sum()),
                     "fill": float(np.sum(fill[sel] * dur[sel]) / busy)}
    return out
