"""DynaServe's evaluation setting (Sec. 6.1) in the simulator, and one run of one system.

Hardware: servers of 4 x A100-80GB; NVLink inside a server (the catalog's A100 figure
scaled by the efficiency fitted to the measured A100 send/recv profile), one 200 Gb/s RoCE
NIC per GPU between servers. Models Qwen-2.5-14B / 32B / 72B at TP 1 / 2 / 4; every system
gets two instances of that TP (2, 4 or 8 GPUs), filled into servers in order, so the 72B
pair talks over the network and the others over NVLink.

Systems (the paper's deployment is the main configuration):

* ``coloc`` (PD colocation, vLLM chunked prefill): ``sarathi`` on both instances (DP=2),
  token budget = the chunk, routed round-robin as in the paper's Sec. 2.4
  (``coloc_router="least_loaded"`` is the variant measured beside it);
* ``disagg`` (PD disaggregation, 1P1D): the ``distserve`` router with ``vllm`` on a prefill
  and a decode instance, KV handed over after the first token;
* ``dynaserve``: the ``dynaserve`` router and local scheduler on both instances, with
  ``PAPER_DYNASERVE``: one alpha and one beta GPU (Sec. 6.1: "1 GPU each for alpha and beta
  in 14B"; ``pairing=fixed``), every split's KV streamed in chunks (Sec. 4.3, decode-phase
  splits included), steps planned to the SLO itself (no headroom), Algorithm 2 counting
  chunk tokens only (no context charge), and Algorithm 2's per-request chunk ``c`` = 2048:
  the paper's text lost c's value, and 2048 is the chunk of the vLLM 0.7.2 it builds on
  (its Sec. 2.4); a parameter (``max_chunk``). servelab's additions (load-based pairing,
  10% headroom, the context charge, bulk copies for decode-phase splits) are the named
  variants of ``DYNASERVE_VARIANTS``, each measured against it.

Workloads: Poisson arrivals, lengths sampled from the data (``azure-code``; ``burstgpt`` is
the Azure 2023 conversation trace standing in for BurstGPT, whose file is not in the shared
data; ``arxiv``; ``mini-reasoning`` fixed at P219 / D1467, the shape the paper gives; and
``hybrid``, half each of the first two). Output lengths are predicted with an additive
N(0, ``prediction_sigma``) error (the paper's predictor is within a few tens of tokens for
95% of requests; the sensitivity study varies it).

Step times come from the simulator's default cost model of the A100-80GB: the profile-driven
model (Vidur's measured A100 operator tables and the measured per-step CPU overhead of vLLM,
docs/costmodel.md); ``Setting.cost`` changes it (the gap test turns the overhead off). Simulated
numbers, not measurements. The same kernels cost the same for every system.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servelab.cluster.config import ClusterConfig, InstanceGroup
from servelab.cluster.links import TopologyConfig
from servelab.core.request import RequestSpec
from servelab.costmodel.links import LinkSpec
from servelab.designs.dynaserve import metrics as dm
from servelab.designs.dynaserve.reproduce.timing import TimedRouter, time_schedules
from servelab.estimators.base import with_predictions
from servelab.estimators.oracle import NoisyOracleConfig, NoisyOracleEstimator
from servelab.metrics.request_metrics import RequestTable
from servelab.paths import default_data_dir
from servelab.simulator import Simulation
from servelab.workloads.spec import parse_workload

GPU = "A100-80GB"
MODELS = {"14B": ("Qwen-2.5-14B", 1), "32B": ("Qwen-2.5-32B", 2), "72B": ("Qwen-2.5-72B", 4)}
LENGTHS = {
    "azure-code": "lengths=azure-code",
    "burstgpt": "lengths=azure-conv",
    "arxiv": "lengths=arxiv",
    "mini-reasoning": "prompt=fixed(219),output=fixed(1467)",
    "hybrid": "lengths=mix(azure-conv:0.5,azure-code:0.5)",
}
SYSTEMS = ("coloc", "disagg", "dynaserve")
CHUNKS = (256, 512, 1024, 2048)  # the colocation chunk is tuned over these per workload
PAPER_C = 2048  # Algorithm 2's c (lost from the paper's text): vLLM 0.7.2's default chunk
PAPER_DYNASERVE = {"pairing": "fixed", "stream_decode_splits": True, "headroom": 0.0, "context_charge": False,
                   "max_chunk": PAPER_C}
# servelab's additions: each alone on the paper's deployment, all together (the defaults of the dynaserve
# preset), and the defaults without each one; name -> (parameters, the configuration it is compared with)
SERVELAB_DEFAULTS = {"pairing": "load", "headroom": 0.1, "context_charge": True, "stream_decode_splits": False,
                     "max_chunk": None}
_ADDITIONS = {"load pairing": {"pairing": "load"}, "10% headroom": {"headroom": 0.1},
              "context charge": {"context_charge": True}, "bulk decode splits": {"stream_decode_splits": False}}
DYNASERVE_VARIANTS = {
    **{name: (params, "paper") for name, params in _ADDITIONS.items()},
    "servelab defaults": (SERVELAB_DEFAULTS, "paper"),
    **{f"defaults without {name}": ({**SERVELAB_DEFAULTS, **{k: PAPER_DYNASERVE[k] for k in params}},
                                    "servelab defaults") for name, params in _ADDITIONS.items()},
}


@dataclass(frozen=True)
class Setting:
    gpus_per_server: int = 4
    network_bytes_per_s: float = 200e9 / 8  # one 200 Gb/s RoCE NIC per GPU
    network_latency_s: float = 10e-6
    max_batch_tokens: int = 8192
    max_num_seqs: int = 256
    tbt_slo_s: float = 0.1
    max_delay_s: float = 2.0  # capacity: scheduling delay bound (Sarathi-Serve: on the median)
    delay_rule: str = "median"  # the bound's statistic: median (Sarathi-Serve's, the paper's) or p99
    prediction_sigma: float = 10.0
    cpu_overhead: str | None = None  # the cost model's per-step overhead (None: measured; "off": the gap test)
    coloc_router: str = "round_robin"  # the paper's Sec. 2.4
    dynaserve: dict = field(default_factory=lambda: dict(PAPER_DYNASERVE))  # preset parameters (variants)
    # the colocation gap test's slower engine: every step x step_scale + step_delta_s (coloc_gap.py)
    step_scale: float = 1.0
    step_delta_s: float = 0.0

    @property
    def cost(self):
        from servelab.costmodel.options import CostOptions

        return CostOptions(cpu_overhead=self.cpu_overhead)

    def cost_for(self, model_key: str):
        """What the simulator gets: the options, or the adjusted model of this model's instance."""
        if self.step_scale == 1.0 and self.step_delta_s == 0.0:
            return self.cost
        from servelab.catalog.instance import InstanceSpec
        from servelab.costmodel.build import build_cost_model
        from servelab.designs.dynaserve.reproduce.adjusted_cost import AdjustedCost

        model, tp = MODELS[model_key]
        return AdjustedCost(build_cost_model(InstanceSpec(GPU, model, tp=tp), self.cost), scale=self.step_scale,
                            delta_s=self.step_delta_s)

    def topology(self) -> TopologyConfig:
        return TopologyConfig(gpus_per_server=self.gpus_per_server,
                              inter_link=LinkSpec(self.network_bytes_per_s, self.network_latency_s))


def cluster(system: str, model_key: str, setting: Setting, *, chunk: int = 2048, **dyna: Any) -> ClusterConfig:
    model, tp = MODELS[model_key]
    common = dict(gpu=GPU, model=model, tp=tp, max_batch_tokens=setting.max_batch_tokens,
                  max_num_seqs=setting.max_num_seqs)
    topo = setting.topology()
    if system == "coloc":
        return ClusterConfig(groups=(InstanceGroup(count=2, policy="sarathi", policy_params={"token_budget": chunk},
                                                   **common),), router=setting.coloc_router, topology=topo)
    if system == "disagg":
        return ClusterConfig(groups=(InstanceGroup(role="prefill", policy="vllm", **common),
                                     InstanceGroup(role="decode", policy="vllm", **common)),
                             router="distserve", topology=topo)
    if system == "dynaserve":
        params = {"tbt_slo_s": setting.tbt_slo_s, **setting.dynaserve, **dyna}
        router_keys = {f.name for f in dataclasses.fields(_router_config())}
        policy = {k: v for k, v in params.items() if k not in router_keys or k in ("tbt_slo_s", "headroom")}
        router = {k: v for k, v in params.items() if k in router_keys}
        return ClusterConfig(groups=(InstanceGroup(count=2, policy="dynaserve", policy_params=policy, **common),),
                             router="dynaserve", router_params=router, topology=topo)
    raise ValueError(f"unknown system {system!r}; expected one of {SYSTEMS}")


def model_speed(model_key: str) -> float:
    """How much faster than the 14B instance this model's instance prefills (rates scale by it)."""
    from servelab.catalog.instance import InstanceSpec
    from servelab.core.plan import StepShape
    from servelab.costmodel.build import build_cost_model

    shape = StepShape(prefill_tokens=(2048,), prefill_context=(2048,))

    def t(key: str) -> float:
        model, tp = MODELS[key]
        return build_cost_model(InstanceSpec(GPU, model, tp=tp)).step_time_s(shape)

    return t("14B") / t(model_key)


def _router_config():
    from servelab.designs.dynaserve.router import DynaServeRouterConfig

    return DynaServeRouterConfig


def num_requests(rate: float, sizes_n: int, duration_s: float, cap: int) -> int:
    """Requests for a run at ``rate``: at least ``sizes_n``, and enough to span ``duration_s``
    of arrivals (long decodes need several lifetimes to reach a steady state), at most ``cap``."""
    return int(min(max(sizes_n, round(rate * duration_s)), cap))


def workload(name: str, rate: float, n: int, seed: int, setting: Setting, *,
             fixed_prediction: int | None = None, output_sigma: float | None = None) -> list[RequestSpec]:
    """Poisson arrivals at ``rate``; ``output_sigma`` draws outputs N(mean, sigma) around the
    fixed shape and ``fixed_prediction`` makes every prediction that value (Table 4)."""
    specs = parse_workload(f"poisson:rate={rate},n={n},{LENGTHS[name]}", default_data_dir(), seed)
    if output_sigma:
        rng = np.random.default_rng((seed, 4))
        specs = [dataclasses.replace(s, num_output_tokens=max(1, int(round(s.num_output_tokens
                                                                          + output_sigma * rng.standard_normal()))))
                 for s in specs]
    if fixed_prediction is not None:
        return [dataclasses.replace(s, predicted_output_tokens=fixed_prediction) for s in specs]
    noisy = NoisyOracleEstimator(NoisyOracleConfig("additive", setting.prediction_sigma, seed))
    return with_predictions(specs, noisy)


def run(system: str, specs: list[RequestSpec], model_key: str, setting: Setting, *, chunk: int = 2048,
        detail: bool = False, saturated: bool = False, steps: bool = False, **dyna: Any) -> dict:
    """One simulation; returns the TBT outcome and throughputs (and with ``detail``
    utilisation, over the saturated window with ``saturated``, decisions, scheduler times
    and transfers; with ``steps`` every step recorded on its own, as ``row["steps"]``)."""
    sim = Simulation(specs, cluster(system, model_key, setting, chunk=chunk, **dyna),
                     cost_model=setting.cost_for(model_key), fast_forward=not steps)
    timed, plan_s = None, None
    if system == "dynaserve" and detail:  # the scheduler times (capacity probes time the router alone)
        timed = TimedRouter(sim.driver.router)
        sim.driver.router = timed
        plan_s = time_schedules(sim.instances)
    t0 = time.process_time()
    res = sim.run()
    cpu = time.process_time() - t0
    if not res.conserved:
        raise RuntimeError(f"{system}: requests left unfinished: {res.unfinished[:10]}")
    table = RequestTable.from_requests(res.requests)
    outcome = dm.tbt_outcome(table, setting.tbt_slo_s)
    row: dict[str, Any] = {"system": system, "model": model_key, "chunk": chunk if system == "coloc" else None,
                           "num_requests": len(specs), "cpu_s": cpu, **outcome.to_dict(),
                           "passes_capacity": dm.capacity_pass(outcome, max_delay_s=setting.max_delay_s,
                                                               delay_rule=setting.delay_rule),
                           **{f"passes_{rule}": dm.capacity_pass(outcome, max_delay_s=setting.max_delay_s,
                                                                 delay_rule=rule) for rule in dm.DELAY_RULES}}
    row["saturated_rps"] = dm.saturated_throughput(table)
    row["bottleneck_rps"] = dm.bottleneck_throughput(len(specs), res.busy_s)
    if steps:
        row["steps"] = res.collector.steps
    if detail:
        window = dm.saturated_window(table) if saturated else None
        row["instances"] = dm.instance_utilization(res.collector, sim.peak_flops, outcome.duration_s, window)
        row["table"] = table
        if timed is not None:
            row.update(_dynaserve_detail(sim, timed, res), schedule_us=np.array(plan_s) * 1e6)
    if system == "dynaserve":
        row["router_report"] = res.router_report
        row["mixed_steps"] = [r["mixed_steps"] for r in res.policy_reports.values() if "mixed_steps" in r]
    return row


def _dynaserve_detail(sim: Simulation, timed: TimedRouter, res) -> dict:
    router = timed.inner
    d = np.array(router.decisions, dtype=np.int64).reshape(-1, 4)
    prompt, total, split = d[:, 1], d[:, 2], d[:, 3]
    gaps = dm.non_overlapped_transfer_s(dm.handoff_times(res.policy_reports), router.landed_s)
    return {"decision_us": np.array(timed.decision_s) * 1e6, "resync_us": np.array(timed.feedback_s) * 1e6,
            "queue_at_decision": np.array(timed.queue_sizes), "split_kinds": split_kinds(prompt, total, split),
            "decode_share_alpha": _decode_share(prompt, total, split), "non_overlapped_s": gaps,
            "num_transfers": len(res.transfers)}


def split_kinds(prompt: np.ndarray, total: np.ndarray, split: np.ndarray) -> dict[str, float]:
    n = max(len(split), 1)
    return {"whole_on_beta": float(np.sum(split == 0) / n), "whole_on_alpha": float(np.sum(split >= total) / n),
            "inside_prefill": float(np.sum((split > 0) & (split < prompt)) / n),
            "at_prompt_end": float(np.sum(split == prompt) / n),
            "inside_decode": float(np.sum((split > prompt) & (split < total)) / n)}


def _decode_share(prompt: np.ndarray, total: np.ndarray, split: np.ndarray) -> float:
    """Mean share of the (predicted) decode tokens that alpha computes, over split requests."""
    mask = (split > 0) & (split < total)
    if not mask.any():
        return float("nan")
    share = np.clip(split[mask] - prompt[mask], 0, None) / np.maximum(total[mask] - prompt[mask], 1)
    return float(share.mean())
