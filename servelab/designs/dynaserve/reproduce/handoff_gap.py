"""Gap test: why 1P1D collapses when every step costs 30 ms more (``paper_coloc``'s item 4).

With a fixed 30 ms added to every step of every system, 1P1D's capacity on hybrid and
azure-code falls to the bottom of its search (a few hundredths of a request per second)
while colocation and DynaServe keep most of theirs. The stated reason: the hand-off gap.
In 1P1D a request's first token comes from the prefill instance, its second from the
decode instance, so that one gap holds the KV copy, the wait for the decode instance's
step in flight and a whole decode step. A request with fewer than 100 gaps may not exceed
the TBT SLO even once (its nearest-rank P99 is its worst gap), so when that one gap passes
100 ms every short request fails, at any load.

The experiment that could refute it, per per-step cost and rate: every request's first
gap, split into the KV copy (the link's latency plus the prompt's KV over its bandwidth),
the wait from the first token to the start of the decode step that emits the second (copy
included) and that step's duration; the share of requests over the SLO on the first gap
and how many of them have fewer than 100 gaps; and the attainment with the first gap not
counted. If that attainment stays below 99%, the hand-off gap is not what breaks 1P1D.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from servelab.designs.dynaserve import metrics as dm
from servelab.designs.dynaserve.reproduce import experiments as ex
from servelab.designs.dynaserve.reproduce import setting as st
from servelab.metrics.request_metrics import FINISHED, RequestTable

WORKLOAD = "hybrid"
DELTAS_S = (0.0, 0.014, 0.030)


def first_gap_parts(table: RequestTable, steps, decode_instance: int, kv_s: np.ndarray) -> dict[str, np.ndarray]:
    """Per request with at least two tokens: its first gap and its parts (seconds): ``kv``
    the copy, ``wait`` first token to the start of the step that emitted the second (copy
    included), ``step`` that step's duration (``wait + step`` is the gap)."""
    off, times = table.token_offsets, table.token_times_s
    rows = np.nonzero(np.diff(off) >= 2)[0]
    t1, t2 = times[off[rows]], times[off[rows] + 1]
    mine = steps.instance_id == decode_instance
    ends = steps.start_s[mine] + steps.duration_s[mine]
    order = np.argsort(ends, kind="stable")
    ends, durs = ends[order], steps.duration_s[mine][order]
    k = np.clip(np.searchsorted(ends, t2 - 1e-9), 0, max(len(ends) - 1, 0))
    step = durs[k] if len(durs) else np.zeros(len(rows))
    gap = t2 - t1
    return {"rows": rows, "gap": gap, "kv": kv_s[rows], "wait": gap - step, "step": step}


def attainment_without_first_gap(table: RequestTable, slo_s: float) -> float:
    """Share of requests meeting the TBT SLO when each request's first gap is not counted."""
    n = len(table)
    if not n:
        return float("nan")
    gaps, row = table.tbt_gaps_s, table.tbt_gap_row
    first = np.ones(len(gaps), bool)
    first[1:] = row[1:] != row[:-1]
    over = (gaps > slo_s) & ~first
    per_row = np.bincount(row, weights=over.astype(np.float64), minlength=n).astype(np.int64)
    allowed = np.floor(0.01 * np.maximum(table.num_gaps - 1, 0)).astype(np.int64)
    return float(np.mean((table.status == FINISHED) & (per_row <= allowed)))


def probe(setting: st.Setting, sizes: ex.Sizes, seed: int, rate: float, delta_s: float,
          workload: str = WORKLOAD) -> dict:
    """One 1P1D run at ``rate`` with ``delta_s`` added to every step: the first gap's parts."""
    adj = dataclasses.replace(setting, step_delta_s=delta_s)
    specs = st.workload(workload, rate, ex._n(rate, sizes), seed, adj)
    r = st.run("disagg", specs, "14B", adj, detail=True, steps=True)
    table: RequestTable = r["table"]
    kv_s = _kv_copy_s(table, setting)
    parts = first_gap_parts(table, r["steps"], 1, kv_s)
    slo = setting.tbt_slo_s
    over = parts["gap"] > slo
    short = np.diff(table.token_offsets)[parts["rows"]] - 1 < 100  # fewer than 100 gaps: no gap may exceed
    met = dm.meets_tbt(table, slo)

    def pct(x: np.ndarray, q: float) -> float | None:
        return float(np.percentile(x, q) * 1e3) if len(x) else None

    return {"rate": rate, "delta_s": delta_s, "seed": seed, "num_requests": len(table),
            "attainment": float(met.mean()), "attainment_without_first_gap": attainment_without_first_gap(table, slo),
            "first_gap_over_share": float(over.mean()) if len(over) else None,
            "first_gap_over_short_share": float((over & short).mean()) if len(over) else None,
            "short_share": float(short.mean()) if len(short) else None,
            **{f"{name}_ms_p{q}": pct(parts[name], q) for name in ("gap", "kv", "wait", "step") for q in (50, 99)},
            "later_gap_ms_p99": _later_p99(table)}


def _later_p99(table: RequestTable) -> float | None:
    gaps, row = table.tbt_gaps_s, table.tbt_gap_row
    if not len(gaps):
        return None
    first = np.ones(len(gaps), bool)
    first[1:] = row[1:] != row[:-1]
    later = gaps[~first]
    return float(np.percentile(later, 99) * 1e3) if len(later) else None


def _kv_copy_s(table: RequestTable, setting: st.Setting) -> np.ndarray:
    """The KV copy of each request's prompt from the prefill to the decode instance (the
    link the two 14B instances share: NVLink inside a server)."""
    from servelab.catalog.instance import InstanceSpec, kv_bytes_per_token
    from servelab.cluster.links import Topology

    model, tp = st.MODELS["14B"]
    spec = Topology([st.GPU] * 2, [tp] * 2, setting.topology()).spec(0, 1)
    per_token = kv_bytes_per_token(InstanceSpec(st.GPU, model, tp=tp)) / spec.bandwidth_bytes_per_s
    return spec.latency_s + table.num_prompt_tokens * per_token


def handoff_gap(setting: st.Setting, sizes: ex.Sizes, seeds: Sequence[int], rates: Sequence[float],
                deltas: Sequence[float] = DELTAS_S) -> list[dict]:
    """``probe`` over seeds, per-step costs and rates; per (delta, rate) the per-seed rows
    and their means."""
    out = []
    for d in deltas:
        for rate in rates:
            per_seed = [probe(setting, sizes, s, rate, d) for s in seeds]
            keys = [k for k, v in per_seed[0].items() if k not in ("rate", "delta_s", "seed") and
                    (v is None or isinstance(v, (int, float)))]
            mean = {k: (float(np.mean([p[k] for p in per_seed if p[k] is not None]))
                        if any(p[k] is not None for p in per_seed) else None) for k in keys}
            out.append({"rate": rate, "delta_s": d, "seeds": per_seed, **mean})
    return out


def rates_for(capacity_rows: Sequence[dict]) -> list[float]:
    """Near idle (the capacity search's floor) and 1P1D's capacity on hybrid with no added cost."""
    rates = [ex.CAPACITY_LO]
    base = next((c for c in capacity_rows if c.get("workload", WORKLOAD) == WORKLOAD and c["delta_s"] == 0.0), None)
    mean = base["disagg"]["median"]["interval"].get("mean") if base else None
    if mean:
        rates.append(round(float(mean), 2))
    return rates


def text(rows: list[dict] | None, big_delta_s: float) -> str:
    """The report's paragraph: the numbers per per-step cost and rate, then what they decide."""
    from servelab.designs.dynaserve.reproduce.report_tables import fmt

    if not rows:
        return ""
    pct = lambda x: fmt(100 * x if x is not None else None, 1)  # noqa: E731
    parts = "; ".join(
        f"+{fmt(1e3 * r['delta_s'], 0)} ms at {fmt(r['rate'])} req/s: requests meeting the SLO {pct(r['attainment'])}% "
        f"({pct(r['attainment_without_first_gap'])}% with the first gap not counted); first gap p50 "
        f"{fmt(r['gap_ms_p50'], 0)} / p99 {fmt(r['gap_ms_p99'], 0)} ms = KV copy (p99 {fmt(r['kv_ms_p99'], 1)} ms) "
        f"and the wait for the decode instance's step in flight (wait incl. copy p99 {fmt(r['wait_ms_p99'], 0)} ms) "
        f"+ the decode step (p99 {fmt(r['step_ms_p99'], 0)} ms); later gaps p99 {fmt(r['later_gap_ms_p99'], 0)} ms; "
        f"first gap over 100 ms for {pct(r['first_gap_over_share'])}% of requests "
        f"({pct(r['first_gap_over_short_share'])}% with fewer than 100 gaps, who fail on it)" for r in rows)
    big = [r for r in rows if abs(r["delta_s"] - big_delta_s) < 1e-9]
    broken = [r for r in big if (r["attainment"] or 0) < 0.99]
    if broken and all((r["attainment_without_first_gap"] or 0) >= 0.99 for r in broken):
        kv = max(r["kv_ms_p99"] or 0 for r in broken)
        gap = max(r["gap_ms_p99"] or 0 for r in broken)
        verdict = (f"The reason holds: at +{fmt(1e3 * big_delta_s, 0)} ms every run that fails the 99% bar passes it "
                   "once the first gap is not counted, and the later gaps stay far inside the SLO. The KV copy is not "
                   f"what breaks it (p99 {fmt(kv, 1)} ms of a {fmt(gap, 0)} ms first gap): the second token waits "
                   "for the decode instance's step in flight and then for a whole step of its own, two steps that "
                   f"each grew by {fmt(1e3 * big_delta_s, 0)} ms, so the one gap passes 100 ms once a decode step "
                   "passes about 50 ms, at any load; a request with fewer than 100 gaps fails on it. Colocation has "
                   "no hand-off, and DynaServe keeps such requests off a hand-off after their first token "
                   "(`router._keep_handoff_gap`).")
    elif broken:
        verdict = ("The reason does not hold: some runs that fail the 99% bar still fail it with the first gap not "
                   "counted, so later gaps break them too.")
    else:
        verdict = f"At +{fmt(1e3 * big_delta_s, 0)} ms no run tested here fails the 99% bar."
    return ("(5) *Why 1P1D collapses at the largest per-step cost* (`reproduce/handoff_gap.py`; hybrid, 1P1D, near "
            "idle and at its own capacity without added cost, means over the seeds). The stated reason, the hand-off "
            "gap: a request's first token comes from the prefill instance and its second from the decode instance, "
            "so that one gap holds the KV copy, the wait for the decode instance's step in flight and a decode "
            "step. " + parts + ". " + verdict)
