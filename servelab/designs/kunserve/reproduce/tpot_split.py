"""The pipeline's TPOT cost, read on the tokens produced while pipelined.

A request's TPOT averages every gap between its tokens; KunServe pipelines only part of a run,
so P50 TPOT over all requests mixes gaps decoded in a group with gaps decoded as DP. Here
every inter-token gap is placed in 1 s bins by its midpoint and marked *pipelined* when the
request's instance was a member of a live group then (groups from the reconfiguration log).
``binned`` keeps per-bin sums and counts (small enough for every run's summary); ``split``
reads KunServe's pipelined and DP mean gaps and the reference run's (vLLM on the same
arrivals) mean gap over the bins where KunServe had pipelined tokens, weighted as KunServe's
pipelined tokens are, so the two are compared on the same stretch of the run.
"""

from __future__ import annotations

import numpy as np

BIN_S = 1.0


def live_groups(events) -> dict[int, list[tuple[float, float]]]:
    """Instance id -> the spans it was a member of a group (formed to split or merge)."""
    opened: dict[int, tuple[float, list[int]]] = {}
    out: dict[int, list[tuple[float, float]]] = {}
    for t, kind, d in sorted(events, key=lambda e: e[0]):
        if kind == "form":
            opened[d["group"]] = (t, list(d["members"]))
        elif kind in ("split", "merge") and d.get("group") in opened:
            a, members = opened.pop(d["group"])
            for i in members:
                out.setdefault(i, []).append((a, t))
    for a, members in opened.values():
        for i in members:
            out.setdefault(i, []).append((a, np.inf))
    return out


def binned(requests, events, horizon_s: float) -> dict:
    """Per 1 s bin: sum and count of inter-token gaps, pipelined and not."""
    nb = int(np.ceil(horizon_s / BIN_S)) + 1
    acc = {k: np.zeros(nb) for k in ("pp_sum", "pp_n", "dp_sum", "dp_n")}
    live = live_groups(events)
    for r in requests:
        t = np.asarray(r.token_times_s, dtype=float)
        if len(t) < 2:
            continue
        gaps, mid = np.diff(t), (t[:-1] + t[1:]) / 2
        inside = np.zeros(len(gaps), bool)
        for a, b in live.get(r.instance_id, ()):
            inside |= (mid >= a) & (mid < b)
        idx = np.minimum((mid / BIN_S).astype(int), nb - 1)
        for tag, sel in (("pp", inside), ("dp", ~inside)):
            acc[f"{tag}_sum"] += np.bincount(idx[sel], weights=gaps[sel], minlength=nb)
            acc[f"{tag}_n"] += np.bincount(idx[sel], minlength=nb)
    return {k: v.tolist() for k, v in acc.items()}


def split(kun: dict, ref: dict) -> dict:
    """KunServe's mean gap pipelined / DP, and the reference's over the same bins."""
    nb = max(len(kun["pp_n"]), len(ref["pp_n"]))  # each run's bins end at its own makespan

    def get(d: dict, key: str) -> np.ndarray:
        x = np.asarray(d[key], dtype=float)
        return np.pad(x, (0, nb - len(x)))

    pp_sum, pp_n, dp_sum, dp_n = (get(kun, k) for k in ("pp_sum", "pp_n", "dp_sum", "dp_n"))
    r_sum, r_n = get(ref, "pp_sum") + get(ref, "dp_sum"), get(ref, "pp_n") + get(ref, "dp_n")
    if pp_n.sum() == 0:
        return {"pipelined_share": 0.0, "pipelined_gap_s": None, "dp_gap_s": float(dp_sum.sum() / max(dp_n.sum(), 1)),
                "ref_gap_same_bins_s": None, "pipelined_vs_ref": None}
    ref_mean = np.divide(r_sum, r_n, out=np.zeros_like(r_sum), where=r_n > 0)
    use = (pp_n > 0) & (r_n > 0)
    ref_same = float(np.sum(ref_mean[use] * pp_n[use]) / np.sum(pp_n[use]))
    pp_gap = float(pp_sum.sum() / pp_n.sum())
    return {"pipelined_share": float(pp_n.sum() / (pp_n.sum() + dp_n.sum())), "pipelined_gap_s": pp_gap,
            "dp_gap_s": float(dp_sum.sum() / max(dp_n.sum(), 1)), "ref_gap_same_bins_s": ref_same,
            "pipelined_vs_ref": pp_gap / ref_same - 1.0}
