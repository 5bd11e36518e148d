"""Sarathi-Serve chunked prefill: decodes first, then prefill chunks up to a token budget.

vLLM's chunked-prefill default. Every step runs all running decodes, then continues
partially prefilled requests, then admits waiting ones (FCFS), each taking at most the
budget that is left, so decode latency stays bounded by one budget-sized step.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.core.plan import EMPTY_PLAN, StepPlan
from servelab.core.policy import POLICIES, InstanceState
from servelab.core.planning import PlanBuilder, is_decode, run_held_kv, sorted_by
from servelab.baselines.vllm import ContinuousBatchingPolicy, ContinuousConfig


@dataclass(frozen=True)
class SarathiConfig(ContinuousConfig):
    token_budget: int = 512

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {self.token_budget}")


@POLICIES.register("sarathi")
class SarathiPolicy(ContinuousBatchingPolicy):
    Config = SarathiConfig
    chunks_prefills = True

    def schedule(self, now_s: float, state: InstanceState) -> StepPlan:
        budget = min(self.config.token_budget, state.max_batch_tokens)
        rejects = self._rejections(state)
        rejected = {rid for rid, _ in rejects}
        b = PlanBuilder(state, token_budget=max(budget, state.num_running))
        b.reject = rejects
        if b.add_group_decodes():  # every decode fits: the rest of the running are the non-members
            running = state.running_others
        else:
            running = sorted_by(state.running, self._key)
            b.add_decodes(running, swap=self.config.preemption == "swap")
        b.token_budget = max(budget, b.num_tokens)
        for req in running:
            if not is_decode(req) and req.request_id not in b.evicted and b.tokens_left > 0:
                b.try_add(req, min(req.num_pending_tokens, b.tokens_left))
        waiting = sorted_by(state.waiting, self._key)
        for req in waiting:
            if req.request_id in rejected:
                continue
            if b.tokens_left < 1 or not b.try_add(req, min(req.num_pending_tokens, b.tokens_left), new_request=True):
                break
        if not b.ids and not b.num_group_rows and waiting and not b.preempt:
            # requests holding the blocks wait with their KV behind a head that cannot fit
            # (hand-offs, swapped-back requests; a pipeline group's exchanged requests): run
            # them, as vllm does. Also when a running request's next chunk cannot get blocks:
            # the step would otherwise be empty and no step would ever free one
            run_held_kv(state, waiting, b, chunked=True)
        if not b.ids and not b.num_group_rows and state.swapped and not b.preempt:
            return self._swap_in_one(state, b)
        plan = b.build()
        return plan if not plan.is_empty else EMPTY_PLAN

