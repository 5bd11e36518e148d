"""The paper's premise, checked on a vLLM run before any claim is measured on it.

KunServe acts on *memory throttling*: before the burst requests are served promptly (the
paper's P50 TTFT is well under a second), and during it vLLM's KV fills while its compute
still has room, so requests queue for memory. A point where vLLM queues for compute already
before the burst (every step at its token budget) cannot show the effect: more KV does not
add compute, and pipelining removes some. The check reads the run's steps:

- ``pre_burst_p50_ttft_s``: P50 TTFT of the requests that arrive in the half before the
  first burst (after the warm-up, when the KV has filled to its steady state);
- ``time_above_95_kv_s``: seconds (per instance, mean) with more than 95% of the KV used;
- ``num_preemptions``: recompute preemptions (vLLM frees KV by dropping requests' caches);
- ``memory_queued_s`` / ``compute_queued_s``: seconds per instance with requests queued while
  the step used under / at least 90% of its token budget (queueing for memory, or for
  compute); ``token_fill_queued``: the steps' token budget used while requests queued;
- ``ceiling_p99_ttft_s`` (``with_ceiling``): vLLM's P99 TTFT on the same arrivals with 4x
  the KV blocks and the same compute, the most any design that frees memory can reach;
- ``holds``: pre-burst P50 under 1 s, vLLM memory-throttled (time above 95% KV or
  preemptions), memory what queues (the 4x-KV ceiling at most half vLLM's P99 TTFT), and
  the run's mean KV demand (running + head of line, the router's timeline) under the
  paper's 60%: a burst that throttles a system otherwise within its memory.
  (Recompute fills vLLM's steps with re-prefill, so the step fill alone cannot tell a
  memory queue from a compute one; the ceiling run can.)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

PRE_BURST_P50_S = 1.0
KV_FULL = 0.95
FILL_FULL = 0.9
CEILING_GAIN = 2.0
MEAN_DEMAND = 0.6  # the paper's bound on the run's mean KV demand (running + head of line)
KV_SCALE = 4.0


def premise_check(result, table, bursts: Sequence[tuple[float, float]], token_budget: int) -> dict:
    steps = result.collector.steps
    n = max(1, len(set(steps.instance_id.tolist()))) if len(steps) else 1
    first = bursts[0][0] if bursts else np.inf
    warm = first / 2 if np.isfinite(first) else 0.0  # the half before the burst: after the warm-up
    pre = table.ttft_s[(table.arrival_s >= warm) & (table.arrival_s < first) & ~np.isnan(table.ttft_s)]
    dur = steps.duration_s
    share = steps.kv_used_blocks / np.maximum(steps.kv_total_blocks, 1)
    fill = np.minimum(steps.num_tokens / max(token_budget, 1), 1.0)
    queued = steps.num_waiting > 0
    mem_q = float(np.sum(dur[queued & (fill < FILL_FULL)])) / n
    cmp_q = float(np.sum(dur[queued & (fill >= FILL_FULL)])) / n
    qdur = float(np.sum(dur[queued]))
    out = {"pre_burst_p50_ttft_s": float(np.percentile(pre, 50)) if len(pre) else None,
           "time_above_95_kv_s": float(np.sum(dur[share > KV_FULL])) / n,
           "num_preemptions": int(sum(r.num_preemptions for r in result.requests)),
           "memory_queued_s": mem_q, "compute_queued_s": cmp_q,
           "token_fill_queued": float(np.sum(fill[queued] * dur[queued]) / qdur) if qdur > 0 else None,
           "busy_share": float(np.sum(dur)) / n / max(result.makespan_s, 1e-9)}
    out["p99_ttft_s"] = float(np.nanpercentile(table.ttft_s, 99)) if len(table) else None
    out["memory_throttled"] = out["time_above_95_kv_s"] > 1.0 or out["num_preemptions"] > 0
    out["prompt_before_burst"] = out["pre_burst_p50_ttft_s"] is not None and out["pre_burst_p50_ttft_s"] < PRE_BURST_P50_S
    return out


def with_ceiling(check: dict, ceiling_p99_ttft_s: float, mean_demand_share: float | None = None) -> dict:
    """The check completed by the memory-unbound run (see the module docstring)."""
    out = dict(check, ceiling_p99_ttft_s=ceiling_p99_ttft_s)
    if mean_demand_share is not None:
        out["mean_demand_share"] = mean_demand_share
    p99 = check["p99_ttft_s"]
    out["ceiling_gain"] = p99 / ceiling_p99_ttft_s if p99 and ceiling_p99_ttft_s else None
    demand = out.get("mean_demand_share")
    out["holds"] = bool(check["prompt_before_burst"] and check["memory_throttled"]
                        and out["ceiling_gain"] is not None and out["ceiling_gain"] >= CEILING_GAIN
                        and (demand is None or demand <= MEAN_DEMAND))
    return out


def fmt_check(c: dict | None) -> str:
    """One line of a check, printed beside every claim."""
    if not c:
        return "n/a"
    p50 = c["pre_burst_p50_ttft_s"]
    fill = c["token_fill_queued"]
    dem = c.get("mean_demand_share")
    return (f"pre-burst P50 TTFT {'n/a' if p50 is None else f'{p50:.2f} s'}, "
            f"{'' if dem is None else f'mean KV demand {dem:.0%}, '}>95% KV {c['time_above_95_kv_s']:.0f} s, "
            f"{c['num_preemptions']} preempt., queued for memory {c['memory_queued_s']:.0f} s / compute "
            f"{c['compute_queued_s']:.0f} s, budget used while queued {'n/a' if fill is None else f'{fill:.0%}'}, "
            + (f"4x-KV ceiling P99 TTFT {_s(c.get('ceiling_p99_ttft_s'))} vs {_s(c.get('p99_ttft_s'))}"
               f" -> premise {'holds' if c.get('holds') else 'fails'}" if "holds" in c else
               f"vLLM P99 TTFT {_s(c.get('p99_ttft_s'))} (ceiling: the point's check)"))


def _s(v) -> str:
    return "n/a" if v is None else f"{v:.2f} s"
