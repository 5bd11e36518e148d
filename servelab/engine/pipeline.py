"""A pipeline group on the real engine: stages run one after another on their own layers.

The group's step runs stage by stage: the first stage embeds the step's tokens and runs its
layers, each later stage takes the previous one's hidden state (handed over as a tensor, moved
to its device), the last stage's logits are sampled. Each request's KV lives split across the
stages by layer range, every stage's cache indexed by the group's block ids.

Bytes that cross: at formation ``exchange_kv`` copies each member's requests' KV, layer range
by layer range, from the member's whole-model cache into every stage's cache (the other
stages' ranges are the exchange; its own range moves into its new cache); at the split
``split_kv`` copies every stage's range into the target instance's whole-model cache.

One microbatch per step (correctness first): stages never overlap, so the bubble is
``(S - 1) / S`` of stage time; the stats say so rather than model an overlap that is not run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from servelab.cluster.pipeline import PipelineStats
from servelab.core.plan import StepPlan, StepResult
from servelab.core.request import Request
from servelab.engine.executor import Executor
from servelab.engine.runner import ModelRunner


@dataclass(frozen=True, slots=True)
class Stage:
    instance_id: int
    layers: tuple[int, int]
    runner: ModelRunner

    @property
    def runtime_blocks(self) -> int:
        return self.runner.kv_cache.num_blocks


class EnginePipelineExecutor(Executor):
    """Runs a pipeline group's steps on its stages (the engine side of ``PipelineExecutor``)."""

    def __init__(self, stages: Sequence[Stage], states: Any, members: Sequence[Any] = (), factory: Any = None
                 ) -> None:
        if len(stages) < 2:
            raise ValueError("a pipeline group needs two or more stages")
        for a, b in zip(stages, stages[1:]):
            if a.layers[1] != b.layers[0]:
                raise ValueError(f"stage layers {a.layers} and {b.layers} do not meet")
        if stages[0].layers[0] != 0 or stages[-1].layers[1] != stages[-1].runner.model.config.num_layers:
            raise ValueError("the stages' layers must cover the whole model")
        super().__init__(stages[-1].runner, states)  # the last stage samples
        self.stages = list(stages)
        self.members = list(members)
        self.factory = factory
        self.stats = PipelineStats()
        # the members' handles, as PipelineExecutor's stage cost models (a policy counts the stages;
        # Reconfigurer._refresh_group resets them): the engine times steps by running them
        self.stage_costs: list[Any] = [m.cost_model for m in self.members]
        self.exchanged_bytes = 0  # KV copied to another member's stage at formation
        self.split_bytes = 0  # KV copied back to whole instances at the split

    # ---- steps ----
    def execute(self, plan: StepPlan, batch: Sequence[Request], blocks, swap_copies=()) -> StepResult:
        t0 = time.perf_counter()
        if swap_copies:
            raise ValueError("a pipeline group has no host KV pool to swap with")
        if plan.padding is not None:
            raise ValueError("a pipeline group runs ragged steps only (the policy asked for padding)")
        chunks = [self._chunk(req, n, blocks) for req, n in zip(batch, plan.num_tokens)]
        if not chunks:
            return StepResult(duration_s=time.perf_counter() - t0)
        hidden, busy = None, []
        for stage in self.stages:
            s0 = time.perf_counter()
            request_ids, hidden = stage.runner.run_stage(chunks, hidden)
            busy.append(time.perf_counter() - s0)
        sampled = self.runner._sample(request_ids, hidden, self.states.sampling)
        stopped = self._stops(batch, sampled)
        self._account(busy)
        return StepResult(duration_s=time.perf_counter() - t0, sampled_token_ids=sampled, stopped_ids=stopped)

    def _account(self, busy: list[float]) -> None:
        st = self.stats
        makespan = sum(busy)  # stages run one after another
        st.num_steps += 1
        st.makespan_s += makespan
        st.stage_capacity_s += len(busy) * makespan
        st.bubble_s += len(busy) * makespan - sum(busy)

    # ---- KV bytes: formation, split, moves ----
    def exchange_kv(self, moves: Sequence[tuple[int, Sequence[int], Sequence[int], int]]) -> None:
        """``moves``: (member index, its block table there, the group's block table, tokens)
        per request; copies each stage's layers of that KV into the stage's cache, then the
        members' whole-model caches go (they are idle while grouped)."""
        for k, old_table, new_table, tokens in moves:
            n = self._num_blocks(tokens)
            source = self.members[k].executor.runner.kv_cache
            for j, stage in enumerate(self.stages):
                data = source.read_blocks(old_table[:n], stage.layers)
                stage.runner.kv_cache.write_blocks(new_table[:n], data)
                if j != k:
                    self.exchanged_bytes += data.numel() * data.element_size()
        for m in self.members:
            if self.factory is not None:
                self.factory.retire(m.instance_id)
            m.executor = self  # the member runs nothing of its own while grouped

    def split_kv(self, old_table: Sequence[int], target: Executor, new_table: Sequence[int], tokens: int) -> None:
        """Copy a request's KV from every stage into ``target``'s whole-model cache."""
        n = self._num_blocks(tokens)
        for stage in self.stages:
            data = stage.runner.kv_cache.read_blocks(old_table[:n])
            target.runner.kv_cache.write_blocks(new_table[:n], data, stage.layers)
            self.split_bytes += data.numel() * data.element_size()

    def export_kv(self, block_ids: list[int]) -> torch.Tensor:
        return torch.cat([s.runner.kv_cache.read_blocks(block_ids).to(self.runner.device) for s in self.stages])

    def import_kv(self, block_ids: list[int], payload: torch.Tensor) -> None:
        for s in self.stages:
            s.runner.kv_cache.write_blocks(block_ids, payload[s.layers[0]:s.layers[1]])

    @property
    def num_gpu_blocks(self) -> int:
        """The group's KV blocks: every stage's cache holds them (the reconfigurer sizes the
        group's block manager by this)."""
        return min(s.runtime_blocks for s in self.stages)

    def _num_blocks(self, tokens: int) -> int:
        return -(-tokens // self.runner.kv_cache.block_size)
