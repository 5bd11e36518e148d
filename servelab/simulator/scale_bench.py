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


def _point(instances: int, requests: int, rate: float, repeats: int, data_dir, cost) -> dict:
    """Simulate one point; CPU seconds of the runs only (workload and cost model built before)."""
    from servelab.cluster.presets import cluster_for
    from servelab.simulator import Simulation
    from servelab.workloads.memory import run_shape
    from servelab.workloads.spec import parse_workload

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
        # untimed: a finished simulation is freed by the cyclic collector (its driver, views and
        # instances refer to each other), and left to it the next run paid for that: a
        # one-instance run right after 96 instances spent 1.2 of its 2.2 CPU-s collecting them
        gc.collect()
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


def _cost():
    from servelab.catalog.instance import InstanceSpec
    from servelab.costmodel.options import CostOptions
    from servelab.simulator.hardware import cost_for_spec

    return cost_for_spec(InstanceSpec(GPU, MODEL), CostOptions())


def run_point(instances: int, requests: int, rate: float, repeats: int = 1, data_dir=None) -> dict:
    """Simulate one point; CPU seconds of the runs only (workload and cost model built before)."""
    return _point(instances, requests, rate, repeats, data_dir, _cost())


def bracketed_ratios(point_speeds: list[float], reference_speeds: list[float]) -> list[float]:
    """Each run's speed over the mean of the two one-instance runs around it (reference k and
    k + 1 bracket point run k): the machine's speed drifts over minutes on a shared host, and
    this divides it out of each ratio."""
    if len(reference_speeds) != len(point_speeds) + 1:
        raise ValueError(f"{len(point_speeds)} runs need {len(point_speeds) + 1} references around them, "
                         f"got {len(reference_speeds)}")
    return [p / ((a + b) / 2) for p, a, b in zip(point_speeds, reference_speeds, reference_speeds[1:])]


def run_with_reference(instances: int, requests: int, rate: float, rounds: int = 1, reference_repeats: int = 16,
                       data_dir=None) -> dict:
    """The point ``rounds`` times in this process, each run between two runs of the one-instance
    reference (``reference_repeats`` workloads of ``requests``, seeds 0..): reference, point,
    reference, point, ..., reference. The same process, allocator and neighbours for both, so
    the ratio to one instance is not one noisy point set against another process's. The row
    is the point's median run (by CPU-s); ``ratios`` holds every run's bracketed ratio and
    ``reference`` every reference run's speed."""
    cost = _cost()
    _point(1, requests, rate, 1, data_dir, cost)  # untimed: the first run in a process pays for lazy imports
    refs = [_point(1, requests, rate, reference_repeats, data_dir, cost)]
    runs = []
    for _ in range(rounds):
        runs.append(_point(instances, requests, rate, 1, data_dir, cost))
        refs.append(_point(1, requests, rate, reference_repeats, data_dir, cost))
    ratios = bracketed_ratios([r["tokens_per_cpu_s"] for r in runs], [r["tokens_per_cpu_s"] for r in refs])
    if any(r["fingerprints"] != refs[0]["fingerprints"] for r in refs) or \
            any(r["fingerprints"] != runs[0]["fingerprints"] for r in runs):
        raise RuntimeError("the same workload gave different results in one process")
    k = sorted(range(rounds), key=lambda i: runs[i]["cpu_s"])[(rounds - 1) // 2]
    return {**runs[k], "cpu_runs": [r["cpu_s"] for r in runs], "ratios": ratios,
            "reference": {"repeats": reference_repeats, "tokens_per_cpu_s": [r["tokens_per_cpu_s"] for r in refs],
                          "cpu_s": [r["cpu_s"] for r in refs], "fingerprints": refs[0]["fingerprints"]},
            "peak_rss_gb": peak_rss_gb()}


def run(args) -> None:
    """``servelab perf scale``: one point, JSON on stdout (with ``reference_rounds``, the point
    that many times between one-instance reference runs, ``run_with_reference``)."""
    from servelab.simulator import hugepage_arenas

    hugepage_arenas.install()  # before anything is simulated: every run of this process alike
    rounds = getattr(args, "reference_rounds", 0)
    if rounds:
        out = run_with_reference(args.instances, args.requests, args.rate, rounds,
                                 getattr(args, "reference_repeats", 16), args.data_dir)
    else:
        out = run_point(args.instances, args.requests, args.rate, args.repeats, args.data_dir)
    out["hugepage_arenas"] = hugepage_arenas.why_not or "yes"
    print(json.dumps(out, indent=2))
