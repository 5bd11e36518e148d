"""What AlignedServe measures about itself (issue item 8): batch generation time, the time
to schedule an iteration, the share of batch-switch iterations, pool occupancy over time,
and the KV moves that scheduling caused.

Decision times are the CPU time of the router's own code (``time.thread_time``, ns
resolution): four engineers share two cores here, and wall-clock timings of microsecond
work carry 10 ms descheduling pauses. The KV latencies are simulated (the links' time) or
measured (the engine's copies).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class AlignedStats:
    batch_gen_s: list[float] = field(default_factory=list)  # one Density First Search each
    batch_sizes: list[int] = field(default_factory=list)
    batch_cases: list[int] = field(default_factory=list)
    batch_spans: list[int] = field(default_factory=list)  # longest - shortest prefix in a batch
    num_forced_batches: int = 0
    schedule_s: list[float] = field(default_factory=list)  # router work after each decode iteration
    num_iterations: int = 0
    num_switch_iterations: int = 0  # running requests from more than one batch (the paper's Section 4.4 wording)
    # the other reading of a "batch switch": iterations after which requests of a batch other than one the
    # running requests belong to joined (Algorithm 2's case 2 happening), not every iteration two batches share
    num_switch_events: int = 0
    switch_minority: list[float] = field(default_factory=list)  # mixed iterations: rows outside the largest batch / rows
    num_evictions: int = 0
    num_evictions_to_pool: int = 0
    num_dynamic: int = 0  # pool requests pulled into the Candidate Requests Buffer
    num_starved: int = 0  # requests scheduled by the starvation bound
    num_starved_batches: int = 0  # batches cut from a starving subtree (each with its own id)
    cut_pool: list[tuple[int, int, int]] = field(default_factory=list)  # (requests, blocks, threshold) at each cut
    num_steals: int = 0  # an idle decode GPU took another GPU's unjoined candidate requests (pool empty)
    num_stolen: int = 0
    num_joins: int = 0  # requests released to a decode instance
    num_joins_completions: int = 0  # ... after completions (the paper's case 1/2)
    num_joins_small: int = 0  # ... because the running batch was under its minimum size
    kv_wait_s: list[float] = field(default_factory=list)  # a decode instance paused for joining KV
    pool_wait_s: list[float] = field(default_factory=list)  # KV into the pool after prefill -> on a decode GPU
    rejoin_wait_s: list[float] = field(default_factory=list)  # evicted from a decode GPU -> back on one
    num_prefetch_skipped: int = 0  # the buffer GPU had no room: released from the pool over PCIe
    num_prefetched: int = 0  # requests whose KV was prefetched into a buffer GPU (candidate or requests buffer)
    # at each skipped prefetch: (the request's blocks, the buffer's room then, the buffer's whole room:
    # its blocks less the tenth kept for prefills) -- says whether the buffer was occupied or too small
    prefetch_skips: list[tuple[int, int, int]] = field(default_factory=list)
    pool_samples: list[tuple[float, float]] = field(default_factory=list)  # (time, bytes)
    release_s: list[float] = field(default_factory=list)  # schedule decision -> KV on the decode GPU
    step_contexts: list[tuple[int, int, int]] = field(default_factory=list)  # (rows, sum, max) per iteration
    batch_fill: list[float] = field(default_factory=list)  # each cut batch's blocks / the block threshold
    used_share: list[float] = field(default_factory=list)  # the decode GPU's used blocks / its blocks, per iteration
    step_s: list[float] = field(default_factory=list)  # each decode iteration's forward time (cost model)
    step_even_s: list[float] = field(default_factory=list)  # ... with its context spread evenly over its rows

    def sample_pool(self, now_s: float, used_bytes: float) -> None:
        if not self.pool_samples or self.pool_samples[-1][1] != used_bytes:
            self.pool_samples.append((now_s, float(used_bytes)))

    def summary(self) -> dict:
        def pct(xs, q):
            return float(np.percentile(xs, q)) if len(xs) else float("nan")

        cuts = np.array(self.cut_pool, dtype=float).reshape(-1, 3)
        depth = cuts[:, 1] / np.maximum(cuts[:, 2], 1)  # pool blocks / threshold at each cut
        sizes = np.asarray(self.batch_sizes[:len(depth)], dtype=float)
        minority = np.asarray(self.switch_minority, dtype=float)
        rows = [r for r, _, _ in self.step_contexts]

        return {
            "num_batches": len(self.batch_sizes),
            "num_forced_batches": self.num_forced_batches,
            "batch_size_mean": float(np.mean(self.batch_sizes)) if self.batch_sizes else 0.0,
            "batch_span_median": pct(self.batch_spans, 50),
            "batch_cases": {c: self.batch_cases.count(c) for c in sorted(set(self.batch_cases))},
            "batch_gen_p50_ms": 1e3 * pct(self.batch_gen_s, 50),
            "batch_gen_p99_ms": 1e3 * pct(self.batch_gen_s, 99),
            "schedule_p50_ms": 1e3 * pct(self.schedule_s, 50),
            "schedule_p99_ms": 1e3 * pct(self.schedule_s, 99),
            "release_p50_ms": 1e3 * pct(self.release_s, 50),
            "release_p95_ms": 1e3 * pct(self.release_s, 95),
            "num_iterations": self.num_iterations,
            "step_p50_ms": 1e3 * pct(self.step_s, 50),
            # the paper's iteration-level bubble: how much longer the decode iterations took than the same
            # iterations with each one's context spread evenly over its rows (same KV reads, no long row)
            "iteration_bubble": (sum(self.step_s) / sum(self.step_even_s) - 1) if sum(self.step_even_s) else 0.0,
            "switch_share": self.num_switch_iterations / self.num_iterations if self.num_iterations else 0.0,
            "switch_event_share": self.num_switch_events / self.num_iterations if self.num_iterations else 0.0,
            # mixed iterations: the share of rows not in the iteration's largest batch (p50), and the share of all
            # iterations mixed with more than a tenth of their rows outside it (a switch in progress, not stragglers)
            "switch_minority_rows_p50": pct(minority, 50),
            "switch_share_over_tenth": (float(np.sum(minority > 0.1)) / self.num_iterations
                                        if self.num_iterations else 0.0),
            "num_steals": self.num_steals,
            "num_stolen": self.num_stolen,
            "num_evictions": self.num_evictions,
            "num_evictions_to_pool": self.num_evictions_to_pool,
            "num_dynamic": self.num_dynamic,
            "num_starved": self.num_starved,
            "num_starved_batches": self.num_starved_batches,
            "pool_depth_at_cut": {  # the premise: DFS narrows only when the pool exceeds the threshold
                "requests_p10_p50_p90": [pct(cuts[:, 0], q) for q in (10, 50, 90)],
                "blocks_over_threshold_p10_p50_p90": [pct(depth, q) for q in (10, 50, 90)],
                "share_over_threshold": float(np.mean(depth > 1.0)) if len(depth) else 0.0,
                # per request batched rather than per cut: many small cuts (starved subtrees, the drained
                # end) hold few requests, so the per-cut median understates where most requests were cut
                "requests_cut_over_threshold": (float(sizes[depth > 1.0].sum() / sizes.sum())
                                                if len(depth) and sizes.sum() else 0.0),
                "blocks_over_threshold_request_p50": _weighted_median(depth, sizes),
            },
            "rows_per_iteration_mean": float(np.mean(rows)) if rows else 0.0,
            # what the join rule fills: a cut batch against the threshold, the decode GPU's blocks per iteration
            "batch_blocks_over_threshold_p10_p50_p90": [pct(self.batch_fill, q) for q in (10, 50, 90)],
            "gpu_blocks_used_p10_p50_p90": [pct(self.used_share, q) for q in (10, 50, 90)],
            "rows_per_iteration_p10_p50_p90": [pct(rows, q) for q in (10, 50, 90)],
            "num_joins": self.num_joins,
            "num_joins_completions": self.num_joins_completions,
            "num_joins_small": self.num_joins_small,
            "num_kv_waits": len(self.kv_wait_s),
            "kv_wait_total_s": float(np.sum(self.kv_wait_s)) if self.kv_wait_s else 0.0,
            "kv_wait_p50_p95_ms": [1e3 * pct(self.kv_wait_s, q) for q in (50, 95)],
            "num_prefetch_skipped": self.num_prefetch_skipped,
            "num_prefetched": self.num_prefetched,
            "prefetch_skips": _skips(self.prefetch_skips),
            # the wait before decoding (TTFT's in the paper, Fig. 15), and an evicted request's wait to rejoin
            "pool_wait_s": _dist(self.pool_wait_s),
            "rejoin_wait_s": _dist(self.rejoin_wait_s),
            "pool_peak_gb": max((b for _, b in self.pool_samples), default=0.0) / 2**30,
        }


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The value below which half the weight lies (nan when there is no weight)."""
    if not len(values) or not weights.sum():
        return float("nan")
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, cum[-1] / 2)])


def _skips(skips: list[tuple[int, int, int]]) -> dict:
    """Why prefetches were skipped: the request alone exceeded the buffer's whole room (no
    setting of the buffer's occupancy could have taken it) or the room left at that moment."""
    if not skips:
        return {"count": 0, "too_big": 0, "need_blocks_p50": 0.0, "room_blocks_p50": 0.0, "capacity_blocks": 0}
    a = np.asarray(skips, dtype=float)
    return {"count": len(a), "too_big": int(np.sum(a[:, 0] > a[:, 2])), "need_blocks_p50": float(np.median(a[:, 0])),
            "room_blocks_p50": float(np.median(a[:, 1])), "capacity_blocks": int(a[:, 2].max())}


def _dist(xs: list[float]) -> dict:
    a = np.asarray(xs, dtype=float)
    if not len(a):
        return {"count": 0, "mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    return {"count": int(len(a)), "mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}
