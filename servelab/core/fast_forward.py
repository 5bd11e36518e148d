"""Fast-forward of steady decode stretches: many identical decode steps in one numpy jump.

Between two events (an arrival, a transfer, a timer) a continuous-batching instance whose
policy is ``stable_under_decode`` runs the same all-decode plan every step, and only the
context lengths grow. The number of such steps is bounded by (a) the first request to
finish or hand off, (b) the next event on the heap and (c) the free KV blocks. Step times
come from the cost model's vectorised ``decode_step_times_s``, so the jump reproduces the
step-by-step run exactly. A run is applied lazily: only when something reads or reaches
the instance (a router decision, a request placed on it) are its finished steps applied,
and a request placed on it cuts the run short at the step then in flight.

It reads an instance only through the policies' read-only ``InstanceState`` (free blocks, rows
running): the instance runtime imports this module, never the reverse.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace

import numpy as np

from servelab.core.plan import StepPlan, StepShape
from servelab.core.policy import InstanceState
from servelab.core.request import Request

MIN_JUMP_STEPS = 3  # below this, stepping one by one is cheaper


def steps_until_exit(batch: list[Request]) -> int:
    """Steps until the first request finishes or reaches its hand-off point (that step included).

    Stops scanning as soon as a request is that close that no jump is worth it.
    """
    horizon = 1 << 30
    for req in batch:
        left = req.max_output_tokens - req.num_generated_tokens
        if req.handoff_at_tokens is not None:
            left = min(left, req.handoff_at_tokens - req.num_computed_tokens)
        if left < horizon:
            horizon = left
            if horizon < MIN_JUMP_STEPS:
                break
    return horizon


def steps_within_memory(instance: InstanceState, num_rows: int) -> int:
    """Steps every row can append a token without running out of free blocks (conservative)."""
    free = instance.blocks.num_free_gpu_blocks
    per_row = free // num_rows - 1
    return max(per_row, 0) * instance.blocks.block_size


def is_full_decode(plan: StepPlan, shape: StepShape, instance: InstanceState) -> bool:
    """Every running request decodes one token and nothing else happens (a padded decode
    batch qualifies: its rows stay fixed and only the padded context grows)."""
    return (
        shape.num_decodes == instance.num_running == plan.num_rows
        and not shape.prefill_tokens
        and (plan.padding is None or plan.padding.row_tokens == 1)
        and not (plan.preempt_ids or plan.swap_out_ids or plan.swap_in_ids or plan.reject)
    )


def plan_jump(cost_model, shape: StepShape, num_steps: int, now_s: float) -> np.ndarray:
    """End times of ``num_steps`` decode steps of ``shape``'s batch, contexts growing by one."""
    pad = shape.padding
    if pad is not None:  # dense padded decode: the padded context grows by one per step
        durations = np.fromiter((cost_model.step_time_s(replace(shape, padding=replace(
            pad, context_tokens=pad.context_tokens + i))) for i in range(num_steps)), float, num_steps)
        return now_s + np.cumsum(durations)
    n = shape.num_decodes
    steps = np.arange(num_steps, dtype=np.int64)
    context_sums = shape.decode_context_sum + n * steps
    context_maxes = shape.decode_context_max + steps
    return now_s + np.cumsum(cost_model.decode_step_times_s(n, context_sums, context_maxes))


@dataclass(slots=True)
class DecodeRun:
    """A stretch of identical decode steps in flight; steps are applied when someone looks.

    ends[i] is the end time of step i. Steps before ``final_step`` are applied in bulk
    (``num_applied`` of them so far); ``final_step`` is completed as an ordinary step.
    """

    shape: StepShape
    ends: np.ndarray
    start_s: float
    num_waiting: int
    final_step: int
    num_applied: int = 0
    ends_list: list[float] | None = None  # ``ends`` as floats, for bisection without numpy overhead

    def num_ended_by(self, now_s: float) -> int:
        ends = self.ends_list
        if ends is None:
            ends = self.ends_list = self.ends.tolist()
        return bisect_right(ends, now_s)

    def step_start(self, index: int) -> float:
        return self.start_s if index == 0 else float(self.ends[index - 1])
