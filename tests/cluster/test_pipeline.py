"""Pipeline groups: the schedule against a hand-computed one, links that make activations wait,
and a simulated drop -> pipeline -> restore -> split that keeps every request and block."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from servelab.catalog.models import get_model
from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.links import Link
from servelab.cluster.pipeline import PipelineExecutor, balance_rows, pipeline_schedule
from servelab.cluster.reconfig import FormPipeline, SetLayers, SplitPipeline
from servelab.core.plan import StepShape
from servelab.core.policy import ROUTERS, Placement, Router
from servelab.core.request import RequestSpec, RequestStatus
from servelab.costmodel.links import LinkSpec
from servelab.simulator import Simulation


def test_schedule_matches_a_hand_computed_one():
    # 3 microbatches on 2 stages, times [m][s]; sends of 0.5 between the stages
    times = [[2.0, 1.0], [1.0, 3.0], [2.0, 1.0]]
    sends = [[0.5], [0.5], [0.5]]
    # stage 0: mb0 0-2, mb1 2-3, mb2 3-5
    # stage 1: mb0 2.5-3.5, mb1 max(3.5, 3.5)=3.5-6.5, mb2 max(6.5, 5.5)=6.5-7.5
    t = pipeline_schedule(times, sends)
    assert t.makespan_s == pytest.approx(7.5)
    assert t.busy_s == (5.0, 5.0)
    assert t.bubble_s == pytest.approx(2 * 7.5 - 10.0)
    assert t.bubble_share == pytest.approx(5.0 / 15.0)


def test_equal_microbatches_have_the_textbook_bubble():
    # M equal microbatches over S equal stages: bubble share (S-1)/(M+S-1)
    for m, s in ((4, 2), (8, 4), (1, 3)):
        t = pipeline_schedule([[1.0] * s for _ in range(m)])
        assert t.bubble_share == pytest.approx((s - 1) / (m + s - 1))


def test_activation_waits_for_the_chunk_on_its_link():
    link = Link("a", LinkSpec(1e9))
    link.occupy(0.0, 3.0)  # a KV chunk holds the link until t=3
    t = pipeline_schedule([[1.0, 1.0]], [[0.1]], links=[link])
    assert t.activation_wait_s == pytest.approx(2.0)
    assert t.makespan_s == pytest.approx(3.1 + 1.0)


def test_a_running_pipeline_starts_the_next_step_in_the_last_ones_tail():
    # 2 equal microbatches on 2 stages of 1 s: the first step fills and drains (3 s); the next,
    # decided at 3, began at 2 (slot 0 left the last stage at 2, stage 0 was free): it ends at 5
    first = pipeline_schedule([[1.0, 1.0], [1.0, 1.0]])
    assert first.makespan_s == pytest.approx(3.0) and first.exit_s == (2.0, 3.0) and first.stage_free_s == (2.0, 3.0)
    nxt = pipeline_schedule([[1.0, 1.0], [1.0, 1.0]], start_s=3.0, stage_free_s=first.stage_free_s,
                            ready_s=first.exit_s)
    assert nxt.makespan_s == pytest.approx(2.0) and nxt.exit_s == (4.0, 5.0) and nxt.bubble_s == pytest.approx(0.0)


class _Scripted:
    """Stage cost models that answer from one script: the executor asks microbatch by
    microbatch, stage by stage, so microbatch m costs ``times[m]`` on every stage."""

    def __init__(self, times: list[float], num_stages: int) -> None:
        self.script = [t for t in times for _ in range(num_stages)]
        self.k = 0

    def step_time_s(self, shape) -> float:
        t = self.script[self.k % len(self.script)]
        self.k += 1
        return t


def _run(overlap: bool, starts, times_per_mb) -> tuple[list[float], float]:
    """Steps launched at ``starts`` (None: when the previous one ended) on a 2-stage group whose
    microbatch m takes ``times_per_mb[m]`` on each stage; returns each step's time and the bubble."""
    shapes = [StepShape((), (), num_decodes=1, decode_context_sum=1, decode_context_max=1) for _ in times_per_mb]
    cost = _Scripted(times_per_mb, 2)
    ex = PipelineExecutor([cost, cost], [Link("l", LinkSpec(1e12))], hidden_bytes_per_token=0.0,
                          former=lambda shape: shapes, overlap=overlap)
    now, makespans = 0.0, []
    for start in starts:
        now = now if start is None else start
        makespans.append(ex.time_step(shapes[0], start_s=now).makespan_s)
        now += makespans[-1]
    return makespans, ex.stats.bubble_share


def test_overlapped_steps_cost_their_slowest_stage_and_drained_ones_fill_and_drain():
    steps = [None] * 10
    over, over_bubble = _run(True, steps, [1.0, 1.0])
    drain, drain_bubble = _run(False, steps, [1.0, 1.0])
    assert drain == pytest.approx([3.0] * 10) and drain_bubble == pytest.approx(1 / 3)
    assert over == pytest.approx([3.0] + [2.0] * 9)  # fill once, then full
    assert over_bubble == pytest.approx((2 * 21 - 2 * 20) / (2 * 21))  # 21 s of two stages, 40 s of work
    # after an idle gap the pipeline starts empty again
    gap, _ = _run(True, [None, None, 100.0, None], [1.0, 1.0])
    assert gap == pytest.approx([3.0, 2.0, 3.0, 2.0])


def test_unbalanced_microbatches_leave_a_bubble_even_when_overlapped():
    # KunServe's Fig. 8: microbatches of 1 s and 2 s per stage -> the steady step takes 4 s for
    # 3 s of work per stage (25% bubble); balanced 1.5 s ones take 3 s (none)
    unbalanced, _ = _run(True, [None] * 6, [1.0, 2.0])
    balanced, _ = _run(True, [None] * 6, [1.5, 1.5])
    assert unbalanced[1:] == pytest.approx([4.0] * 5) and balanced[1:] == pytest.approx([3.0] * 5)


def test_balance_rows_spreads_tokens():
    shape = StepShape((100, 60, 40), (100, 60, 40), num_decodes=20, decode_context_sum=20 * 300,
                      decode_context_max=300)
    groups = balance_rows(shape, 2)
    sizes = [sum((list(shape.prefill_tokens) + [1] * 20)[i] for i in g) for g in groups]
    assert sorted(sizes) == [110, 110] and sorted(i for g in groups for i in g) == list(range(23))


@dataclass(frozen=True)
class KunCfg:
    drop_s: float = 0.5
    restore_s: float = 3.0


@ROUTERS.register("test_drop_restore")
class DropRestoreRouter(Router):
    """Halve two instances' layers into one pipeline group at ``drop_s``, restore them and split
    the group at ``restore_s`` (stage changes wait for the steps in flight)."""

    Config = KunCfg

    def __init__(self, config: KunCfg = KunCfg()) -> None:
        self.config = config
        self.phase = 0
        self.next = 0

    def on_arrival(self, now_s, request, cluster):
        ids = [v.instance_id for v in cluster.instances]
        self.next += 1
        return [Placement(request, ids[self.next % len(ids)])]

    def on_step_done(self, now_s, instance_id, shape, finished, cluster):
        layers = get_model("Llama-2-7B").num_layers
        if self.phase == 0 and now_s >= self.config.drop_s:
            self.phase = 1
            return [SetLayers(0, (0, layers // 2)), SetLayers(1, (layers // 2, layers)), FormPipeline((0, 1), 4)]
        if self.phase == 1 and now_s >= self.config.restore_s:
            self.phase = 2
            return [SetLayers(0, (0, layers), restore_from=1), SetLayers(1, (0, layers), restore_from=0)]
        if self.phase == 2 and all(spec.layers is None for _, spec in cluster.instance(0).members):
            self.phase = 3
            return [SplitPipeline(0)]
        return []


def test_drop_pipeline_restore_split_keeps_every_request():
    specs = [RequestSpec(i, 0.02 * i, 500 + 7 * i, 60) for i in range(300)]
    cluster = ClusterConfig(groups=(InstanceGroup(count=2, policy="sarathi"),), router="test_drop_restore")
    sim = Simulation(specs, cluster)
    before = sim.driver.drivers[0].runtime.blocks.num_gpu_blocks
    res = sim.run()
    assert res.conserved and all(r.status is RequestStatus.FINISHED for r in res.requests)
    kinds = [kind for _, kind, _ in sim.driver.reconfig.events_log]
    assert kinds[:3] == ["drop", "drop", "form"] and "split" in kinds and kinds.count("restored") == 2
    report = list(res.pipeline.values())
    assert report and report[0]["steps"] > 0 and 0 < report[0]["bubble_share"] < 1
    assert report[0]["ended_s"] is not None
    for d in sim.driver.drivers:  # back to two whole instances, every block free
        assert d.spec.layers is None and d.runtime.blocks.num_used_gpu_blocks == 0
        assert d.runtime.blocks.num_gpu_blocks == before
        d.runtime.check_invariants()


def test_dropping_half_the_layers_frees_weight_memory_for_kv():
    from servelab.catalog.instance import InstanceSpec, num_kv_blocks

    whole = InstanceSpec("A100-80GB", "Llama-2-7B")
    half = InstanceSpec("A100-80GB", "Llama-2-7B", layers=(0, 16))
    # half the weights freed, and each token's KV holds half the layers: more than twice the tokens
    assert num_kv_blocks(half) > 2 * num_kv_blocks(whole)


def test_steps_the_former_leaves_whole_are_counted():
    """A step the former returns as one microbatch idles the later stage while the first works:
    counted, so a report can say how much of a group's bubble comes from such steps."""
    one = [StepShape((), (), num_decodes=1, decode_context_sum=1, decode_context_max=1)]
    two = one * 2
    cost = _Scripted([1.0], 2)
    formed = iter([one, two, one])
    ex = PipelineExecutor([cost, cost], [Link("l", LinkSpec(1e12))], hidden_bytes_per_token=0.0,
                          former=lambda shape: next(formed), overlap=False)
    bubbles = [ex.time_step(one[0], start_s=10.0 * k).bubble_s for k in range(3)]
    assert ex.stats.num_steps == 3 and ex.stats.single_microbatch_steps == 2
    assert bubbles[0] == pytest.approx(2.0) and bubbles[1] == pytest.approx(2.0)  # 2 stages x 2 s - 2 s; 2 x 3 - 4
