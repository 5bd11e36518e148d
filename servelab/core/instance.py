"""Instance runtime: the queues and KV blocks of one instance, and the only code that mutates them.

The runtime turns a policy's ``StepPlan`` into block-manager operations (``apply``) and a
step's ``StepResult`` into request progress (``complete``). Simulator and engine share it, so
the same plan moves the same blocks on either clock. A plan that cannot be applied (a
request not on this instance, memory it does not have) raises ``PlanError``: that is a
policy bug, and the conformance tests run every registered policy against this check.

The queues themselves, and the changes that need no step (arrivals, reservations, moves out,
preemption, swaps), are the base class ``InstanceQueues`` in ``core.instance_queues``; this
module is the step half: plan application, step completion and the decode fast-forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servelab.core.fast_forward import steps_until_exit
from servelab.core.instance_queues import InstanceLimits, InstanceQueues, PlanError, owed_tokens
from servelab.core.plan import StepPlan, StepResult, StepShape
from servelab.core.request import Request, RequestStatus

__all__ = ["AppliedStep", "InstanceLimits", "InstanceRuntime", "PlanError", "StepOutcome", "SwapCopies"]


@dataclass(slots=True)
class StepOutcome:
    """What changed in one step, for the cluster layer and the metrics."""

    finished: list[Request] = field(default_factory=list)
    handed_off: list[Request] = field(default_factory=list)  # leave for another instance (detached)


SwapCopies = list[tuple[str, list[tuple[int, int]]]]  # ("out" | "in", [(src block, dst block), ...])


@dataclass(slots=True)
class AppliedStep:
    shape: StepShape
    batch: list[Request]  # the plan's requests, in plan order
    rejected: list[Request]  # refused by the plan; already ended
    swap_copies: SwapCopies = field(default_factory=list)  # KV copies a real executor makes first, in order
    plan: StepPlan | None = None
    group_rows: int = 0  # the first rows are the decode group's members (one token each)


class InstanceRuntime(InstanceQueues):
    """One instance's queues and blocks (``InstanceQueues``) and the step application that
    mutates them: ``apply`` (plan -> memory moves and a ``StepShape``), ``complete`` (result ->
    request progress), and the simulator's decode fast-forward."""

    # ---- plan application ----
    def apply(self, plan: StepPlan, now_s: float) -> "AppliedStep":
        """Make the plan's memory moves and reserve KV; returns the step's shape and requests."""
        rejected = [self._reject(rid, reason, now_s) for rid, reason in plan.reject]
        for rid in plan.preempt_ids:
            self._preempt(self.get(rid))
        copies: SwapCopies = []
        for rid in plan.swap_out_ids:
            copies.append(("out", self._swap_out(self.get(rid))))
        for rid in plan.swap_in_ids:
            copies.append(("in", self._swap_in(self.get(rid))))
        swap_blocks = sum(len(pairs) for _, pairs in copies)
        row_ids, row_tokens = plan.request_ids, plan.num_tokens
        if len(row_ids) > self.max_num_seqs:
            raise PlanError(f"instance {self.instance_id}: {len(row_ids)} rows > max_num_seqs {self.max_num_seqs}")
        group, group_rows = self.group, 0
        if group is not None and group.n:
            if row_ids[:group.n] == group.ids:  # the group decodes as one: its rows cost O(1)
                group_rows = group.n
                row_ids, row_tokens = row_ids[group_rows:], row_tokens[group_rows:]
            elif not group.members.keys().isdisjoint(row_ids):  # members scheduled one by one
                self._dissolve_group()
        by_id = self._by_id
        try:
            batch = [by_id[rid] for rid in row_ids]
        except KeyError as exc:
            raise PlanError(f"instance {self.instance_id}: request {exc.args[0]} is not here") from None
        prefill_tokens: list[int] = []
        prefill_context: list[int] = []
        num_decodes = ctx_sum = ctx_max = 0
        admitted: list[Request] = []
        decode_ids: list[int] = []  # decode rows: their KV slots are reserved in one call below
        decode_context: list[int] = []
        decoding = RequestStatus.DECODING
        for req, n in zip(batch, row_tokens):
            status = req.status
            computed = req.num_computed_tokens
            if n == 1 and status is decoding and computed + 1 == req.num_prompt_tokens + req.num_generated_tokens:
                decode_ids.append(req.request_id)
                decode_context.append(computed + 1)
                continue
            self._reserve(req, n)
            if status is RequestStatus.QUEUED or status is RequestStatus.PREEMPTED or status is RequestStatus.TRANSFERRING:
                admitted.append(req)
                req.status = RequestStatus.PREFILLING if req.is_prefill else decoding
                if req.first_scheduled_time_s is None:
                    req.first_scheduled_time_s = now_s
            context = computed + n
            if n == 1 and not req.is_prefill:
                num_decodes += 1
                ctx_sum += context
                ctx_max = max(ctx_max, context)
            else:
                prefill_tokens.append(n)
                prefill_context.append(context)
        if decode_ids:
            try:
                self.blocks.ensure_decode_slots(decode_ids, decode_context)
            except MemoryError as exc:
                raise PlanError(f"instance {self.instance_id}: {exc}") from None
            num_decodes += len(decode_ids)
            ctx_sum += sum(decode_context)
            ctx_max = max(ctx_max, max(decode_context))
        if group_rows:
            try:
                group.reserve_step()
            except MemoryError as exc:
                raise PlanError(f"instance {self.instance_id}: {exc}") from None
            num_decodes += group_rows
            ctx_sum += group.context_sum_next()
            ctx_max = max(ctx_max, group.context_max_next())
            batch = group.requests + batch
        self._inflight_group = group_rows
        pad = plan.padding
        step_tokens = sum(prefill_tokens) + num_decodes if pad is None else pad.num_rows * pad.row_tokens
        if step_tokens > self.max_batch_tokens:
            raise PlanError(f"instance {self.instance_id}: a step of {step_tokens} tokens > max_batch_tokens "
                            f"{self.max_batch_tokens}")
        if admitted:
            self._admit(admitted)
        shape = StepShape(tuple(prefill_tokens), tuple(prefill_context), num_decodes, ctx_sum, ctx_max,
                          plan.padding, swap_blocks)
        return AppliedStep(shape, batch, rejected, copies, plan, group_rows)

    def _reserve(self, req: Request, n: int) -> None:
        if req.status.is_terminal or req.status is RequestStatus.SWAPPED:
            raise PlanError(f"request {req.request_id} is {req.status.value}; it cannot run")
        if n > req.num_pending_tokens:
            raise PlanError(f"request {req.request_id}: {n} tokens scheduled, {req.num_pending_tokens} pending")
        want = req.num_computed_tokens + n - self.blocks.num_reserved_tokens(req.request_id)
        if want > 0:
            try:
                self.blocks.allocate(req.request_id, want)
            except MemoryError as exc:
                raise PlanError(f"instance {self.instance_id}: {exc}") from None

    # ---- step completion ----
    def complete(self, plan: StepPlan, batch: list[Request], result: StepResult, now_s: float) -> StepOutcome:
        """Advance every scheduled request; emit tokens, finish or hand off requests."""
        out = StepOutcome()
        self._outstanding -= sum(plan.num_tokens)
        stopped = dict(result.stopped_ids) if result.stopped_ids else None
        sampled = result.sampled_token_ids
        decoding = RequestStatus.DECODING
        group_rows, self._inflight_group = self._inflight_group, 0
        rows = zip(batch, plan.num_tokens)
        if group_rows:
            self._group_exits(self.group.advance(1, [now_s]), out, now_s)
            rows = zip(batch[group_rows:], plan.num_tokens[group_rows:])
        joiners = []
        for req, n in rows:
            computed = req.num_computed_tokens + n
            req.num_computed_tokens = computed
            if computed == req.num_prompt_tokens + req.num_generated_tokens:
                generated = req.num_generated_tokens + 1
                req.num_generated_tokens = generated
                req.token_times_s.append(now_s)
                if sampled:
                    token = sampled.get(req.request_id)
                    if token is not None:
                        req.output_token_ids.append(token)
                req.status = decoding
                if generated >= req.max_output_tokens or (stopped and req.request_id in stopped):
                    _leave(out, req, now_s, stopped.get(req.request_id, "length") if stopped else "length")
                    continue
            if req.handoff_at_tokens is not None and computed >= req.handoff_at_tokens:
                _leave(out, req, now_s, None)
            elif req.status is decoding and computed + 1 == req.num_prompt_tokens + req.num_generated_tokens:
                joiners.append(req)
        self._remove_leavers(out)
        group = self.group
        if group is not None and joiners and (group.n or len(self._running) >= MIN_GROUP_ROWS):
            others = self._others
            for req in joiners:
                if req.request_id in others:  # still running here (not preempted by its own plan)
                    del others[req.request_id]
                    group.join(req)
        return out

    def _group_exits(self, exits: list[Request], out: StepOutcome, now_s: float) -> None:
        """Members that reached their length or hand-off point leave like any other row."""
        for req in exits:
            self._others[req.request_id] = req
            if req.num_generated_tokens >= req.max_output_tokens:
                _leave(out, req, now_s, "length")
            else:
                _leave(out, req, now_s, None)

    def decode_horizon(self, batch: list[Request]) -> int:
        """Steps until the first request of a full-decode ``batch`` finishes or hands off."""
        group_rows = self._inflight_group
        if not group_rows:
            return steps_until_exit(batch)
        return min(self.group.steps_until_exit(), steps_until_exit(batch[group_rows:]))

    def fast_forward_decodes(self, batch: list[Request], num_steps: int, step_end_times_s: list[float], *,
                             final: bool = False) -> StepOutcome:
        """Apply ``num_steps`` pure-decode steps of the whole ``batch`` at once (simulator only).

        The caller guarantees that the KV blocks fit and that no request finishes or hands off
        before the last of these steps; with ``final`` the last step is completed here too
        (requests that reach their length or hand-off point leave), so a run costs one pass.
        """
        self._outstanding -= num_steps * len(batch)
        out = StepOutcome()
        allocate, reserved = self.blocks.allocate, self.blocks.num_reserved_tokens
        now_s = step_end_times_s[-1]
        group_rows = self._inflight_group
        if group_rows:
            exits = self.group.advance(num_steps, step_end_times_s)
            if final:
                self._inflight_group = 0
                self._group_exits(exits, out, now_s)
            elif exits:
                raise PlanError(f"instance {self.instance_id}: a decode run passed a request's last step")
            batch = batch[group_rows:]
        for req in batch:
            extra = num_steps - reserved(req.request_id) + req.num_computed_tokens
            if extra > 0:
                allocate(req.request_id, extra)
            req.num_computed_tokens += num_steps
            req.num_generated_tokens += num_steps
            req.token_times_s.extend(step_end_times_s)
            if not final:
                continue
            if req.num_generated_tokens >= req.max_output_tokens:
                _leave(out, req, now_s, "length")
            elif req.handoff_at_tokens is not None and req.num_computed_tokens >= req.handoff_at_tokens:
                _leave(out, req, now_s, None)
        self._remove_leavers(out)
        return out

    def _remove_leavers(self, out: StepOutcome) -> None:
        for req in out.finished:
            self._remove(req)
        for req in out.handed_off:  # keeps its KV until the cluster has copied it out
            self._outstanding -= owed_tokens(req)
            del self._by_id[req.request_id]
            self._run_remove(req)
            self.detached[req.request_id] = req

    def reserve_decode_slots(self, batch: list[Request]) -> None:
        """KV slots for one more decode token of each request (a step in flight, simulator only)."""
        group_rows = self._inflight_group
        if group_rows:
            self.group.reserve_step()
            batch = batch[group_rows:]
        self.blocks.ensure_decode_slots([r.request_id for r in batch], [r.num_computed_tokens + 1 for r in batch])


def _leave(out: StepOutcome, req: Request, now_s: float, finish_reason: str | None) -> None:
    """A request ends its time here: finished with ``finish_reason``, or (None) handed off."""
    if finish_reason is not None:
        req.finish(RequestStatus.FINISHED, now_s, finish_reason)
        out.finished.append(req)
    else:
        req.status = RequestStatus.TRANSFERRING
        out.handed_off.append(req)


# A decode group is formed once this many requests run: below it, stepping each request is
# cheaper than the group's bookkeeping (measured in docs/benchmarks/cluster_layer.md).
MIN_GROUP_ROWS = 32
