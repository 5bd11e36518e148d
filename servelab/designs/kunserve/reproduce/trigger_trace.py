"""Why a reactive drop is slower than pipelines formed at t=0: one KunServe run's trigger
timeline and where its worst requests queued.

From the run's router (where each request was dispatched, when each unit first read
throttled, i.e. its head could not be admitted) and its reconfiguration log (groups formed,
their KV exchange landed): the first throttled moment, the first drop, every group formed
with its exchange time, and the worst 1% of requests by TTFT with their queueing (arrival to
first scheduled) cut by the phase of the unit they were dispatched to: *single, before its
drop* (the unit was still a single instance), *exchange* (its group formed, the KV exchange
in flight), *group* (after the exchange landed). A slow trigger, a slow exchange or a group
that queues for compute each shows as its own share, so the reason is read, not assumed.
"""

from __future__ import annotations

import numpy as np

PHASES = ("single, before its drop", "exchange", "group")


def group_ends(events) -> dict[int, list[float]]:
    """Group id -> the times it split or merged into another, from the reconfiguration log
    ``(t, kind, details)`` (a group id is reused after a split, so callers take the first end
    after the formation they look at)."""
    ends: dict[int, list[float]] = {}
    for t, kind, d in events:
        if kind in ("split", "merge"):
            ends.setdefault(d["group"], []).append(t)
    return ends


def _unit_spans(events) -> list[tuple[float, float, float, tuple[int, ...]]]:
    """(formed, exchange landed, ended, members) per group, from the reconfiguration log."""
    landed = {}
    for t, kind, d in events:
        if kind == "exchanged":
            landed.setdefault(d["group"], []).append(t)
    ends = group_ends(events)
    out = []
    for t, kind, d in events:
        if kind != "form":
            continue
        gid = d["group"]
        done = min((x for x in landed.get(gid, []) if x >= t), default=t)
        end = min((x for x in ends.get(gid, []) if x > t), default=np.inf)
        out.append((t, done, end, tuple(d["members"])))
    return sorted(out)


def trace(router, events, arrival: np.ndarray, ttft: np.ndarray, queue: np.ndarray, request_ids) -> dict | None:
    """The timeline and the worst 1%'s queueing by phase (None: not a KunServe run)."""
    placed = getattr(router, "placed", None)
    if placed is None:
        return None
    spans = _unit_spans(events)
    first_thr = min(getattr(router, "first_throttled_s", {}).values(), default=None)
    ok = ~np.isnan(ttft)
    k = max(1, int(ok.sum()) // 100)
    worst = np.argsort(-np.nan_to_num(ttft, nan=-np.inf))[:k]
    by_phase = dict.fromkeys(PHASES, 0.0)
    first_form = spans[0][0] if spans else np.inf
    for j in worst:
        a, e = float(arrival[j]), float(arrival[j] + queue[j])
        iid = placed.get(int(request_ids[j]))
        span = next(((f, x, z) for f, x, z, m in spans if iid in m and z > a and f < e), None)
        f, x = (span[0], span[1]) if span else (np.inf, np.inf)
        by_phase["single, before its drop"] += max(0.0, min(e, f) - a)
        by_phase["exchange"] += max(0.0, min(e, x) - max(a, f))
        by_phase["group"] += max(0.0, e - max(a, x))
    n = len(worst)
    return {"first_throttled_s": first_thr, "first_form_s": spans[0][0] if spans else None,
            "forms": [{"t": f, "members": list(m), "exchange_s": x - f} for f, x, _, m in spans],
            "worst_n": n, "worst_ttft_s": float(np.mean(ttft[worst])), "worst_queue_s": float(np.mean(queue[worst])),
            "worst_before_first_form": float(np.mean(arrival[worst] < first_form)),
            "worst_queue_by_phase_s": {p: v / n for p, v in by_phase.items()}}
