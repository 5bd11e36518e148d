"""The per-instance driver: the one place that owns the hook order of a step.

    add (arrive) -> start: schedule -> apply -> end rejected -> launch on the executor
                 -> finish: complete -> on_step_done -> end finished -> hand off

Simulator and engine use this same class; only what is injected differs: the executor (a
cost model, the PyTorch model, an actor in another process) and the times passed in (the
cluster driver's clock). The driver never reads a clock itself: every method takes ``now_s``
and returns when the step it launched ends, so the cluster driver can schedule the event.

Fast-forward (an optimisation, results unchanged): when the executor can time a run of
identical decode steps (``decode_run_ends``) and the policy is ``stable_under_decode``, a
stretch of full-decode steps is launched as one ``DecodeRun``. The run is applied lazily:
``settle`` brings it up to ``now`` when somebody reads the instance, ``interrupt`` cuts it at
the step in flight when something reaches the instance (an arrival, a move).

Invariants: a request that leaves an instance leaves through ``_end`` (for good) or as a
hand-off returned by ``finish`` (its KV still held by the runtime, detached, until the
cluster has copied it); every step that runs is recorded once in the metrics collector.
"""

from __future__ import annotations

import math
from typing import Any

from servelab.core.fast_forward import MIN_JUMP_STEPS, DecodeRun, is_full_decode, steps_within_memory
from servelab.core.instance import AppliedStep, InstanceRuntime, StepOutcome
from servelab.core.plan import StepPlan, StepResult, StepShape
from servelab.core.policy import SchedulingPolicy
from servelab.core.request import Request
from servelab.metrics.collector import MetricsCollector, record_step

ASYNC = math.inf  # ``start`` returns this when the step runs elsewhere: poll ``pending``


class InstanceDriver:
    __slots__ = ("runtime", "policy", "executor", "collector", "flops_per_token", "busy", "plan", "applied",
                 "result", "pending", "step_start_s", "num_waiting", "run", "version", "wakeup_s", "busy_s",
                 "listener", "_can_jump", "_abort_after_step", "spec", "cost_model", "kv_bytes_per_token", "paused")

    def __init__(self, runtime: InstanceRuntime, policy: SchedulingPolicy, executor: Any,
                 collector: MetricsCollector, *, flops_per_token: float = 0.0, fast_forward: bool = True,
                 spec: Any = None, cost_model: Any = None, kv_bytes_per_token: float = 0.0) -> None:
        self.runtime = runtime
        self.policy = policy
        self.executor = executor
        self.collector = collector
        self.flops_per_token = flops_per_token
        self.spec = spec  # InstanceSpec (hardware, model, layers) when known; routers read it
        self.cost_model = cost_model  # what routers and policies may ask for a step's time
        self.kv_bytes_per_token = kv_bytes_per_token  # what a move of one token's KV costs on a link
        runtime.cost_model = cost_model if runtime.cost_model is None else runtime.cost_model
        runtime.spec = spec if runtime.spec is None else runtime.spec
        self.busy = False
        self.plan: StepPlan | None = None
        self.applied: AppliedStep | None = None
        self.result: StepResult | None = None
        self.pending: Any = None  # a PendingStep while a step runs elsewhere
        self.step_start_s = 0.0
        self.num_waiting = 0  # requests left waiting while the step in flight runs (counted after it was applied)
        self.run: DecodeRun | None = None  # a fast-forwarded stretch of decode steps in flight
        self.version = 0  # step-done events carry it; a truncated run leaves a stale event behind
        self.wakeup_s: float | None = None
        self.busy_s = 0.0
        self.listener: Any = None  # optional: on_step(driver, applied, outcome, now_s) (the server streams)
        self._can_jump = (fast_forward and policy.stable_under_decode and hasattr(executor, "decode_run_ends"))
        if getattr(executor, "reads_requests", True) is False and getattr(policy, "uses_decode_group", False):
            runtime.enable_decode_group()
        self._abort_after_step: list[tuple[int, str]] = []
        self.paused = False  # set while a reconfiguration waits for this instance to drain its step

    @property
    def instance_id(self) -> int:
        return self.runtime.instance_id

    # ---- requests in ----
    def add(self, req: Request, now_s: float) -> float | None:
        """Queue ``req`` here. Returns the new end of the step in flight when a decode run had
        to be cut short for it (the caller schedules that event), else None."""
        cut = self.interrupt(now_s) if self.run is not None else None
        self.runtime.add(req)
        self.executor.admit(req)
        self.policy.on_arrival(now_s, req)
        return cut

    # ---- steps ----
    def start(self, now_s: float) -> float | None:
        """Launch the next step if the instance is free and the policy has work.

        Returns when it ends (``ASYNC`` when it runs elsewhere and ``pending`` must be polled),
        or None when nothing runs (the caller may arm ``next_wakeup_s``).
        """
        if self.busy or self.paused or self.runtime.is_idle:
            return None
        rt, policy = self.runtime, self.policy
        while True:
            plan = policy.schedule(now_s, rt)
            if plan.is_empty:
                return None
            applied = rt.apply(plan, now_s)
            # after apply, like num_running: a request the step admits is running, not also waiting
            # (sampled before, a step admitting 63 requests counted them twice; issue 31)
            num_waiting = len(rt.waiting)
            for req in applied.rejected:
                self._end(req, now_s)
            if plan.preempt_ids or plan.swap_out_ids:
                collector = self.collector
                for _ in plan.preempt_ids:
                    collector.on_preemption(rt.instance_id, now_s, "recompute")
                for _ in plan.swap_out_ids:
                    collector.on_preemption(rt.instance_id, now_s, "swap")
            if applied.num_rows or applied.swap_copies:
                break
            if rt.is_idle:  # only rejections, and nothing is left
                return None
        self.plan, self.applied, self.num_waiting = plan, applied, num_waiting
        self.busy = True
        self.step_start_s = now_s
        if self._can_jump and is_full_decode(plan, applied.shape, rt):
            end = self._try_jump(now_s)
            if end is not None:
                return end
        launched = self.executor.launch(applied, rt.blocks)
        self.version += 1
        if isinstance(launched, StepResult):
            self.result = launched
            self._record(now_s, launched.duration_s, applied.shape, 1, num_waiting)
            return now_s + launched.duration_s
        self.pending = launched
        return ASYNC

    def finish(self, now_s: float) -> StepOutcome:
        """The step in flight ended at ``now_s``: complete it, end finished requests; the
        outcome's ``handed_off`` are detached (their KV is still held here until released)."""
        rt = self.runtime
        plan, applied = self.plan, self.applied
        if self.listener is not None:
            applied.batch  # noqa: B018 -- built now: the decode group's members change as the step completes
        if self.run is not None:
            outcome, result = self._finish_run(now_s)
        else:
            result = self.result
            if result is None:  # ran elsewhere
                result = self.pending.result()
                self.pending = None
                self._record(self.step_start_s, result.duration_s, applied.shape, 1, self.num_waiting)
            outcome = rt.complete(plan, applied.rows, result, now_s)
        self.busy, self.plan, self.applied, self.result = False, None, None, None
        self.policy.on_step_done(now_s, plan, result, applied.shape)
        for req in outcome.finished:
            self._end(req, now_s)
        for req in outcome.handed_off:
            self.policy.on_finish(now_s, req)
        if self.listener is not None:
            self.listener.on_step(self, applied, outcome, now_s)
        if self._abort_after_step:
            pending, self._abort_after_step = self._abort_after_step, []
            for rid, reason in pending:
                self.abort(rid, reason, now_s)
        return outcome

    def next_wakeup_s(self, now_s: float) -> float | None:
        return self.policy.next_wakeup_s(now_s)

    # ---- requests out ----
    def abort(self, request_id: int, reason: str, now_s: float) -> Request | None:
        """End a request here (client gone, fault, shutdown). A request inside the step in
        flight is aborted when that step ends; returns the request when ended now."""
        if self.busy and any(r.request_id == request_id for r in self.applied.batch):
            self._abort_after_step.append((request_id, reason))
            return None
        if not self.runtime.has(request_id):
            return None
        req = self.runtime.abort(request_id, reason, now_s)
        self._end(req, now_s)
        return req

    def abort_all(self, reason: str, now_s: float) -> list[Request]:
        """End every request still here (a run that cannot move them again, a failed instance)."""
        rt = self.runtime
        ended = []
        for req in list(rt.waiting) + list(rt.running) + list(rt.swapped):
            rt.abort(req.request_id, reason, now_s)
            self._end(req, now_s)
            ended.append(req)
        return ended

    def release_detached(self, request_id: int) -> None:
        """A handed-off request's KV has been copied away: free it here."""
        self.runtime.release_detached(request_id)
        self.executor.release(request_id, False)

    def _end(self, req: Request, now_s: float) -> None:
        self.policy.on_finish(now_s, req)
        self.collector.on_request_end(req)
        self.executor.release(req.request_id, True)

    # ---- fast-forward (executors that can time a decode run) ----
    def _try_jump(self, now_s: float) -> float | None:
        """Start a run of identical decode steps, applied lazily (see ``settle``). The run ends
        when a request finishes or hands off, or KV blocks would run short; an event that
        reaches this instance earlier truncates it at the step then in flight."""
        rt, applied = self.runtime, self.applied
        horizon = rt.decode_horizon(applied.rows)
        if horizon < MIN_JUMP_STEPS:  # the common case at ~100 rows: a request leaves within 2 steps
            return None
        horizon = min(horizon, steps_within_memory(rt, applied.num_rows) + 1)
        if horizon < MIN_JUMP_STEPS:
            return None
        ends = self.executor.decode_run_ends(applied.shape, horizon, now_s)
        self.run = DecodeRun(applied.shape, ends, now_s, self.num_waiting, len(ends) - 1)
        self.version += 1
        self._load_changed()
        return float(ends[-1])

    def settle(self, now_s: float) -> None:
        """Apply the run's steps that ended by now, in one jump (the last is ``finish``'s)."""
        run = self.run
        done = min(run.num_ended_by(now_s), run.final_step)
        if done > run.num_applied:
            ends = run.ends[run.num_applied:done]
            start = run.step_start(run.num_applied)
            self.runtime.fast_forward_decodes(self.applied.rows, len(ends), ends.tolist())
            self._record(start, float(ends[-1]) - start, run.shape, len(ends), run.num_waiting)
            run.num_applied = done
        # the step in flight holds its KV slots, as it would step by step
        self.runtime.reserve_decode_slots(self.applied.rows)

    def interrupt(self, now_s: float) -> float | None:
        """Something reached this instance: its run ends with the step now in flight.
        Returns the run's new end time when it changed (the caller schedules that event)."""
        self.settle(now_s)
        run = self.run
        if run.num_applied < run.final_step:
            run.final_step = run.num_applied
            self.version += 1
            self._load_changed()
            return float(run.ends[run.final_step])
        return None

    def outstanding_tokens_at(self, now_s: float) -> int:
        """``runtime.num_outstanding_tokens`` as it would be with the run settled to ``now_s``,
        without settling it (routers ask on every arrival)."""
        run = self.run
        if run is None:
            return self.runtime.num_outstanding_tokens
        done = min(run.num_ended_by(now_s), run.final_step)
        return self.runtime.num_outstanding_tokens - (done - run.num_applied) * self.applied.num_rows

    def _load_changed(self) -> None:
        """A run began, was cut or ended: how the load falls with time changed (``outstanding_tokens_at``)."""
        watch = self.runtime.load_watch
        if watch is not None:
            watch(self.runtime.instance_id)

    def _finish_run(self, now_s: float) -> tuple[StepOutcome, StepResult]:
        """The run's last step ends now: apply what is left of it, last step included, in one pass."""
        run = self.run
        self.run = None
        self._load_changed()
        first, last = run.num_applied, run.final_step
        ends = run.ends[first:last + 1]
        start = run.step_start(first)
        outcome = self.runtime.fast_forward_decodes(self.applied.rows, len(ends), ends.tolist(), final=True)
        self._record(start, now_s - start, run.shape, len(ends), run.num_waiting)
        return outcome, StepResult(duration_s=now_s - run.step_start(last))

    def _record(self, start_s: float, duration_s: float, shape: StepShape, num_steps: int, num_waiting: int) -> None:
        self.busy_s += duration_s
        record_step(self.collector, self.runtime, start_s, duration_s, shape, num_waiting, self.flops_per_token,
                    num_steps)
