"""Documented upper bounds on sizes a user can ask for.

Work that grows with a parameter rather than with the input must be bounded, and numbers
that reach numpy must fit its integer types; a value beyond a bound is a ``UserError`` that
quotes the bound. Each bound is far above any real use, so it only stops typos and absurd
values (``n=100000000000``, a 10^23-token trace cell) before they turn into an allocation
failure, an overflow or a run without end.
"""

from __future__ import annotations

# Tokens in one prompt or one output. The longest context of a released model is 10M tokens;
# 10x that leaves room, and int64 sums over millions of requests cannot overflow.
MAX_TOKENS = 100_000_000

# Requests in a generated workload (n= of synthetic and dataset sources). A replayed trace is
# bounded by its file instead. 10M requests take a few GB of request objects.
MAX_NUM_REQUESTS = 10_000_000

# Simulated instances in one cluster: 4,096 instances on a small workload simulate in about
# 3 s; the simulator's per-step work grows with the instance count, not with the input.
MAX_INSTANCES = 4096

# Span of arrival times, in seconds (about 31 years). Beyond it, adding a step time to the
# clock no longer changes it in float64, and a run cannot advance.
MAX_DURATION_S = 1e9

# Coefficient of variation of gamma inter-arrival gaps. At cv = 100 the gamma shape is 1e-4
# (nearly every gap is 0, a few are huge); beyond it the shape underflows.
MAX_CV = 100.0

# A duration parameter of a policy or router (any ``*_s``: a batch's wait, a poll interval, a
# cool-down), in seconds. A batch that waits an hour for company is already no serving system;
# beyond that, a wait (``static:max_wait_s=1e300``) only turns into a TTFT of 1e300 s.
MAX_PARAM_SECONDS = 3600.0

# Integer policy parameters (batch sizes, budgets, bin counts): a C int, so no policy meets
# an overflow when it hands the value to numpy.
MAX_PARAM_INT = 2**31 - 1

# Host (CPU) memory for swapped-out KV per instance, in GiB (vLLM's swap_space). 1 TiB is
# more than a serving host has; the block free lists grow with it.
MAX_SWAP_SPACE_GB = 1024.0


def step_limits_error(max_batch_tokens: int, max_num_seqs: int) -> str | None:
    """vLLM's rule for the two step limits, or None: every running row must be able to decode
    in one step, so ``max_num_batched_tokens >= max_num_seqs`` (vLLM refuses to start
    otherwise; a smaller token budget would leave decodes that no step can take)."""
    if max_batch_tokens < max_num_seqs:
        return (f"the step token limit (--max-num-batched-tokens, max_batch_tokens) of {max_batch_tokens} must be "
                f">= --max-num-seqs (max_num_seqs) of {max_num_seqs}, as vLLM requires: every running request must "
                f"be able to decode in one step")
    return None
