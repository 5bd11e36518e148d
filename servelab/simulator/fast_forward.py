"""Fast-forward of steady decode stretches: many identical decode steps in one numpy jump.

Between two events (an arrival, a transfer, a timer) a continuous-batching instance whose
policy is ``stable_under_decode`` runs the same all-decode plan every step, and only the
context lengths grow. The number of such steps is bounded by (a) the first request to
finish or hand off, (b) the next event on the heap and (c) the free KV blocks. Step times
come from the cost model's vectorised ``decode_step_times_s``, so the jump reproduces the
step-by-step run exactly.
"""

from __future__ import annotations

import numpy as np

from servelab.core.instance import InstanceRuntime
from servelab.core.plan import StepPlan, StepShape
from servelab.core.request import Request

MIN_JUMP_STEPS = 3  # below this, stepping one by one is cheaper


def steps_until_exit(batch: list[Request]) -> int:
    """Steps until the first request finishes or reaches its hand-off point (that step included)."""
    horizon = 1 << 30
    for req in batch:
        left = req.max_output_tokens - req.num_generated_tokens
        if req.handoff_at_tokens is not None:
            left = min(left, req.handoff_at_tokens - req.num_computed_tokens)
        if left < horizon:
            horizon = left
    return horizon


def steps_within_memory(instance: InstanceRuntime, num_rows: int) -> int:
    """Steps every row can append a token without running out of free blocks (conservative)."""
    free = instance.blocks.num_free_gpu_blocks
    per_row = free // num_rows - 1
    return max(per_row, 0) * instance.blocks.block_size


def is_full_decode(plan: StepPlan, shape: StepShape, instance: InstanceRuntime) -> bool:
    return (
        shape.num_decodes == len(instance.running) == len(plan.request_ids)
        and not shape.prefill_tokens
        and plan.padding is None
        and not (plan.preempt_ids or plan.swap_out_ids or plan.swap_in_ids or plan.reject)
    )


def plan_jump(cost_model, shape: StepShape, num_steps: int, now_s: float, next_event_s: float) -> np.ndarray:
    """End times of the steps to take now: each step's plan is made before ``next_event_s``."""
    n = shape.num_decodes
    context_sums = shape.decode_context_sum + n * np.arange(num_steps, dtype=np.int64)
    durations = cost_model.decode_step_times_s(n, context_sums)
    ends = now_s + np.cumsum(durations)
    # step i starts at ends[i-1]; only steps that start before the next event keep the plan
    num_ok = 1 + int(np.searchsorted(ends[:-1], next_event_s, side="left"))
    return ends[:num_ok]
