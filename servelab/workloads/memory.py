"""Will a workload fit in memory? Refuse one that cannot, before it is built.

A workload is a list of request objects, and a run adds a request record and every token's
time per request; ``poisson:rate=1,n=10000000`` took 3 GB before its first step and would
have needed far more by its end. ``check_workload_memory`` estimates what a workload will
need from its size (requests and output tokens, known as arrays before any object exists)
with per-request and per-token costs measured on this code, and refuses one above the
*workload memory limit*: ``SERVELAB_MEMORY_LIMIT_GB`` when set, else 80% of the memory the
machine has available now (``MemAvailable``). 1M requests of 200 output tokens need about
11 GiB at today's costs; compact per-request records (issue 29) will lower the two
constants below, and with them the estimate.

Measured (tracemalloc, ``poisson`` workloads of 20,000 to 200,000 requests under ``vllm``,
peak of workload building plus a run plus its summary, divided by requests and tokens).
"""

from __future__ import annotations

import math
import os

from servelab.core.errors import UserError

BYTES_PER_REQUEST = 1_500  # its RequestSpec (250 B), its Request and records while it runs (1,200 B)
BYTES_PER_OUTPUT_TOKEN = 48  # its time while it runs, and the summary's arrays of them
LIMIT_ENV = "SERVELAB_MEMORY_LIMIT_GB"
AVAILABLE_SHARE = 0.8


def workload_bytes(num_requests: int, num_output_tokens: int) -> int:
    """Bytes a run of this size needs at its peak (workload, requests, token times, summary)."""
    return num_requests * BYTES_PER_REQUEST + num_output_tokens * BYTES_PER_OUTPUT_TOKEN


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
        raise UserError(f"{num_requests:,} requests with {num_output_tokens:,} output tokens need about "
                        f"{need / 2**30:.1f} GiB to simulate ({BYTES_PER_REQUEST:,} B a request and "
                        f"{BYTES_PER_OUTPUT_TOKEN} B an output token), over the workload memory limit of "
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
