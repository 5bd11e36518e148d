"""Will a workload fit in memory? Refuse one that cannot, before it is built.

A workload is a list of request objects, and a run adds a request record and every token's
time per request; ``poisson:rate=1,n=10000000`` took 3 GB before its first step and would
have needed far more by its end. ``check_workload_memory`` estimates what a workload will
need from its size (requests and output tokens, known as arrays before any object exists)
with per-request and per-token costs measured on this code, and refuses one above the
*workload memory limit*: ``SERVELAB_MEMORY_LIMIT_GB`` when set, else 80% of the memory the
machine has available now (``MemAvailable``).

What a run needs depends on what it keeps: every command that writes a summary builds its
arrays of token times and gaps (33 B an output token, on top of the run's 10 B), but
``servelab perf scale`` builds none, and its 1,024 instances hold their KV block lists (75 KB
each; 310 KB before the instances shared their block id objects, ``core.kv_blocks.block_ids``). A command says so with ``run_shape(instances=..., summary=...)`` around the workload's
building; without it the estimate assumes one instance and a summary. 1M requests of 200
output tokens: about 10.0 GiB with a summary, 3.1 GiB under ``perf scale`` on 1,024 instances
(docs/benchmarks/scale.md has the measured peak; the estimate before counted the summary there
too: 10.3 GiB).

Measured on this code (peak RSS of a fresh process from after its imports and cost model, ``poisson``
workloads as ``perf scale``'s: 64 instances x 977 requests with outputs of 100 and of 300 tokens,
summary built after the run; 512 instances x 4 requests for the instance cost).
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

from servelab.core.errors import UserError

BYTES_PER_REQUEST = 1_250  # its RequestSpec, its Request and records while it runs
BYTES_PER_OUTPUT_TOKEN = 10  # its time in the request's list (the float shared by a step's rows)
SUMMARY_BYTES_PER_REQUEST = 850  # the summary's per-request table
SUMMARY_BYTES_PER_OUTPUT_TOKEN = 33  # the summary's arrays of token times and gaps, and their temporaries
BYTES_PER_INSTANCE = 75_000  # its KV block lists (the ids are shared objects), queues and policy
LIMIT_ENV = "SERVELAB_MEMORY_LIMIT_GB"
AVAILABLE_SHARE = 0.8

_SHAPE: ContextVar[tuple[int, bool]] = ContextVar("servelab_run_shape", default=(1, True))


@contextmanager
def run_shape(*, instances: int = 1, summary: bool = True) -> Iterator[None]:
    """Workloads built inside run on ``instances`` instances, with or without a summary."""
    token = _SHAPE.set((max(int(instances), 1), bool(summary)))
    try:
        yield
    finally:
        _SHAPE.reset(token)


def workload_bytes(num_requests: int, num_output_tokens: int, *, instances: int | None = None,
                   summary: bool | None = None) -> int:
    """Bytes a run of this size needs at its peak (workload, requests, token times, instances,
    and the summary's arrays when it builds one); unset arguments come from ``run_shape``."""
    shape_instances, shape_summary = _SHAPE.get()
    instances = shape_instances if instances is None else instances
    summary = shape_summary if summary is None else summary
    per_request = BYTES_PER_REQUEST + (SUMMARY_BYTES_PER_REQUEST if summary else 0)
    per_token = BYTES_PER_OUTPUT_TOKEN + (SUMMARY_BYTES_PER_OUTPUT_TOKEN if summary else 0)
    return num_requests * per_request + num_output_tokens * per_token + instances * BYTES_PER_INSTANCE


def memory_limit_bytes() -> tuple[float, str]:
    """(the workload memory limit in bytes, where it comes from); inf when nothing says."""
    text = os.environ.get(LIMIT_ENV)
    if text is not None:
        try:
            gb = float(text)
        except ValueError:
            gb = math.nan
        if not 0 < gb < math.inf:
            raise UserError(f"{LIMIT_ENV}={text!r}: must be a number of GiB > 0")
        return gb * 2**30, f"{LIMIT_ENV}={text}"
    available = _available_bytes()
    if available is None:
        return math.inf, "unknown available memory"
    return AVAILABLE_SHARE * available, f"{AVAILABLE_SHARE:.0%} of the {available / 2**30:.1f} GiB available now"


def check_workload_memory(num_requests: int, num_output_tokens: int) -> None:
    """Refuse a workload whose run would need more than the workload memory limit."""
    need = workload_bytes(num_requests, num_output_tokens)
    limit, source = memory_limit_bytes()
    if need > limit:
        instances, summary = _SHAPE.get()
        per_request = BYTES_PER_REQUEST + (SUMMARY_BYTES_PER_REQUEST if summary else 0)
        per_token = BYTES_PER_OUTPUT_TOKEN + (SUMMARY_BYTES_PER_OUTPUT_TOKEN if summary else 0)
        raise UserError(f"{num_requests:,} requests with {num_output_tokens:,} output tokens need about "
                        f"{need / 2**30:.1f} GiB to simulate ({per_request:,} B a request and {per_token} B an "
                        f"output token{' with the summary' if summary else ''}, {BYTES_PER_INSTANCE // 1000:,} KB "
                        f"an instance x {instances:,}), over the workload memory limit of "
                        f"{limit / 2**30:.1f} GiB ({source}; {LIMIT_ENV} sets it): use fewer requests (n=, "
                        f"window=) or shorter outputs")


def _available_bytes() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return None
