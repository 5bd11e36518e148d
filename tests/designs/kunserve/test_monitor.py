"""KunServe's monitor: throttling is head-of-line KV demand (running + the head of the queue),
so a compute queue that fits memory neither drops nor keeps a group pipelined; capacity is
read at the whole model's KV per token, so a group restoring its layers is not counted twice;
and the design's statistics reach every run's summary.json."""

from __future__ import annotations

from dataclasses import dataclass, field

from servelab.core.request import RequestSpec, RequestStatus
from servelab.designs.kunserve.monitor import hol_demand_blocks, hol_excess_blocks
from servelab.simulator import Simulation


@dataclass
class _Blocks:
    num_used_gpu_blocks: int
    num_gpu_blocks: int
    block_size: int = 16
    held: set = field(default_factory=set)  # request ids holding KV here
    watermark_blocks: int = 0  # kept free by the scheduler when admitting (the trigger charges it)

    def is_on_gpu(self, request_id: int) -> bool:
        return request_id in self.held


@dataclass
class _Req:
    arrival_time_s: float
    request_id: int
    num_tokens: int


@dataclass
class _View:
    blocks: _Blocks
    waiting: list = field(default_factory=list)
    instance_id: int = 0
    num_running: int = 0
    kv_bytes_per_token: float = 1.0

    @property
    def members(self):
        return [(self.instance_id, None)]


def test_a_compute_queue_that_fits_memory_is_not_throttled():
    # 600 of 1000 blocks used; 40 queued requests of 320 tokens (20 blocks each, 800 in all):
    # the head fits (620 <= 1000), the whole queue would not (1400 > 1000)
    queue = [_Req(0.1 * i, i, 320) for i in range(40)][::-1]
    view = _View(_Blocks(600, 1000), queue)
    assert hol_demand_blocks(view) == 620 and hol_excess_blocks(view) < 0
    # the head (earliest arrival, wherever it sits in the queue) cannot be admitted: throttled
    view.blocks.num_used_gpu_blocks = 990
    assert hol_excess_blocks(view) == 10


def test_a_queued_request_holding_its_kv_is_not_the_head_of_line():
    """A group's request whose KV exchange has not landed waits in the queue holding its blocks
    (they are in the used count). Before the fix it was taken as the head and its KV counted a
    second time: 985 of 1000 blocks used and a 7.8K-token head (490 blocks) read as throttled."""
    exchanging = _Req(0.0, 0, 7840)
    view = _View(_Blocks(985, 1000, held={0}), [exchanging])
    assert hol_demand_blocks(view) == 985 and hol_excess_blocks(view) < 0
    view.waiting.append(_Req(1.0, 1, 320))  # a new request behind it needs 20 blocks: throttled
    assert hol_demand_blocks(view) == 1005 and hol_excess_blocks(view) == 5


def test_compute_queueing_does_not_drop(small_cluster):
    """Short requests all at once: the queue holds ~3x the KV capacity in tokens, but the
    running ones never fill it. Counting every queued request dropped here (before the fix)."""
    specs = [RequestSpec(i, 0.001 * i, 200, 20) for i in range(600)]
    sim = Simulation(specs, small_cluster("kunserve"))
    res = sim.run()
    assert res.conserved and all(r.status is RequestStatus.FINISHED for r in res.requests)
    assert not [k for _, k, _ in sim.driver.reconfig.events_log if k == "form"]
    assert max(d.runtime.blocks.num_gpu_blocks for d in sim.driver.drivers) * 16 < 600 * 220 / 2


def test_capacity_is_not_counted_twice_while_a_group_restores(burst, small_cluster):
    sim = Simulation(burst(tail=15), small_cluster("kunserve"))
    res = sim.run()
    router = sim.router
    kinds = [k for _, k, _ in sim.driver.reconfig.events_log]
    assert res.conserved and "form" in kinds and "split" in kinds
    from servelab.catalog.instance import held_param_bytes

    drivers = sim.driver.drivers  # whole again after the split
    full_kv = sum(d.runtime.blocks.num_gpu_blocks * d.runtime.blocks.block_size * d.kv_bytes_per_token for d in drivers)
    copy = held_param_bytes(drivers[0].spec)
    t, used, demand, cap, params = zip(*router.timeline)
    # two instances in one group free one copy of the weights for KV, and never more
    assert max(cap) <= full_kv + copy * 1.001
    assert max(cap) > full_kv


def test_microbatches_default_to_the_stages_and_the_report_says_what_the_design_did(burst, small_cluster):
    from servelab.api import SimulationOutput
    from servelab.metrics import RequestTable
    from servelab.metrics.summary import summarize

    sim = Simulation(burst(tail=15), small_cluster("kunserve"))
    res = sim.run()
    out = SimulationOutput("kunserve", summarize(RequestTable.from_requests(res.requests), res.collector), res, 0.0,
                           0.0)
    rep = out.to_dict()["policy_reports"]
    router = rep["router"]
    assert router["num_drops"] >= 1 and router["groups_formed"] == router["groups_split"] == 1
    assert router["kv_freed_gb"] > 0 and router["time_pipelined_group_s"] > 0
    assert router["drops"][0]["microbatches"] == [2]  # a two-stage group runs two microbatches
    trig = router["drops"][0]["trigger"][0]
    assert trig["hol_demand_blocks"] > trig["capacity_blocks"]
    g = router["groups"][0]
    assert g["restore_demand_share"] <= 0.5 and g["formed_s"] < g["restore_s"] < g["split_s"]
    groups = list(rep["pipeline_groups"].values())
    assert groups and 0 < groups[0]["bubble_share"] < 1


def test_a_throttled_group_triggers_a_drop_and_an_unthrottled_one_may_restore():
    """Escalation: a pipeline group whose head-of-line demand exceeds its KV asks for a drop
    (before, groups only ever checked for restore, so a throttled group never escalated)."""
    from types import SimpleNamespace as NS

    from servelab.designs.kunserve.router import KunServeRouter

    calls = []

    class Probe(KunServeRouter):
        def _drop(self, now_s, cluster):
            calls.append(("drop", now_s))
            return []

        def _maybe_restore(self, now_s, view, cluster):
            calls.append(("restore", now_s))
            return []

    spec = NS(layers=(0, 24))
    view = NS(instance_id=0, members=[(0, spec), (1, spec)], waiting=[_Req(0.0, 7, 3200)],
              blocks=_Blocks(990, 1000), num_running=5, kv_bytes_per_token=1.0)
    cluster = NS(instances=[view], instance=lambda i: view, can_change_layers=True)
    router = Probe()
    router._last_sample_s = 100.0  # no memory sample in this probe
    router.on_step_done(10.1, 0, None, [], cluster)
    view.blocks.num_used_gpu_blocks = 400  # the head fits now: not throttled
    router.on_step_done(12.0, 0, None, [], cluster)
    assert calls == [("drop", 10.1), ("restore", 12.0)]
