"""The single-instance engine API: one policy driving the real model on the wall clock.

``EngineInstance`` is an ``EngineCluster`` of one instance: the same ``InstanceDriver``
(hook order) and ``ClusterDriver`` (arrivals, wake-ups, the end of the run) as the
simulator, with the PyTorch executor and the wall clock injected. A request is added once
its arrival time (relative to the run's start) has passed, and a step takes as long as the
forward pass really takes.

Invariants: every request ends completed, rejected or aborted with a reason; a request
whose prompt plus ``max_tokens`` exceeds the model's positions is rejected on arrival; after
``run`` every KV block is free (``EngineResult.num_used_blocks_after == 0``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servelab.core.policy import POLICIES, SchedulingPolicy
from servelab.engine.cluster import EngineCluster, EngineConfig, EngineResult

__all__ = ["EngineConfig", "EngineInstance", "EngineResult"]


class EngineInstance(EngineCluster):
    """A loaded model, its KV cache, and a policy spec; ``run`` serves one workload."""

    def __init__(self, model: str | Path | Any, policy_spec: str = "vllm", config: EngineConfig = EngineConfig(), *,
                 dtype: str | None = None, device: str = "auto") -> None:
        super().__init__(model, policy_spec, config, num_instances=1, dtype=dtype, device=device)
        self.policy_name, self.policy_params = self.groups[0].policy, dict(self.groups[0].policy_params)

    def new_policy(self) -> SchedulingPolicy:
        return POLICIES.create(self.policy_name, dict(self.policy_params))
