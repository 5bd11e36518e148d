"""vLLM-style continuous batching: prefill-first, FCFS, recompute preemption (plus orderings).

Each step either prefills whole prompts of newly admitted requests (no decodes in that
step, as vLLM v0's default scheduler) or decodes every running request. ``sjf``, ``ljf``
and ``priority`` reuse the same loop with the waiting and running queues ordered by the
predicted remaining length or the priority (ties by arrival). Requests that arrive with
their KV already computed elsewhere (P/D hand-offs) join the decode batch directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.core.plan import EMPTY_PLAN, PaddedBatch, StepPlan
from servelab.core.policy import POLICIES, InstanceState, SchedulingPolicy
from servelab.core.request import Request
from servelab.core.planning import ORDERS, PlanBuilder, admission_error, run_held_kv, sorted_by, step_limit_error


@dataclass(frozen=True)
class PreemptionConfig:
    """What a policy with a built-in queue order (sjf, ljf, priority) takes."""

    preemption: str = "recompute"  # recompute | swap (needs a host KV pool)

    def __post_init__(self) -> None:
        if self.preemption not in ("recompute", "swap"):
            raise ValueError(f"preemption must be recompute or swap, got {self.preemption!r}")


@dataclass(frozen=True)
class ContinuousConfig(PreemptionConfig):
    order: str = "fcfs"  # fcfs | sjf | ljf | priority
    # prefill steps run as one dense batch padded to the longest prompt, whose rows x longest
    # must fit the step limit (vLLM <= 0.3 counted len(seq_lens) * max(seq_lens)); KV stays paged
    padded: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {sorted(ORDERS)}, got {self.order!r}")


class ContinuousBatchingPolicy(SchedulingPolicy):
    """Shared by vllm, sjf, ljf and priority. ``fixed_order`` names the order of a policy
    that is defined by it (its Config then has no ``order``, so ``sjf:order=ljf`` is an
    unknown parameter rather than a setting that is silently overridden); otherwise
    ``Config.order`` picks it."""

    Config: type[PreemptionConfig] = ContinuousConfig
    fixed_order: str | None = None
    stable_under_decode = True
    uses_decode_group = True  # reads running requests one by one only when decodes do not all fit
    chunks_prefills = False  # a prefill runs whole: a prompt over the step limit can never run

    def __init__(self, config: PreemptionConfig | None = None) -> None:
        self.config = config if config is not None else self.Config()
        self._key = ORDERS[self.fixed_order or self.config.order]
        self._unchecked: list[Request] = []

    def on_arrival(self, now_s: float, request: Request) -> None:
        self._unchecked.append(request)

    def check_instance(self, state: InstanceState) -> str | None:
        if self.config.preemption == "swap" and state.blocks.config.num_cpu_blocks == 0:
            return ("preemption=swap needs a host KV pool on the instance (give it swap space: --swap-space GiB, "
                    "InstanceGroup.host_kv_gb); without one it would silently recompute")
        return None

    def _rejections(self, state: InstanceState) -> list[tuple[int, str]]:
        out = []
        for req in self._unchecked:
            if req.status.is_terminal:
                continue
            reason = admission_error(req, state)
            if reason is None and not self.chunks_prefills:
                reason = step_limit_error(req, state)
            if reason is not None:
                out.append((req.request_id, reason))
        self._unchecked.clear()
        return out

    def schedule(self, now_s: float, state: InstanceState) -> StepPlan:
        rejects = self._rejections(state) if self._unchecked else []
        waiting = sorted_by(state.waiting, self._key)
        if rejects:
            rejected = {rid for rid, _ in rejects}
            waiting = [r for r in waiting if r.request_id not in rejected]
        b = PlanBuilder(state, token_budget=state.max_batch_tokens)
        b.reject = rejects
        admitted_prefill = False
        swapped = sorted_by(state.swapped, self._key) if state.swapped else ()
        # vLLM v0 (and DistServe's decoding scheduler): while a swapped request waits to come
        # back nothing new is admitted, unless nothing runs and it cannot come back yet
        if swapped and (state.num_running or state.blocks.can_swap_in(swapped[0].request_id)):
            waiting = ()
        padded, longest = getattr(self.config, "padded", False), 0
        for req in waiting:
            if padded and req.num_pending_tokens > 1 and \
                    (len(b.ids) + 1) * max(longest, req.num_pending_tokens) > state.max_batch_tokens:
                break
            if not b.try_add(req, req.num_pending_tokens, new_request=True):
                over = step_limit_error(req, state)  # preempted by recompute, its tokens no longer fit a step
                if over is None:
                    break
                b.reject.append((req.request_id, over))
                continue
            admitted_prefill |= req.num_pending_tokens > 1 or req.is_prefill
            longest = max(longest, req.num_pending_tokens)
        if not b.ids and waiting and not state.num_running:  # a count: no member synced
            run_held_kv(state, waiting, b)
        if admitted_prefill:
            return b.build(padding=PaddedBatch(len(b.ids), longest, longest) if padded and len(b.ids) > 1 else None)
        if not b.add_group_decodes():  # the common case costs O(1); shortages take the full path
            b.add_decodes(sorted_by(state.running, self._key), swap=self.config.preemption == "swap")
        plan = b.build(swap_in_ids=self._swap_ins(state, swapped, b))
        return plan if not plan.is_empty else EMPTY_PLAN

    def _swap_in_one(self, state: InstanceState, b: PlanBuilder) -> StepPlan:
        """One swapped request back when nothing else runs (sarathi's and dynaserve's plans)."""
        req = min(state.swapped, key=self._key)
        if state.blocks.can_swap_in(req.request_id):
            return StepPlan(swap_in_ids=(req.request_id,), reject=tuple(b.reject))
        return b.build()

    @staticmethod
    def _swap_ins(state: InstanceState, swapped, b: PlanBuilder) -> tuple[int, ...]:
        """Swapped requests that come back this step, in queue order, as vLLM v0's
        ``_schedule_swapped`` takes them: every one whose blocks fit beside the step's decodes
        with the watermark left free (none in a step that evicts). They decode from the next
        step. Before, one came back only when nothing else ran, so a decode instance drained
        its swapped requests one at a time (found by the BucketServe reproduction: DistServe
        with swap decoded one row for the last 170 s of a 330 s offline run)."""
        if not swapped or b.preempt or b.swap_out:
            return ()
        busy = bool(b.ids or b.num_group_rows or state.num_running)
        reserve = b.blocks.watermark_blocks if busy else 0
        out: list[int] = []
        for req in swapped:
            need = b.blocks.num_swapped_blocks(req.request_id)
            if need + reserve > b.free_blocks:
                break
            b.free_blocks -= need
            out.append(req.request_id)
        return tuple(out)


@POLICIES.register("vllm")
class VLLMPolicy(ContinuousBatchingPolicy):
    pass


@POLICIES.register("sjf")
class SJFPolicy(ContinuousBatchingPolicy):
    """Shortest predicted remaining output first (``RequestSpec.predicted_output_tokens``)."""

    Config = PreemptionConfig
    fixed_order = "sjf"


@POLICIES.register("ljf")
class LJFPolicy(ContinuousBatchingPolicy):
    Config = PreemptionConfig
    fixed_order = "ljf"


@POLICIES.register("priority")
class PriorityPolicy(ContinuousBatchingPolicy):
    Config = PreemptionConfig
    fixed_order = "priority"
