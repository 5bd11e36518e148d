"""Independent runs of a reproduction spread over worker processes (``SERVELAB_REPRO_JOBS``).

Every reproduction run is a deterministic simulation of the requests in its task, so where a run
happens does not change its result: one process and N give the same numbers (the designs' tests
compare them). The runner charges the workers' CPU to the step once they have ended
(``runner.cpu_time_s``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from servelab.core.errors import UserError

JOBS_ENV = "SERVELAB_REPRO_JOBS"  # worker processes (unset or 1: in this process)


def jobs_from_env() -> int:
    """The worker count ``SERVELAB_REPRO_JOBS`` asks for (1 when unset); one clear line if malformed."""
    raw = os.environ.get(JOBS_ENV, "1") or "1"
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"{JOBS_ENV} must be a whole number of processes, got {raw!r}") from None


def map_in_processes(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``[fn(item) for item in items]``, in order, over ``SERVELAB_REPRO_JOBS`` worker processes
    when that is > 1 (``fn``: a module-level function, so it pickles). An interrupt (Ctrl-C,
    SIGTERM) or a failed run drops the queued runs: the pool's ``with`` block would wait for
    every one of them first."""
    jobs = jobs_from_env()
    if jobs <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(max_workers=min(jobs, len(items)))
    try:
        out = list(pool.map(fn, items))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return out
