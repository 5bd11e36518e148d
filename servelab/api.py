"""Python API that mirrors the CLI: simulate, sweep, capacity. No torch imported.

Each call takes explicit arguments (no global state) and returns plain dataclasses whose
``to_dict`` is JSON-safe, so the CLI's ``--json`` output and a notebook see the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from servelab.cluster.config import ClusterConfig, default_link
from servelab.cluster.presets import cluster_for
from servelab.core.request import SLO, RequestSpec
from servelab.costmodel.links import LinkSpec
from servelab.metrics import RequestTable, RunSummary, capacity_search, summarize
from servelab.metrics.capacity import CapacityResult
from servelab.paths import default_data_dir
from servelab.simulator import SimResult, simulate

DEFAULT_DATA_DIR = default_data_dir()


@dataclass(frozen=True)
class HardwareChoice:
    """The per-instance hardware of a simulated cluster."""

    num_instances: int = 1
    gpu: str = "A100-80GB"
    model: str = "Llama-2-7B"
    tp: int = 1
    pp: int = 1
    max_num_seqs: int = 256
    max_batch_tokens: int = 8192
    link: LinkSpec = field(default_factory=default_link)

    def cluster(self, policy_spec: str) -> ClusterConfig:
        return cluster_for(policy_spec, num_instances=self.num_instances, link=self.link, gpu=self.gpu,
                           model=self.model, tp=self.tp, pp=self.pp, max_num_seqs=self.max_num_seqs,
                           max_batch_tokens=self.max_batch_tokens)


@dataclass
class SimulationOutput:
    policy: str
    summary: RunSummary
    result: SimResult
    wall_s: float
    cpu_s: float

    @property
    def simulated_tokens_per_cpu_s(self) -> float:
        return self.result.num_output_tokens / self.cpu_s if self.cpu_s > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "wall_s": self.wall_s, "cpu_s": self.cpu_s,
                "simulated_tokens_per_cpu_s": self.simulated_tokens_per_cpu_s,
                "conserved": self.result.conserved, **self.summary.to_dict(),
                "policy_reports": {str(k): v for k, v in self.result.policy_reports.items()}}


def load_workload(spec: str, *, data_dir: Path | str = DEFAULT_DATA_DIR, seed: int = 0) -> list[RequestSpec]:
    from servelab.workloads.spec import parse_workload

    return parse_workload(spec, Path(data_dir), seed)


def run_simulation(workload: Sequence[RequestSpec], policy: str, hardware: HardwareChoice = HardwareChoice(), *,
                   cluster: ClusterConfig | None = None, slo: SLO | None = None, cost_model: Any = None,
                   progress: Callable[[float], None] | None = None) -> SimulationOutput:
    """Simulate ``workload`` under ``policy`` (``name[:k=v,...]`` or a preset such as ``distserve``)."""
    import time

    cluster = cluster or hardware.cluster(policy)
    cpu0 = time.process_time()
    result = simulate(workload, cluster, cost_model=cost_model, progress=progress)
    cpu_s = time.process_time() - cpu0
    summary = summarize(RequestTable.from_requests(result.requests), result.collector, slo=slo,
                        peak_flops_per_instance=_peak_flops(cluster))
    return SimulationOutput(policy, summary, result, result.wall_s, cpu_s)


def _peak_flops(cluster: ClusterConfig) -> float | None:
    from servelab.catalog.gpus import get_gpu

    group = cluster.groups[0]
    return get_gpu(group.gpu).peak_flops * group.tp * group.pp


def sweep(workload: Sequence[RequestSpec], policies: Sequence[str], rates: Sequence[float],
          hardware: HardwareChoice = HardwareChoice(), *, slo: SLO | None = None,
          on_point: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """Every policy at every mean arrival rate (the workload's pattern kept, gaps rescaled)."""
    from servelab.workloads.workload import scale_to_rate

    rows = []
    for rate in rates:
        scaled = scale_to_rate(workload, rate)
        for policy in policies:
            out = run_simulation(scaled, policy, hardware, slo=slo)
            s = out.summary
            row = {"policy": policy, "rate": rate, "ttft_p50_s": s.ttft.p50, "ttft_p99_s": s.ttft.p99,
                   "tpot_p50_s": s.tpot.p50, "tpot_p99_s": s.tpot.p99, "throughput_tok_s": s.output_tokens_per_s,
                   "goodput_req_s": s.goodput_requests_per_s, "slo_attainment": s.slo_attainment,
                   "completed": s.num_completed, "rejected": s.num_rejected, "wall_s": out.wall_s}
            rows.append(row)
            if on_point is not None:
                on_point(row)
    return rows


def capacity(workload: Sequence[RequestSpec], policy: str, slo: SLO, hardware: HardwareChoice = HardwareChoice(), *,
             target_attainment: float = 0.9, lo: float = 0.1, hi: float = 100.0, rel_tol: float = 0.05,
             on_probe: Callable[[float, float], None] | None = None) -> CapacityResult:
    """Highest mean request rate whose SLO attainment stays >= ``target_attainment`` (bisection)."""
    from servelab.workloads.workload import scale_to_rate

    def attainment_at(rate: float) -> float:
        out = run_simulation(scale_to_rate(workload, rate), policy, hardware, slo=slo)
        if on_probe is not None:
            on_probe(rate, out.summary.slo_attainment)
        return out.summary.slo_attainment

    return capacity_search(attainment_at, lo=lo, hi=hi, target_attainment=target_attainment, rel_tol=rel_tol)
