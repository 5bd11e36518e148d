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
from typing import Any

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
    """An applied plan: the step's shape and requests. ``rows`` are the plan's listed requests
    (``plan.request_ids``, in order); when the plan names the decode group, its ``group_rows``
    members run first, one token each, and are not copied here. ``batch`` (every row, group
    first) is built on demand for the readers that want the requests (a trace, a move, the
    engine), while the step is in flight."""

    shape: StepShape
    rows: list[Request]  # the plan's listed requests, in plan order
    rejected: list[Request]  # refused by the plan; already ended
    swap_copies: SwapCopies = field(default_factory=list)  # KV copies a real executor makes first, in order
    plan: StepPlan | None = None
    group_rows: int = 0  # decode group members ahead of ``rows`` (one token each)
    group: Any = None  # their ``GroupRows`` (by reference)
    _batch: list[Request] | None = None

    @property
    def num_rows(self) -> int:
        return self.group_rows + len(self.rows)

    @property
    def batch(self) -> list[Request]:
        """Every row's request, the group's members first (built once: O(rows))."""
        if not self.group_rows:
            return self.rows
        if self._batch is None:
            self._batch = self.group.requests + self.rows
        return self._batch


class InstanceRuntime(InstanceQueues):
    """One instance's queues and blocks (``InstanceQueues``) and the step application that
    mutates them: ``apply`` (plan -> memory moves and a ``StepShape``), ``complete`` (result ->
    request progress), and the simulator's decode fast-forward."""

    __slots__ = ()

    # ---- plan application ----
    def apply(self, plan: StepPlan, now_s: float) -> "AppliedStep":
        """Make the plan's memory moves and reserve KV; returns the step's shape and requests."""
        if plan.group and not plan.request_ids and plan.padding is None and not (
                plan.reject or plan.preempt_ids or plan.swap_out_ids or plan.swap_in_ids):
            return self._apply_group_step(plan)
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
        group, group_rows = self.group, 0
        if plan.group is not None:  # the group decodes as one, named by reference: its rows cost O(1)
            group_rows = self._current_group_rows(plan.group)
        if len(row_ids) + group_rows > self.max_num_seqs:
            raise PlanError(f"instance {self.instance_id}: {len(row_ids) + group_rows} rows > max_num_seqs "
                            f"{self.max_num_seqs}")
        if group is not None and group.n and row_ids and not group.members.keys().isdisjoint(row_ids):
            if group_rows:
                raise PlanError(f"instance {self.instance_id}: a decode group member is scheduled twice")
            if row_ids[:group.n] == group.ids:  # listed one by one, in group order (a policy's full path)
                group_rows = group.n
                row_ids, row_tokens = row_ids[group_rows:], row_tokens[group_rows:]
            else:
                self._dissolve_group()  # members scheduled one by one
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
            self._reserve_group_step()
            num_decodes += group_rows
            ctx_sum += group.context_sum_next()
            ctx_max = max(ctx_max, group.context_max_next())
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
        return AppliedStep(shape, batch, rejected, copies, plan, group_rows, group.rows() if group_rows else None)

    def _apply_group_step(self, plan: StepPlan) -> "AppliedStep":
        """``apply`` of the most common plan, the decode group alone (no listed rows, no memory
        moves, no padding): the same checks, reservation and shape without the general path's
        per-kind bookkeeping, which cost about a tenth of a simulated step (issue 29)."""
        rows, group = plan.group, self.group
        n = self._current_group_rows(rows)
        if n > self.max_num_seqs:
            raise PlanError(f"instance {self.instance_id}: {n} rows > max_num_seqs {self.max_num_seqs}")
        self._reserve_group_step()
        self._inflight_group = n
        if n > self.max_batch_tokens:
            raise PlanError(f"instance {self.instance_id}: a step of {n} tokens > max_batch_tokens "
                            f"{self.max_batch_tokens}")
        shape = StepShape((), (), n, group.context_sum_next(), group.context_max_next(), None, 0)
        return AppliedStep(shape, [], [], [], plan, n, rows)

    def _current_group_rows(self, rows) -> int:
        """The rows a plan names by reference (``GroupRows``), refused unless they are this
        instance's decode group at its current membership."""
        if rows.group is not self.group or not rows.is_current:
            raise PlanError(f"instance {self.instance_id}: the plan's decode group rows are not this "
                            "instance's current group")
        return rows.n

    def _reserve_group_step(self) -> None:
        """The decode group's KV slots for this step; a shortage is the plan's error."""
        try:
            self.group.reserve_step()
        except MemoryError as exc:
            raise PlanError(f"instance {self.instance_id}: {exc}") from None

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
    def complete(self, plan: StepPlan, rows: list[Request], result: StepResult, now_s: float) -> StepOutcome:
        """Advance every scheduled request (``rows``: the plan's listed requests, ``AppliedStep.rows``,
        after the decode group's members when the plan names the group); emit tokens, finish or
        hand off requests."""
        out = StepOutcome()
        self._outstanding -= plan.total_tokens
        stopped = dict(result.stopped_ids) if result.stopped_ids else None
        sampled = result.sampled_token_ids
        decoding = RequestStatus.DECODING
        group_rows, self._inflight_group = self._inflight_group, 0
        if group_rows:
            exits = self.group.advance(1, [now_s])
            if exits:
                self._group_exits(exits, out, now_s)
        tokens = plan.num_tokens
        if group_rows and plan.group is None:  # the plan listed the group's members (``apply``)
            tokens = tokens[group_rows:]
        joiners = []
        for req, n in zip(rows, tokens):
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
        if out.finished or out.handed_off:
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

    def decode_horizon(self, rows: list[Request]) -> int:
        """Steps until the first request of a full-decode step (the decode group's members in
        flight and ``rows``, the plan's listed requests) finishes or hands off."""
        if not self._inflight_group:
            return steps_until_exit(rows)
        return min(self.group.steps_until_exit(), steps_until_exit(rows))

    def fast_forward_decodes(self, rows: list[Request], num_steps: int, step_end_times_s: list[float], *,
                             final: bool = False) -> StepOutcome:
        """Apply ``num_steps`` pure-decode steps of the whole batch at once (simulator only): the
        decode group's members in flight and ``rows``, the plan's listed requests.

        The caller guarantees that the KV blocks fit and that no request finishes or hands off
        before the last of these steps; with ``final`` the last step is completed here too
        (requests that reach their length or hand-off point leave), so a run costs one pass.
        """
        group_rows = self._inflight_group
        self._outstanding -= num_steps * (len(rows) + group_rows)
        out = StepOutcome()
        allocate, reserved = self.blocks.allocate, self.blocks.num_reserved_tokens
        now_s = step_end_times_s[-1]
        if group_rows:
            exits = self.group.advance(num_steps, step_end_times_s)
            if final:
                self._inflight_group = 0
                self._group_exits(exits, out, now_s)
            elif exits:
                raise PlanError(f"instance {self.instance_id}: a decode run passed a request's last step")
        for req in rows:
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

    def reserve_decode_slots(self, rows: list[Request]) -> None:
        """KV slots for one more decode token of each request of the step in flight (the decode
        group's members and ``rows``, the plan's listed requests; simulator only)."""
        if self._inflight_group:
            self.group.reserve_step()
        self.blocks.ensure_decode_slots([r.request_id for r in rows], [r.num_computed_tokens + 1 for r in rows])


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
