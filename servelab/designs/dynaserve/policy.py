"""DynaServe's local scheduler (Algorithm 2): SLO-aware batch composition on one instance.

Every step first takes every decode (running ones, and requests whose KV just arrived
from their alpha instance mid-decode), which are latency-critical. From the number of
decodes and their mean context it looks up, in the instance's profile table, the largest
prefill token budget that keeps the step under the TBT target, then adds prefill chunks
first come first served (partially prefilled requests first) up to that budget, each at
most ``max_chunk`` tokens. Measured step times refine the table online.

``planner="exact"`` (a gap test, simulator only) replaces the table's estimate by the
instance's own cost model: each chunk is the largest whose step, timed exactly as the
simulator will time it, stays within the target. With it, steps planned to the SLO land
within it by construction, so what remains of the misses is the rule's, not the estimate's.

With ``slo_aware=False`` the budget is a fixed ``fixed_budget`` whatever the decodes (a
static chunk size, vLLM's default of 2048): the ablation of the paper's Figure 11.

A step that holds no decode always admits at least ``min_prefill`` tokens, so a long
context whose decodes alone reach the target can still not block prefill forever when the
decodes end; while decodes run, a zero budget means a decode-only step (the SLO first).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelab.baselines.vllm import ContinuousBatchingPolicy, PreemptionConfig
from servelab.core.plan import EMPTY_PLAN, StepPlan, StepResult, StepShape
from servelab.core.planning import PlanBuilder, is_decode, run_held_kv
from servelab.core.policy import POLICIES, InstanceState
from servelab.core.request import Request
from servelab.designs.dynaserve.profile import ProfileTable


@dataclass(frozen=True)
class DynaServePolicyConfig(PreemptionConfig):
    tbt_slo_s: float = 0.1
    headroom: float = 0.1  # steps are planned to (1 - headroom) x the TBT SLO
    slo_aware: bool = True
    fixed_budget: int = 2048  # prefill tokens per step when slo_aware is off
    max_chunk: int | None = None  # Algorithm 2's c: prefill tokens one request may take per step
    context_charge: bool = True  # charge a late chunk for the context it attends to (not in the paper)
    min_prefill: int = 16
    fallback_budget: int = 256  # before the table has values (engine: until steps are measured)
    online_update: bool = True
    planner: str = "table"  # "table" (Algorithm 2's profile table) or "exact" (the cost model; gap test)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.planner not in ("table", "exact"):
            raise ValueError(f"planner must be 'table' or 'exact', got {self.planner!r}")
        if not self.tbt_slo_s > 0:
            raise ValueError(f"tbt_slo_s must be > 0, got {self.tbt_slo_s}")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"headroom must be in [0, 1), got {self.headroom}")
        for name in ("fixed_budget", "min_prefill", "fallback_budget"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_chunk is not None and self.max_chunk < 1:
            raise ValueError(f"max_chunk must be >= 1 or none, got {self.max_chunk}")

    @property
    def target_s(self) -> float:
        return self.tbt_slo_s * (1.0 - self.headroom)


@POLICIES.register("dynaserve")
class DynaServePolicy(ContinuousBatchingPolicy):
    Config = DynaServePolicyConfig
    fixed_order = "fcfs"  # Algorithm 2 takes prefill in arrival order
    chunks_prefills = True

    def __init__(self, config: DynaServePolicyConfig | None = None) -> None:
        super().__init__(config)
        self.profile_table: ProfileTable | None = None
        self.handoff_times_s: dict[int, float] = {}  # request id -> when it left here for its beta
        self._budget_sum = 0  # prefill budgets of steps that had prefill to run (for reports)
        self._budget_steps = 0
        # (planned s, simulated s) of each step that held decodes and prefill: the gap test of
        # "steps planned to the SLO land just over it" (planned = the table's estimate of the step)
        self._mixed_planned: list[float] = []
        self._mixed_actual: list[float] = []
        # planner="exact": the estimate of each planned step, by its composition (the next step may be
        # planned before the last one is reported)
        self._exact_planned: dict[tuple, float] = {}

    def table_for(self, state: InstanceState) -> ProfileTable:
        """Built at first use: profiled from the instance's cost model, or empty (engine)."""
        if self.profile_table is None:
            cost = getattr(state, "cost_model", None)
            if cost is not None:
                self.profile_table = ProfileTable.from_cost_model(cost, state.max_batch_tokens, state.max_num_seqs)
            else:
                self.profile_table = ProfileTable.unprofiled(state.max_batch_tokens, state.max_num_seqs)
        return self.profile_table

    def on_finish(self, now_s: float, request: Request) -> None:
        if not request.status.is_terminal:  # handed off to its beta instance
            self.handoff_times_s[request.request_id] = now_s

    def on_step_done(self, now_s: float, plan: StepPlan, result: StepResult, shape: StepShape) -> None:
        table = self.profile_table
        if self.config.slo_aware and table is not None and table.ready and shape.num_decodes and shape.prefill_tokens:
            # the table has not changed since this step was planned (it changes only below)
            n = shape.num_decodes
            planned = self._exact_planned.pop(_signature(shape), None) if self._exact_planned else None
            if planned is None:
                planned = table.latency_s(float(sum(shape.prefill_tokens)), shape.decode_context_sum / n, float(n))
            self._mixed_planned.append(planned)
            self._mixed_actual.append(result.duration_s)
        if self.config.online_update and self.profile_table is not None:
            self.profile_table.observe(shape, result.duration_s)

    def prefill_budget(self, state: InstanceState, num_decodes: int, context_sum: int) -> int:
        cfg = self.config
        if not cfg.slo_aware:
            return cfg.fixed_budget
        if self._exact(state) is not None:  # each chunk is sized by its exact step time instead
            return state.max_batch_tokens
        table = self.table_for(state)
        if not table.ready:
            budget = cfg.fallback_budget
        else:
            mean = context_sum / num_decodes if num_decodes else 0.0
            budget = table.prefill_budget(mean, num_decodes, cfg.target_s)
        return budget if num_decodes else max(budget, cfg.min_prefill)

    def schedule(self, now_s: float, state: InstanceState) -> StepPlan:
        rejects = self._rejections(state)
        rejected = {rid for rid, _ in rejects}
        b = PlanBuilder(state, token_budget=state.max_batch_tokens)
        b.reject = rejects
        group = getattr(state, "group", None)
        add_group = getattr(b, "add_group_decodes", None)  # the core's decode group, where it has one
        if add_group is not None and add_group():  # the simulator's steady decoders: one O(1) row block
            running = state.running_others
            context = group.context_sum_next() - group.n
        else:
            running = list(state.running)
            b.add_decodes(running, swap=self.config.preemption == "swap")
            context = 0
        scheduled = set(b.ids)
        context += sum(r.num_computed_tokens for r in running if r.request_id in scheduled)
        waiting = [r for r in state.waiting if r.request_id not in rejected]
        for req in waiting:  # arrived from alpha mid-decode: a decode like the others (its KV is here
            if is_decode(req):  # already, so no watermark: holding it back could only deadlock)
                if not b.try_add(req, 1):
                    break
                context += req.num_computed_tokens
        group_ids = getattr(b, "group_ids", ())
        num_decodes = len(b.ids) + len(group_ids)
        prefill = [r for r in running if not is_decode(r) and r.request_id not in b.evicted]
        prefill += [r for r in waiting if not is_decode(r)]
        if prefill:
            budget = min(self.prefill_budget(state, num_decodes, context),
                         state.max_batch_tokens - b.num_tokens)
            self._budget_sum += budget
            self._budget_steps += 1
            b.token_budget = b.num_tokens + max(budget, 0)
            cost = self._exact(state)
            if cost is not None:
                decodes = (num_decodes, context + num_decodes, _context_max(running, waiting, scheduled, b, group))
                self._add_exact(b, prefill, {r.request_id for r in running}, cost, decodes)
            else:
                self._add_prefill(b, prefill, {r.request_id for r in running}, self.table_for(state))
        if not b.ids and not group_ids and waiting and not b.preempt:
            run_held_kv(state, waiting, b, chunked=True)  # KV holders behind a head that cannot fit
        if not b.ids and not group_ids and state.swapped and not b.preempt:
            return self._swap_in_one(state, b)
        plan = b.build()
        return plan if not plan.is_empty else EMPTY_PLAN

    def _exact(self, state: InstanceState):
        """The instance's cost model when planning exactly (``planner="exact"``), else None."""
        if self.config.planner != "exact" or not self.config.slo_aware:
            return None
        cost = getattr(state, "cost_model", None)
        if cost is None:
            raise ValueError("planner='exact' needs the instance's cost model (simulator only)")
        return cost

    def _add_exact(self, b: PlanBuilder, prefill: list[Request], running_ids: set[int], cost,
                   decodes: tuple[int, int, int]) -> None:
        """FCFS chunks, each the largest whose step (the decodes, the chunks so far and it, each
        chunk attending to its context) the cost model times within the target."""
        target, cap = self.config.target_s, self.config.max_chunk
        chunks: list[int] = []
        ctxs: list[int] = []

        def t(n: int, ctx: int) -> float:
            return cost.step_time_s(StepShape(tuple(chunks) + (n,), tuple(ctxs) + (ctx + n,), *decodes))

        for req in prefill:
            ctx = req.num_computed_tokens
            pending = req.num_pending_tokens
            if req.handoff_at_tokens is not None:  # the builder cuts a chunk at the hand-off point
                pending = min(pending, req.handoff_at_tokens - ctx)
            hi = min(pending, b.tokens_left, cap if cap is not None else b.tokens_left)
            if hi < 1:
                break
            n = hi
            if t(hi, ctx) > target:
                lo = 0 if decodes[0] or chunks else min(self.config.min_prefill, hi)
                while lo < hi:  # the largest n in [lo, hi) within the target
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if t(mid, ctx) <= target else (lo, mid - 1)
                n = lo
            if n < 1:
                break
            if b.try_add(req, n, new_request=req.request_id not in running_ids):
                chunks.append(n)
                ctxs.append(ctx + n)
            elif req.request_id not in running_ids:
                break  # FCFS
            if n < pending:
                break  # the step is full
        if chunks and decodes[0]:
            shape = StepShape(tuple(chunks), tuple(ctxs), *decodes)
            if len(self._exact_planned) > 64:  # plans never run (rejected, replanned) do not pile up
                self._exact_planned.clear()
            self._exact_planned[_signature(shape)] = cost.step_time_s(shape)

    def _add_prefill(self, b: PlanBuilder, prefill: list[Request], running_ids: set[int], table: ProfileTable) -> None:
        """FCFS chunks up to the budget. A chunk late in a long prompt also attends to the
        context before it, which the table (chunks from scratch) does not time: it is charged
        as ``1 + w * context`` tokens, ``w`` the table's attention cost per context token
        (``context_charge``; servelab's addition: Algorithm 2 counts chunk tokens only)."""
        cap = self.config.max_chunk
        w = table.context_weight if (self.config.slo_aware and self.config.context_charge and table.ready) else 0.0
        for req in prefill:
            left = b.tokens_left
            if left < 1:
                break
            ctx = req.num_computed_tokens
            n = min(req.num_pending_tokens, int(left / (1.0 + w * (ctx + left / 2))) if w else left)
            if cap is not None:
                n = min(n, cap)
            if n < 1:
                break
            added = b.try_add(req, n, new_request=req.request_id not in running_ids)
            if added and w:
                b.token_budget -= int(w * n * (ctx + n / 2))
            elif not added and req.request_id not in running_ids:
                break  # FCFS: a waiting request that does not fit blocks the ones behind it

    def report(self) -> dict:
        table = self.profile_table
        return {"handoff_times_s": dict(self.handoff_times_s), "num_budget_steps": self._budget_steps,
                "budget_mean": self._budget_sum / self._budget_steps if self._budget_steps else None,
                "profile_observations": table.num_observed if table is not None else 0,
                "mixed_steps": step_error_summary(self._mixed_planned, self._mixed_actual, self.config.tbt_slo_s,
                                                  self.config.target_s)}


def _signature(shape: StepShape) -> tuple:
    return shape.prefill_tokens, shape.prefill_context, shape.num_decodes, shape.decode_context_sum


def _context_max(running: list[Request], waiting: list[Request], scheduled: set[int], b: PlanBuilder,
                 group) -> int:
    """The largest decode context of the step being planned (as the instance will time it)."""
    m = max((r.num_computed_tokens + 1 for r in running if r.request_id in scheduled), default=0)
    m = max(m, max((r.num_computed_tokens + 1 for r in waiting if r.request_id in b.ids and is_decode(r)), default=0))
    if getattr(b, "group_ids", ()):
        m = max(m, group.context_max_next())
    return m


def step_error_summary(planned: list[float], actual: list[float], slo_s: float, target_s: float) -> dict:
    """Planned (profile table) against simulated time of the mixed steps: the signed error
    (simulated - planned) percentiles in ms, and the shares of steps over the TBT SLO and of
    steps planned within the target that still land over the SLO."""
    if not planned:
        return {"count": 0}
    p, a = np.asarray(planned), np.asarray(actual)
    err = (a - p) * 1e3
    within = p <= target_s * (1 + 1e-9)
    q = np.percentile(err, [1, 50, 90, 99])
    return {"count": len(p), "error_ms_mean": float(err.mean()), "error_ms_p1": float(q[0]),
            "error_ms_p50": float(q[1]), "error_ms_p90": float(q[2]), "error_ms_p99": float(q[3]),
            "planned_ms_p50": float(np.median(p) * 1e3), "actual_ms_p50": float(np.median(a) * 1e3),
            "actual_ms_p99": float(np.percentile(a, 99) * 1e3),
            "over_slo_share": float(np.mean(a > slo_s)),
            "planned_within_target_over_slo_share": float(np.mean(within & (a > slo_s)))}
