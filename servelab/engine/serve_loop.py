"""The engine loop: one scheduling policy driving the real model on the wall clock.

``EngineInstance`` owns a loaded checkpoint and a paged KV cache sized from a byte budget.
``run`` serves a list of ``RequestSpec`` (with ``prompt_token_ids``) through the same
objects the simulator uses: a policy from ``POLICIES``, an ``InstanceRuntime`` that applies
its plans, and ``MetricsCollector`` / ``summarize`` for the report. Only the clock and the
executor differ: a request is added once its arrival time (relative to the run's start) has
passed, and a step takes as long as the forward pass really takes.

Loop: admit arrivals -> ``policy.schedule`` -> ``runtime.apply`` -> ``Executor.execute`` ->
``runtime.complete``. When the policy has nothing to run, the loop sleeps until the next
arrival or the policy's wake-up time; when neither exists while requests still wait, they
are aborted with a reason (a policy that never admits them), as the simulator does.

Invariants: every request ends completed, rejected or aborted with a reason; a request
whose prompt plus ``max_tokens`` exceeds the model's positions is rejected on arrival; after
``run`` every KV block is free (``EngineResult.num_used_blocks_after == 0``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.core.instance import InstanceLimits, InstanceRuntime
from servelab.core.kv_blocks import KVCacheConfig
from servelab.core.policy import POLICIES, SchedulingPolicy
from servelab.core.registry import parse_name_params
from servelab.core.request import Request, RequestSpec, RequestStatus
from servelab.engine.executor import Executor
from servelab.engine.sampling import SamplingParams
from servelab.metrics import MetricsCollector, RequestTable, RunSummary, summarize
from servelab.metrics.collector import record_step

_IDLE_POLL_S = 0.05  # longest sleep while waiting for an arrival or a policy wake-up


@dataclass(frozen=True, slots=True)
class EngineConfig:
    kv_budget_bytes: int = 256 << 20
    block_size: int = 16
    max_batch_tokens: int = 2048
    max_num_seqs: int = 64
    num_host_blocks: int = 0  # host KV pool for swap preemption; 0 disables swapping
    watermark: float = 0.01
    seed: int = 0  # sampler seed for requests without their own

    def __post_init__(self) -> None:
        if self.kv_budget_bytes < 1:
            raise ValueError(f"kv_budget_bytes must be >= 1, got {self.kv_budget_bytes}")
        if self.block_size < 1 or self.max_batch_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("block_size, max_batch_tokens and max_num_seqs must be >= 1")
        if self.num_host_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {self.num_host_blocks}")


@dataclass
class EngineResult:
    requests: list[Request]
    texts: dict[int, str]  # output text per request id (cut at a stop string)
    collector: MetricsCollector
    summary: RunSummary
    wall_s: float
    num_used_blocks_after: int
    num_gpu_blocks: int

    @property
    def num_output_tokens(self) -> int:
        return sum(r.num_generated_tokens for r in self.requests)

    def outputs(self) -> dict[int, list[int]]:
        return {r.request_id: list(r.output_token_ids) for r in self.requests}


class EngineInstance:
    """A loaded model, its KV cache, and a policy spec; ``run`` serves one workload."""

    def __init__(self, model: str | Path | Any, policy_spec: str = "vllm", config: EngineConfig = EngineConfig(), *,
                 dtype: str | None = None, device: str = "cpu") -> None:
        from servelab.engine.kv_cache import PagedKVCache, num_blocks_for_budget
        from servelab.engine.loader import load_checkpoint

        self.loaded = load_checkpoint(model, dtype=dtype, device=device) if isinstance(model, (str, Path)) else model
        name, params = parse_name_params(policy_spec)
        POLICIES.create(name, dict(params))  # fail early on a bad spec
        self.policy_name, self.policy_params = name, params
        self.config = config
        c = self.loaded.config
        kv_dtype = self.loaded.model.embed_tokens.weight.dtype
        num_blocks = num_blocks_for_budget(config.kv_budget_bytes, c.num_layers, config.block_size,
                                           c.num_kv_heads, c.head_dim, kv_dtype)
        if num_blocks < 1:
            raise ValueError(f"a KV budget of {config.kv_budget_bytes} bytes holds no block of {config.block_size} "
                             f"tokens for this model")
        self.kv_config = KVCacheConfig(config.block_size, num_blocks, config.num_host_blocks, config.watermark)
        self.cache = PagedKVCache(c.num_layers, num_blocks, config.block_size, c.num_kv_heads, c.head_dim,
                                  dtype=kv_dtype, device=self.loaded.model.embed_tokens.weight.device,
                                  num_host_blocks=config.num_host_blocks)
        self.flops_per_token = 2.0 * sum(p.numel() for n, p in self.loaded.model.named_parameters()
                                         if n.startswith("layers.") and p.dim() == 2)

    @property
    def num_gpu_blocks(self) -> int:
        return self.kv_config.num_gpu_blocks

    def new_policy(self) -> SchedulingPolicy:
        return POLICIES.create(self.policy_name, dict(self.policy_params))

    def run(self, specs: Sequence[RequestSpec], params: SamplingParams | Mapping[int, SamplingParams]
            ) -> EngineResult:
        """Serve every spec; ``params`` is one SamplingParams for all or one per request id."""
        from servelab.engine.runner import ModelRunner
        from servelab.engine.sampling import Sampler

        runner = ModelRunner(self.loaded.model, self.cache, Sampler(self.config.seed, device=self.cache.device))
        executor = Executor(runner, tokenizer=self.loaded.tokenizer, eos_token_ids=self.loaded.generation.eos_token_ids)
        loop = _Loop(self, executor, self.new_policy(), specs, params)
        return loop.run()


class _Loop:
    """State of one run: runtime, policy, pending arrivals, the wall clock."""

    def __init__(self, engine: EngineInstance, executor: Executor, policy: SchedulingPolicy,
                 specs: Sequence[RequestSpec], params: SamplingParams | Mapping[int, SamplingParams]) -> None:
        self.engine = engine
        self.executor = executor
        self.policy = policy
        cfg = engine.config
        self.runtime = InstanceRuntime(0, engine.kv_config, InstanceLimits(cfg.max_batch_tokens, cfg.max_num_seqs))
        self.pending = sorted(specs, key=lambda s: (s.arrival_time_s, s.request_id))
        if len({s.request_id for s in specs}) != len(specs):
            raise ValueError("request ids must be unique within a run")
        self.params = params
        self.collector = MetricsCollector()
        self.requests: list[Request] = []
        self.t0 = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def run(self) -> EngineResult:
        self.t0 = time.perf_counter()
        i = 0
        rt = self.runtime
        while i < len(self.pending) or not rt.is_idle:
            now = self.now()
            while i < len(self.pending) and self.pending[i].arrival_time_s <= now:
                self._arrive(self.pending[i], now)
                i += 1
            next_arrival = self.pending[i].arrival_time_s if i < len(self.pending) else None
            if rt.is_idle:
                if next_arrival is not None:
                    time.sleep(max(0.0, min(next_arrival - now, _IDLE_POLL_S)))
                continue
            if not self._step(now):
                wake = self.policy.next_wakeup_s(now)
                targets = [t for t in (wake, next_arrival) if t is not None]
                if not targets:
                    self._abort_leftovers(now)
                    continue
                time.sleep(max(0.0, min(min(targets) - self.now(), _IDLE_POLL_S)))
        wall = self.now()
        table = RequestTable.from_requests(self.requests)
        return EngineResult(self.requests, dict(self.executor.outputs_text), self.collector,
                            summarize(table, self.collector), wall, rt.blocks.num_used_gpu_blocks,
                            rt.blocks.num_gpu_blocks)

    def _params_for(self, spec: RequestSpec) -> SamplingParams:
        if isinstance(self.params, SamplingParams):
            return self.params
        try:
            return self.params[spec.request_id]
        except KeyError:
            raise ValueError(f"no SamplingParams for request {spec.request_id}") from None

    def _arrive(self, spec: RequestSpec, now: float) -> None:
        params = self._params_for(spec)
        req = Request(spec, max_output_tokens=params.max_tokens)
        self.requests.append(req)
        max_position = self.engine.loaded.config.max_position
        if spec.prompt_token_ids is None:
            self._end(req, RequestStatus.REJECTED, now, "no prompt_token_ids (the engine needs token ids)")
        elif spec.num_prompt_tokens + params.max_tokens > max_position:
            self._end(req, RequestStatus.REJECTED, now, f"prompt {spec.num_prompt_tokens} + max_tokens "
                      f"{params.max_tokens} exceeds the model's {max_position} positions")
        else:
            self.executor.add_request(req, params)
            self.runtime.add(req)
            self.policy.on_arrival(now, req)

    def _end(self, req: Request, status: RequestStatus, now: float, reason: str) -> None:
        req.finish(status, now, reason)
        self.collector.on_request_end(req)

    def _step(self, now: float) -> bool:
        """Plan, apply, execute and complete one step; False when the policy had nothing to do."""
        rt, policy = self.runtime, self.policy
        plan = policy.schedule(now, rt)
        if plan.is_empty:
            return False
        num_waiting = len(rt.waiting)
        applied = rt.apply(plan, now)
        for req in applied.rejected:
            self._leave(req, now)
        for _ in plan.preempt_ids:
            self.collector.on_preemption(rt.instance_id, now, "recompute")
        for _ in plan.swap_out_ids:
            self.collector.on_preemption(rt.instance_id, now, "swap")
        if not applied.batch:
            self.executor.copy_swaps(applied.swap_copies)
            return True
        result = self.executor.execute(plan, applied.batch, rt.blocks, applied.swap_copies)
        end = self.now()
        record_step(self.collector, rt, now, end - now, applied.shape, num_waiting, self.engine.flops_per_token)
        outcome = rt.complete(plan, applied.batch, result, end)
        policy.on_step_done(end, plan, result)
        for req in outcome.finished:
            self._leave(req, end)
        if outcome.handed_off:
            raise RuntimeError("the single-instance engine cannot hand requests off")
        return True

    def _leave(self, req: Request, now: float) -> None:
        self.policy.on_finish(now, req)
        self.collector.on_request_end(req)
        self.executor.release(req.request_id)

    def _abort_leftovers(self, now: float) -> None:
        rt = self.runtime
        for req in list(rt.waiting) + list(rt.running) + list(rt.swapped):
            rt.abort(req.request_id, "the policy left the request queued with nothing to wait for", now)
            self._leave(req, now)
