"""Each instance of a least-loaded cluster steps as it would alone on the arrivals it was given.

docs/benchmarks/scale.md compares the cost per token of N instances with one instance's at the
same load per instance, and N instances take about 10% more steps per token than one instance
fed the whole Poisson stream. This is the check that those steps are the simulated system's
(the router splits the stream, so an instance's arrivals come together less often and share
fewer prefill steps), not work the simulator adds at scale (a fast-forward cut short where
nothing reached the instance): replayed alone, every instance takes exactly the steps, and
gives exactly the results, it had inside the cluster.
"""

from __future__ import annotations

from servelab.catalog.instance import InstanceSpec
from servelab.cluster.presets import cluster_for
from servelab.costmodel.options import CostOptions
from servelab.simulator import Simulation, scale_bench
from servelab.simulator.hardware import cost_for_spec
from servelab.workloads.spec import parse_workload


def _fate(requests) -> dict:
    return {r.request_id: (r.status, r.num_generated_tokens, r.finish_time_s, tuple(r.token_times_s))
            for r in requests}


def test_instances_replayed_alone_take_the_same_steps(tmp_path):
    instances = 4
    cost = cost_for_spec(InstanceSpec(scale_bench.GPU, scale_bench.MODEL), CostOptions())
    workload = parse_workload(scale_bench.workload_spec(instances, 120, 5.5), tmp_path, 0)

    def cluster(n):
        return cluster_for(scale_bench.POLICY, num_instances=n, gpu=scale_bench.GPU, model=scale_bench.MODEL)

    together = Simulation(workload, cluster(instances), cost_model=cost).run()
    steps_by_instance = together.collector.steps.instance_id
    for iid in range(instances):
        mine = [r for r in together.requests if r.instance_id == iid]
        assert mine, f"instance {iid} got no request"
        alone = Simulation([r.spec for r in mine], cluster(1), cost_model=cost).run()
        assert _fate(alone.requests) == _fate(mine), f"instance {iid} ran differently alone"
        assert alone.collector.num_steps == int((steps_by_instance == iid).sum())
        assert alone.collector.num_steps > 0
