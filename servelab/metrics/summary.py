"""Run summary: one frozen record of everything a run is judged by.

``summarize`` combines the per-request ``RequestTable`` with the ``MetricsCollector``'s step
records. Latency statistics cover finished requests only (TBT over all their gaps);
throughput and goodput are over the makespan, from the first arrival to the last request
end (or over ``duration_s`` when given). Goodput counts only requests meeting their SLO,
so it never exceeds throughput; SLO attainment is over every arrived request, so
rejections and aborts count against it.

Conservation: every arrived request must have ended (finished, rejected or aborted), and
when the collector saw request ends, exactly those requests and each once. A run that
breaks this raises ``ConservationError`` naming the request ids, instead of reporting
numbers that silently leave requests out.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from servelab.core.admission import is_overflow_reason
from servelab.core.request import SLO
from servelab.metrics.collector import MetricsCollector, time_weighted_mean
from servelab.metrics.request_metrics import ABORTED, FINISHED, REJECTED, STATUS_NAMES, UNFINISHED, RequestTable

_NAN = float("nan")


class ConservationError(RuntimeError):
    """Arrived requests and ended requests do not match up."""


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Distribution summary of one latency metric, in seconds (NaN when count is 0)."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: np.ndarray) -> LatencyStats:
        values = values[np.isfinite(values)]
        if len(values) == 0:
            return cls(0, _NAN, _NAN, _NAN, _NAN, _NAN)
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        return cls(len(values), float(values.mean()), float(p50), float(p90), float(p99), float(values.max()))


@dataclass(frozen=True, slots=True)
class InstanceSummary:
    """busy_fraction: busy time over the run's duration; mfu: FLOPs achieved while busy / peak."""

    instance_id: int
    num_steps: int
    busy_s: float
    busy_fraction: float
    mfu: float | None


@dataclass(frozen=True, slots=True)
class RunSummary:
    num_arrived: int
    num_completed: int
    num_rejected: int
    num_aborted: int
    num_rejected_context: int  # of num_rejected: over the context at admission (prompt + max_tokens > max_model_len)
    end_reasons: tuple[tuple[str, str, int], ...]  # (status, reason code, count), most common first
    ttft: LatencyStats
    tpot: LatencyStats
    tbt: LatencyStats
    e2e: LatencyStats
    queueing: LatencyStats
    duration_s: float  # the denominator of every rate below
    num_output_tokens: int  # every token emitted, by any request
    output_tokens_per_s: float
    requests_per_s: float  # completed requests
    num_slo_met: int
    goodput_requests_per_s: float
    goodput_tokens_per_s: float
    slo_attainment: float  # SLO-meeting requests / arrived requests; NaN (None in JSON) without an SLO
    has_slo: bool  # whether any target applied; without one there is no attainment or goodput
    num_preemptions_recompute: int
    num_preemptions_swap: int
    padding_waste: float  # padded tokens computed / all tokens computed
    kv_utilization_mean: float  # cluster KV blocks used / total, time-weighted
    kv_utilization_max: float
    queue_length_mean: float  # requests left waiting while steps run (counted after each step admits), time-weighted
    queue_length_max: float
    instances: tuple[InstanceSummary, ...]

    def to_dict(self) -> dict:
        """JSON-safe dict: NaN and infinities become None, tuples become lists."""
        return _json_safe(asdict(self))

    def flat_dict(self) -> dict[str, float | int | None]:
        """Scalars only, for sweep rows and CSV: ``ttft_p99``-style keys, instances averaged."""
        out: dict[str, float | int | None] = {}
        for key, value in self.to_dict().items():
            if isinstance(value, dict):
                out.update({f"{key}_{stat}": v for stat, v in value.items()})
            elif not isinstance(value, list):
                out[key] = value
        for name in ("busy_fraction", "mfu"):
            values = [v for v in (getattr(i, name) for i in self.instances) if v is not None and math.isfinite(v)]
            out[f"{name}_mean"] = sum(values) / len(values) if values else None
        return out


def summarize(table: RequestTable, collector: MetricsCollector, *, duration_s: float | None = None,
              slo: SLO | None = None, peak_flops_per_instance: float | None = None) -> RunSummary:
    """Summarise one run; ``slo`` replaces every request's own SLO when given."""
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    if peak_flops_per_instance is not None and not peak_flops_per_instance > 0:
        raise ValueError(f"peak_flops_per_instance must be > 0, got {peak_flops_per_instance!r}")
    check_conservation(table, collector)
    finished = table.status == FINISHED
    met = table.slo_met(slo)
    has_slo = table.has_slo(slo)
    duration = duration_s if duration_s is not None else _makespan_s(table)
    num_out = int(table.num_output_tokens.sum())
    num_arrived = len(table)
    kv_mean, kv_max = _kv_utilization(collector)
    queue_mean, queue_max = _series_stats(collector, "num_waiting")
    return RunSummary(
        num_arrived=num_arrived,
        num_completed=int(finished.sum()),
        num_rejected=int((table.status == REJECTED).sum()),
        num_aborted=int((table.status == ABORTED).sum()),
        num_rejected_context=_num_over_context(table),
        end_reasons=_end_reasons(table),
        ttft=LatencyStats.of(table.ttft_s[finished]),
        tpot=LatencyStats.of(table.tpot_s[finished]),
        tbt=LatencyStats.of(table.gaps_of(finished)),
        e2e=LatencyStats.of(table.e2e_s[finished]),
        queueing=LatencyStats.of(table.queueing_s[finished]),
        duration_s=duration,
        num_output_tokens=num_out,
        output_tokens_per_s=_rate(num_out, duration),
        requests_per_s=_rate(int(finished.sum()), duration),
        num_slo_met=int(met.sum()),
        goodput_requests_per_s=_rate(int(met.sum()), duration) if has_slo else _NAN,
        goodput_tokens_per_s=_rate(int(table.num_output_tokens[met].sum()), duration) if has_slo else _NAN,
        slo_attainment=float(met.sum() / num_arrived) if num_arrived and has_slo else _NAN,
        has_slo=has_slo,
        num_preemptions_recompute=collector.num_preemptions("recompute"),
        num_preemptions_swap=collector.num_preemptions("swap"),
        padding_waste=_padding_waste(collector),
        kv_utilization_mean=kv_mean,
        kv_utilization_max=kv_max,
        queue_length_mean=queue_mean,
        queue_length_max=queue_max,
        instances=_instances(collector, duration, peak_flops_per_instance),
    )


def check_conservation(table: RequestTable, collector: MetricsCollector) -> None:
    """Raise ``ConservationError`` unless arrived == completed + rejected + aborted."""
    unfinished = table.request_id[table.status == UNFINISHED]
    if len(unfinished):
        raise ConservationError(f"{len(table)} arrived but {len(unfinished)} never ended "
                                f"(finished, rejected or aborted): request ids {_ids(unfinished)}")
    if not collector.ended_requests:
        return
    reported = Counter(r.request_id for r in collector.ended_requests)
    twice = sorted(rid for rid, n in reported.items() if n > 1)
    if twice:
        raise ConservationError(f"requests reported ended more than once: ids {_ids(twice)}")
    arrived = set(table.request_id.tolist())
    missing, unknown = sorted(arrived - reported.keys()), sorted(reported.keys() - arrived)
    if missing:
        raise ConservationError(f"requests ended without on_request_end: ids {_ids(missing)}")
    if unknown:
        raise ConservationError(f"on_request_end for requests not in the table: ids {_ids(unknown)}")


def _makespan_s(table: RequestTable) -> float:
    if len(table) == 0:
        return _NAN
    return float(np.nanmax(table.finish_s) - table.arrival_s.min())


def _rate(count: int, duration_s: float) -> float:
    return count / duration_s if duration_s > 0 else _NAN


def reason_code(reason: str | None) -> str:
    """A finish reason with its numbers folded into ``N`` ("prompt 5000 + max_tokens 10 exceeds
    max_model_len 4096" -> "prompt N + max_tokens N exceeds max_model_len N"): one code per
    kind of ending, so a summary holds a few codes with counts, not one entry per request
    (each request's own reason, numbers included, is in requests.csv)."""
    return re.sub(r"\d+(\.\d+)?", "N", reason) if reason else ""


def _end_reasons(table: RequestTable) -> tuple[tuple[str, str, int], ...]:
    counts = Counter(zip((STATUS_NAMES[s] for s in table.status.tolist()),
                         (reason_code(r) for r in table.finish_reason)))
    return tuple((status, reason, n) for (status, reason), n in counts.most_common())


def _num_over_context(table: RequestTable) -> int:
    rejected = (table.status == REJECTED).tolist()
    return sum(1 for r, why in zip(rejected, table.finish_reason) if r and is_overflow_reason(why))


def _padding_waste(collector: MetricsCollector) -> float:
    steps = collector.steps
    padded = float(steps.num_padding_tokens.sum())
    total = padded + float(steps.num_tokens.sum())
    return padded / total if total > 0 else _NAN


def _series_stats(collector: MetricsCollector, column: str) -> tuple[float, float]:
    times, values, end_s = collector.cluster_series(column)
    if len(times) == 0:
        return _NAN, _NAN
    return time_weighted_mean(times, values, end_s), float(values.max())


def _kv_utilization(collector: MetricsCollector) -> tuple[float, float]:
    times, used, end_s = collector.cluster_series("kv_used_blocks")
    _, total, _ = collector.cluster_series("kv_total_blocks")
    if len(times) == 0 or not np.all(total > 0):
        return _NAN, _NAN
    util = used / total
    return time_weighted_mean(times, util, end_s), float(util.max())


def _instances(collector: MetricsCollector, duration_s: float,
               peak_flops: float | None) -> tuple[InstanceSummary, ...]:
    steps = collector.steps
    out = []
    for iid, busy in collector.busy_s().items():
        mine = steps.instance_id == iid
        flops = steps.flops[mine]
        mfu = None
        if peak_flops is not None and busy > 0 and not np.all(np.isnan(flops)):
            mfu = float(np.nansum(flops) / (peak_flops * busy))
        out.append(InstanceSummary(iid, int(mine.sum()), busy, _rate(busy, duration_s), mfu))
    return tuple(out)


def _ids(ids, limit: int = 20) -> str:
    ids = [int(i) for i in ids]
    shown = ", ".join(map(str, ids[:limit]))
    return shown + (f" ... ({len(ids)} in all)" if len(ids) > limit else "")


def _json_safe(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    return value
