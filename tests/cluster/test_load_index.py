"""The least-loaded index (cluster/load_index.py) gives the scan's answer on every arrival."""

from __future__ import annotations

import pytest

from servelab.baselines.routers import LeastLoadedRouter
from servelab.cluster.presets import cluster_for
from servelab.core.policy import Placement
from servelab.simulator import Simulation
from simkit import ToyCostModel, random_workload


class CheckedRouter(LeastLoadedRouter):
    """Places by the index and checks it against a scan of every instance at every arrival."""

    def __init__(self) -> None:
        self.checked = 0

    def on_arrival(self, now_s, request, cluster):
        loads = cluster.outstanding_tokens()
        least = min(loads)
        scan = min(v.instance_id for v, load in zip(cluster.instances, loads) if load == least)
        picked = cluster.least_loaded()
        assert picked.instance_id == scan, (now_s, loads)
        self.checked += 1
        return [Placement(request, picked.instance_id)]


@pytest.mark.parametrize("policy,instances", [("vllm", 4), ("vllm", 13), ("sarathi", 5)])
def test_index_matches_scan_on_every_arrival(policy, instances):
    workload = random_workload(600, seed=instances, rate=40.0 * instances / 4)
    sim = Simulation(workload, cluster_for(policy, num_instances=instances), cost_model=ToyCostModel())
    router = CheckedRouter()
    sim.driver.router = router
    res = sim.run()
    assert router.checked == len(workload)
    assert res.conserved
    # decode runs were in flight while routing: the index had to follow loads falling with time
    assert sum(1 for d in sim.instances if d.busy_s > 0) == instances


def test_least_loaded_router_same_results_with_and_without_index():
    """The router's placements (hence every request's fate) are the scan's."""
    workload = random_workload(400, seed=3, rate=60.0)

    def run(indexed: bool):
        sim = Simulation(workload, cluster_for("vllm", num_instances=6), cost_model=ToyCostModel())
        if not indexed:
            sim.driver.view.least_loaded = None  # the router falls back to the scan
        res = sim.run()
        return [(r.request_id, r.instance_id, r.status, r.finish_time_s, tuple(r.token_times_s)) for r in res.requests]

    assert run(True) == run(False)
