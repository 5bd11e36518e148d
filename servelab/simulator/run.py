"""The simulation loop: arrivals -> router -> instances -> policy plans -> cost model -> events.

Every request that arrives ends completed, rejected or aborted with a reason; ``SimResult``
checks that conservation and says so. The loop never looks at a wall clock, so a run is a
pure function of (workload, cluster config, cost models, seed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from servelab.cluster.config import ClusterConfig
from servelab.core.instance import InstanceLimits, InstanceRuntime, StepOutcome
from servelab.core.plan import StepPlan, StepResult, StepShape
from servelab.core.policy import POLICIES, ROUTERS, Placement, SchedulingPolicy
from servelab.core.request import Request, RequestSpec, RequestStatus
from servelab.metrics.collector import MetricsCollector, record_step
from servelab.simulator.events import EventKind, EventQueue
from servelab.simulator.fast_forward import (MIN_JUMP_STEPS, DecodeRun, is_full_decode, plan_jump,
                                             steps_until_exit, steps_within_memory)
from servelab.simulator.hardware import SimInstanceModel, build_instance_model


@dataclass
class SimResult:
    requests: list[Request]
    num_instances: int
    makespan_s: float
    wall_s: float
    busy_s: list[float]
    collector: Any
    transfers: list[tuple[int, int, float, float, float]] = field(default_factory=list)
    unfinished: list[int] = field(default_factory=list)
    policy_reports: dict[int, dict] = field(default_factory=dict)  # per instance, from policies with report()

    @property
    def num_output_tokens(self) -> int:
        return sum(r.num_generated_tokens for r in self.requests)

    @property
    def conserved(self) -> bool:
        return not self.unfinished


class _Instance:
    """Simulator-side wrapper: runtime + policy + cost model + the step in flight."""

    __slots__ = ("runtime", "policy", "model", "busy", "plan", "batch", "wakeup_s", "step_start_s", "run", "version")

    def __init__(self, runtime: InstanceRuntime, policy: SchedulingPolicy, model: SimInstanceModel) -> None:
        self.runtime = runtime
        self.policy = policy
        self.model = model
        self.busy = False
        self.plan: StepPlan | None = None
        self.batch: list[Request] = []
        self.wakeup_s: float | None = None
        self.step_start_s = 0.0
        self.run: DecodeRun | None = None  # a fast-forwarded stretch of decode steps in flight
        self.version = 0  # STEP_DONE events carry it; a truncated run leaves a stale event behind


class _ClusterView:
    def __init__(self, instances: list[_Instance]) -> None:
        self.instances = [inst.runtime for inst in instances]

    def instances_with_role(self, role: str):
        return [inst for inst in self.instances if inst.role == role]


class Simulation:
    def __init__(self, workload: Sequence[RequestSpec], cluster: ClusterConfig, *, cost_model=None,
                 collector=None, fast_forward: bool = True, progress: Callable[[float], None] | None = None) -> None:
        self.specs = sorted(workload, key=lambda s: (s.arrival_time_s, s.request_id))
        self.cluster = cluster
        self.collector = collector if collector is not None else MetricsCollector()
        self.fast_forward = fast_forward
        self.progress = progress
        self.instances: list[_Instance] = []
        for iid, group in enumerate(cluster.instance_groups()):
            model = build_instance_model(group, cost_model)
            runtime = InstanceRuntime(iid, model.kv_config, InstanceLimits(group.max_batch_tokens, group.max_num_seqs),
                                      group.role)
            policy = POLICIES.create(group.policy, dict(group.policy_params))
            self.instances.append(_Instance(runtime, policy, model))
        self.view = _ClusterView(self.instances)
        self.router = ROUTERS.create(cluster.router, dict(cluster.router_params))
        self.events = EventQueue()
        self.requests: list[Request] = []
        self.now_s = 0.0
        self._router_timer_s: float | None = None
        self.busy_s = [0.0] * len(self.instances)
        self.transfers: list[tuple[int, int, float, float, float]] = []  # (src, dst, start, duration, bytes)

    # ---- main loop ----
    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        specs, num_specs, i = self.specs, len(self.specs), 0
        events = self.events
        last_progress = 0
        while i < num_specs or len(events):
            next_arrival = specs[i].arrival_time_s if i < num_specs else float("inf")
            if (next_arrival, EventKind.ARRIVAL) <= events.peek_key():
                self.now_s = next_arrival
                self._on_arrival(specs[i])
                i += 1
                if self.progress is not None and i - last_progress >= 1000:
                    last_progress = i
                    self.progress(i / num_specs)
                continue
            self.now_s, kind, payload = events.pop()
            if kind is EventKind.STEP_DONE:
                instance_id, version = payload
                if version == self.instances[instance_id].version:
                    self._on_step_done(instance_id)
            elif kind is EventKind.TRANSFER_DONE:
                self._on_transfer_done(*payload)
            elif kind is EventKind.WAKEUP:
                inst = self.instances[payload]
                inst.wakeup_s = None
                self._kick(inst)
            elif kind is EventKind.ROUTER_TIMER:
                self._router_timer_s = None
                self._settle_all()
                self._place(self.router.on_timer(self.now_s, self.view))
        self._abort_leftovers()
        return self._result(time.perf_counter() - wall0)

    # ---- arrivals and placement ----
    def _on_arrival(self, spec: RequestSpec) -> None:
        req = Request(spec)
        self.requests.append(req)
        self._settle_all()
        self._place(self.router.on_arrival(self.now_s, req, self.view))

    def _place(self, placements: list[Placement]) -> None:
        """Queue every placement first, then let each touched instance plan once: a batch a
        router places together is seen together."""
        touched: list[_Instance] = []
        for p in placements:
            if p.instance_id is None:
                p.request.finish(RequestStatus.REJECTED, self.now_s, p.reject_reason or "rejected by router")
                self.collector.on_request_end(p.request)
                continue
            inst = self.instances[p.instance_id]
            if p.request.handoff_at_tokens is None:
                p.request.handoff_at_tokens = self.router.handoff_point(p.request, inst.runtime)
            self._add(inst, p.request)
            if inst not in touched:
                touched.append(inst)
        for inst in touched:
            self._kick(inst)
        self._arm_router_timer()

    def _add(self, inst: _Instance, req: Request) -> None:
        if inst.run is not None:  # the instance would see it at its next step boundary
            self._truncate_run(inst)
        inst.runtime.add(req)
        inst.policy.on_arrival(self.now_s, req)

    def _arm_router_timer(self) -> None:
        t = self.router.next_wakeup_s(self.now_s)
        if t is not None and (self._router_timer_s is None or t < self._router_timer_s):
            self._router_timer_s = max(t, self.now_s)
            self.events.push(self._router_timer_s, EventKind.ROUTER_TIMER)

    # ---- steps ----
    def _kick(self, inst: _Instance) -> None:
        if inst.busy or inst.runtime.is_idle:
            return
        rt = inst.runtime
        plan = inst.policy.schedule(self.now_s, rt)
        if plan.is_empty:
            self._arm_wakeup(inst)
            return
        num_waiting = len(rt.waiting)  # the queue the step was planned against
        applied = rt.apply(plan, self.now_s)
        shape, batch = applied.shape, applied.batch
        for req in applied.rejected:
            inst.policy.on_finish(self.now_s, req)
            self.collector.on_request_end(req)
        for _ in plan.preempt_ids:
            self.collector.on_preemption(rt.instance_id, self.now_s, "recompute")
        for _ in plan.swap_out_ids:
            self.collector.on_preemption(rt.instance_id, self.now_s, "swap")
        if not batch:  # only memory moves or rejections: ask again
            self._kick(inst)
            return
        if (self.fast_forward and inst.policy.stable_under_decode and is_full_decode(plan, shape, rt)):
            jumped = self._try_jump(inst, plan, shape, batch, num_waiting)
            if jumped:
                return
        duration = inst.model.cost.step_time_s(shape)
        self._start_step(inst, plan, batch, shape, duration, num_waiting)

    def _start_step(self, inst: _Instance, plan: StepPlan, batch: list[Request], shape: StepShape,
                    duration_s: float, num_waiting: int) -> None:
        inst.busy, inst.plan, inst.batch = True, plan, batch
        inst.step_start_s = self.now_s
        self._record_step(inst, self.now_s, duration_s, shape, 1, num_waiting)
        inst.version += 1
        self.events.push(self.now_s + duration_s, EventKind.STEP_DONE, (inst.runtime.instance_id, inst.version))

    def _try_jump(self, inst: _Instance, plan: StepPlan, shape: StepShape, batch: list[Request],
                  num_waiting: int) -> bool:
        """Start a run of identical decode steps, applied lazily (see ``_settle_run``).

        The run ends when a request finishes or hands off, or KV blocks would run short; an
        event that touches this instance earlier truncates it at the step then in flight.
        """
        rt = inst.runtime
        horizon = min(steps_until_exit(batch), steps_within_memory(rt, len(batch)) + 1)
        if horizon < MIN_JUMP_STEPS:
            return False
        ends = plan_jump(inst.model.cost, shape, horizon, self.now_s)
        inst.busy, inst.plan, inst.batch = True, plan, batch
        inst.run = DecodeRun(shape, ends, self.now_s, num_waiting, len(ends) - 1)
        inst.version += 1
        self.events.push(float(ends[-1]), EventKind.STEP_DONE, (rt.instance_id, inst.version))
        return True

    def _settle_run(self, inst: _Instance) -> None:
        """Apply the run's steps that ended by now, in one jump (the last step is _finish_run's)."""
        run = inst.run
        done = min(run.num_ended_by(self.now_s), run.final_step)
        if done > run.num_applied:
            ends = run.ends[run.num_applied:done]
            start = run.step_start(run.num_applied)
            inst.runtime.fast_forward_decodes(inst.batch, len(ends), ends.tolist())
            self._record_step(inst, start, float(ends[-1]) - start, run.shape, len(ends), run.num_waiting)
            run.num_applied = done
        # the step in flight holds its KV slots, as it would step by step
        inst.runtime.reserve_decode_slots(inst.batch)

    def _truncate_run(self, inst: _Instance) -> None:
        """Something reached this instance: its run ends with the step now in flight."""
        self._settle_run(inst)
        run = inst.run
        if run.num_applied < run.final_step:
            run.final_step = run.num_applied
            inst.version += 1
            self.events.push(float(run.ends[run.final_step]), EventKind.STEP_DONE,
                             (inst.runtime.instance_id, inst.version))

    def _settle_all(self) -> None:
        """Routers read every instance's state: bring runs up to now first."""
        for inst in self.instances:
            if inst.run is not None:
                self._settle_run(inst)

    def _finish_run(self, inst: _Instance) -> tuple[StepOutcome, StepResult]:
        """The run's last step ends now: apply what is left of it, last step included, in one pass."""
        run = inst.run
        inst.run = None
        first, last = run.num_applied, run.final_step
        ends = run.ends[first:last + 1]
        start = run.step_start(first)
        outcome = inst.runtime.fast_forward_decodes(inst.batch, len(ends), ends.tolist(), final=True)
        self._record_step(inst, start, self.now_s - start, run.shape, len(ends), run.num_waiting)
        return outcome, StepResult(duration_s=self.now_s - run.step_start(last))

    def _record_step(self, inst: _Instance, start_s: float, duration_s: float, shape: StepShape, num_steps: int,
                     num_waiting: int) -> None:
        self.busy_s[inst.runtime.instance_id] += duration_s
        record_step(self.collector, inst.runtime, start_s, duration_s, shape, num_waiting, inst.model.flops_per_token,
                    num_steps)

    def _arm_wakeup(self, inst: _Instance) -> None:
        t = inst.policy.next_wakeup_s(self.now_s)
        if t is not None and (inst.wakeup_s is None or t < inst.wakeup_s):
            inst.wakeup_s = max(t, self.now_s)
            self.events.push(inst.wakeup_s, EventKind.WAKEUP, inst.runtime.instance_id)

    def _on_step_done(self, instance_id: int) -> None:
        inst = self.instances[instance_id]
        rt = inst.runtime
        plan, batch = inst.plan, inst.batch
        if inst.run is not None:
            outcome, result = self._finish_run(inst)
        else:
            result = StepResult(duration_s=self.now_s - inst.step_start_s)
            outcome = rt.complete(plan, batch, result, self.now_s)
        inst.busy, inst.plan, inst.batch = False, None, []
        inst.policy.on_step_done(self.now_s, plan, result)
        self._settle(inst, outcome)
        if rt.is_idle:
            self._settle_all()
            self._place(self.router.on_instance_idle(self.now_s, instance_id, self.view))
        self._kick(inst)

    def _settle(self, inst: _Instance, outcome: StepOutcome) -> None:
        for req in outcome.finished:
            inst.policy.on_finish(self.now_s, req)
            self.collector.on_request_end(req)
        for req in outcome.handed_off:
            inst.policy.on_finish(self.now_s, req)
            self._hand_off(inst, req)

    # ---- hand-offs (P/D, micro-requests) ----
    def _hand_off(self, source: _Instance, req: Request) -> None:
        self._settle_all()
        target_id = self.router.handoff_target(self.now_s, req, source.runtime.instance_id, self.view)
        req.handoff_at_tokens = None
        req.num_transfers += 1
        num_bytes = req.num_computed_tokens * source.model.kv_bytes_per_token
        done = self.now_s + self.cluster.link.transfer_time_s(num_bytes)
        self.transfers.append((source.runtime.instance_id, target_id, self.now_s, done - self.now_s, num_bytes))
        self.events.push(done, EventKind.TRANSFER_DONE, (req, target_id))

    def _on_transfer_done(self, req: Request, target_id: int) -> None:
        target = self.instances[target_id]
        req.handoff_at_tokens = self.router.handoff_point(req, target.runtime)
        self._add(target, req)
        self._kick(target)

    # ---- end of run ----
    def _abort_leftovers(self) -> None:
        """Requests still queued when no event can move them again (a policy that never admits)."""
        for inst in self.instances:
            rt = inst.runtime
            for req in list(rt.waiting) + list(rt.running) + list(rt.swapped):
                rt.abort(req.request_id, "simulation ended with the request still queued", self.now_s)
                inst.policy.on_finish(self.now_s, req)
                self.collector.on_request_end(req)

    def _result(self, wall_s: float) -> SimResult:
        unfinished = [r.request_id for r in self.requests if not r.status.is_terminal]
        busy = list(self.busy_s)
        first = self.specs[0].arrival_time_s if self.specs else 0.0
        reports = {inst.runtime.instance_id: inst.policy.report() for inst in self.instances
                   if callable(getattr(inst.policy, "report", None))}
        return SimResult(self.requests, len(self.instances), self.now_s - first, wall_s, busy, self.collector,
                         self.transfers, unfinished=unfinished, policy_reports=reports)


def simulate(workload: Sequence[RequestSpec], cluster: ClusterConfig, *, cost_model=None, fast_forward: bool = True,
             progress: Callable[[float], None] | None = None) -> SimResult:
    """Run ``workload`` on ``cluster``; ``cost_model`` (optional) replaces every instance's."""
    sim = Simulation(workload, cluster, cost_model=cost_model, fast_forward=fast_forward, progress=progress)
    return sim.run()
