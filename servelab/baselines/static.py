"""Request-level static batching in arrival order (FasterTransformer style), the padded baseline.

The first ``batch_size`` queued requests (arrival order) form a batch when the instance is free; its
prompts are prefilled as one dense batch padded to the longest prompt, and the batch holds
the instance until its longest output finishes: finished rows keep costing compute until
then. KV is reserved up front for the padded rectangle, rows x (longest prompt + longest
output), as a static engine preallocates its dense cache (``padded_kv``; False reserves only
each row's own prompt + output), so a formed batch never runs out of memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.core.plan import EMPTY_PLAN, PaddedBatch, StepPlan
from servelab.core.policy import POLICIES, InstanceState, SchedulingPolicy
from servelab.core.request import Request
from servelab.core.planning import admission_error, step_limit_error


@dataclass(frozen=True)
class StaticConfig:
    batch_size: int = 8
    max_wait_s: float = 0.0  # wait this long for a full batch before running a partial one
    padded_kv: bool = True  # KV sized as the dense padded batch, as the engine allocates it

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not (math.isfinite(self.max_wait_s) and self.max_wait_s >= 0):
            raise ValueError(f"max_wait_s must be a finite number >= 0, got {self.max_wait_s}")


@POLICIES.register("static")
class StaticBatchingPolicy(SchedulingPolicy):
    Config = StaticConfig
    # a held batch decodes the same rows every step until one finishes, and its padded length
    # grows by one per step: the simulator may fast-forward such stretches
    stable_under_decode = True

    def __init__(self, config: StaticConfig = StaticConfig()) -> None:
        self.config = config
        self._batch: list[Request] = []  # the batch holding the instance
        self._max_prompt = 0
        self._oldest_waiting_s: float | None = None
        self._unchecked: list[Request] = []  # arrivals not yet checked for admission

    def on_arrival(self, now_s: float, request: Request) -> None:
        self._unchecked.append(request)
        if self._oldest_waiting_s is None:
            self._oldest_waiting_s = now_s

    def next_wakeup_s(self, now_s: float) -> float | None:
        if self._batch or self._oldest_waiting_s is None:
            return None
        return self._oldest_waiting_s + self.config.max_wait_s

    def schedule(self, now_s: float, state: InstanceState) -> StepPlan:
        self._batch = [r for r in self._batch if not r.status.is_terminal]
        if self._batch:
            return self._decode_step()
        return self._form_batch(now_s, state)

    def candidates(self, waiting: list[Request]) -> list[Request]:
        """The next batch's requests in order, before the memory check: arrival order here;
        subclasses (``uellm``) choose and order them their own way."""
        return waiting[: self.config.batch_size]

    def _decode_step(self) -> StepPlan:
        """Every live row decodes; the dense batch keeps all formed rows (finished ones too) at
        the padded length max prompt + tokens generated so far, as a static engine does."""
        rows = [r for r in self._batch if r.num_pending_tokens == 1]
        context = self._max_prompt + self._batch[0].num_generated_tokens
        pad = PaddedBatch(num_rows=self._num_rows, row_tokens=1, context_tokens=context)
        return StepPlan(tuple(r.request_id for r in rows), tuple(1 for _ in rows), padding=pad)

    def _form_batch(self, now_s: float, state: InstanceState) -> StepPlan:
        waiting = state.waiting
        if not waiting:
            self._oldest_waiting_s = None
            return EMPTY_PLAN
        unchecked, self._unchecked = self._unchecked, []
        rejects = [(r.request_id, why) for r in unchecked if not r.status.is_terminal
                   and (why := admission_error(r, state) or step_limit_error(r, state)) is not None]
        if rejects:
            # the wait clock restarts from the oldest request left: a stale start (a rejected
            # request's arrival) would ask for a wake-up in the past on an instance with
            # nothing to run, and the driver would wake it at the same time forever
            refused = {rid for rid, _ in rejects}
            self._oldest_waiting_s = min((r.arrival_time_s for r in waiting if r.request_id not in refused),
                                         default=None)
            return StepPlan(reject=tuple(rejects))
        full = len(waiting) >= self.config.batch_size
        if not full and self._oldest_waiting_s is not None and now_s < self._oldest_waiting_s + self.config.max_wait_s:
            return EMPTY_PLAN
        rows = self.candidates(waiting)[: state.max_num_seqs]  # batch_size may exceed the instance's row limit
        batch = fit_batch(rows, state.blocks, self.config.padded_kv, state.max_batch_tokens)
        if not batch:
            return EMPTY_PLAN
        self._batch = batch
        self._num_rows = len(batch)
        self._max_prompt = max(r.num_pending_tokens for r in batch)
        taken = {r.request_id for r in batch}
        self._oldest_waiting_s = min((r.arrival_time_s for r in waiting if r.request_id not in taken), default=None)
        pad = PaddedBatch(num_rows=len(batch), row_tokens=self._max_prompt, context_tokens=self._max_prompt)
        return StepPlan(tuple(r.request_id for r in batch), tuple(r.num_pending_tokens for r in batch), padding=pad)


def fit_batch(candidates: list[Request], blocks, padded_kv: bool, max_tokens: int) -> list[Request]:
    """The longest prefix of ``candidates`` whose padded prefill, rows x longest prompt, stays
    within ``max_tokens`` (the step limit) and whose KV fits the free blocks: the padded
    rectangle rows x (longest prompt + longest remaining output) when ``padded_kv``, else the
    sum of each row's own prompt + remaining output."""
    batch: list[Request] = []
    free, prompt, output = blocks.num_free_gpu_blocks, 0, 0
    for req in candidates:
        remaining = req.max_output_tokens - req.num_generated_tokens
        prompt = max(prompt, req.num_tokens)
        if (len(batch) + 1) * prompt > max_tokens:
            break
        if padded_kv:
            output = max(output, remaining)
            if (len(batch) + 1) * blocks.blocks_for(prompt + output) > free:
                break
        else:
            need = blocks.blocks_for(req.num_tokens + remaining)
            if need > free:
                break
            free -= need
        batch.append(req)
    return batch
