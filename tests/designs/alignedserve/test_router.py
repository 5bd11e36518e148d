"""The alignedserve router in the simulator: requests pass prefill -> pool -> buffers ->
decode and all finish; batches are prefix-aligned; prefetch uses PCIe then NVLink, and
without NVLink batches go over PCIe straight to the decode GPU; case 3 evicts; the
starvation bound schedules a request that no batch takes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from servelab.cluster.links import TopologyConfig
from servelab.cluster.presets import cluster_for
from servelab.core.policy import POOL
from servelab.core.registry import RegistryError
from servelab.core.request import RequestSpec, RequestStatus
from servelab.simulator.run import Simulation

HW = dict(gpu="H100-80GB", model="OPT-2.7B")


def _mixed(n=300, seed=0, gap_s=0.01, long_share=0.1):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt = int(rng.integers(1000, 8000)) if rng.random() < long_share else int(rng.integers(32, 1000))
        out.append(RequestSpec(i, i * gap_s, prompt, int(rng.integers(16, 256))))
    return out


def _run(specs, spec="alignedserve", n=2, gpu=HW["gpu"], model=HW["model"], **cluster_changes):
    cluster = replace(cluster_for(spec, num_instances=n, gpu=gpu, model=model), max_model_len=16384,
                      **cluster_changes)
    sim = Simulation(specs, cluster)
    return sim.run(), sim.router


def test_every_request_finishes_and_batches_are_aligned():
    # OPT-13B, two prefill GPUs feeding one decode GPU: the pool holds more than a batch
    specs = _mixed(600, gap_s=0.002)
    hw = dict(gpu="H100-80GB", model="OPT-13B")
    res, router = _run(specs, "alignedserve:max_wait_s=0", n=3, **hw)
    assert res.conserved and all(r.status is RequestStatus.FINISHED for r in res.requests)
    fcfs_res, fcfs = _run(specs, "alignedserve:prefix_aware=false,max_wait_s=0", n=3, **hw)
    assert fcfs_res.conserved
    s, f = router.stats.summary(), fcfs.stats.summary()
    assert s["num_batches"] > 5 and f["num_batches"] > 5
    assert s["batch_span_median"] < f["batch_span_median"] / 4  # aligned vs FCFS-cut batches


def test_prefetch_goes_pcie_to_the_prefill_gpu_then_nvlink_and_direct_without_nvlink():
    specs = _mixed(120)
    res, _ = _run(specs, "alignedserve:min_batch=8")
    hops = {(s, d) for s, d, *_ in res.transfers}
    assert {(0, POOL), (POOL, 0), (0, 1)} <= hops and (POOL, 1) not in hops
    res, _ = _run(specs, "alignedserve:min_batch=8", topology=TopologyConfig(nvlink=False))
    hops = {(s, d) for s, d, *_ in res.transfers}
    assert (POOL, 1) in hops and (POOL, 0) not in hops
    assert all(r.status is RequestStatus.FINISHED for r in res.requests)


def test_case_3_evicts_when_the_batch_outgrows_the_decode_gpu():
    # long outputs on OPT-13B (about 11k tokens of KV per H100 after the weights): the batch grows out of it
    specs = [RequestSpec(i, 0.0, 900 + 10 * i, 1500) for i in range(40)]
    cluster = replace(cluster_for("alignedserve:min_batch=4,block_fraction=0.9", num_instances=2, gpu="H100-80GB",
                                  model="OPT-30B"), max_model_len=16384)
    sim = Simulation(specs, cluster)
    res = sim.run()
    assert res.conserved and all(r.status is RequestStatus.FINISHED for r in res.requests)
    assert sim.router.stats.num_evictions > 0


def test_the_starvation_bound_schedules_a_request_no_batch_takes():
    # one 3000-token request (188 blocks) never fits a batch of 1% of the decode GPU's blocks (about
    # 130), and short requests keep arriving, so Density First Search always finds them instead
    specs = [RequestSpec(0, 0.0, 3000, 20)] + [RequestSpec(i, 0.03 * i, 100, 50) for i in range(1, 300)]
    res, router = _run(specs, "alignedserve:min_batch=5,block_fraction=0.01,max_wait_s=2,idle_force=false")
    lone = res.requests[0]
    assert lone.status is RequestStatus.FINISHED and router.stats.num_starved >= 1
    assert lone.token_times_s[1] - lone.token_times_s[0] < 2.5  # parked at most max_wait_s (+ the moves)


def test_starvation_releases_are_tagged_batches_of_their_own():
    """Regression (issue 25): requests released by the starvation bound had no batch id (all
    read as -1, one batch), so the switch share undercounted. Each starving subtree's batch
    now has its own id, like any batch, and every released request carries one."""
    specs = [RequestSpec(0, 0.0, 3000, 20), RequestSpec(1, 0.0, 6000, 20)] + \
        [RequestSpec(i, 0.03 * i, 100, 50) for i in range(2, 300)]
    res, router = _run(specs, "alignedserve:min_batch=5,block_fraction=0.01,max_wait_s=2,idle_force=false")
    assert all(r.status is RequestStatus.FINISHED for r in res.requests)
    stats = router.stats
    assert stats.num_starved_batches >= 2 and stats.num_starved >= 2
    assert set(router._tag) == {r.request_id for r in res.requests}  # every released request is tagged
    assert router._tag[0] != router._tag[1] and min(router._tag.values()) >= 0
    assert len(set(router._tag.values())) == len(stats.batch_sizes)  # one id per batch cut, starved ones too


def _held(num_running, credit, small, join="paper", free=5000, watermark=100):
    from collections import deque
    from types import SimpleNamespace

    from servelab.core.request import Request
    from servelab.designs.alignedserve.buffers import Slot
    from servelab.designs.alignedserve.config import AlignedServeConfig
    from servelab.designs.alignedserve.router import AlignedServeRouter

    blocks = SimpleNamespace(block_size=16, num_free_gpu_blocks=free, num_gpu_blocks=10000,
                             num_used_gpu_blocks=10000 - free, watermark_blocks=watermark)
    inst = SimpleNamespace(blocks=blocks, num_running=num_running, waiting=(), max_num_seqs=256, swapped=())
    slot = Slot(iid=1, buffer_iid=0, credit=credit, small=small)
    slot.candidate = deque(Request(RequestSpec(i, 0.0, 100, 10)) for i in range(20))
    slot.ready = {r.request_id for r in slot.candidate}
    router = AlignedServeRouter(AlignedServeConfig(join=join))
    return router._release(slot, slot.candidate, inst, 0.0), slot


def test_the_paper_join_rule_joins_only_after_completions_or_under_the_minimum():
    """Regression (issue 25): the next batch joined whenever blocks were free, so the decode
    GPU took the whole pool and Density First Search never narrowed. The paper's triggers: a
    running batch takes requests only after completions or while under min_batch; the old
    rule stays as ``join=greedy``."""
    moves, slot = _held(num_running=40, credit=0, small=False, free=9000)
    assert moves == []  # nothing completed, the batch is not small: nobody joins
    moves, _ = _held(num_running=10, credit=0, small=True)
    assert len(moves) == 20  # under the minimum: the batch fills as blocks allow
    moves, _ = _held(num_running=40, credit=0, small=False, join="greedy")
    assert len(moves) == 20


def test_completions_refill_the_batch_up_to_its_block_threshold_not_one_for_one():
    """Regression (issue 25, session 4): one join per completion locked a decode GPU's rows at
    the size of the first batch it took at start-up (ShareGPT-like, OPT-6.7B, 2000 requests:
    54 rows on 16% of the GPU's blocks for most of the run, against the 40% a batch may hold).
    The paper: completed requests release HBM and "we try to select some requests ... to join";
    a batch holds at most the block threshold, so a completion refills the released blocks up
    to it. The one-for-one reading stays as ``join=one-for-one``."""
    # 10000 blocks, threshold 40% = 4000; each candidate (no KV computed yet) needs 1 block
    moves, slot = _held(num_running=40, credit=1, small=False, free=9000)
    assert len(moves) == 20  # one completion, 1000 blocks used: all 20 fit under 4000
    moves, slot = _held(num_running=40, credit=1, small=False, free=6010)
    assert len(moves) == 10 and slot.credit == 0  # 3990 + 10 = 4000; an eleventh would pass it
    moves, slot = _held(num_running=40, credit=1, small=False, free=5000)
    assert moves == []  # above the threshold already: completions free blocks, nobody joins yet
    moves, slot = _held(num_running=40, credit=3, small=False, free=9000, join="one-for-one")
    assert len(moves) == 3 and slot.credit == 0


def test_paper_joins_keep_more_rows_than_one_for_one():
    # OPT-2.7B, 600 requests at time 0, two prefill GPUs and one decode GPU: one for one keeps
    # the first batch's 45 rows, refilling to the threshold about 82 (measured when written)
    specs = _mixed(600, gap_s=0.0)
    rows = {}
    for join in ("paper", "one-for-one"):
        _, router = _run(specs, f"alignedserve:join={join},max_wait_s=0", n=3)
        rows[join] = router.stats.summary()["rows_per_iteration_mean"]
    assert rows["paper"] > 1.4 * rows["one-for-one"]


def test_paper_joins_run_one_batch_at_a_time_and_greedy_joins_fill_the_gpu():
    specs = _mixed(600, gap_s=0.002)
    hw = dict(gpu="H100-80GB", model="OPT-13B")
    rows = {}
    for join in ("paper", "greedy"):
        _, router = _run(specs, f"alignedserve:join={join},max_wait_s=0", n=3, **hw)
        s = router.stats.summary()
        assert s["pool_depth_at_cut"]["share_over_threshold"] > 0.5  # the premise: a deep pool at cuts
        rows[join] = s["rows_per_iteration_mean"]
    assert rows["paper"] < rows["greedy"]  # one batch at a time, not as much as the GPU holds


def test_a_joining_batch_waits_for_its_kv_and_prefetch_shortens_the_wait():
    """Issue 25 item 4: with ``wait_for_kv`` the decode iteration pauses until joining KV has
    landed; prefetching over NVLink makes those pauses shorter than fetching over PCIe."""
    specs = _mixed(300, gap_s=0.002)
    waits = {}
    for spec in ("alignedserve:max_wait_s=0", "alignedserve:max_wait_s=0,prefetch=false",
                 "alignedserve:max_wait_s=0,wait_for_kv=false"):
        res, router = _run(specs, spec, n=3, gpu="H100-80GB", model="OPT-13B")
        assert all(r.status is RequestStatus.FINISHED for r in res.requests)
        waits[spec] = router.stats.summary()
    with_p, without_p = waits["alignedserve:max_wait_s=0"], waits["alignedserve:max_wait_s=0,prefetch=false"]
    assert with_p["num_kv_waits"] > 0 and waits["alignedserve:max_wait_s=0,wait_for_kv=false"]["num_kv_waits"] == 0
    assert with_p["kv_wait_p50_p95_ms"][0] < without_p["kv_wait_p50_p95_ms"][0]


def test_bad_parameters_are_one_clear_error():
    with pytest.raises(RegistryError, match="no parameter 'bogus'"):
        cluster_for("alignedserve:bogus=1", num_instances=2)
    with pytest.raises(RegistryError, match="at least 2"):
        cluster_for("alignedserve", num_instances=1)
    with pytest.raises(Exception, match="block_fraction"):
        Simulation(_mixed(3), cluster_for("alignedserve:block_fraction=2", num_instances=2, **HW))
    with pytest.raises(Exception, match="join must be one of paper, one-for-one, greedy"):
        Simulation(_mixed(3), cluster_for("alignedserve:join=fifo", num_instances=2, **HW))


def test_a_request_in_transit_does_not_hold_up_ready_ones_behind_it():
    """Regression (full reproduction, OPT-13B, 75% short): an eviction waiting for room in the
    buffer sat at the head of the requests buffer, so the ready requests behind it, whose
    release would have made that room, were never released."""
    from collections import deque
    from types import SimpleNamespace

    from servelab.core.request import Request
    from servelab.designs.alignedserve.buffers import Slot
    from servelab.designs.alignedserve.router import AlignedServeRouter

    blocks = SimpleNamespace(block_size=16, num_free_gpu_blocks=1000, num_gpu_blocks=1000, num_used_gpu_blocks=0,
                             watermark_blocks=10)
    inst = SimpleNamespace(blocks=blocks, num_running=0, waiting=(), max_num_seqs=256, swapped=())
    evicted, ready = (Request(RequestSpec(i, 0.0, 100, 10)) for i in range(2))
    slot = Slot(iid=1, buffer_iid=0)
    slot.requests = deque([evicted, ready])
    slot.ready = {ready.request_id}
    moves = AlignedServeRouter()._release(slot, slot.requests, inst, 0.0)
    assert [m.request for m in moves] == [ready] and list(slot.requests) == [evicted]


def test_the_designs_statistics_reach_every_runs_summary():
    """Issue 25 item 7: summary.json's policy_reports carry the router's own statistics."""
    import json

    from servelab.api import HardwareChoice, run_simulation

    out = run_simulation(_mixed(150, gap_s=0.002, long_share=0.0), "alignedserve",
                         HardwareChoice(num_instances=2, gpu="H100-80GB", model="OPT-2.7B"))
    report = json.loads(json.dumps(out.to_dict()))["policy_reports"]["router"]
    depth = report["pool_depth_at_cut"]
    assert report["num_batches"] > 0 and len(depth["blocks_over_threshold_p10_p50_p90"]) == 3
    assert 0.0 <= depth["share_over_threshold"] <= 1.0 and 0.0 < report["switch_share"] <= 1.0
    assert report["rows_per_iteration_mean"] > 1 and report["num_kv_waits"] > 0
    assert report["num_joins"] == 150 and "num_starved_batches" in report
    # what the join rule fills: cut batches against the threshold, the decode GPU's blocks per iteration
    assert 0 < report["gpu_blocks_used_p10_p50_p90"][1] <= 1
    assert 0 < report["batch_blocks_over_threshold_p10_p50_p90"][1]
    waits = report["pool_wait_s"]  # prefill -> pool -> on a decode GPU, once per request
    assert waits["count"] == 150 and 0 < waits["p50"] <= waits["p99"] <= waits["max"]
    assert report["rejoin_wait_s"]["count"] <= report["num_evictions"]


def test_a_release_leaves_the_decode_instances_watermark_free():
    """Regression: the router released KV when need + growth headroom fit the free blocks,
    but a decode instance admits incoming KV only above its watermark (``can_reserve``); in
    between, the transfer waited at the decode GPU for memory, unseen by the router (Mooncake
    conv, OPT-6.7B: 95 transfers waited 68 s median, up to 212 s, inside the pool wait)."""
    # 10 running: the router's growth headroom is 10 x 32 tokens = 21 blocks, the watermark 60
    moves, _ = _held(num_running=10, credit=0, small=True, free=40, watermark=60)
    assert len(moves) == 0  # fits the router's headroom, not the instance's watermark
    moves, _ = _held(num_running=10, credit=0, small=True, free=200, watermark=60)
    assert len(moves) >= 1


def test_no_released_kv_waits_at_a_decode_gpu_for_memory(monkeypatch):
    from servelab.cluster import transfers

    blocked = []
    try_reserve = transfers.KVTransfers._try_reserve

    def spy(self, t):
        ok = try_reserve(self, t)
        if not ok and t.destination >= 0 and self.cluster.drivers[t.destination].runtime.role == "decode":
            blocked.append(t.request.request_id)
        return ok

    monkeypatch.setattr(transfers.KVTransfers, "_try_reserve", spy)
    from servelab.designs.alignedserve.reproduce import setting

    rng = np.random.default_rng(0)  # long prompts: a few fill a decode GPU (OPT-6.7B, ~0.5 MB a token)
    specs = [RequestSpec(i, 0.0, int(rng.integers(4000, 15000)), int(rng.integers(2, 200))) for i in range(60)]
    sim = Simulation(specs, setting.cluster("alignedserve", "OPT-6.7B", 2))  # 16K context, as the reproduction
    res, router = sim.run(), sim.router  # before the fix: 76 transfers waited
    assert res.conserved and all(r.status is RequestStatus.FINISHED for r in res.requests)
    assert router.stats.summary()["pool_wait_s"]["count"] == 60
    assert blocked == []


def test_prefetch_statistics_count_prefetches_and_say_why_one_was_skipped():
    """Issue 25 (prefetch must matter): the report needs how many prefetches had room, and for a
    skipped one whether the buffer was occupied or the request larger than the buffer could be."""
    from types import SimpleNamespace

    from servelab.core.request import Request
    from servelab.designs.alignedserve.buffers import Slot
    from servelab.designs.alignedserve.router import AlignedServeRouter

    blocks = SimpleNamespace(block_size=16, num_free_gpu_blocks=150, num_gpu_blocks=1000)
    cluster = SimpleNamespace(instance=lambda iid: SimpleNamespace(blocks=blocks))  # no topology: prefetch on
    router = AlignedServeRouter()
    slot = Slot(iid=1, buffer_iid=0)
    reqs = []
    for i, n_blocks in enumerate((40, 40, 950)):  # room: 150 free - 100 kept for prefills = 50 blocks
        req = Request(RequestSpec(i, 0.0, 16 * n_blocks, 10))
        req.num_computed_tokens = 16 * n_blocks
        reqs.append(req)
    moves = [m for req in reqs for m in router._to_buffer(slot, req, slot.candidate, cluster)]
    assert [m.request for m in moves] == reqs[:1] and moves[0].destination == 0
    s = router.stats.summary()
    assert s["num_prefetched"] == 1 and s["num_prefetch_skipped"] == 2
    skips = s["prefetch_skips"]  # the second: room 10 of 900 left; the third: larger than the whole 900
    assert skips["count"] == 2 and skips["too_big"] == 1 and skips["capacity_blocks"] == 900
    assert slot.ready == {1, 2}  # skipped requests are released from the pool directly


def _two_slots(steal=True, pooled=False):
    from collections import deque
    from types import SimpleNamespace

    from servelab.core.request import Request
    from servelab.designs.alignedserve.buffers import Slot
    from servelab.designs.alignedserve.config import AlignedServeConfig
    from servelab.designs.alignedserve.router import AlignedServeRouter

    router = AlignedServeRouter(AlignedServeConfig(steal=steal))
    busy, idle = Slot(iid=2, buffer_iid=0, candidate_id=7), Slot(iid=3, buffer_iid=1)
    busy.candidate = deque(Request(RequestSpec(i, 0.0, 100, 10)) for i in range(6))
    busy.ready = {0, 1, 2, 3}  # 4 and 5 are still crossing into the busy GPU's buffer
    router._slots = {2: busy, 3: idle}
    if pooled:
        router._pooled = {99: Request(RequestSpec(99, 0.0, 100, 10))}
    inst = SimpleNamespace(running=(), waiting=())
    router._steal(idle, inst)
    return router, busy, idle


def test_an_idle_decode_gpu_takes_over_a_busy_one_s_waiting_candidate_batch():
    """Regression (issue 25, offline tail): a candidate batch was bound to the decode GPU it was
    cut for, so with the pool empty it waited for that GPU's completions while another decode
    GPU idled. The idle one now takes its ready, unjoined requests (same batch id); requests
    still in transit stay (their landing is expected in the busy GPU's buffer)."""
    router, busy, idle = _two_slots()
    assert [r.request_id for r in idle.candidate] == [0, 1, 2, 3] and idle.ready == {0, 1, 2, 3}
    assert [r.request_id for r in busy.candidate] == [4, 5] and not busy.ready
    assert idle.candidate_id == 7 and all(router._owner[i] == 3 for i in range(4))
    assert router.stats.num_steals == 1 and router.stats.num_stolen == 4
    _, busy, idle = _two_slots(steal=False)  # the binding, kept as a variant
    assert not idle.candidate and len(busy.candidate) == 6
    _, busy, idle = _two_slots(pooled=True)  # the pool still has requests: the idle GPU cuts its own batch
    assert not idle.candidate and len(busy.candidate) == 6


def test_switch_readings_and_per_request_pool_depth_are_reported():
    """Issue 25: both readings of a batch switch (mixed iterations; iterations after which another
    batch joined) and the pool depth per request batched, not only per cut, are in the report."""
    from servelab.designs.alignedserve.stats import AlignedStats

    st = AlignedStats(num_iterations=10, num_switch_iterations=4, num_switch_events=1,
                      switch_minority=[0.05, 0.2, 0.3, 0.5])
    st.batch_sizes = [1, 1, 98]
    st.cut_pool = [(1, 10, 100), (1, 10, 100), (98, 500, 100)]  # two small shallow cuts, one big deep one
    s = st.summary()
    assert s["switch_share"] == 0.4 and s["switch_event_share"] == 0.1
    assert s["switch_share_over_tenth"] == 0.3 and s["switch_minority_rows_p50"] == pytest.approx(0.25)
    depth = s["pool_depth_at_cut"]
    assert depth["blocks_over_threshold_p10_p50_p90"][1] == pytest.approx(0.1)  # per cut: shallow
    assert depth["requests_cut_over_threshold"] == pytest.approx(0.98)  # per request: deep
    assert depth["blocks_over_threshold_request_p50"] == pytest.approx(5.0)
