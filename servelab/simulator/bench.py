"""Simulator speed benchmark, run by ``servelab perf simulator [--repeats 3]`` (the CLI calls ``run``;
this module never imports the CLI).

Replays the whole Azure 2023 conversation trace (19,366 requests) on simulated A100-80GB
instances (one by default) serving Llama-2-7B under ``vllm`` on the default cost model (the
profile-driven one since issue 23) and reports CPU seconds and simulated
output tokens per CPU-second (median of the repeats). The cost model is built once, outside
the timed region, as a long sweep would reuse it; trace loading is timed separately.
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np

from servelab.cluster.presets import cluster_for
from servelab.simulator import Simulation
from servelab.workloads.spec import parse_workload


def run(args) -> None:
    """The benchmark; ``args`` carries the ``servelab perf simulator`` options."""
    t0 = time.process_time()
    workload = parse_workload(args.workload, args.data_dir, 0)
    load_s = time.process_time() - t0
    from servelab.catalog.instance import InstanceSpec
    from servelab.costmodel.options import CostOptions
    from servelab.simulator.hardware import cost_for_spec

    options = CostOptions(op_times=getattr(args, "op_times", "profile"))
    cost = cost_for_spec(InstanceSpec("A100-80GB", "Llama-2-7B"), options)
    runs = []
    for _ in range(args.repeats):
        t0 = time.process_time()
        cluster = cluster_for(args.policy, num_instances=args.instances, gpu="A100-80GB", model="Llama-2-7B")
        sim = Simulation(workload, cluster, cost_model=cost, fast_forward=not args.no_fast_forward)
        decision_s: list[float] = []
        if args.time_decisions:
            for inst in sim.instances:
                inst.policy.schedule = _timed(inst.policy.schedule, decision_s)
        res = sim.run()
        cpu_s = time.process_time() - t0
        run = {"cpu_s": cpu_s, "wall_s": res.wall_s, "tokens": res.num_output_tokens,
               "tokens_per_cpu_s": res.num_output_tokens / cpu_s, "conserved": res.conserved,
               "makespan_s": res.makespan_s}
        if decision_s:
            us = np.array(decision_s) * 1e6
            run["schedule_calls"] = len(us)
            run["schedule_us_p50_p99_max"] = [float(np.percentile(us, 50)), float(np.percentile(us, 99)), float(us.max())]
        runs.append(run)
    print(json.dumps({"workload": args.workload, "policy": args.policy, "instances": args.instances,
                      "op_times": options.op_times,
                      "requests": len(workload),
                      "load_cpu_s": load_s, "fast_forward": not args.no_fast_forward,
                      "median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
                      "median_tokens_per_cpu_s": statistics.median(r["tokens_per_cpu_s"] for r in runs),
                      "runs": runs}, indent=2))


def _timed(schedule, sink: list[float]):
    def timed(now_s, state):
        t0 = time.perf_counter()
        plan = schedule(now_s, state)
        sink.append(time.perf_counter() - t0)
        return plan

    return timed

