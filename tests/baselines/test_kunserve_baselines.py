"""KunServe's baselines under a burst that throttles the KV cache: Llumnix migrates running
requests, InferCept swaps them to host memory over PCIe and back, vLLM-PP runs static
two-stage pipelines with twice the KV per token of memory; every request finishes."""

from __future__ import annotations

from dataclasses import replace

from servelab.cluster.links import TopologyConfig
from servelab.cluster.presets import cluster_for
from servelab.core.policy import POOL
from servelab.core.request import RequestSpec, RequestStatus
from servelab.costmodel.links import LinkSpec
from servelab.simulator import Simulation

SMALL = {"gpu": "A800-80GB", "model": "Qwen-2.5-14B", "memory_reserve_fraction": 0.6}


def _run(spec: str, specs, num_instances: int = 2):
    c = cluster_for(spec, num_instances=num_instances, **SMALL)
    c = replace(c, link=None, topology=TopologyConfig(gpus_per_server=1, inter_link=LinkSpec(25e9, 10e-6)))
    sim = Simulation(specs, c)
    res = sim.run()
    assert res.conserved and all(r.status is RequestStatus.FINISHED for r in res.requests)
    return sim, res


def _skewed():
    """Long requests land on instance 0 first (KV-load dispatch spreads later ones)."""
    return [RequestSpec(i, 0.03 * i, 2500 if i % 2 else 600, 150 if i % 3 else 40) for i in range(40)]


def test_llumnix_migrates_running_requests_with_their_kv():
    sim, res = _run("llumnix", _skewed())
    assert sim.router.num_migrations > 0
    assert any(src >= 0 and dst >= 0 and nbytes > 0 for src, dst, _, _, nbytes in res.transfers)
    sim, _ = _run("llumnix:migrate=false", _skewed())
    assert sim.router.num_migrations == 0


def test_infercept_swaps_over_pcie_and_back():
    sim, res = _run("infercept", _skewed())
    r = sim.router
    assert r.num_swap_outs > 0 and r.num_swap_ins == r.num_swap_outs
    outs = [t for t in res.transfers if t[1] == POOL]
    assert outs and all(duration > 0 for _, _, _, duration, _ in outs)  # charged the PCIe link's time


def test_vllm_pp_pairs_instances_into_pipelines():
    sim, res = _run("vllm-pp", _skewed(), num_instances=3)
    forms = [d["members"] for _, k, d in sim.driver.reconfig.events_log if k == "form"]
    assert forms == [[0, 1]]
    assert [v.instance_id for v in sim.driver.view.instances] == [0, 2]
    group = list(res.pipeline.values())[0]
    assert group["steps"] > 0 and group["bubble_share"] > 0
    members = sim.driver.reconfig.groups[0].members
    whole = sim.driver.drivers[2].runtime.blocks.num_gpu_blocks
    assert all(m.runtime.blocks.num_gpu_blocks > 2 * whole for m in members)


def test_infercept_serves_swapped_requests_before_the_queue():
    """vLLM brings swapped requests back before it admits queued ones; InferCept here used to
    wait until its instance's queue was empty, so new requests overtook the swapped ones."""
    from types import SimpleNamespace as NS

    from servelab.baselines.infercept import InferCeptRouter
    from servelab.core.policy import Move

    blocks = NS(num_free_gpu_blocks=500, num_gpu_blocks=1000, watermark_blocks=10, blocks_for=lambda t: -(-t // 16))
    queued = [NS(num_tokens=4000, arrival_time_s=1.0, request_id=9)]  # a head that does not fit: 250 blocks
    view = NS(instance_id=0, blocks=blocks, waiting=queued, running=[], num_running=0)
    parked = NS(request_id=3, arrival_time_s=0.5, num_computed_tokens=1600, num_generated_tokens=10,
                status=RequestStatus.SWAPPED)
    router = InferCeptRouter()
    router._parked[3], router._home[3] = parked, 0
    actions = router._swap_in(NS(instances=[view]))
    assert [type(a) for a in actions] == [Move] and actions[0].destination == 0


def test_vllm_pp_rows_keeps_a_prompt_in_one_microbatch():
    """Token chunking cuts a lone prompt between the two microbatches, so its second half runs
    on stage 0 while the first is on stage 1; with ``former=rows`` (vLLM's virtual engines: a
    request's chunk in one engine's pass) the prompt crosses both stages whole, later."""
    ttft = {}
    for former in ("tokens", "rows"):
        _, res = _run(f"vllm-pp:former={former}", [RequestSpec(0, 0.0, 1000, 4)])
        r = res.requests[0]
        ttft[former] = r.token_times_s[0] - r.arrival_time_s
    assert ttft["rows"] > 1.2 * ttft["tokens"]


def test_infercept_swapped_first_holds_arrivals_while_swapped_requests_are_away():
    """vLLM v0's rule, the default (issue 24: InferCept serves swapped requests first, as vLLM
    does): no new request on an instance while requests it swapped out are away; with
    ``swapped_first=false`` new requests take the memory swapping freed, so they wait less."""
    from servelab.baselines.infercept import InferCeptConfig

    assert InferCeptConfig().swapped_first  # fails before issue 24's default change
    specs = [RequestSpec(i, 0.2 * i, 2500 if i % 2 else 600, 300 if i % 3 else 60) for i in range(60)]
    mean = {}
    for spec in ("infercept", "infercept:swapped_first=false"):
        sim, res = _run(spec, specs)
        r = sim.router
        assert r.num_swap_outs > 0 and r.num_swap_ins == r.num_swap_outs
        assert (r.num_held > 0) == (spec == "infercept")
        mean[spec] = sum(q.token_times_s[0] - q.arrival_time_s for q in res.requests) / len(specs)
    assert mean["infercept"] > 1.5 * mean["infercept:swapped_first=false"]  # held arrivals wait (0.79 vs 0.41 s)
