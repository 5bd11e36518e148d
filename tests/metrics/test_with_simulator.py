"""Metrics over real simulator runs: conservation holds and the collector agrees with the run."""

import numpy as np
from simkit import ToyCostModel, random_workload

from servelab.cluster.config import ClusterConfig, InstanceGroup, single_instance
from servelab.core.request import SLO, RequestSpec
from servelab.metrics import RequestTable, summarize
from servelab.simulator import simulate


def test_summary_agrees_with_simulation():
    wl = random_workload(300, seed=5, rate=30)
    cl = ClusterConfig(groups=(InstanceGroup(count=2),), router="round_robin")
    res = simulate(wl, cl, cost_model=ToyCostModel())
    table = RequestTable.from_requests(res.requests)
    s = summarize(table, res.collector, slo=SLO(ttft_s=0.5, tpot_s=0.05), peak_flops_per_instance=312e12)
    assert s.num_arrived == 300 == s.num_completed + s.num_rejected + s.num_aborted
    assert s.num_output_tokens == res.num_output_tokens == sum(spec.num_output_tokens for spec in wl)
    busy = {i.instance_id: i.busy_s for i in s.instances}
    assert np.allclose([busy[0], busy[1]], res.busy_s)
    assert 0 < s.slo_attainment <= 1 and s.goodput_tokens_per_s <= s.output_tokens_per_s
    assert 0 <= s.kv_utilization_mean <= s.kv_utilization_max <= 1
    assert s.padding_waste == 0.0 and all(0 < i.mfu < 1 for i in s.instances)


def test_preemptions_counted_by_the_collector():
    wl = [RequestSpec(i, 0.0, 1500, 900) for i in range(40)]
    res = simulate(wl, single_instance("vllm", gpu="A100-40GB", model="Llama-2-13B"), cost_model=ToyCostModel())
    s = summarize(RequestTable.from_requests(res.requests), res.collector)
    assert s.num_preemptions_recompute == sum(r.num_preemptions for r in res.requests) > 0
    assert s.queue_length_max > 0 and s.kv_utilization_max > 0.9


def test_a_request_is_never_both_waiting_and_running():
    """Issue 31 (8): the queue was sampled before a step admitted requests and the running
    count after, so a step admitting 63 requests counted them twice, and a distserve prefill
    instance that went idle kept its last 63 "waiting" to the end (max 124 of 64 requests)."""
    from servelab import api

    burst = [RequestSpec(i, 0.0, 64, 16) for i in range(64)]
    res = simulate(burst, single_instance("vllm", max_num_seqs=8), cost_model=ToyCostModel())
    steps = res.collector.steps
    assert np.all(steps.num_waiting + steps.num_running <= 64) and 0 < steps.num_waiting.max() < 64
    out = api.run_simulation("gsm8k:n=64", "distserve", api.HardwareChoice(num_instances=2))
    assert out.summary.queue_length_max <= 64
