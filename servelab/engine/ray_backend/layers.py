"""KunServe's drop -> pipeline group -> restore -> split with every instance a Ray actor.

``RayEngineFactory`` is ``layer_range.EngineFactory`` (the rebuild seam the cluster's
reconfiguration calls) with the weights and caches in the actors: a group's formation turns
each member's actor into a stage (its dropped layers freed there, ``stage_worker``), the
restore copies each missing layer's tensors from the named peer's actor to this one (through
the object store: the driver passes the read's ref to the write), and the split gives each
actor a whole runner again. ``RayPipelineExecutor`` runs a group's step as chained actor
calls: stage 0 in the first member's actor, its hidden state handed on as an ``ObjectRef`` to
stage 1 in the next, the last samples; one ``ray.get`` per step. The step's rows are cut into
the group's ``num_microbatches`` (token-count balanced, whole rows) and every microbatch's
chain is submitted before the wait: an actor runs its calls in submission order, so stage 1
works on microbatch m while stage 0 works on m+1 (the overlap the in-process
``EnginePipelineExecutor`` cannot have, its stages sharing one thread). Consecutive steps do
not overlap: the next is decided when this one's tokens are back.

KV at formation (``exchange_kv``: each request's KV, layer range by layer range, from the
member's whole cache to every stage's cache) and at the split (``split_kv``: every stage's
range into the target's new whole cache) goes actor to actor through the object store, the
driver passing refs only. ``handoff_s`` per step: the step's round trip less the stages'
compute (the two actor calls and the activation hand-off between them), measured on steps of
one microbatch only (with several, stages overlap and the difference is no longer overhead).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray

from servelab.cluster.pipeline import PipelineStats, deal_by_size
from servelab.core.plan import StepPlan, StepResult
from servelab.core.policy import POOL
from servelab.core.request import Request
from servelab.engine.executor import Executor
from servelab.engine.layer_range import EngineFactory


@dataclass(frozen=True, slots=True)
class RayStage:
    instance_id: int
    layers: tuple[int, int]
    worker: Any  # the member's actor


class RayPipelineExecutor(Executor):
    """A pipeline group's steps over its members' actors (the Ray side of ``EnginePipelineExecutor``)."""

    def __init__(self, stages: Sequence[RayStage], states: Any, members: Sequence[Any], factory: Any,
                 num_blocks: int, block_size: int, block_bytes_per_layer: int, num_microbatches: int = 1) -> None:
        if len(stages) < 2:
            raise ValueError("a pipeline group needs two or more stages")
        for a, b in zip(stages, stages[1:]):
            if a.layers[1] != b.layers[0]:
                raise ValueError(f"stage layers {a.layers} and {b.layers} do not meet")
        super().__init__(None, states)  # the model runs in the actors
        self.stages = list(stages)
        self.members = list(members)
        self.factory = factory
        self.stats = PipelineStats()
        self.stage_costs: list[Any] = [m.cost_model for m in self.members]
        self._num_blocks = num_blocks
        self.block_size = block_size
        self.block_bytes_per_layer = block_bytes_per_layer
        self.num_microbatches = max(1, num_microbatches)
        self.exchanged_bytes = 0
        self.split_bytes = 0
        self.handoff_s: list[float] = []  # per step: round trip - stages' compute
        self.hidden_bytes: list[int] = []  # per step: the activations handed between stages

    # ---- steps ----
    def execute(self, plan: StepPlan, batch: Sequence[Request], blocks, swap_copies=()) -> StepResult:
        if swap_copies:
            raise ValueError("a pipeline group has no host KV pool to swap with")
        if plan.padding is not None:
            raise ValueError("a pipeline group runs ragged steps only (the policy asked for padding)")
        chunks = [self._chunk(req, n, blocks) for req, n in zip(batch, plan.num_tokens)]
        if not chunks:
            return StepResult(duration_s=0.0)
        sampling = {c.request_id: self.states.sampling[c.request_id] for c in chunks if c.sample}
        microbatches = _deal(chunks, self.num_microbatches)
        t0 = time.perf_counter()
        lasts, secs = [], []
        for mb in microbatches:  # every chain submitted before the wait: the stages overlap
            hidden = None
            for stage in self.stages[:-1]:
                hidden, s = stage.worker.run_stage.remote(mb, hidden)  # the ref goes on, not the tensor
                secs.append(s)
            mb_sampling = {c.request_id: sampling[c.request_id] for c in mb if c.request_id in sampling}
            lasts.append(self.stages[-1].worker.run_last_stage.remote(mb, hidden, mb_sampling))
        sampled: dict[int, int] = {}
        last_busy = 0.0
        for got, took in ray.get(lasts):
            sampled.update(got)
            last_busy += took
        firsts = ray.get(secs)  # [mb0 stage0, mb0 stage1, ..., mb1 stage0, ...]
        n = len(self.stages) - 1
        busy = [sum(firsts[k::n]) for k in range(n)] + [last_busy]
        wall = time.perf_counter() - t0
        if len(microbatches) == 1:
            self.handoff_s.append(wall - sum(busy))
        row_bytes = self.factory.model_spec.hidden_size * self.factory.dtype_bytes  # one token's hidden state
        self.hidden_bytes.append(sum(len(c.token_ids) for c in chunks) * row_bytes * (len(self.stages) - 1))
        self._account(busy, wall)
        return StepResult(duration_s=wall, sampled_token_ids=sampled, stopped_ids=self._stops(batch, sampled))

    def _account(self, busy: list[float], wall_s: float) -> None:
        """The step's makespan is its measured round trip (stages overlap across microbatches);
        the bubble is the stage time inside it not spent computing (Ray's overhead included)."""
        st = self.stats
        makespan = max(wall_s, max(busy))
        st.num_steps += 1
        st.makespan_s += makespan
        st.stage_capacity_s += len(busy) * makespan
        st.bubble_s += len(busy) * makespan - sum(busy)

    def release(self, request_id: int, ended: bool = True) -> str:
        self.stages[-1].worker.release.remote(request_id)  # the last stage samples: its generators
        return self.states.end(request_id) if ended else ""

    # ---- KV between actors ----
    def exchange_kv(self, moves: Sequence[tuple[int, Sequence[int], Sequence[int], int]]) -> None:
        """Each request's KV, stage range by stage range, from its member's whole cache into the
        stages' caches (actor to actor); then the members' whole runners go."""
        writes = []
        for k, old_table, new_table, tokens in moves:
            n = self._blocks(tokens)
            source = self.stages[k].worker
            for j, stage in enumerate(self.stages):
                ref = source.read_kv.remote(list(old_table[:n]), stage.layers, True)
                writes.append(stage.worker.write_kv.remote(list(new_table[:n]), ref, None, False))
                if j != k:
                    self.exchanged_bytes += n * (stage.layers[1] - stage.layers[0]) * self.block_bytes_per_layer
        ray.get(writes)
        for m in self.members:
            self.factory.retire(m.instance_id)
            m.executor = self  # the member runs nothing of its own while grouped

    def split_kv(self, old_table: Sequence[int], target: Any, new_table: Sequence[int], tokens: int) -> None:
        """A request's KV from every stage's cache into ``target``'s (a ``RayExecutor``) new whole cache."""
        n = self._blocks(tokens)
        writes = []
        for stage in self.stages:
            ref = stage.worker.read_kv.remote(list(old_table[:n]), None, False)
            writes.append(target.worker.write_kv.remote(list(new_table[:n]), ref, stage.layers, True))
            self.split_bytes += n * (stage.layers[1] - stage.layers[0]) * self.block_bytes_per_layer
        ray.get(writes)

    def export_kv(self, block_ids: list[int]):
        raise ValueError("moving a request out of a pipeline group is not supported on the Ray backend yet")

    def import_kv(self, block_ids: list[int], payload: Any) -> None:
        raise ValueError("moving a request into a pipeline group is not supported on the Ray backend yet")

    @property
    def num_gpu_blocks(self) -> int:
        return self._num_blocks

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


def _deal(chunks: list, num_microbatches: int) -> list[list]:
    """Whole rows, token-balanced (the simulator's token-count chunking), each microbatch in the step's row order."""
    groups = deal_by_size([len(c.token_ids) for c in chunks], num_microbatches)
    return [[chunks[i] for i in g] for g in groups]


class RayEngineFactory(EngineFactory):
    """``EngineFactory`` whose instances are actors: weights and caches change there."""

    def __init__(self, engine: Any, states: Any, sampler: Any, executors: Sequence[Any]) -> None:
        super().__init__(engine, states, sampler)
        self.ray_executors = {e.instance_id: e for e in executors}
        self.staged: set[int] = set()  # instances whose actor is a pipeline stage now
        ray.get([e.worker.reset_layers.remote() for e in executors])

    def executor(self, cost):
        """The instance's ``RayExecutor``; after a split its actor gets a whole runner again."""
        iid = cost.instance_id
        ex = self.ray_executors[iid]
        if iid in self.staged:
            ray.get(ex.worker.become_whole.remote(self.engine.kv_config.num_gpu_blocks,
                                                  self.engine.config.num_host_blocks))
            self.staged.discard(iid)
        return ex

    def group_executor(self, members: list, links: list, action: Any, group_id: int):
        from servelab.engine.kv_cache import num_blocks_for_budget

        e, c = self.engine, self.engine.loaded.config
        num_blocks = min(num_blocks_for_budget(e.config.kv_budget_bytes, m.spec.num_layers_held, e.config.block_size,
                                               c.num_kv_heads, c.head_dim, e.kv_dtype) for m in members)
        stages = [RayStage(m.instance_id, m.spec.layer_range, self.ray_executors[m.instance_id].worker)
                  for m in members]
        dropped = ray.get([s.worker.become_stage.remote(s.layers, num_blocks) for s in stages])
        self.dropped_bytes += sum(dropped)
        self.staged.update(s.instance_id for s in stages)
        per_layer = 2 * e.config.block_size * c.num_kv_heads * c.head_dim * e.kv_dtype.itemsize
        executor = RayPipelineExecutor(stages, self.states, members, self, num_blocks, e.config.block_size, per_layer,
                                       num_microbatches=getattr(action, "num_microbatches", 1))
        self.group_executors.append(executor)
        return executor

    def layers_changed(self, instance_id: int, spec: Any, source: Any) -> None:
        """A restore landed: each missing layer's tensors go from a holder's actor (the named
        peer, else any actor holding it, else this host's checkpoint) to this actor."""
        if instance_id not in self.staged:
            return  # a whole instance holds every layer
        worker = self.ray_executors[instance_id].worker
        held = set(ray.get(worker.held.remote()))
        lo, hi = spec.layer_range
        for i in range(lo, hi):
            if i in held:
                continue
            donor = None if source == POOL or source is None else self._holder(i, source)
            state = None if donor is None else donor.layer_state.remote(i)  # None: this host's checkpoint
            self.restored_bytes += ray.get(worker.set_layer.remote(i, state))

    def _holder(self, index: int, preferred: int) -> Any:
        order = [preferred] + sorted(self.ray_executors)
        for iid in order:
            w = self.ray_executors[iid].worker
            if index in ray.get(w.held.remote()):
                return w
        return None

    def retire(self, instance_id: int) -> None:
        self.ray_executors[instance_id].worker.retire_whole.remote()

    def held_layers(self, instance_id: int) -> list[int]:
        return ray.get(self.ray_executors[instance_id].worker.held.remote())
