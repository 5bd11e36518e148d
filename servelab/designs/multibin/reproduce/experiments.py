"""The experiments behind ``servelab reproduce multibin``: one function per paper figure, data only.

Figures 3, 4 and 8 (pure service-time queueing) run on the batch-level queue simulator
(``servelab.designs.multibin.queue_sim``); Figures 6 and 7 use GSM8K output lengths (tokenised
reference answers) and the linear tokens-to-time model, Figure 7 also on the token-level
simulator (``multibin`` policy, ``LinearStepCost``). Every sweep uses common random numbers:
for one seed and rate, every k sees the same arrivals and service times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from servelab.designs.multibin.binning import BinEdges, exponential_edges, quantile_edges, uniform_edges
from servelab.designs.multibin.theory import (expected_latency_uniform, expected_service_numeric,
                                               exponential_throughput_bound, throughput_uniform)
from servelab.designs.multibin.queue_sim import simulate_batches
from servelab.designs.multibin.service_dists import EmpiricalService, ExponentialService, UniformService
from servelab.designs.multibin.service_models import LinearServiceModel, LinearStepCost
from servelab.core.request import RequestSpec
from servelab.workloads.arrivals import PoissonArrivals


@dataclass(frozen=True)
class SweepResult:
    ks: tuple[int, ...]
    rates: tuple[float, ...]
    throughput: np.ndarray  # [k, rate], mean over seeds
    throughput_std: np.ndarray
    latency: np.ndarray  # [k, rate]
    latency_std: np.ndarray
    full_batch_throughput: np.ndarray  # [k, rate]: B / mean service time of full batches


def rate_sweep(dist, edges_for_k, ks: Sequence[int], rates: Sequence[float], *, batch_size: int, num_requests: int,
               seeds: Sequence[int], num_servers: int | None = 1, to_time=None) -> SweepResult:
    """Mean throughput (requests / makespan) and latency over seeds for every (k, arrival rate)."""
    thr = np.zeros((len(ks), len(rates), len(seeds)))
    lat = np.zeros_like(thr)
    full = np.zeros_like(thr)
    edges = [edges_for_k(k) for k in ks]
    for si, seed in enumerate(seeds):
        for ri, rate in enumerate(rates):
            rng = np.random.default_rng((seed, ri))
            arrivals = PoissonArrivals(rate).sample(num_requests, rng)
            values = dist.sample(num_requests, rng)
            service = values if to_time is None else to_time(values)
            for ki, e in enumerate(edges):
                res = simulate_batches(service, values, arrivals, e, batch_size, num_servers=num_servers)
                thr[ki, ri, si], lat[ki, ri, si] = res.throughput_per_s, res.mean_latency_s
                full[ki, ri, si] = res.full_batch_throughput_per_s
    return SweepResult(tuple(ks), tuple(rates), thr.mean(-1), thr.std(-1), lat.mean(-1), lat.std(-1), full.mean(-1))


def figure3(*, lmin=1.0, lmax=20.0, batch_size=128, ks=(1, 2, 3, 4, 5), rates=None, num_requests=128_000,
            seeds=range(10), saturation_factor=5.0) -> dict:
    """Uniform service: throughput vs arrival rate, and the saturated throughput against Theorem 4.2."""
    dist = UniformService(lmin, lmax)
    c_max = batch_size / dist.mean
    rates = tuple(rates or (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 16))
    sweep = rate_sweep(dist, lambda k: uniform_edges(lmin, lmax, k), ks, rates, batch_size=batch_size,
                       num_requests=num_requests, seeds=list(seeds))
    sat = rate_sweep(dist, lambda k: uniform_edges(lmin, lmax, k), ks, (saturation_factor * c_max,),
                     batch_size=batch_size, num_requests=num_requests, seeds=list(seeds))
    theory = np.array([throughput_uniform(k, batch_size, lmin, lmax) for k in ks])
    return {"sweep": sweep, "saturated": sat.throughput[:, 0], "saturated_std": sat.throughput_std[:, 0],
            "saturation_rate": saturation_factor * c_max, "theory": theory, "c_max": c_max,
            "rel_err": sat.throughput[:, 0] / theory - 1, "full_batch": sat.full_batch_throughput[:, 0]}


def figure4(*, lmin=1.0, lmax=20.0, batch_size=128, ks=(1, 2, 3), rates=None, num_requests=128_000,
            seeds=range(10)) -> dict:
    """Uniform service: latency vs arrival rate (one server and infinite servers) against Lemma 5.1."""
    dist = UniformService(lmin, lmax)
    rates = tuple(rates or (0.25, 0.5, 1, 1.5, 2, 3, 4, 5, 6))
    kw = dict(batch_size=batch_size, num_requests=num_requests, seeds=list(seeds))
    one = rate_sweep(dist, lambda k: uniform_edges(lmin, lmax, k), ks, rates, num_servers=1, **kw)
    inf = rate_sweep(dist, lambda k: uniform_edges(lmin, lmax, k), ks, rates, num_servers=None, **kw)
    theory = np.array([[expected_latency_uniform(k, batch_size, lmin, lmax, r) for r in rates] for k in ks])
    return {"one_server": one, "infinite": inf, "theory": theory}


def figure8(*, mu=0.1, batch_size=200, ks=(1, 2, 3, 4, 5, 6), rates=None, num_requests=200_000, seeds=range(10),
            saturation_factor=3.0) -> dict:
    """Exponential service, Lemma A.1 boundaries: throughput and latency vs rate and k."""
    dist = ExponentialService(mu)
    c_max = batch_size * mu
    rates = tuple(rates or (1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 18))
    edges_for_k = lambda k: exponential_edges(mu, batch_size, k)  # noqa: E731
    kw = dict(batch_size=batch_size, num_requests=num_requests, seeds=list(seeds))
    sweep = rate_sweep(dist, edges_for_k, ks, rates, **kw)
    sat = rate_sweep(dist, edges_for_k, ks, (saturation_factor * c_max,), **kw)
    bound = np.array([exponential_throughput_bound(k, batch_size, mu) for k in ks])
    exact = np.array([batch_size / expected_service_numeric(edges_for_k(k), dist, batch_size) for k in ks])
    return {"sweep": sweep, "saturated": sat.throughput[:, 0], "bound": bound, "exact": exact, "c_max": c_max,
            "rel_err_exact": sat.throughput[:, 0] / exact - 1, "full_batch": sat.full_batch_throughput[:, 0]}


def figure6(output_tokens: np.ndarray, model: LinearServiceModel, *, batch_size=8, num_servers=8,
            ks=(1, 2, 4, 8, 16), rates=None, num_requests=20_000, seeds=range(3)) -> dict:
    """GSM8K lengths, linear service time, 8 servers: throughput and latency vs arrival rate."""
    dist = EmpiricalService(output_tokens)
    rates = tuple(rates or (2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26))
    sweep = rate_sweep(dist, lambda k: quantile_edges(output_tokens, k), ks, rates, batch_size=batch_size,
                       num_requests=num_requests, seeds=list(seeds), num_servers=num_servers,
                       to_time=model.request_time_s)
    return {"sweep": sweep, "model": model}


def burst_throughput(output_tokens: np.ndarray, estimates: np.ndarray, edges: BinEdges, model: LinearServiceModel,
                     batch_size: int) -> float:
    """Figure 7 on the queue simulator: everything at t=0, one server; output tokens per second."""
    n = len(output_tokens)
    res = simulate_batches(model.request_time_s(output_tokens), estimates, np.zeros(n), edges, batch_size)
    return float(np.sum(output_tokens)) / res.makespan_s


def burst_throughput_token_level(specs: Sequence[RequestSpec], edges: BinEdges, model: LinearServiceModel,
                                 batch_size: int) -> float:
    """Figure 7 on the token-level simulator: ``multibin`` policy, padded steps, ``LinearStepCost``."""
    from servelab.cluster.config import single_instance
    from servelab.simulator import simulate

    params = dict(batch_size=batch_size, num_bins=edges.num_bins, boundaries="explicit", edges=edges.inner,
                  max_wait_s=1e-6)  # leftovers leave once every arrival (all at t=0) is binned
    result = simulate(specs, single_instance("multibin", policy_params=params, max_num_seqs=max(batch_size, 8)),
                      cost_model=LinearStepCost.from_linear(model))
    if not result.conserved or any(r.status.name != "FINISHED" for r in result.requests):
        raise RuntimeError("token-level Figure 7 run left requests unfinished")
    return result.num_output_tokens / result.makespan_s


def figure7(output_tokens: np.ndarray, model: LinearServiceModel, *, batch_size=8, ks=(1, 2, 4, 8, 16, 32),
            max_tokens=1024, token_level_requests: int | None = None, estimates: dict | None = None,
            seed=0) -> dict:
    """All requests at t=0, one server, B=8, oracle bins: tokens/s vs k (queue sim, token-level sim)."""
    order = np.random.default_rng(seed).permutation(len(output_tokens))
    tokens = np.minimum(np.asarray(output_tokens)[order], max_tokens)
    edges = {k: quantile_edges(tokens, k) for k in ks}
    fast = np.array([burst_throughput(tokens, tokens, edges[k], model, batch_size) for k in ks])
    sub = tokens[:token_level_requests] if token_level_requests else tokens
    specs = [RequestSpec(i, 0.0, 16, int(t)) for i, t in enumerate(sub)]
    token = np.array([burst_throughput_token_level(specs, edges[k], model, batch_size) for k in ks])
    sub_fast = np.array([burst_throughput(sub, sub, edges[k], model, batch_size) for k in ks])
    noisy = {}
    for name, est in (estimates or {}).items():  # estimates aligned with output_tokens, permuted the same way
        est_perm = np.asarray(est)[order]
        noisy[name] = np.array([burst_throughput(tokens, est_perm, quantile_edges(est_perm, k), model, batch_size)
                                for k in ks])
    return {"ks": tuple(ks), "fast": fast, "token_level": token, "fast_same_subset": sub_fast,
            "num_token_level": len(sub), "estimated": noisy}

def crosscheck_token_level(*, num_requests=600, rate=0.8, batch_size=16, num_bins=3, lmin=1.0, lmax=20.0,
                           per_token_s=0.1, max_wait_s=50.0, seed=0) -> list[dict]:
    """Same trace through the queue simulator and the token-level simulator (1 server: ``multibin``
    policy; 2 servers: ``multibin`` router + ``multibin_replica``). Service U(lmin, lmax) is
    rounded to whole tokens of ``per_token_s`` each, so both paths see identical batch times."""
    from servelab.cluster.config import ClusterConfig, InstanceGroup, single_instance
    from servelab.simulator import simulate

    rng = np.random.default_rng(seed)
    arrivals = PoissonArrivals(rate).sample(num_requests, rng)
    tokens = np.maximum(np.rint(UniformService(lmin, lmax).sample(num_requests, rng) / per_token_s), 1).astype(int)
    model = LinearServiceModel(0.0, per_token_s)
    edges = uniform_edges(lmin / per_token_s, lmax / per_token_s, num_bins)
    specs = [RequestSpec(i, float(a), 8, int(t)) for i, (a, t) in enumerate(zip(arrivals, tokens))]
    params = dict(batch_size=batch_size, num_bins=num_bins, boundaries="explicit", edges=edges.inner,
                  max_wait_s=max_wait_s)
    clusters = {1: single_instance("multibin", policy_params=params),
                2: ClusterConfig(groups=(InstanceGroup(count=2, policy="multibin_replica"),), router="multibin",
                                 router_params=params)}
    rows = []
    for servers, cluster in clusters.items():
        fast = simulate_batches(model.request_time_s(tokens), tokens, arrivals, edges, batch_size,
                                num_servers=servers, max_wait_s=max_wait_s)
        res = simulate(specs, cluster, cost_model=LinearStepCost.from_linear(model))
        finished = [r for r in res.requests if r.status.name == "FINISHED"]
        token_latency = float(np.mean([r.finish_time_s - r.arrival_time_s for r in finished]))
        rows.append({"servers": servers, "fast_throughput": fast.throughput_per_s,
                     "token_throughput": len(finished) / res.makespan_s, "fast_latency": fast.mean_latency_s,
                     "token_latency": token_latency, "num_finished": len(finished), "num_requests": num_requests})
    return rows
