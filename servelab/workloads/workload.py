"""Workloads: compose arrivals + lengths into requests, then reshape and summarise them.

A workload is a list of ``RequestSpec`` sorted by ``arrival_time_s`` with ids 0..n-1.
Every function here takes any sequence of specs and returns a new list that keeps those
invariants (ids renumbered where rows are dropped); specs are never mutated.

``predicted_output_tokens`` is left None: length estimators fill it in later. Arrival times
span at most ``MAX_DURATION_S``; a rate or rescaling that would stretch them further is a
``UserError``, as are bad attribute values and windows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from servelab.core.errors import UserError
from servelab.core.limits import MAX_DURATION_S
from servelab.core.request import SLO, RequestSpec, ServiceClass
from servelab.workloads.arrivals import ArrivalProcess
from servelab.workloads.lengths import LengthSource, LengthTable
from servelab.workloads.memory import check_workload_memory

Workload = list[RequestSpec]


@dataclass(frozen=True, slots=True)
class RequestAttrs:
    """Per-request attributes beyond lengths and arrival.

    offline_fraction: share of requests marked ``ServiceClass.OFFLINE``; they get no SLO.
    priority_weights: ``((priority, weight), ...)``; empty means every priority is 0.
    """

    slo: SLO | None = None
    offline_fraction: float = 0.0
    priority_weights: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.offline_fraction <= 1.0:
            raise UserError(f"offline fraction must be in [0, 1], got {self.offline_fraction}")
        weights = [w for _, w in self.priority_weights]
        if weights and (any(not 0 <= w < np.inf for w in weights) or not 0 < sum(weights) < np.inf):
            raise UserError(f"priority weights must be finite and >= 0 with a positive sum, "
                            f"got {self.priority_weights}")
        values = [p for p, _ in self.priority_weights]
        if len(set(values)) != len(values):
            raise UserError(f"each priority may be given once, got {self.priority_weights}")

    @property
    def is_default(self) -> bool:
        return self.slo is None and self.offline_fraction == 0.0 and not self.priority_weights


def compose(arrival_s: np.ndarray, lengths: LengthTable) -> Workload:
    """Zip arrival times with length rows (row i gets the i-th arrival); sorts and re-bases."""
    if len(arrival_s) != len(lengths):
        raise ValueError(f"{len(arrival_s)} arrival times but {len(lengths)} length rows")
    if len(arrival_s) == 0:
        return []
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    check_workload_memory(len(arrival_s), int(lengths.num_output_tokens.sum()))  # before any object exists
    order = np.argsort(arrival_s, kind="stable")
    times_s = arrival_s[order] - arrival_s[order[0]]
    _check_span(times_s)
    times = times_s.tolist()
    prompts = lengths.num_prompt_tokens[order].tolist()
    outputs = lengths.num_output_tokens[order].tolist()
    texts = lengths.prompt_texts
    return [RequestSpec(i, times[i], prompts[i], outputs[i],
                        prompt_text=None if texts is None else texts[int(j)])
            for i, j in enumerate(order)]


def build_workload(arrivals: ArrivalProcess, lengths: LengthSource, num_requests: int,
                   rng: np.random.Generator, attrs: RequestAttrs | None = None) -> Workload:
    """Sample arrivals and lengths from independent child streams of ``rng``.

    Separate streams mean changing the length source leaves arrival times unchanged for the
    same seed, so comparisons across length settings see the same traffic pattern.
    """
    arrival_rng, length_rng, attr_rng = rng.spawn(3)
    workload = compose(arrivals.sample(num_requests, arrival_rng), lengths.sample(num_requests, length_rng))
    return assign_attrs(workload, attrs, attr_rng) if attrs is not None else workload


def assign_attrs(workload: Sequence[RequestSpec], attrs: RequestAttrs, rng: np.random.Generator) -> Workload:
    """Give each request a service class, priority and SLO drawn from ``attrs``."""
    n = len(workload)
    offline = rng.random(n) < attrs.offline_fraction
    if attrs.priority_weights:
        values = np.array([p for p, _ in attrs.priority_weights], dtype=np.int64)
        probs = np.array([w for _, w in attrs.priority_weights], dtype=np.float64)
        priorities = rng.choice(values, size=n, p=probs / probs.sum()).tolist()
    else:
        priorities = [0] * n
    return [dataclasses.replace(spec, priority=priorities[i],
                                service_class=ServiceClass.OFFLINE if offline[i] else ServiceClass.ONLINE,
                                slo=None if offline[i] else attrs.slo)
            for i, spec in enumerate(workload)]


def arrival_times(workload: Sequence[RequestSpec]) -> np.ndarray:
    return np.fromiter((s.arrival_time_s for s in workload), dtype=np.float64, count=len(workload))


def length_table(workload: Sequence[RequestSpec], name: str = "workload") -> LengthTable:
    """The workload's prompt/output pairs (with prompt texts if every request has one)."""
    prompt = np.fromiter((s.num_prompt_tokens for s in workload), dtype=np.int64, count=len(workload))
    output = np.fromiter((s.num_output_tokens for s in workload), dtype=np.int64, count=len(workload))
    texts = tuple(s.prompt_text for s in workload)
    return LengthTable(prompt, output, texts if all(t is not None for t in texts) and texts else None, name)


def _renumbered(specs: Sequence[RequestSpec], times_s: Sequence[float]) -> Workload:
    return [dataclasses.replace(spec, request_id=i, arrival_time_s=float(t))
            for i, (spec, t) in enumerate(zip(specs, times_s))]


def mean_rate_per_s(workload: Sequence[RequestSpec]) -> float:
    """(n - 1) / duration: the inverse mean inter-arrival gap; inf if all arrive together."""
    if len(workload) < 2:
        return float("nan")
    duration_s = workload[-1].arrival_time_s - workload[0].arrival_time_s
    return (len(workload) - 1) / duration_s if duration_s > 0 else float("inf")


def _check_span(times_s: np.ndarray) -> None:
    if times_s.size and not times_s[-1] - times_s[0] <= MAX_DURATION_S:
        raise UserError(f"arrivals would span {times_s[-1] - times_s[0]:.3g} s, more than the {MAX_DURATION_S:.0e} s "
                        "maximum (is the rate far too low?)")


def scale_rate(workload: Sequence[RequestSpec], factor: float) -> Workload:
    """Multiply the arrival rate by ``factor``: every inter-arrival gap is divided by it.

    The temporal pattern (bursts, diurnal shape, order) is kept; only the clock changes.
    """
    if not 0 < factor < np.inf:
        raise UserError(f"rate scale factor must be a finite number > 0, got {factor}")
    times = arrival_times(workload)
    scaled = (times - times[0]) / factor if len(times) else times
    _check_span(scaled)
    return _renumbered(workload, scaled.tolist())


def scale_to_rate(workload: Sequence[RequestSpec], rate_per_s: float) -> Workload:
    """Rescale so ``mean_rate_per_s`` equals ``rate_per_s`` (needs >= 2 distinct times)."""
    if not 0 < rate_per_s < np.inf:
        raise UserError(f"rate must be a finite number > 0 (requests/s), got {rate_per_s}")
    current = mean_rate_per_s(workload)
    if not np.isfinite(current):
        raise UserError(f"cannot set the rate of a workload of {len(workload)} request(s) that all arrive at once; "
                        "rescaling needs at least 2 distinct arrival times")
    return scale_rate(workload, rate_per_s / current)


def time_window(workload: Sequence[RequestSpec], start_s: float, end_s: float) -> Workload:
    """Requests with ``start_s <= arrival < end_s``, re-based so the first one arrives at 0."""
    if not 0 <= start_s < end_s < np.inf:
        raise UserError(f"time window needs 0 <= start < end (finite seconds), got [{start_s}, {end_s})")
    kept = [s for s in workload if start_s <= s.arrival_time_s < end_s]
    if not kept:
        return []
    first_s = kept[0].arrival_time_s
    return _renumbered(kept, [s.arrival_time_s - first_s for s in kept])


def head(workload: Sequence[RequestSpec], num_requests: int) -> Workload:
    """The first ``num_requests`` requests (ids are already 0..n-1, so they stay valid)."""
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    return list(workload[:num_requests])


@dataclass(frozen=True, slots=True)
class WorkloadStats:
    num_requests: int
    duration_s: float
    rate_per_s: float  # (n - 1) / duration
    prompt_mean: float
    prompt_p50: float
    prompt_p99: float
    output_mean: float
    output_p50: float
    output_p99: float

    def __str__(self) -> str:
        return (f"{self.num_requests} requests over {self.duration_s:.1f} s ({self.rate_per_s:.3g} req/s); "
                f"prompt mean/p50/p99 {self.prompt_mean:.0f}/{self.prompt_p50:.0f}/{self.prompt_p99:.0f}; "
                f"output mean/p50/p99 {self.output_mean:.0f}/{self.output_p50:.0f}/{self.output_p99:.0f}")


def describe(workload: Sequence[RequestSpec]) -> WorkloadStats:
    if not workload:
        raise ValueError("cannot describe an empty workload")
    table = length_table(workload)
    p, o = table.num_prompt_tokens, table.num_output_tokens
    return WorkloadStats(
        num_requests=len(workload),
        duration_s=workload[-1].arrival_time_s - workload[0].arrival_time_s,
        rate_per_s=mean_rate_per_s(workload),
        prompt_mean=float(p.mean()), prompt_p50=float(np.percentile(p, 50)), prompt_p99=float(np.percentile(p, 99)),
        output_mean=float(o.mean()), output_p50=float(np.percentile(o, 50)), output_p99=float(np.percentile(o, 99)),
    )
