"""DynaServe's metrics, computed from a finished run (column-wise, no per-token Python).

- A request meets the TBT SLO when it finished and its own P99 TBT is within the SLO, i.e.
  at most 1% of its gaps (rounded down) exceed it (nearest-rank P99; a one-token request
  has no gap and meets it).
- Goodput: output tokens per second of the requests that meet it (the paper's definition).
- Token share within the SLO: gaps (all requests) no longer than the SLO (Figure 11).
- Serving capacity probe: a rate passes when at least 99% of requests meet the TBT SLO
  (the paper's Sec. 6.3: "only 1% of requests" may violate it) and the scheduling delay
  (arrival to first scheduled) stays under ``max_delay_s``. The paper takes its capacity
  definition from Sarathi-Serve, which bounds the *median* scheduling delay (2 s); that is
  ``delay_rule="median"``, the default. ``delay_rule="p99"`` bounds the P99 delay instead,
  a stricter rule that penalises a system whose prompt splits queue a few requests behind
  long prefills; the reproduction reports both from the same runs. Without any delay bound
  an overloaded prefill queue would pass, as only TTFT grows.
- Per instance: MFU over the run (linear-layer FLOPs / (peak x duration)) and KV-cache use
  (time-weighted share of KV blocks in use), the paper's Table 1 columns; for a saturated
  run over its saturated window (the second half of the arrivals), like its throughput.
- Non-overlapped transfer time: per split request, from its hand-off on alpha to its KV
  landing on beta (what streaming hides is the part sent before the hand-off).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from servelab.metrics.collector import MetricsCollector
from servelab.metrics.request_metrics import FINISHED, RequestTable

TBT_SLO_S = 0.1


@dataclass(frozen=True, slots=True)
class TBTOutcome:
    num_requests: int
    num_meeting: int
    attainment: float  # share of requests meeting the TBT SLO
    goodput_tokens_per_s: float
    throughput_tokens_per_s: float
    requests_per_s: float  # completed requests over the duration
    token_share_within: float  # share of all gaps within the SLO
    tbt_p50_s: float
    tbt_p99_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    delay_p99_s: float  # scheduling delay: arrival to first scheduled
    delay_p50_s: float
    duration_s: float

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in asdict(self).items()}


def meets_tbt(table: RequestTable, slo_s: float = TBT_SLO_S) -> np.ndarray:
    """Per request: finished with at most floor(1% of its gaps) over ``slo_s``."""
    over = (table.tbt_gaps_s > slo_s).astype(np.int64)
    per_row = np.bincount(table.tbt_gap_row, weights=over, minlength=len(table)).astype(np.int64)
    allowed = np.floor(0.01 * table.num_gaps).astype(np.int64)
    return (table.status == FINISHED) & (per_row <= allowed)


def tbt_outcome(table: RequestTable, slo_s: float = TBT_SLO_S, duration_s: float | None = None) -> TBTOutcome:
    finished = table.status == FINISHED
    met = meets_tbt(table, slo_s)
    if duration_s is None:
        ends = table.finish_s[np.isfinite(table.finish_s)]
        duration_s = float(ends.max() - table.arrival_s.min()) if len(ends) else float("nan")
    gaps = table.tbt_gaps_s
    ttft = table.ttft_s[finished]
    delay = table.queueing_s[finished]

    def pct(values: np.ndarray, q: float) -> float:
        values = values[np.isfinite(values)]
        return float(np.percentile(values, q)) if len(values) else float("nan")

    rate = (lambda x: x / duration_s) if duration_s and duration_s > 0 else (lambda x: float("nan"))
    return TBTOutcome(len(table), int(met.sum()), float(met.mean()) if len(table) else float("nan"),
                      rate(float(table.num_output_tokens[met].sum())), rate(float(table.num_output_tokens.sum())),
                      rate(float(finished.sum())), float(np.mean(gaps <= slo_s)) if len(gaps) else float("nan"),
                      pct(gaps, 50), pct(gaps, 99), pct(ttft, 50), pct(ttft, 99), pct(delay, 99), pct(delay, 50),
                      duration_s)


def saturated_window(table: RequestTable) -> tuple[float, float]:
    """The second half of the arrival period: an overloaded system is busy and in steady state
    there (its queue has built up, and no drain of the last requests is counted)."""
    last = float(table.arrival_s.max()) if len(table) else float("nan")
    first = float(table.arrival_s.min()) if len(table) else float("nan")
    return first + (last - first) / 2, last


def saturated_throughput(table: RequestTable) -> float:
    """Completions per second inside ``saturated_window``: the service rate of a system fed
    faster than it serves (a finite run's completions over its makespan would count the
    ramp-up and the drain)."""
    t1, t2 = saturated_window(table)
    if not t2 > t1:
        return float("nan")
    ends = table.finish_s[table.status == FINISHED]
    return float(np.sum((ends >= t1) & (ends <= t2)) / (t2 - t1))


def bottleneck_throughput(num_requests: int, busy_s: Sequence[float]) -> float:
    """Requests per second of the busiest instance's time: what a burst says the service rate is."""
    busiest = max(busy_s, default=0.0)
    return num_requests / busiest if busiest > 0 else float("nan")


DELAY_RULES = ("median", "p99")


def capacity_pass(outcome: TBTOutcome, *, target: float = 0.99, max_delay_s: float = 2.0,
                  delay_rule: str = "median") -> bool:
    """Whether a probe passes the capacity rule: attainment >= ``target`` and the scheduling
    delay's median (Sarathi-Serve's rule, the paper's) or P99 within ``max_delay_s``."""
    if delay_rule not in DELAY_RULES:
        raise ValueError(f"delay_rule must be one of {DELAY_RULES}, got {delay_rule!r}")
    delay = outcome.delay_p50_s if delay_rule == "median" else outcome.delay_p99_s
    return outcome.attainment >= target and delay <= max_delay_s


def tbt_cdf(table: RequestTable, points_ms: Sequence[float]) -> list[float]:
    """Share of gaps no longer than each point (ms)."""
    gaps = np.sort(table.tbt_gaps_s)
    return [float(np.searchsorted(gaps, p / 1000.0, side="right") / max(len(gaps), 1)) for p in points_ms]


def instance_utilization(collector: MetricsCollector, peak_flops: Sequence[float], duration_s: float,
                         window: tuple[float, float] | None = None) -> list[dict[str, float]]:
    """Per instance: MFU over ``duration_s`` and the time-weighted share of KV blocks in use;
    with ``window`` (start, end), over the steps that start inside it and its length instead."""
    steps = collector.steps
    out = []
    if window is not None and window[1] > window[0]:
        duration_s = window[1] - window[0]
    for iid, peak in enumerate(peak_flops):
        mine = steps.instance_id == iid
        if window is not None and window[1] > window[0]:
            mine &= (steps.start_s >= window[0]) & (steps.start_s < window[1])
        flops = np.nan_to_num(steps.flops[mine]).sum()
        dur = steps.duration_s[mine]
        start = steps.start_s[mine]
        used = steps.kv_used_blocks[mine]
        total = steps.kv_total_blocks[mine]
        kv = _time_weighted(start, used / np.maximum(total, 1), duration_s, float(start.min()) if len(start) else 0.0)
        out.append({"instance": iid, "mfu": float(flops / (peak * duration_s)) if duration_s > 0 else float("nan"),
                    "kv_use": kv, "busy_fraction": float(dur.sum() / duration_s) if duration_s > 0 else float("nan")})
    return out


def _time_weighted(times: np.ndarray, values: np.ndarray, duration_s: float, t0: float) -> float:
    """Mean of a step function (each value holds until the next time) over ``duration_s``."""
    if len(times) == 0 or not duration_s > 0:
        return 0.0
    order = np.argsort(times, kind="stable")
    times, values = times[order], values[order]
    widths = np.diff(times, append=max(t0 + duration_s, float(times[-1])))
    return float(np.dot(widths, values) / duration_s)


def non_overlapped_transfer_s(handoff_times: dict[int, float], landed_s: dict[int, float]) -> np.ndarray:
    """Per split request that reached its beta: landing time minus hand-off time."""
    ids = sorted(set(handoff_times) & set(landed_s))
    return np.array([landed_s[i] - handoff_times[i] for i in ids], dtype=np.float64)


def handoff_times(policy_reports: dict[int, dict[str, Any]]) -> dict[int, float]:
    out: dict[int, float] = {}
    for report in policy_reports.values():
        out.update(report.get("handoff_times_s", {}))
    return out
