"""Bucketing overhead benchmark: CPU time of one BucketServe decision (measured, not simulated).

A decision is what the policy does per bucket prefill: place one new request (bisection),
run ADJUSTBUCKETS, pick the longest-waiting bucket, read its FCFS candidates, and remove the
chosen batch. The benchmark holds ``num_queued`` requests over ``num_buckets`` equal-width
buckets (``min_split_size`` set so no split fires and the bucket count stays put), repeats
the decision and re-adds the batch so the queue size stays constant, and reports the mean
and median seconds per decision from ``time.thread_time`` (CPU time of this thread: the machine
is shared, and wall time would count other processes' time slices, milliseconds each, as the
decision's; garbage collection inside a decision still counts). This is the one place in the
BucketServe code that reads a clock; it is a benchmark, never used by the policy.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from servelab.designs.bucketserve.buckets import BucketingConfig, BucketManager


def _equal_edges(max_len: int, num_buckets: int) -> list[int]:
    edges = np.unique(np.linspace(0, max_len, num_buckets + 1).round().astype(int)).tolist()
    if len(edges) - 1 != num_buckets:
        raise ValueError(f"cannot make {num_buckets} buckets of whole tokens in [0, {max_len}]")
    return edges


def time_decisions(num_queued: int, num_buckets: int, *, rng: np.random.Generator, max_len: int = 4096,
                   batch_size: int = 32, repeats: int = 200) -> dict:
    """Seconds per decision at a fixed queue size and bucket count."""
    if num_queued < 1 or num_buckets < 1 or repeats < 1:
        raise ValueError("num_queued, num_buckets and repeats must be >= 1")
    manager = BucketManager(BucketingConfig(max_len, min_split_size=num_queued + batch_size + 1))
    lengths = np.clip(rng.lognormal(5.0, 1.2, num_queued + repeats), 1, max_len).astype(int).tolist()
    for key in range(num_queued):
        manager.add(key, lengths[key], float(key))
    manager.repartition(_equal_edges(max_len, num_buckets))
    times = np.empty(repeats)
    next_key = num_queued
    for i in range(repeats):
        t0 = time.thread_time()
        manager.add(next_key, lengths[next_key], float(next_key))
        manager.adjust(1)  # total >= N_max: the split pass runs over every bucket
        index = manager.oldest_bucket()
        batch = manager.candidates(index, "fcfs", batch_size)
        removed = manager.remove_many([e.key for e in batch])
        times[i] = time.thread_time() - t0
        next_key += 1
        for e in removed[1:]:  # keep the queue size constant (the oldest one leaves for good)
            manager.add(e.key, e.length, e.arrival_s + 1e6)
        if len(manager) > num_queued:
            manager.remove(manager.candidates(manager.oldest_bucket(), "fcfs", 1)[0].key)
    return {"num_queued": num_queued, "num_buckets": manager.num_buckets, "mean_s": float(times.mean()),
            "median_s": float(np.median(times)), "p99_s": float(np.quantile(times, 0.99)), "repeats": repeats}


def overhead_grid(queued: Sequence[int] = (10, 100, 1000, 10_000), buckets: Sequence[int] = (1, 4, 16, 64, 256, 1024),
                  *, seed: int = 0, repeats: int = 200) -> list[dict]:
    """``time_decisions`` over a grid; one row per (queue size, bucket count)."""
    rng = np.random.default_rng(seed)
    return [time_decisions(n, k, rng=rng, repeats=repeats) for n in queued for k in buckets]
