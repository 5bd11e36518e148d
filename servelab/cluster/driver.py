"""The cluster driver: arrivals -> router -> instance drivers -> steps, transfers, reconfiguration.

One event loop for the simulator and the real engine. What differs is injected: the clock
(``SimClock`` jumps to the next event; ``WallClock`` sleeps until it) and each instance's
executor (a cost model, the PyTorch model). Events are kept in a heap keyed (time, kind,
sequence), so a simulated run is a pure function of its inputs.

Routers see a ``ClusterView`` (``cluster.views``); the clocks are in ``cluster.clocks``.

Every request that arrives ends completed, rejected or aborted with a reason; at the end of
a finite run whatever is still queued, held by the router, parked in the pool or in transit
is aborted with a reason that says where it was. ``ClusterResult.unfinished`` lists any
request that still has no terminal status (a bug; the summary refuses it).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from servelab.cluster.clocks import SimClock
from servelab.cluster.kv_pool import ClusterKVPool
from servelab.cluster.links import Topology
from servelab.cluster.views import ClusterView
from servelab.cluster.watchdog import Watchdog, WatchdogConfig
from servelab.core.admission import AdmissionConfig, admit
from servelab.core.driver import ASYNC, InstanceDriver
from servelab.core.events import EventKind, EventQueue
from servelab.core.policy import Move, Placement, Router
from servelab.core.request import Request, RequestSpec, RequestStatus
from servelab.metrics.collector import MetricsCollector


@dataclass
class ClusterResult:
    requests: list[Request]
    num_instances: int
    makespan_s: float
    wall_s: float
    busy_s: list[float]
    collector: MetricsCollector
    transfers: list[tuple[int, int, float, float, float]] = field(default_factory=list)
    unfinished: list[int] = field(default_factory=list)
    policy_reports: dict[int, dict] = field(default_factory=dict)  # per instance: its policy's report()
    router_report: dict = field(default_factory=dict)  # the router's report()
    links: dict[str, dict] = field(default_factory=dict)  # per link: busy_s, bytes, jobs
    pool_peak_bytes: float = 0.0
    pipeline: dict[int, dict] = field(default_factory=dict)  # per pipeline group: bubble stats
    num_rejected_at_admission: int = 0

    @property
    def num_output_tokens(self) -> int:
        return sum(r.num_generated_tokens for r in self.requests)

    @property
    def conserved(self) -> bool:
        return not self.unfinished


class ClusterDriver:
    def __init__(self, drivers: list[InstanceDriver], router: Router, *, clock: Any = None,
                 topology: Topology | None = None, collector: MetricsCollector | None = None,
                 admission: AdmissionConfig = AdmissionConfig(), pool: ClusterKVPool | None = None,
                 measured_transfers: bool = False, rebuild: Callable | None = None,
                 max_output_tokens: Callable[[RequestSpec], int] | None = None,
                 on_arrival: Callable[[Request], str | None] | None = None) -> None:
        from servelab.cluster.moves import Mover
        from servelab.cluster.reconfigure import Reconfigurer

        self.drivers = drivers
        self.active: set[int] = set(range(len(drivers)))
        self.router = router
        self.clock = clock if clock is not None else SimClock()
        self.topology = topology
        self.collector = collector if collector is not None else MetricsCollector()
        self.admission = admission
        self.pool = pool
        self.max_output_tokens = max_output_tokens  # spec -> the output cap (engine: SamplingParams)
        self.arrival_hook = on_arrival  # request -> why it cannot be served here, or None (engine: token ids)
        self.events = EventQueue()
        self.now_s = 0.0
        self.requests: list[Request] = []
        self._request_by_id: dict[int, Request] = {}
        self.num_rejected_at_admission = 0
        self.view = ClusterView(self)
        self.view.rebuild()
        self.mover = Mover(self, measured=measured_transfers)
        self.reconfig = Reconfigurer(self, rebuild)
        self._router_timer_s: float | None = None
        self.router_decision_s: list[float] = []  # CPU time of each on_arrival (routers read no clock)
        # timed only for a router that reports statistics (the rest would keep a float a request)
        self._time_router = type(router).report is not Router.report
        self._router_hears_steps = type(router).on_step_done is not Router.on_step_done
        self._arrivals_done = False
        self.watchdog = WatchdogConfig()  # ends a run that stops making progress (cluster/watchdog.py)
        for d in drivers:
            problem = d.policy.check_instance(d.runtime)
            if problem is not None:
                from servelab.core.registry import RegistryError

                raise RegistryError(f"policy {d.policy.name!r} on instance {d.instance_id}: {problem}")

    # ---- main loop ----
    def run(self, specs: Sequence[RequestSpec]) -> ClusterResult:
        """Serve a finite workload to the end (arrival times relative to the clock's start)."""
        wall0 = time.perf_counter()
        specs = sorted(specs, key=lambda s: (s.arrival_time_s, s.request_id))
        if len({s.request_id for s in specs}) != len(specs):
            raise ValueError("request ids must be unique within a run")
        if hasattr(self.clock, "start"):
            self.clock.start()
        num_specs, i = len(specs), 0
        events = self.events
        progress, last_progress = getattr(self, "progress", None), 0
        if not specs:
            self._on_arrivals_done()
        ended = self.collector.ended_requests
        watchdog = Watchdog(self, self.watchdog)
        while i < num_specs or len(events) or (len(ended) < len(self.requests) and self.mover.break_stalemate()
                                               and len(events)):
            if i == num_specs and len(ended) == len(self.requests):
                break  # every request ended: timers left in the heap (max-wait, wake-ups) are moot
            next_arrival = specs[i].arrival_time_s if i < num_specs else math.inf
            if (next_arrival, EventKind.ARRIVAL) <= events.peek_key():
                self.now_s = self.clock.advance(next_arrival)
                self._on_arrival(specs[i])
                i += 1
                if i == num_specs:
                    self._on_arrivals_done()
                if progress is not None and i - last_progress >= 1000:
                    last_progress = i
                    progress(i / num_specs)
                continue
            t, kind, payload = events.pop()
            self.now_s = self.clock.advance(t)
            self._dispatch(kind, payload)
            if watchdog.stalled(self.now_s):
                break
        self._abort_leftovers(watchdog.reason)
        return self._result(time.perf_counter() - wall0)

    def _dispatch(self, kind: EventKind, payload: Any) -> None:
        if kind is EventKind.STEP_DONE:
            instance_id, version = payload
            d = self.drivers[instance_id]
            if version == d.version and instance_id in self.active:
                self._on_step_done(d)
        elif kind is EventKind.TRANSFER_DONE:
            self.mover.on_link_done(payload)
        elif kind is EventKind.WAKEUP:
            d = self.drivers[payload]
            d.wakeup_s = None
            if payload in self.active:
                self._kick(d)
        elif kind is EventKind.ROUTER_TIMER:
            self._router_timer_s = None
            self.apply(self.router.on_timer(self.now_s, self.view))
        elif kind is EventKind.CALLBACK:
            payload()

    def serve(self, inbox: "queue.Queue", stop: "threading.Event", *, poll_s: float = 0.05) -> None:
        """Server mode (wall clock): serve requests submitted while running until ``stop`` is set.

        ``inbox`` carries ``("submit", spec, on_request)`` (the spec's arrival time is ignored:
        it arrives now; ``on_request(request)`` is called from this thread before it is routed,
        so a caller can attach a token stream) and ``("abort", request_id, reason)``. Requests
        still unfinished when ``stop`` is set are aborted with the reason "server shutting down";
        a graceful shutdown stops submitting, waits for ``idle()``, then sets ``stop``.
        """
        import queue as queue_mod

        events = self.events
        while not stop.is_set():
            self.now_s = self.clock.now()
            try:
                while True:
                    self._on_message(inbox.get_nowait())
            except queue_mod.Empty:
                pass
            if len(events) and events.peek_key()[0] <= self.clock.now():
                t, kind, payload = events.pop()
                self.now_s = max(t, self.clock.now())
                self._dispatch(kind, payload)
                continue
            wait = poll_s if not len(events) else min(poll_s, max(0.0, events.peek_key()[0] - self.clock.now()))
            try:
                self._on_message(inbox.get(timeout=wait))
            except queue_mod.Empty:
                if not len(events) and not self.idle():
                    self.mover.break_stalemate()
        self.now_s = self.clock.now()
        self._abort_leftovers("server shutting down")

    def idle(self) -> bool:
        """True when every request submitted so far has ended."""
        return len(self.collector.ended_requests) == len(self.requests)

    def _on_message(self, message: tuple) -> None:
        self.now_s = self.clock.now()
        if message[0] == "submit":
            _, spec, on_request = message
            from dataclasses import replace

            self._on_arrival(replace(spec, arrival_time_s=self.now_s), on_request)
        elif message[0] == "abort":
            self.abort_request(message[1], message[2])
        else:
            raise ValueError(f"unknown inbox message {message[0]!r}")

    # ---- arrivals and routing ----
    def _on_arrival(self, spec: RequestSpec, on_request: Callable[[Request], None] | None = None) -> None:
        cap = self.max_output_tokens(spec) if self.max_output_tokens is not None else spec.num_output_tokens
        admitted, why = admit(spec, cap, self.admission)
        req = Request(admitted if admitted is not None else spec, max_output_tokens=cap)
        self.requests.append(req)
        self._request_by_id[req.request_id] = req
        if on_request is not None:
            on_request(req)
        if why is None and self.arrival_hook is not None:
            why = self.arrival_hook(req)
        if why is not None:
            self.num_rejected_at_admission += 1
            req.finish(RequestStatus.REJECTED, self.now_s, why)
            self.collector.on_request_end(req)
            return
        if not self._time_router:
            self.apply(self.router.on_arrival(self.now_s, req, self.view))
            return
        t0 = time.thread_time()
        actions = self.router.on_arrival(self.now_s, req, self.view)
        self.router_decision_s.append(time.thread_time() - t0)
        self.apply(actions)

    def _on_arrivals_done(self) -> None:
        self._arrivals_done = True
        for iid in sorted(self.active):
            d = self.drivers[iid]
            d.policy.on_arrivals_done(self.now_s)
            self._kick(d)
        self.apply(self.router.on_arrivals_done(self.now_s, self.view))

    def apply(self, actions: list) -> None:
        """Carry out router actions; placements first queued, then each touched instance plans
        once, so a batch a router places together is seen together."""
        if not actions:
            self._arm_router_timer()
            return
        touched: list[InstanceDriver] = []
        for a in actions:
            if type(a) is Placement:
                d = self._place(a)
                if d is not None and d not in touched:
                    touched.append(d)
            elif type(a) is Move:
                self.mover.move(a)
            else:
                self.reconfig.apply(a)
        for d in touched:
            self._kick(d)
        self._arm_router_timer()

    def _place(self, p: Placement) -> InstanceDriver | None:
        req = p.request
        if p.instance_id is None:
            self.end_request(req, RequestStatus.REJECTED, p.reject_reason or "rejected by router")
            return None
        if p.instance_id not in self.active:
            raise ValueError(f"router {self.router.name!r} placed request {req.request_id} on instance "
                             f"{p.instance_id}, which is not an active instance")
        d = self.drivers[p.instance_id]
        if p.handoff_at_tokens is not None:
            req.handoff_at_tokens = p.handoff_at_tokens
            req.handoff_target = p.handoff_target
            req.stream_kv_tokens = p.stream_kv_tokens
        elif req.handoff_at_tokens is None:
            req.handoff_at_tokens = self.router.handoff_point(req, self.view.instance(p.instance_id))
        self.add_to(d, req)
        return d

    def add_to(self, d: InstanceDriver, req: Request) -> None:
        """Queue a request on an instance (cuts a decode run short at the step in flight)."""
        cut = d.add(req, self.now_s)
        if cut is not None:
            self.events.push(cut, EventKind.STEP_DONE, (d.instance_id, d.version))
        if req.stream_kv_tokens is not None and req.handoff_at_tokens is not None \
                and req.handoff_target not in (None, d.instance_id):
            self.mover.watch_stream(d, req)

    def end_request(self, req: Request, status: RequestStatus, reason: str) -> None:
        """End a request that is on no instance's queue (rejected by the router, parked, lost
        in a move); whatever KV it still holds anywhere is freed."""
        req.finish(status, self.now_s, reason)
        self.mover.forget(req)
        self.collector.on_request_end(req)

    def abort_request(self, request_id: int, reason: str) -> bool:
        """End a request wherever it is (a client went away, a shutdown). A request inside a
        step in flight ends when that step does. Returns False when it had already ended."""
        req = self._request_by_id.get(request_id)
        if req is None or req.status.is_terminal:
            return False
        iid = req.instance_id
        if iid is not None and iid in self.active and self.drivers[iid].runtime.has(request_id):
            self.drivers[iid].abort(request_id, reason, self.now_s)
            if req.status.is_terminal:
                self.mover.forget(req)
            return True
        self.end_request(req, RequestStatus.ABORTED, reason)
        return True

    def _arm_router_timer(self) -> None:
        t = self.router.next_wakeup_s(self.now_s)
        if t is not None and (self._router_timer_s is None or t < self._router_timer_s):
            self._router_timer_s = max(t, self.now_s)
            self.events.push(self._router_timer_s, EventKind.ROUTER_TIMER)

    # ---- steps ----
    def kick(self, instance_id: int) -> None:
        if instance_id in self.active:
            self._kick(self.drivers[instance_id])

    def _kick(self, d: InstanceDriver) -> None:
        end = d.start(self.now_s)
        if end is None:
            if not d.busy:
                t = d.next_wakeup_s(self.now_s)
                if t is not None and (d.wakeup_s is None or t < d.wakeup_s):
                    d.wakeup_s = max(t, self.now_s)
                    self.events.push(d.wakeup_s, EventKind.WAKEUP, d.instance_id)
            return
        if end is ASYNC:  # the step runs elsewhere: a clock that can wait on it reports its end
            watch = getattr(self.clock, "watch_pending", None)
            if watch is None:
                raise NotImplementedError("asynchronous executors need a clock with watch_pending "
                                          "(engine.ray_backend.clock.PollingWallClock)")
            watch(self, d)
            return
        self.events.push(end, EventKind.STEP_DONE, (d.instance_id, d.version))

    def _on_step_done(self, d: InstanceDriver) -> None:
        iid = d.runtime.instance_id
        if self._router_hears_steps:
            shape = d.applied.shape
            outcome = d.finish(self.now_s)
            self.apply(self.router.on_step_done(self.now_s, iid, shape, outcome.finished, self.view))
            if self.drivers[iid] is not d or iid not in self.active:
                return  # the router failed or regrouped this instance
        else:
            outcome = d.finish(self.now_s)
        self.mover.after_step(d, outcome)
        self.reconfig.after_step()
        if self.drivers[iid] is not d or iid not in self.active:
            return
        if d.runtime.is_idle:
            self.apply(self.router.on_instance_idle(self.now_s, iid, self.view))
        self._kick(d)

    def push_callback(self, t: float, fn: Callable[[], None]) -> None:
        self.events.push(t, EventKind.CALLBACK, fn)

    def push_step_done(self, d: InstanceDriver, t: float) -> None:
        self.events.push(t, EventKind.STEP_DONE, (d.instance_id, d.version))

    # ---- end of run ----
    def _abort_leftovers(self, reason: str | None = None) -> None:
        for iid in sorted(self.active):
            d = self.drivers[iid]
            d.busy, d.run = False, None  # a step still in flight will not be completed
            d.abort_all(reason or "the run ended with the request still queued (the policy never ran it)",
                        self.now_s)
        for req in self.requests:
            if not req.status.is_terminal:
                where = self.mover.where(req)
                self.end_request(req, RequestStatus.ABORTED, reason or f"the run ended with the request {where}")

    def _result(self, wall_s: float) -> ClusterResult:
        unfinished = [r.request_id for r in self.requests if not r.status.is_terminal]
        first = min((r.arrival_time_s for r in self.requests), default=0.0)
        last = max((r.finish_time_s for r in self.requests if r.finish_time_s is not None), default=self.now_s)
        reports = {d.instance_id: d.policy.report() for d in self.drivers
                   if callable(getattr(d.policy, "report", None))}
        links = {str(k): {"busy_s": lk.busy_s, "bytes": lk.bytes_moved, "jobs": lk.num_jobs}
                 for k, lk in self.mover.links.items()}
        router_report = self.router.report()
        if router_report:  # a router with statistics also gets its decision times, measured here
            router_report = {**router_report, "decision_time_us": _percentiles_us(self.router_decision_s)}
        return ClusterResult(self.requests, len(self.drivers), last - first, wall_s,
                             [d.busy_s for d in self.drivers], self.collector, list(self.mover.transfers),
                             unfinished=unfinished, policy_reports=reports, router_report=router_report,
                             links=links,
                             pool_peak_bytes=self.pool.peak_bytes if self.pool is not None else 0.0,
                             pipeline=self.reconfig.pipeline_report(),
                             num_rejected_at_admission=self.num_rejected_at_admission)


def _percentiles_us(times_s: list[float]) -> dict:
    """p50 / p99 / max of per-decision CPU times in microseconds (thread time, so other
    processes on a shared machine do not count)."""
    if not times_s:
        return {"count": 0}
    import numpy as np

    us = np.asarray(times_s) * 1e6
    return {"count": len(us), "p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99)),
            "max": float(us.max())}
