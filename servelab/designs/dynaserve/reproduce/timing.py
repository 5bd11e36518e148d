"""Measuring the global scheduler: CPU time per decision, outside the router itself.

Routers never read clocks; ``TimedRouter`` wraps one and times each ``on_arrival`` (the
per-request decision: pair choice, the split search, committing both parts) and each
``on_step_done`` (the timeline calibration, amortised over steps) in CPU time of the thread
(``time.thread_time``: this machine is shared, and wall time would count other processes'
time slices, a few ms each, as ours), and records the queue the decision saw (requests waiting or running
on every instance). ``queue_benchmark`` times decisions against timelines preloaded
with a given number of running requests, to show how the cost grows with the queue.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from servelab.core.policy import Router
from servelab.core.request import Request


class TimedRouter(Router):
    def __init__(self, inner: Router) -> None:
        self.inner = inner
        self.name = inner.name
        self.decision_s: list[float] = []
        self.feedback_s: list[float] = []
        self.queue_sizes: list[int] = []

    def on_arrival(self, now_s: float, request: Request, cluster) -> list:
        t0 = time.thread_time()
        out = self.inner.on_arrival(now_s, request, cluster)
        self.decision_s.append(time.thread_time() - t0)
        self.queue_sizes.append(sum(len(i.running) + len(i.waiting) for i in cluster.instances))
        return out

    def on_step_done(self, now_s, instance_id, shape, finished, cluster) -> list:
        t0 = time.thread_time()
        out = self.inner.on_step_done(now_s, instance_id, shape, finished, cluster)
        self.feedback_s.append(time.thread_time() - t0)
        return out

    def report(self) -> dict:
        return self.inner.report()

    def on_instance_idle(self, now_s, instance_id, cluster):
        return self.inner.on_instance_idle(now_s, instance_id, cluster)

    def on_timer(self, now_s, cluster):
        return self.inner.on_timer(now_s, cluster)

    def next_wakeup_s(self, now_s):
        return self.inner.next_wakeup_s(now_s)

    def on_arrivals_done(self, now_s, cluster):
        return self.inner.on_arrivals_done(now_s, cluster)

    def on_moved(self, now_s, request, destination, cluster):
        return self.inner.on_moved(now_s, request, destination, cluster)

    def handoff_target(self, now_s, request, source_id, cluster) -> int:
        return self.inner.handoff_target(now_s, request, source_id, cluster)

    def handoff_point(self, request, instance) -> int | None:
        return self.inner.handoff_point(request, instance)


def time_schedules(drivers: Sequence[Any]) -> list[float]:
    """Time every ``schedule`` call (Algorithm 2's batch planner, once per step) of the
    instances' policies in CPU time of the thread; returns the list the times go to. The
    policy object is wrapped on the instance only (its class and other runs are untouched)."""
    times: list[float] = []
    for d in drivers:
        policy = d.policy
        inner = policy.schedule

        def schedule(now_s, state, _inner=inner):
            t0 = time.thread_time()
            plan = _inner(now_s, state)
            times.append(time.thread_time() - t0)
            return plan

        policy.schedule = schedule
    return times


def percentiles_us(values: Sequence[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=np.float64)
    if not len(v):
        return {"count": 0}
    p50, p99 = np.percentile(v, [50, 99])
    return {"count": int(len(v)), "mean": float(v.mean()), "p50": float(p50), "p99": float(p99), "max": float(v.max())}


def queue_benchmark(queue_sizes: Sequence[int], *, repeats: int = 200, seed: int = 0, model: str = "Qwen-2.5-14B"
                    ) -> list[dict[str, Any]]:
    """Decision time with ``q`` running requests already on each instance's timeline."""
    from servelab.catalog.instance import InstanceSpec
    from servelab.designs.dynaserve.profile import ProfileTable
    from servelab.designs.dynaserve.split import choose_split, segments_for
    from servelab.designs.dynaserve.timeline import Timeline
    from servelab.simulator.hardware import model_for_spec

    cost = model_for_spec(InstanceSpec("A100-80GB", model), None).cost
    table = ProfileTable.from_cost_model(cost, 8192, 256)
    rng = np.random.default_rng(seed)
    rows = []
    for q in queue_sizes:
        timelines = []
        for _ in range(2):
            t = Timeline(table, target_s=0.09, max_num_seqs=256)
            t.rebuild(0.0, rng.integers(1, 1500, q), rng.integers(200, 3000, q).astype(np.float64), [])
            timelines.append(t)
        times = []
        for i in range(repeats):
            prompt, output = int(rng.integers(100, 4000)), int(rng.integers(10, 1500))
            total = prompt + output + 20
            t0 = time.thread_time()
            choice = choose_split(prompt, total, timelines[0], timelines[1])
            a, _ = segments_for(choice.split_tokens, prompt, total, 0.0, 0.0)
            end = timelines[0].add(a) if a is not None else 0.0
            _, b = segments_for(choice.split_tokens, prompt, total, 0.0, end + 1e-4)
            if b is not None:
                timelines[1].add(b)
            times.append(time.thread_time() - t0)
            for t in timelines:  # what the router does after the next step (not a decision)
                t.flush()
            if i % 20 == 19:  # keep the queue near q: rebuild as finished work would leave it
                for t in timelines:
                    t.rebuild(0.0, rng.integers(1, 1500, q), rng.integers(200, 3000, q).astype(np.float64), [])
        rows.append({"queue": q, **percentiles_us(np.array(times) * 1e6)})
    return rows

