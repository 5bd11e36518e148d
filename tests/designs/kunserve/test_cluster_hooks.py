"""The cluster hooks KunServe added (additive, default off): a pipeline group's KV exchange
as chunks of a given size (or one bulk job), restores in chunks, a former that returns the
microbatches' shapes, and the group's step limits; ``can_change_layers`` on the view."""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.catalog.models import get_model
from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.links import TopologyConfig
from servelab.cluster.reconfig import FormPipeline, SetLayers, SplitPipeline
from servelab.core.plan import StepShape
from servelab.core.policy import ROUTERS, Placement, Router
from servelab.core.request import RequestSpec, RequestStatus
from servelab.costmodel.links import LinkSpec
from servelab.simulator import Simulation

LAYERS = get_model("Qwen-2.5-14B").num_layers


@dataclass(frozen=True)
class HookCfg:
    chunk_bytes: float = 0.0  # 0: None (one job per request); -1: inf (bulk)
    restore_chunk_bytes: float = 0.0


@ROUTERS.register("test_kunserve_hooks")
class HookRouter(Router):
    """Group instances 0 and 1 after 0.3 s with the hook options, restore and split at 2 s."""

    Config = HookCfg
    seen_can_change = None

    def __init__(self, config: HookCfg = HookCfg()) -> None:
        self.config = config
        self.phase, self.next = 0, 0
        self.shapes: list[StepShape] = []

    def former(self, shape: StepShape) -> list[StepShape]:
        self.shapes.append(shape)
        half = StepShape(shape.prefill_tokens, shape.prefill_context, 0, 0, 0)
        rest = StepShape((), (), shape.num_decodes, shape.decode_context_sum, shape.decode_context_max)
        return [s for s in (half, rest) if s.num_tokens]

    def on_arrival(self, now_s, request, cluster):
        HookRouter.seen_can_change = cluster.can_change_layers
        ids = [v.instance_id for v in cluster.instances]
        self.next += 1
        return [Placement(request, ids[self.next % len(ids)])]

    def on_step_done(self, now_s, instance_id, shape, finished, cluster):
        c = self.config
        if len(cluster.instance(instance_id).members) > 1:
            self.group_max_num_seqs = cluster.instance(instance_id).max_num_seqs
        if self.phase == 0 and now_s >= 0.3:
            self.phase = 1
            chunk = None if c.chunk_bytes == 0 else (math.inf if c.chunk_bytes < 0 else c.chunk_bytes)
            return [SetLayers(0, (0, LAYERS // 2)), SetLayers(1, (LAYERS // 2, LAYERS)),
                    FormPipeline((0, 1), 2, exchange_chunk_bytes=chunk, former=self.former, max_num_seqs=512)]
        if self.phase == 1 and now_s >= 2.0:
            self.phase = 2
            rc = c.restore_chunk_bytes or None
            return [SetLayers(0, (0, LAYERS), restore_from=1, chunk_bytes=rc),
                    SetLayers(1, (0, LAYERS), restore_from=0, chunk_bytes=rc)]
        if self.phase == 2 and all(spec.layers is None for _, spec in cluster.instance(0).members):
            self.phase = 3
            return [SplitPipeline(0)]
        return []


def _run(**params):
    specs = [RequestSpec(i, 0.01 * i, 1500 + 11 * i, 80) for i in range(120)]
    cluster = ClusterConfig(groups=(InstanceGroup(count=2, policy="sarathi", gpu="A800-80GB", model="Qwen-2.5-14B"),),
                            router="test_kunserve_hooks", router_params=params,
                            topology=TopologyConfig(gpus_per_server=1, inter_link=LinkSpec(25e9, 10e-6)))
    sim = Simulation(specs, cluster)
    res = sim.run()
    assert res.conserved and all(r.status is RequestStatus.FINISHED for r in res.requests)
    return sim, res


def _exchange(sim):
    return next(d for _, k, d in sim.driver.reconfig.events_log if k == "exchanged")


def test_exchange_in_chunks_or_one_bulk_job_moves_the_same_bytes():
    sim_bulk, res_bulk = _run(chunk_bytes=-1)
    bulk = _exchange(sim_bulk)
    chunk = bulk["bytes"] / 10
    sim_chunk, res_chunk = _run(chunk_bytes=chunk)
    chunked = _exchange(sim_chunk)
    assert chunked["bytes"] == bulk["bytes"] > 0 and chunked["num_requests"] == bulk["num_requests"] > 0
    # per direction: one job in bulk, at least the bytes / chunk jobs when chunked (links also carry restores)
    jobs = lambda res: sum(v["jobs"] for v in res.links.values())  # noqa: E731
    assert jobs(res_chunk) >= jobs(res_bulk) + 8


def test_restore_in_chunks_lands_and_the_group_splits():
    sim, res = _run(restore_chunk_bytes=256e6)
    kinds = [k for _, k, _ in sim.driver.reconfig.events_log]
    assert kinds.count("restored") == 2 and kinds[-1] == "split"
    assert max(v["jobs"] for v in res.links.values()) >= 20  # 14 GB of weights in 256 MB chunks


def test_the_former_shapes_and_the_group_limits_are_used():
    sim, res = _run()
    router = sim.router
    assert router.shapes and HookRouter.seen_can_change is True
    assert list(res.pipeline.values())[0]["steps"] > 0
    assert router.group_max_num_seqs == 512 and sim.driver.drivers[0].runtime.max_num_seqs == 256
