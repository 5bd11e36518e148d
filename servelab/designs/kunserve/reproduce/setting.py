"""The paper's setting, as the simulator runs it.

Clusters (the paper's Table 2): A is 8 servers with one A800-80GB each on 200 Gb/s RDMA and
no NVLink, Qwen-2.5-14B at one GPU per instance; B is 2 servers of 8 H800-80GB (NVLink
300 GB/s inside, 400 Gb/s RDMA between), Qwen-2.5-72B at TP 4 (4 instances). Links are the
nominal figures, per GPU, widened by the GPUs of an instance (``Topology``).

Arrivals: the BurstGPT trace is not in ``../shared/data``, so arrivals are the Azure LLM
2023 conversation trace's timestamps, rescaled to a base rate (pattern kept), with the
BurstGPT-like spikes the paper shows (the rate doubles for a minute) made by replaying each
arrival inside a burst window twice. Lengths are lognormal with the paper's means (drawn,
then scaled so the sample mean matches): BurstGPT-like 642 / 262, ShareGPT-like 1,660 / 373
(inputs at most 4K), LongBench-like 5.9K / 499.

Operating points are chosen and *checked* for the paper's premise (``premise``): on a grid
of base rates, the highest at which vLLM serves promptly before the burst (P50 TTFT under
1 s) and is memory-throttled in it; where no grid rate does both, the highest prompt one
(the nearest point), with the check saying the premise fails. Every system runs with the
cluster's token budget (512 on A, 2,048 for 72B TP 4 on B).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from servelab.cluster.config import ClusterConfig
from servelab.cluster.links import TopologyConfig
from servelab.cluster.presets import cluster_for
from servelab.core.request import RequestSpec
from servelab.costmodel.links import LinkSpec


@dataclass(frozen=True)
class Hardware:
    name: str
    gpu: str
    model: str
    tp: int
    num_instances: int
    gpus_per_server: int
    nvlink: bool
    inter_gbps: float
    intra_gbs: float | None = None
    memory_reserve_fraction: float = 0.1  # of GPU memory kept out of weights and KV (tests shrink the KV)
    token_budget: int = 512  # every system's chunked-prefill step budget on this cluster (the same for all)

    @property
    def label(self) -> str:
        return f"{self.model} TP{self.tp} x {self.num_instances} on {self.gpu} (cluster {self.name})"


CLUSTER_A = Hardware("A", "A800-80GB", "Qwen-2.5-14B", 1, 8, 1, False, 200.0)
# 72B at TP 4: a 512-token step leaves the four GPUs' compute mostly idle (every system is then
# compute-bound by its step size); 2,048 is the budget at which TP-4 steps are compute-efficient
CLUSTER_B = Hardware("B", "H800-80GB", "Qwen-2.5-72B", 4, 4, 8, True, 400.0, 300.0, token_budget=2048)


@dataclass(frozen=True)
class Lengths:
    name: str
    mean_in: float
    mean_out: float
    sigma: float
    max_in: int
    max_out: int = 2048


LENGTHS = {
    "burstgpt": Lengths("burstgpt", 642, 262, 1.0, 8192),
    "sharegpt": Lengths("sharegpt", 1660, 373, 0.8, 4096),
    "longbench": Lengths("longbench", 5900, 499, 0.5, 16384),
    # not in the paper: a gap test's workload whose KV outgrows memory while decode leaves compute idle
    "decode-heavy": Lengths("decode-heavy", 1000, 1500, 0.5, 4096, 4096),
}

SYSTEMS = {  # name -> cluster spec; every system schedules with chunked prefill (the cluster's budget)
    "vllm": "kunserve:drop=false",  # vLLM 0.6.3 DP: chunked prefill, recompute, Llumnix's dispatch (as all)
    "vllm-pp": "vllm-pp",
    "infercept": "infercept",
    "llumnix": "llumnix",
    "kunserve": "kunserve",
}
BASELINES = ("vllm", "vllm-pp", "infercept", "llumnix")


def token_budget(hw: Hardware) -> int:
    return hw.token_budget


def with_budget(system_spec: str, hw: Hardware) -> str:
    """``system_spec`` with the cluster's token budget, unless the spec sets one."""
    if "token_budget=" in system_spec:
        return system_spec
    return system_spec + ("," if ":" in system_spec else ":") + f"token_budget={hw.token_budget}"


def cluster(system_spec: str, hw: Hardware) -> ClusterConfig:
    c = cluster_for(with_budget(system_spec, hw), num_instances=hw.num_instances, gpu=hw.gpu, model=hw.model, tp=hw.tp,
                    memory_reserve_fraction=hw.memory_reserve_fraction)
    intra = LinkSpec(hw.intra_gbs * 1e9, 10e-6) if hw.intra_gbs else None
    topo = TopologyConfig(gpus_per_server=hw.gpus_per_server, nvlink=hw.nvlink, intra_link=intra,
                          inter_link=LinkSpec(hw.inter_gbps / 8 * 1e9, 10e-6))
    return replace(c, link=None, topology=topo)


def _lognormal(rng: np.random.Generator, n: int, mean: float, sigma: float, cap: int) -> np.ndarray:
    z = np.exp(sigma * rng.standard_normal(n))
    scale = mean / np.mean(z)
    for _ in range(6):  # clipping at the cap lowers the mean: scale up until it matches
        vals = np.clip(np.round(z * scale), 1, cap)
        scale *= mean / max(np.mean(vals), 1.0)
    return np.clip(np.round(z * scale), 1, cap).astype(int)


def trace_arrivals(duration_s: float, rate: float, seed: int) -> np.ndarray:
    """Azure conversation timestamps over ``duration_s`` at mean ``rate`` (pattern kept)."""
    from servelab.api import load_workload

    span = 1200.0
    specs = load_workload(f"azure-conv:window=0-{span:g}", seed=seed)
    t = np.array(sorted(s.arrival_time_s for s in specs))
    t = t * (len(t) / span) / rate  # rescale the gaps to the mean rate
    while t[-1] < duration_s:
        t = np.concatenate([t, t + t[-1] + 1.0 / rate])
    return t[t < duration_s]


def with_bursts(t: np.ndarray, bursts: Sequence[tuple[float, float]], factor: int = 2) -> np.ndarray:
    """Each arrival in a burst window is replayed ``factor`` times (spread over its gap)."""
    out = [t]
    gaps = np.diff(t, append=t[-1] + (t[-1] - t[0]) / max(len(t) - 1, 1))
    for a, b in bursts:
        sel = (t >= a) & (t < b)
        for k in range(1, factor):
            out.append(t[sel] + gaps[sel] * k / factor)
    return np.sort(np.concatenate(out))


def with_load(t: np.ndarray, load: Sequence[tuple[float, float]], seed: int) -> np.ndarray:
    """Thin arrivals to a rate multiplier from each ``(from_s, multiplier <= 1)`` on (the last
    segment that has started applies): a lower-load tail after a burst, where demand can fall
    below restore's threshold. Each arrival is kept with the multiplier's probability."""
    if not load:
        return t
    keep = np.ones(len(t))
    for start, mult in sorted(load):
        if not 0 < mult <= 1:
            raise ValueError(f"load multiplier must be in (0, 1], got {mult}")
        keep[t >= start] = mult
    u = np.random.default_rng(seed + 29).random(len(t))
    return t[u < keep]


def workload(lengths: str, rate: float, duration_s: float, bursts: Sequence[tuple[float, float]], seed: int,
             factor: int = 2, load: Sequence[tuple[float, float]] = ()) -> list[RequestSpec]:
    ln = LENGTHS[lengths]
    t = with_bursts(with_load(trace_arrivals(duration_s, rate, seed), load, seed), bursts, factor)
    rng = np.random.default_rng(seed + 17)
    p = _lognormal(rng, len(t), ln.mean_in, ln.sigma, ln.max_in)
    o = _lognormal(rng, len(t), ln.mean_out, ln.sigma, ln.max_out)
    return [RequestSpec(i, float(ti), int(pi), int(oi)) for i, (ti, pi, oi) in enumerate(zip(t, p, o))]
