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


class _Runtime:
    """What the index reads of an instance without a decode run: its id and outstanding total."""

    def __init__(self, instance_id: int) -> None:
        self.instance_id = instance_id
        self.num_outstanding_tokens = 0
        self.load_watch = None


class _Driver:
    def __init__(self, instance_id: int) -> None:
        self.runtime = _Runtime(instance_id)
        self.run = None


def test_int_keys_order_as_load_then_id_negative_loads_and_large_ids_included():
    """A heap key packs (load, id) into one int; loads below zero and ids up to 2**32 - 1 keep
    the (load, lowest id) order, against a scan after every change."""
    import random

    from servelab.cluster.load_index import LoadIndex

    rng = random.Random(7)
    ids = [0, 1, 5, 2**31, 2**32 - 1]
    drivers = [_Driver(i) for i in ids]
    index = LoadIndex(drivers)
    for step in range(2_000):
        d = rng.choice(drivers)
        d.runtime.num_outstanding_tokens = rng.randint(-3, 3) * rng.choice([1, 2**40])
        d.runtime.load_watch(d.runtime.instance_id)
        want = min((x.runtime.num_outstanding_tokens, x.runtime.instance_id) for x in drivers)
        assert index.least_loaded(float(step)) == want


def test_instance_ids_outside_the_key_range_are_refused():
    from servelab.cluster.load_index import LoadIndex

    with pytest.raises(ValueError, match="instance ids"):
        LoadIndex([_Driver(2**32)])
