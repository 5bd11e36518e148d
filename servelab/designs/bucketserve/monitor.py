"""Global Monitor (BucketServe Sec. III): live figures that feed the batching controller.

It records what the policy sees through its hooks and its state view: GPU KV memory use,
queue lengths, request arrival rate, average sequence length and batch latency, plus the
bucketing activity (decisions, splits, merges, bucket counts, padded vs real tokens). The
controller reads ``avg_seq_len`` to estimate N_max; everything is exported by ``summary``
and a down-sampled time series for the results.

The arrival rate is an exponentially decayed count (count x ln 2 / half-life), the batch
latency an exponentially weighted moving average; the average
sequence length is a running mean (it sizes N_max, so it should not swing with one long
request). All times come from the ``now_s`` the simulator or engine passes in; the monitor
never reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    rate_halflife_s: float = 10.0  # EWMA half-life of the arrival rate
    latency_alpha: float = 0.2  # EWMA weight of the newest batch latency
    sample_every_s: float = 1.0  # time-series resolution
    max_samples: int = 10_000  # cap on kept samples (oldest half thinned when reached)

    def __post_init__(self) -> None:
        if self.rate_halflife_s <= 0 or not 0 < self.latency_alpha <= 1 or self.sample_every_s <= 0:
            raise ValueError(f"invalid MonitorConfig {self}")
        if self.max_samples < 2:
            raise ValueError(f"MonitorConfig.max_samples must be >= 2, got {self.max_samples}")


@dataclass(slots=True)
class GlobalMonitor:
    config: MonitorConfig = field(default_factory=MonitorConfig)
    num_arrivals: int = 0
    sum_arrival_len: int = 0
    arrival_rate_rps: float = 0.0
    last_arrival_s: float | None = None
    batch_latency_s: float = 0.0
    num_steps: int = 0
    num_prefill_batches: int = 0
    num_decisions: int = 0  # schedule() calls that ran the bucketing logic
    num_splits: int = 0
    num_merges: int = 0
    max_buckets: int = 1
    padded_tokens: int = 0  # rows x longest row of the bucket batches (Eq. 1's rectangle, computed or not)
    real_tokens: int = 0  # prompt tokens actually in those steps
    busy_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    memory_used_frac: float = 0.0
    num_queued: int = 0
    num_running: int = 0
    num_buckets: int = 1
    samples: list[dict] = field(default_factory=list)
    _next_sample_s: float = 0.0
    _decayed_count: float = 0.0

    @property
    def avg_seq_len(self) -> float:
        return self.sum_arrival_len / self.num_arrivals if self.num_arrivals else 0.0

    def on_arrival(self, now_s: float, length: int) -> None:
        self.num_arrivals += 1
        self.sum_arrival_len += length
        # exponentially decayed arrival count; count * ln2 / halflife estimates the rate
        h = self.config.rate_halflife_s
        gap = max(now_s - self.last_arrival_s, 0.0) if self.last_arrival_s is not None else 0.0
        self._decayed_count = self._decayed_count * 0.5 ** (gap / h) + 1.0
        self.arrival_rate_rps = self._decayed_count * math.log(2) / h
        self.last_arrival_s = now_s

    def on_decision(self, now_s: float, *, num_queued: int, num_running: int, memory_used_frac: float,
                    num_buckets: int, num_splits: int, merged: bool) -> None:
        self.num_decisions += 1
        self.num_splits += num_splits
        self.num_merges += int(merged)
        self.max_buckets = max(self.max_buckets, num_buckets)
        self.num_queued, self.num_running, self.num_buckets = num_queued, num_running, num_buckets
        self.memory_used_frac = memory_used_frac
        if now_s >= self._next_sample_s:
            self._next_sample_s = now_s + self.config.sample_every_s
            self._sample(now_s)

    def on_step(self, duration_s: float, *, is_prefill: bool, padded_tokens: int = 0, real_tokens: int = 0) -> None:
        self.num_steps += 1
        self.busy_s += duration_s
        a = self.config.latency_alpha
        self.batch_latency_s = duration_s if self.num_steps == 1 else a * duration_s + (1 - a) * self.batch_latency_s
        if is_prefill:
            self.num_prefill_batches += 1
            self.prefill_s += duration_s
            self.padded_tokens += padded_tokens
            self.real_tokens += real_tokens
        else:
            self.decode_s += duration_s

    def _sample(self, now_s: float) -> None:
        if len(self.samples) >= self.config.max_samples:
            self.samples = self.samples[::2]  # keep the span, halve the resolution
            self.config = MonitorConfig(self.config.rate_halflife_s, self.config.latency_alpha,
                                        self.config.sample_every_s * 2, self.config.max_samples)
        self.samples.append({
            "t_s": now_s, "queued": self.num_queued, "running": self.num_running,
            "memory_used_frac": round(self.memory_used_frac, 4), "num_buckets": self.num_buckets,
            "arrival_rate_rps": round(self.arrival_rate_rps, 4), "avg_seq_len": round(self.avg_seq_len, 1),
            "batch_latency_s": round(self.batch_latency_s, 6),
        })

    def summary(self) -> dict:
        padding = 1.0 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0
        return {
            "num_arrivals": self.num_arrivals, "avg_seq_len": self.avg_seq_len,
            "arrival_rate_rps": self.arrival_rate_rps, "batch_latency_s": self.batch_latency_s,
            "num_steps": self.num_steps, "num_prefill_batches": self.num_prefill_batches,
            "num_decisions": self.num_decisions, "num_splits": self.num_splits, "num_merges": self.num_merges,
            "max_buckets": self.max_buckets, "padded_tokens": self.padded_tokens, "real_tokens": self.real_tokens,
            "padding_waste_frac": padding, "busy_s": self.busy_s, "prefill_s": self.prefill_s,
            "decode_s": self.decode_s, "memory_used_frac": self.memory_used_frac,
        }
