"""The cluster driver with executors whose steps end elsewhere (``PendingStep``): a clock
with ``watch_pending`` reports each step's end, and the run is the one the same executors give
synchronously. No Ray here: the pending steps are the cost model's, reported by a fake clock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.clocks import SimClock
from servelab.core.executor import PendingStep
from servelab.simulator.run import Simulation
from simkit import ToyCostModel, random_workload


@dataclass
class _Pending:
    step: object

    def done(self) -> bool:
        return True

    def result(self):
        return self.step


class _AsyncExecutor:
    """Runs the wrapped executor's step but hands it back as a PendingStep."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def launch(self, applied, blocks):
        return _Pending(self.inner.launch(applied, blocks))

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _WatchingClock(SimClock):
    def watch_pending(self, cluster, d) -> None:
        cluster.push_step_done(d, cluster.now_s + d.pending.result().duration_s)


def _finish_times(policy: str, *, pending: bool) -> dict[int, float]:
    cluster = ClusterConfig(groups=(InstanceGroup(count=2, policy=policy),), router="least_loaded")
    sim = Simulation(random_workload(60, seed=3), cluster, cost_model=ToyCostModel(), fast_forward=False)
    if pending:
        for d in sim.instances:
            d.executor = _AsyncExecutor(d.executor)
        sim.driver.clock = _WatchingClock()
    res = sim.run()
    assert res.conserved
    return {r.request_id: r.finish_time_s for r in res.requests}


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_pending_steps_give_the_run_of_synchronous_ones(policy):
    assert isinstance(_Pending(None), PendingStep)
    assert _finish_times(policy, pending=True) == _finish_times(policy, pending=False)


def test_pending_steps_without_a_watching_clock_are_refused():
    cluster = ClusterConfig(groups=(InstanceGroup(count=1, policy="vllm"),))
    sim = Simulation(random_workload(3, seed=1), cluster, cost_model=ToyCostModel(), fast_forward=False)
    sim.instances[0].executor = _AsyncExecutor(sim.instances[0].executor)
    with pytest.raises(NotImplementedError, match="watch_pending"):
        sim.run()
