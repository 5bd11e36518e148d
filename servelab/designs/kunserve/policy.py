"""KunServe's local scheduler: Sarathi-style chunked prefill (the paper runs on vLLM 0.6.3
with chunked prefill), whose step budget grows with the pipeline when its instance is a
pipeline group: after a drop, a step holds ``stages x token_budget`` tokens of queued work,
which the group's microbatch former (lookahead or token chunking) cuts into microbatches.
With the lookahead former over the whole queue (``lookahead_scope="queue"``, the default;
``lookahead_budget``) the step instead takes its share of the queue's Eq. 1 cost, so
consecutive steps cost the same; the former is read from the group's executor (the
``cost_model`` the state carries), the only place the router's Eq. 1 fit lives.

A single instance schedules exactly as ``sarathi`` does, so before a drop KunServe and the
``vllm`` baseline run the same steps.

Requests that rejoin a group with their KV (a member's running requests after the exchange,
a merged group's) wait in the queue holding their blocks; they are resumed before requests
that still need memory, as vLLM keeps running requests ahead of its waiting queue. In plain
FCFS order they stalled behind a head that could not be admitted (72B LongBench: 169
exchanged requests idle for 24 s behind a head short of blocks, the group running 67 decodes
per step), and the idle group read as throttled.
"""

from __future__ import annotations

from dataclasses import replace

from servelab.baselines.sarathi import SarathiConfig, SarathiPolicy
from servelab.core.plan import StepPlan
from servelab.core.planning import is_decode, sorted_by
from servelab.core.policy import POLICIES, InstanceState
from servelab.designs.kunserve.lookahead_budget import queue_step_tokens


@POLICIES.register("kunserve")
class KunServePolicy(SarathiPolicy):
    Config = SarathiConfig

    def __init__(self, config: SarathiConfig | None = None) -> None:
        super().__init__(config)
        self._single = self.config
        self._scaled: dict[int, SarathiConfig] = {}

    def schedule(self, now_s: float, state: InstanceState) -> StepPlan:
        key = self._key
        holds = state.blocks.is_on_gpu
        if any(holds(r.request_id) for r in state.waiting):
            self._key = lambda r: (not holds(r.request_id), key(r))  # KV holders first, then the order
        executor = getattr(state, "cost_model", None)
        stages = len(getattr(executor, "stage_costs", ()) or ())
        if stages > 1:
            budget = self._single.token_budget * stages
            former = getattr(executor, "former", None)
            if getattr(former, "scope", "step") == "queue" and getattr(former, "eq", None) is not None:
                budget = self._queue_budget(state, former.eq, budget)
            cfg = self._scaled.get(budget)
            if cfg is None:
                cfg = replace(self._single, token_budget=budget)
                if budget == self._single.token_budget * stages:  # the fixed budgets only: few of them
                    self._scaled[budget] = cfg
            self.config = cfg
        try:
            return super().schedule(now_s, state)
        finally:
            self.config = self._single
            self._key = key

    def _queue_budget(self, state: InstanceState, eq, budget: int) -> int:
        """The step's token budget when microbatches are planned over the whole queue: its
        decodes plus its share of the queued prompt work (``queue_step_tokens``)."""
        queue = list(sorted_by(state.running, self._key)) + list(sorted_by(state.waiting, self._key))
        decodes = sum(1 for r in queue if is_decode(r))  # with exchanged requests resuming their decode
        prompts = [(r.num_pending_tokens, r.num_computed_tokens) for r in queue if not is_decode(r)]
        take = queue_step_tokens(prompts, decodes, budget - decodes, eq)
        return max(1, min(decodes + take, state.max_batch_tokens))
