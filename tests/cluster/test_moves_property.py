"""Property: random moves, pool trips, resizes and failures never lose, leak or double-own a block.

A chaos router places requests at random (some split at a random token, handed off to
another instance with bulk or streamed KV) and, after random steps, moves running or queued
requests to other instances, parks them in the cluster pool or in another instance's
reserved buffer, fetches them back, shrinks or grows an instance's KV, or fails an
instance. Block managers are checked after every step; at the end every request has ended
with a reason, and every active instance and the pool are empty.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st
from simkit import ToyCostModel

from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.reconfig import FailInstance, ResizeKV
from servelab.core.policy import POOL, ROUTERS, Move, Placement, Router
from servelab.core.request import RequestSpec, RequestStatus
from servelab.simulator import Simulation


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 0
    move_p: float = 0.3
    fail_p: float = 0.0


@ROUTERS.register("test_chaos")
class ChaosRouter(Router):
    Config = ChaosConfig

    def __init__(self, config: ChaosConfig = ChaosConfig()) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.parked: list = []  # requests this router sent to the pool or held in a buffer
        self.checked_steps = 0
        self.cluster_driver = None  # set by the test: invariants are checked after every step

    def on_arrival(self, now_s, request, cluster):
        rng = self.rng
        here = rng.choice(cluster.instances).instance_id
        if len(cluster.instances) > 1 and rng.random() < 0.4:  # a split: hand off at a random token
            there = rng.choice([v.instance_id for v in cluster.instances if v.instance_id != here])
            split = rng.randint(1, request.num_prompt_tokens + request.max_output_tokens - 1)
            return [Placement(request, here, handoff_at_tokens=split, handoff_target=there,
                              stream_kv_tokens=rng.choice([None, 16, 32]))]
        return [Placement(request, here)]

    def on_step_done(self, now_s, instance_id, shape, finished, cluster):
        for iid in self.cluster_driver.active:
            self.cluster_driver.drivers[iid].runtime.check_invariants()
        self.checked_steps += 1
        rng, actions = self.rng, []
        live = [v.instance_id for v in cluster.instances]
        if rng.random() < 0.05:  # first: later actions may take blocks on this instance
            view = cluster.instance(instance_id)
            blocks = view.blocks  # room for the step in flight too: shrinking below use is an error
            size = max(blocks.num_used_gpu_blocks + len(view.running) + 1, rng.randint(8, 400))
            actions.append(ResizeKV(instance_id, size))
        if rng.random() < self.config.move_p:
            view = cluster.instance(instance_id)
            candidates = [r for r in list(view.waiting) + list(view.running) if r.status is not RequestStatus.SWAPPED]
            if candidates:
                req = rng.choice(candidates)
                where = rng.choice(live + [POOL])
                hold = where != POOL and rng.random() < 0.3
                actions.append(Move(req, where, hold=hold, chunk_tokens=rng.choice([None, 16])))
                if where == POOL or hold:
                    self.parked.append(req)
        if self.parked and rng.random() < 0.5:  # bring a parked request back to run somewhere
            req = self.parked.pop(0)
            if req.status is RequestStatus.HELD:
                actions.append(Move(req, rng.choice(live) if req.instance_id is None else req.instance_id))
            elif not req.status.is_terminal:
                self.parked.append(req)
        if len(live) > 1 and rng.random() < self.config.fail_p:
            actions.append(FailInstance(rng.choice(live), requeue=rng.random() < 0.7))
        return actions


def _run(seed: int, num_instances: int, fail_p: float, num_requests: int):
    rng = random.Random(seed)
    specs = [RequestSpec(i, rng.uniform(0, 2), rng.randint(1, 120), rng.randint(1, 40)) for i in range(num_requests)]
    group = InstanceGroup(count=num_instances, policy=rng.choice(["vllm", "sarathi"]), block_size=16)
    cluster = ClusterConfig(groups=(group,), router="test_chaos", kv_pool_gb=1.0,
                            router_params={"seed": seed, "fail_p": fail_p})
    sim = Simulation(specs, cluster, cost_model=ToyCostModel())
    sim.router.cluster_driver = sim.driver
    for d in sim.driver.drivers:  # small KV so moves wait for memory and steps preempt
        d.runtime.resize(rng.randint(24, 200))
    return sim, sim.run()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), num_instances=st.integers(1, 3), fail=st.booleans())
def test_random_moves_keep_every_block_accounted(seed, num_instances, fail):
    sim, res = _run(seed, num_instances, 0.02 if fail else 0.0, 40)
    assert res.conserved, res.unfinished
    for req in res.requests:
        assert req.status.is_terminal and req.finish_reason
        if req.status is RequestStatus.FINISHED:
            assert req.num_generated_tokens == req.max_output_tokens
    c = sim.driver
    for iid in c.active:
        rt = c.drivers[iid].runtime
        rt.check_invariants()
        assert rt.blocks.num_used_gpu_blocks == 0 and not rt.reserved and not rt.detached and rt.is_idle
    assert c.pool is not None and len(c.pool) == 0 and c.pool.used_bytes == 0
    assert sim.router.checked_steps > 0


def test_moves_happen_and_most_requests_finish():
    sim, res = _run(7, 3, 0.0, 60)
    finished = sum(r.status is RequestStatus.FINISHED for r in res.requests)
    assert finished >= 50
    assert sum(r.num_transfers for r in res.requests) > 5  # hand-offs
    assert len(res.transfers) > 10 and any(dst == POOL for _, dst, *_ in res.transfers)
