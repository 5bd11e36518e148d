"""KunServe's local scheduler: Sarathi-style chunked prefill (the paper runs on vLLM 0.6.3
with chunked prefill), whose step budget grows with the pipeline when its instance is a
pipeline group: after a drop, a step holds ``stages x token_budget`` tokens of queued work,
which the group's microbatch former (lookahead or token chunking) cuts into microbatches.

A single instance schedules exactly as ``sarathi`` does, so before a drop KunServe and the
``vllm`` baseline run the same steps.
"""

from __future__ import annotations

from dataclasses import replace

from servelab.baselines.sarathi import SarathiConfig, SarathiPolicy
from servelab.core.plan import StepPlan
from servelab.core.policy import POLICIES, InstanceState


@POLICIES.register("kunserve")
class KunServePolicy(SarathiPolicy):
    Config = SarathiConfig

    def __init__(self, config: SarathiConfig | None = None) -> None:
        super().__init__(config)
        self._single = self.config
        self._scaled: dict[int, SarathiConfig] = {}

    def schedule(self, now_s: float, state: InstanceState) -> StepPlan:
        stages = len(getattr(getattr(state, "cost_model", None), "stage_costs", ()) or ())
        if stages > 1:
            cfg = self._scaled.get(stages)
            if cfg is None:
                cfg = self._scaled[stages] = replace(self._single, token_budget=self._single.token_budget * stages)
            self.config = cfg
        try:
            return super().schedule(now_s, state)
        finally:
            self.config = self._single
