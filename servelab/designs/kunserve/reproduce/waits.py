"""Where the worst requests wait: each request labelled by the phase KunServe was in when it
arrived, read from a reference run's reconfiguration log, and the same labels applied to
every system run on the same arrivals (the gap tests of ``gaps``).

Phases of the reference run (a KunServe run), in order of precedence:

- ``forming``: from a group's formation until its KV exchange has landed (the drop's
  transition: the group's members hold half the layers, requests wait for their KV);
- ``restoring``: from a member's restore copy starting until its group splits;
- ``pipelined``: some group exists (none forming or restoring);
- ``burst, no group``: inside a burst window before any group exists (KunServe is still DP:
  vLLM's queue for memory builds here until the trigger fires);
- ``no group``: the rest;

each with ``, after a split`` from the first split on (a burst after restore meets DP again).

For each phase and system: requests arriving in it, their P99 TTFT, how many of the
system's worst 1% (by TTFT) arrived in it, and those worst requests' mean queueing time
(arrival to first scheduled) and prefill span (first scheduled to first token, which holds
chunked prefill, pipeline passes and any recompute). A reason for a gap is then read from
where the worst requests of each system are, not assumed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

BASE_PHASES = ("no group", "burst, no group", "forming", "pipelined", "restoring")
AFTER = ", after a split"  # a phase again once a group has split (restore's second wave)
PHASES = BASE_PHASES + tuple(p + AFTER for p in BASE_PHASES)


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def phase_spans(events: Sequence, bursts: Sequence[tuple[float, float]], horizon_s: float) -> dict:
    """The reference run's phases as sorted, disjoint-per-label spans (see the module docstring).
    ``events`` is the reconfiguration log as ``(t, kind, details)``."""
    forming, restoring, alive = [], [], []
    opened: dict[int, float] = {}  # group id -> formed at
    restore_at: dict[int, float] = {}  # instance id -> restore copy began
    for t, kind, d in sorted(events, key=lambda e: e[0]):
        if kind == "form":
            opened[d["group"]] = t
            done = next((t2 for t2, k2, d2 in events if k2 == "exchanged" and d2.get("group") == d["group"] and t2 >= t),
                        t)
            forming.append((t, done))
        elif kind in ("split", "merge") and d.get("group") in opened:
            start = opened.pop(d["group"])
            alive.append((start, t))
            if kind == "split":
                began = [restore_at.pop(i) for i in d.get("members", []) if i in restore_at]
                if began:
                    restoring.append((min(began), t))
        elif kind == "restore":
            restore_at.setdefault(d["instance"], t)
    alive += [(start, horizon_s) for start in opened.values()]
    splits = [t for t, kind, _ in events if kind == "split"]
    return {"forming": _union(forming), "restoring": _union(restoring), "pipelined": _union(alive),
            "burst, no group": [tuple(b) for b in bursts], "first_split_s": min(splits, default=None)}


def label(times: np.ndarray, spans: dict) -> np.ndarray:
    """Each time's phase (precedence: forming, restoring, pipelined, burst with no group),
    with ``AFTER`` appended from the first split on."""
    out = np.full(len(times), "no group", dtype=object)
    for name in ("burst, no group", "pipelined", "restoring", "forming"):  # later wins
        for a, b in spans[name]:
            out[(times >= a) & (times < b)] = name
    split = spans.get("first_split_s")
    if split is not None:
        late = times >= split
        out[late] = [p + AFTER for p in out[late]]
    return out


def by_phase(raw: dict, phases: np.ndarray) -> dict:
    """Per phase: requests, P99 TTFT, the run's worst 1% that arrived in it and their mean
    queueing / prefill span (``raw``: the run's per-request arrays)."""
    ttft, queue = raw["ttft"], raw["queue"]
    ok = ~np.isnan(ttft)
    k = max(1, int(ok.sum()) // 100)
    worst = np.zeros(len(ttft), bool)
    worst[np.argsort(-np.nan_to_num(ttft, nan=-np.inf))[:k]] = True
    out = {}
    for name in PHASES:
        sel = (phases == name) & ok
        w = sel & worst
        out[name] = {"n": int(sel.sum()), "p99_ttft_s": float(np.percentile(ttft[sel], 99)) if sel.any() else None,
                     "worst": int(w.sum()),
                     "worst_queue_s": float(np.mean(queue[w])) if w.any() else None,
                     "worst_prefill_s": float(np.mean(ttft[w] - queue[w])) if w.any() else None}
    out["worst_total"] = int(worst.sum())
    return out


def attach(runs: dict, summaries: dict, ref: str, bursts, horizon_s: float) -> None:
    """Every run's phase table (phases from ``runs[ref]``'s log) into its seed summary."""
    r = runs.get(ref)
    if r is None:
        return
    spans = phase_spans(r["events"] + r.get("exchange_events", []), bursts, horizon_s)
    for name, run in runs.items():
        raw = run.get("raw")
        if raw is not None and "arrival" in raw:
            summaries[name]["phases"] = by_phase(raw, label(raw["arrival"], spans))
    summaries[ref]["phase_spans"] = {k: v if k == "first_split_s" else [list(x) for x in v] for k, v in spans.items()}
