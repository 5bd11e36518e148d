"""Simulator speed at fleet scale, run by ``servelab perf scale`` (one point per process, so
its peak RSS is its own; ``scripts/scale_report.py`` runs the points and writes
docs/benchmarks/scale.md).

The question a capacity planner asks: does a simulated token cost the same CPU time on 1,024
instances as on one, at the same load per instance? Each point is a Poisson workload at
``rate`` requests/s per instance times the instances, ``requests`` per instance (prompts
U(512,1536), outputs U(100,300) tokens), on A100-80GB instances serving Llama-2-7B under
``vllm`` behind the preset's router (least-loaded beyond one instance), with the default
cost model built once outside the timed region. One instance runs ``repeats`` workloads
(seeds 0..repeats-1) back to back, so its timed work is not a few milliseconds.
"""

from __future__ import annotations

import gc
import hashlib
import json
import resource
import time
from contextlib import contextmanager

POLICY = "vllm"
GPU, MODEL = "A100-80GB", "Llama-2-7B"
PROMPT, OUTPUT = "uniform(512,1536)", "uniform(100,300)"


def workload_spec(instances: int, requests: int, rate: float) -> str:
    return (f"poisson:rate={rate * instances:g},n={requests * instances},"
            f"prompt={PROMPT},output={OUTPUT}")


def peak_rss_gb() -> float:
    """This process's peak resident set (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def fingerprint(result) -> str:
    """A short digest of what a run produced (each request's status, tokens and finish time),
    to show that two ways of running it gave the same results."""
    h = hashlib.sha256()
    for r in sorted(result.requests, key=lambda r: r.request_id):
        h.update(f"{r.request_id}:{r.status.value}:{r.num_generated_tokens}:{r.finish_time_s!r};".encode())
    return h.hexdigest()[:16]


@contextmanager
def collector_time(totals: list[float]):
    """Adds the CPU seconds Python's cyclic collector takes inside the block to ``totals[0]``
    (``gc.callbacks`` around every collection): the share of a run it costs."""
    start = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            start[0] = time.process_time()
        else:
            totals[0] += time.process_time() - start[0]

    gc.callbacks.append(callback)
    try:
        yield
    finally:
        gc.callbacks.remove(callback)


def run_point(instances: int, requests: int, rate: float, repeats: int = 1, data_dir=None) -> dict:
    """Simulate one point; CPU seconds of the runs only (workload and cost model built before)."""
    from servelab.catalog.instance import InstanceSpec
    from servelab.cluster.presets import cluster_for
    from servelab.costmodel.options import CostOptions
    from servelab.simulator import Simulation
    from servelab.simulator.hardware import cost_for_spec
    from servelab.workloads.memory import run_shape
    from servelab.workloads.spec import parse_workload

    cost = cost_for_spec(InstanceSpec(GPU, MODEL), CostOptions())
    spec = workload_spec(instances, requests, rate)
    cpu_s = tokens = 0.0
    build_s, makespans, prints, num_requests, rss_before = 0.0, [], [], 0, 0.0
    gc_s = [0.0]
    for seed in range(repeats):
        t0 = time.process_time()
        with run_shape(instances=instances, summary=False):  # the memory guard: no summary is built here
            workload = parse_workload(spec, data_dir, seed)
        build_s += time.process_time() - t0
        rss_before = max(rss_before, peak_rss_gb())
        t0 = time.process_time()
        sim = Simulation(workload, cluster_for(POLICY, num_instances=instances, gpu=GPU, model=MODEL),
                         cost_model=cost)
        del workload
        with collector_time(gc_s):
            result = sim.run()
        cpu_s += time.process_time() - t0
        tokens += result.num_output_tokens
        num_requests += len(result.requests)
        makespans.append(result.makespan_s)
        if not result.conserved:
            raise RuntimeError(f"{instances} instances: {len(result.unfinished)} requests never ended")
        prints.append(fingerprint(result))
        del sim, result
    return {"instances": instances, "requests_per_instance": requests, "rate_per_instance": rate,
            "repeats": repeats, "workload": spec, "requests": num_requests, "output_tokens": int(tokens),
            "cpu_s": cpu_s, "gc_cpu_s": gc_s[0], "tokens_per_cpu_s": tokens / cpu_s, "workload_cpu_s": build_s,
            "makespan_s": makespans, "fingerprints": prints, "rss_gb_before_run": rss_before,
            "peak_rss_gb": peak_rss_gb(), "router": "round_robin" if instances == 1 else "least_loaded"}


def run(args) -> None:
    """``servelab perf scale``: one point, JSON on stdout."""
    print(json.dumps(run_point(args.instances, args.requests, args.rate, args.repeats, args.data_dir), indent=2))
