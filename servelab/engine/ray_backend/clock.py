"""The wall clock of a cluster whose steps run in actors: it also waits on them.

``ClusterDriver`` hands a step that returned a ``PendingStep`` to ``watch_pending``. One poll
callback sits in the event heap while any step is in flight; each time it runs it blocks in
``ray.wait`` until a step answers, the next timed event is due, or ``poll_s`` has passed (so
arrivals and server messages, which are not in the heap, wait at most ``poll_s``). A step
that answered becomes a ``STEP_DONE`` event at the time it was seen; a step whose actor died
becomes ``FailInstance`` (its requests go back through the router to be recomputed, or are
aborted with the reason when no instance is left).
"""

from __future__ import annotations

import time
from typing import Any

import ray

from servelab.cluster.clocks import WallClock
from servelab.cluster.reconfig import FailInstance


class PollingWallClock(WallClock):
    def __init__(self, poll_s: float = 0.001) -> None:
        super().__init__()
        self.poll_s = poll_s
        self.cluster: Any = None
        self._pending: dict[Any, tuple[Any, int, Any]] = {}  # ref -> (driver, version, RemoteStep)
        self._armed = False
        self.num_polls = 0

    def bind(self, cluster: Any) -> None:
        self.cluster = cluster

    def defer(self, fn) -> None:
        """Run ``fn`` from the event loop, as soon as the current event is handled."""
        self.cluster.push_callback(self.cluster.now_s, fn)

    def watch_pending(self, cluster: Any, d: Any) -> None:
        step = d.pending
        self.cluster = cluster
        self._pending[step.ref] = (d, d.version, step)
        self._arm()

    def fail(self, instance_id: int, reason: str) -> None:
        """An actor is gone: the cluster fails its instance (from an event, never mid-copy)."""
        c = self.cluster
        if c is None or instance_id not in c.active:
            return
        c.push_callback(c.now_s, lambda: instance_id in c.active and c.apply(
            [FailInstance(instance_id, requeue=True, reason=f"instance {instance_id}: {reason}")]))

    def _arm(self) -> None:
        if not self._armed and self._pending:
            self._armed = True
            self.cluster.push_callback(self.now(), self._poll)

    def _poll(self) -> None:
        self._armed = False
        self.num_polls += 1
        c = self.cluster
        budget = self.poll_s
        if len(c.events):
            budget = min(budget, max(0.0, c.events.peek_key()[0] - self.now()))
        refs = list(self._pending)
        ready, rest = ray.wait(refs, num_returns=1, timeout=budget, fetch_local=False)
        if ready and rest:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0, fetch_local=False)[0]
        seen = time.perf_counter()
        for ref in ready:
            d, version, step = self._pending.pop(ref)
            if d.version != version or d.pending is not step:
                continue  # the instance failed or was rebuilt meanwhile
            step.done_at = seen
            why = step.collect()
            if why is None:
                c.push_step_done(d, self.now())
            elif d.instance_id in c.active:
                step.executor.dead = True
                c.apply([FailInstance(d.instance_id, requeue=True, reason=f"instance {d.instance_id}: {why}")])
        self._arm()
