"""Dynamic Batching Controller math (BucketServe Eqs. 1, 5, 6) and bucket batch formation.

Eq. 5 keeps 10% of the remaining memory back (``M_safe = 0.9 * M_remain``), and Eq. 6 takes
the largest prefix of candidates whose KV fits in ``M_safe``. Eq. 1 (2 x L x H x D x S_max x B
x N bytes, the KV of a dense batch padded to its longest row) is not used: the KV here is
paged, so a batch holds each request's own length, which is what Eq. 6 sums; the padded
rectangle appears only as compute (``PaddedBatch``) and in the monitor's Eq. 2 waste. In the policy Eq. 5 is the instance's memory reserve (the KV pool is what is
left after it), so the batch's budget is the live free KV memory (free blocks x block size,
times ``safe_fraction``, 1.0 by default so the 10% is not taken twice), and the fit is
checked in whole blocks, the unit the block manager allocates, so a batch the controller
accepts can never fail to allocate (no OOM).

``form_batch`` also respects the instance's step limits: at most ``max_num_seqs`` rows and a
padded batch of at most ``max_batch_tokens`` tokens (rows x longest row), the activation
bound a dense padded prefill has to respect.

Pure functions, no state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from servelab.core.kv_blocks import cdiv


def safe_memory(remaining: float, safe_fraction: float = 0.9) -> float:
    """Eq. 5: the memory a batch may use, keeping ``1 - safe_fraction`` for system overheads."""
    if not 0 < safe_fraction <= 1:
        raise ValueError(f"safe_fraction must be in (0, 1], got {safe_fraction}")
    if remaining < 0:
        raise ValueError(f"remaining memory must be >= 0, got {remaining}")
    return safe_fraction * remaining


def max_safe_batch(lengths: Sequence[int], safe_bytes: float, kv_bytes_per_token: float) -> int:
    """Eq. 6: the largest N with sum(S_1..S_N) <= M_safe / (2 L H D B), over ``lengths`` in order."""
    if kv_bytes_per_token <= 0:
        raise ValueError(f"kv_bytes_per_token must be > 0, got {kv_bytes_per_token}")
    budget_tokens = safe_bytes / kv_bytes_per_token
    cum = np.cumsum(np.asarray(lengths, dtype=float))
    return int(np.searchsorted(cum, budget_tokens, side="right"))


def safe_blocks(num_free_blocks: int, safe_fraction: float) -> int:
    """Eq. 5 in blocks: whole blocks of the free KV pool a new batch may take."""
    return math.floor(safe_memory(num_free_blocks, safe_fraction) + 1e-9)


def estimate_n_max(avg_len: float, num_free_blocks: int, block_size: int, safe_fraction: float,
                   max_num_seqs: int, step_rows: int | None = None) -> int:
    """N_max for ADJUSTBUCKETS: Eq. 6 with every S_i set to the monitor's average length,
    capped by ``step_rows``, the rows one batch can run under the step limit.

    The queue itself cannot give N_max (if all queued requests fit, the largest N would just
    be the queue size and the merge test ``total < N_max`` could never hold), so the
    controller uses the average sequence length the global monitor reports. The cap keeps
    the paper's rationale for merging (Sec. III: merge when "all requests can be processed in
    a single batch"): without it the merge test fires when the merged bucket cannot run as
    one batch.
    """
    cap = max_num_seqs if step_rows is None else max(1, min(max_num_seqs, step_rows))
    if avg_len <= 0:
        return cap
    per_request = cdiv(max(int(math.ceil(avg_len)), 1), block_size)
    return max(1, min(cap, safe_blocks(num_free_blocks, safe_fraction) // per_request))


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """The live limits one batch must respect on one instance."""

    safe_blocks: int  # Eq. 5 applied to the free KV blocks
    block_size: int
    max_rows: int  # max_num_seqs minus rows already running in the same step
    max_padded_tokens: int  # rows x longest row for a padded step (activation memory)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"BatchLimits.block_size must be >= 1, got {self.block_size}")


def form_batch(lengths: Sequence[int], limits: BatchLimits, *, padded: bool = True, max_waste: float = 1.0) -> int:
    """How many of ``lengths`` (in the given priority order) go into the batch: Eq. 6 in blocks.

    Stops at the first candidate that does not fit, so the priority order is kept (an FCFS
    bucket never lets a later request overtake its head). ``lengths`` are the tokens each
    request will hold in KV after the step. ``max_waste`` (an extension, off at 1.0) also
    stops a padded batch before its Eq. 2 waste ratio would exceed it.
    """
    used_blocks = 0
    longest = 0
    total = 0
    for n, length in enumerate(lengths):
        if n >= limits.max_rows:
            return n
        blocks = cdiv(length, limits.block_size)
        longest = max(longest, length)
        tokens = (n + 1) * longest if padded else total + length
        if used_blocks + blocks > limits.safe_blocks or tokens > limits.max_padded_tokens:
            return n
        if padded and n and 1.0 - (total + length) / ((n + 1) * longest) > max_waste:
            return n
        used_blocks += blocks
        total += length
    return len(lengths)
