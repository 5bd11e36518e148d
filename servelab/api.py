"""Python API that mirrors the CLI: simulate, sweep, capacity. No torch imported.

Each call takes explicit arguments (no global state) and returns plain dataclasses whose
``to_dict`` is JSON-safe, so the CLI's ``--json`` output and a notebook see the same thing.
Arguments are checked before any simulation runs; a bad one is a ``UserError`` naming it.

One argument order and the CLI's names everywhere: ``(workload, policy, hardware, *, slo=...,
...)``; a workload may be a spec string (``"azure-conv:window=0-60"``) or loaded specs, an SLO
an ``SLO`` or a string (``"ttft:2s,tpot:100ms"``, ``"none"``). Left out, the SLO is the CLI's
default (``workloads.slo.resolve_slo``: the requests' own when the workload carries any, else
ttft 2 s / tpot 100 ms), so a notebook and ``servelab simulate`` report the same attainment.
``capacity(wl, policy, slo, hardware)`` and ``target_attainment=`` (the old forms) still work,
with a ``DeprecationWarning``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from servelab.cluster.config import ClusterConfig, default_link
from servelab.cluster.presets import cluster_for
from servelab.core.admission import OVERFLOW_MODES
from servelab.core.errors import UnknownNameError, UserError
from servelab.core.limits import MAX_INSTANCES, MAX_PARAM_INT, MAX_SWAP_SPACE_GB, step_limits_error
from servelab.core.request import SLO, RequestSpec
from servelab.costmodel.links import LinkSpec
from servelab.metrics import RequestTable, RunSummary, capacity_search, summarize
from servelab.metrics.capacity import DEFAULT_HI, DEFAULT_LO, DEFAULT_MAX_EXPANSIONS, CapacityResult
from servelab.metrics.report import top_reasons
from servelab.paths import default_data_dir
from servelab.simulator import SimResult, simulate
from servelab.workloads.slo import DEFAULT as DEFAULT_SLO, resolve_slo

__all__ = ["SLO", "DEFAULT_SLO", "HardwareChoice", "SimulationOutput", "load_workload", "run_simulation", "sweep",
           "capacity", "check_policy", "DEFAULT_DATA_DIR"]

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
    swap_space_gb: float = 0.0  # host KV per instance for swap preemption (vLLM's --swap-space); 0: none
    max_model_len: int | None = None  # context limit at admission; None: the model's context
    on_overflow: str = "reject"  # a request over the context: "reject" (vLLM) or "truncate" its prompt
    block_size: int = 16  # tokens per KV block (vLLM's --block-size)
    gpu_memory_utilization: float = 0.9  # share of GPU memory for weights + KV (vLLM's); the rest is reserved

    def __post_init__(self) -> None:
        """Check the choice as the user wrote it, so a typo fails before any work and names
        the field: the simulator's per-step work grows with ``num_instances``, not the input."""
        if not 1 <= self.num_instances <= MAX_INSTANCES:
            raise UserError(f"num_instances must be in [1, {MAX_INSTANCES}], got {self.num_instances}")
        for name in ("tp", "pp", "max_num_seqs", "max_batch_tokens", "block_size"):
            if not 1 <= getattr(self, name) <= MAX_PARAM_INT:
                label = "max_batch_tokens (--max-num-batched-tokens)" if name == "max_batch_tokens" else name
                raise UserError(f"{label} must be in [1, {MAX_PARAM_INT:,}], got {getattr(self, name)}")
        if (why := step_limits_error(self.max_batch_tokens, self.max_num_seqs)) is not None:
            raise UserError(why)
        if not 0 <= self.swap_space_gb <= MAX_SWAP_SPACE_GB:
            raise UserError(f"swap_space_gb must be in [0, {MAX_SWAP_SPACE_GB:g}] GiB, got {self.swap_space_gb}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise UserError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.on_overflow not in OVERFLOW_MODES:
            raise UserError(f"on_overflow must be one of {', '.join(OVERFLOW_MODES)}, got {self.on_overflow!r}")
        from servelab.catalog.instance import InstanceSpec, num_kv_blocks
        from servelab.catalog.models import get_model

        try:
            num_kv_blocks(InstanceSpec(self.gpu, self.model, tp=self.tp, pp=self.pp))
        except UnknownNameError:
            raise
        except UserError as err:
            raise UserError(f"{self.model} on {self.gpu} (tp={self.tp}, pp={self.pp}): {err}") from None
        context = get_model(self.model).max_context
        if self.max_model_len is not None and not 2 <= self.max_model_len <= context:
            raise UserError(f"max_model_len must be in [2, {context:,}] (the context of {self.model}), "
                            f"got {self.max_model_len}")

    def cluster(self, policy_spec: str) -> ClusterConfig:
        cluster = cluster_for(policy_spec, num_instances=self.num_instances, link=self.link, gpu=self.gpu,
                              model=self.model, tp=self.tp, pp=self.pp, max_num_seqs=self.max_num_seqs,
                              max_batch_tokens=self.max_batch_tokens, host_kv_gb=self.swap_space_gb,
                              block_size=self.block_size,
                              memory_reserve_fraction=round(1.0 - self.gpu_memory_utilization, 12))  # 0.9 -> 0.1 exactly
        return replace(cluster, max_model_len=self.max_model_len, on_overflow=self.on_overflow)


@dataclass
class SimulationOutput:
    policy: str
    summary: RunSummary
    result: SimResult
    wall_s: float
    cpu_s: float
    slo_note: str = ""  # which SLO judged the run, in words ("SLO: ttft <= 2 s, tpot <= 100 ms (default; ...)")

    @property
    def simulated_tokens_per_cpu_s(self) -> float:
        return self.result.num_output_tokens / self.cpu_s if self.cpu_s > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """The summary's per-instance rows go under ``per_instance``, so ``num_instances`` (the
        count) and the list never share a key."""
        summary = self.summary.to_dict()
        per_instance = summary.pop("instances")
        return {"policy": self.policy, "slo_note": self.slo_note, "wall_s": self.wall_s, "cpu_s": self.cpu_s,
                "simulated_tokens_per_cpu_s": self.simulated_tokens_per_cpu_s,
                "conserved": self.result.conserved, **summary, "num_instances": len(per_instance),
                "per_instance": per_instance,
                "policy_reports": self.policy_reports}

    @property
    def policy_reports(self) -> dict[str, dict]:
        """Each instance's policy report by instance id, the router's under ``"router"`` and the
        pipeline groups a router formed (members, span, steps, bubble share) under ``"pipeline_groups"``."""
        reports = {str(k): v for k, v in self.result.policy_reports.items()}
        if self.result.router_report:
            reports["router"] = self.result.router_report
        if getattr(self.result, "pipeline", None):  # pipeline groups a router formed: steps, bubble share
            reports["pipeline_groups"] = {str(k): v for k, v in self.result.pipeline.items()}
        return reports


def load_workload(spec: str, *, data_dir: Path | str = DEFAULT_DATA_DIR, seed: int = 0) -> list[RequestSpec]:
    from servelab.workloads.spec import parse_workload

    return parse_workload(spec, Path(data_dir), seed)


def _workload(workload: Sequence[RequestSpec] | str) -> Sequence[RequestSpec]:
    return load_workload(workload) if isinstance(workload, str) else workload


def run_simulation(workload: Sequence[RequestSpec] | str, policy: str, hardware: HardwareChoice = HardwareChoice(),
                   *, cluster: ClusterConfig | None = None, slo: SLO | str | None = DEFAULT_SLO, cost_model: Any = None,
                   progress: Callable[[float], None] | None = None, recorder: Any = None,
                   watchdog: Any = None) -> SimulationOutput:
    """Simulate ``workload`` under ``policy`` (``name[:k=v,...]`` or a preset such as ``distserve``);
    ``recorder`` (a ``servelab.trace.StepRecorder``) hears every step, for a trace; ``watchdog`` (a
    ``servelab.cluster.watchdog.WatchdogConfig``, default on) ends a run that stops progressing.
    ``slo``: see the module docstring (left out: the CLI's default)."""
    import time

    from servelab.simulator.run import Simulation

    workload = _workload(workload)
    slo, slo_note = resolve_slo(slo, workload, "slo")
    cluster = cluster or check_policy(policy, hardware)
    cpu0 = time.process_time()
    sim = Simulation(workload, cluster, cost_model=cost_model, progress=progress, watchdog=watchdog)
    if recorder is not None:
        recorder.attach_cluster(sim.driver)
    result = sim.run()
    cpu_s = time.process_time() - cpu0
    from servelab.simulator.hardware import is_cost_options

    fixed = cost_model is not None and not is_cost_options(cost_model)
    peak = measured_hardware(cost_model)[1] if fixed else _peak_flops(cluster)
    summary = summarize(RequestTable.from_requests(result.requests), result.collector, slo=slo,
                        peak_flops_per_instance=peak)
    return SimulationOutput(policy, summary, result, result.wall_s, cpu_s, slo_note)


def check_policy(policy: str, hardware: HardwareChoice) -> ClusterConfig:
    """Build the cluster and every policy and router in it once, so a bad spec or parameter
    fails before any simulation runs (the simulator would find it only when it starts)."""
    from servelab.core.policy import POLICIES, ROUTERS
    from servelab.core.registry import RegistryError

    cluster = hardware.cluster(policy)
    name = policy.partition(":")[0].strip()
    try:
        for group in cluster.groups:
            POLICIES.create(group.policy, dict(group.policy_params))
        ROUTERS.create(cluster.router, dict(cluster.router_params))
    except RegistryError as err:
        if name in str(err):
            raise
        raise RegistryError(f"preset {name!r}: {err}") from None  # a preset passes its parameters on
    return cluster


def measured_hardware(cost_model: Any) -> tuple[str, float | None]:
    """(name, peak FLOP/s or None) of the machine a calibrated cost model was measured on.

    MFU against the catalog GPU's peak would be meaningless for timings taken elsewhere, so
    a calibrated model's MFU uses the peak it recorded, or is left out when it recorded none.
    """
    meta = getattr(cost_model, "meta", None) or {}
    name = meta.get("hardware") or meta.get("processor") or meta.get("machine") or "the calibration machine"
    try:
        peak = float(meta.get("peak_flops", ""))
    except ValueError:
        peak = None
    return name, peak if peak is not None and 0 < peak < float("inf") else None


def _peak_flops(cluster: ClusterConfig) -> float | None:
    from servelab.catalog.gpus import get_gpu

    group = cluster.groups[0]
    return get_gpu(group.gpu).peak_flops * group.tp * group.pp


def sweep(workload: Sequence[RequestSpec] | str, policies: Sequence[str], rates: Sequence[float],
          hardware: HardwareChoice = HardwareChoice(), *, slo: SLO | str | None = DEFAULT_SLO,
          on_point: Callable[[dict], None] | None = None,
          on_requests: Callable[[dict, Sequence[Any]], None] | None = None,
          fanout: Any = None) -> list[dict[str, Any]]:
    """Every policy at every mean arrival rate (the workload's pattern kept, gaps rescaled).
    ``on_requests(row, requests)`` hears each point's requests (the CLI writes them as CSV).
    ``fanout`` (a ``servelab.simulator.fanout.Fanout``) runs the points in other processes or on
    Ray: the same rows in the same order (``on_point`` hears them as they end, in any order)."""
    from servelab.workloads.workload import scale_to_rate

    workload = _workload(workload)
    slo, _ = resolve_slo(slo, workload, "slo")
    if not policies:
        raise UserError("sweep needs at least one policy")
    if not rates:
        raise UserError("sweep needs at least one rate")
    for policy in policies:
        check_policy(policy, hardware)  # a bad spec fails here, before the first simulation
    scaled_at = [(rate, scale_to_rate(workload, rate)) for rate in rates]  # checks every rate up front
    points = [(scaled, policy, hardware, slo, rate, on_requests is not None)
              for rate, scaled in scaled_at for policy in policies]

    def heard(_: int, done: tuple[dict, Any]) -> None:
        row, requests = done
        if on_requests is not None:
            on_requests(row, requests)
        if on_point is not None:
            on_point(row)

    if fanout is None:
        from servelab.simulator.fanout import Fanout

        fanout = Fanout()
    return fanout.map(sweep_point, points, heard, keep=lambda done: done[0])


def sweep_point(point: tuple) -> tuple[dict[str, Any], Any]:
    """One sweep point, (row, its requests or None): module-level, so other processes can run it."""
    scaled, policy, hardware, slo, rate, keep_requests = point
    out = run_simulation(scaled, policy, hardware, slo=slo)
    s = out.summary
    row = {"policy": policy, "rate": rate, "ttft_p50_s": s.ttft.p50, "ttft_p99_s": s.ttft.p99,
           "tpot_p50_s": s.tpot.p50, "tpot_p99_s": s.tpot.p99, "throughput_tok_s": s.output_tokens_per_s,
           "goodput_req_s": s.goodput_requests_per_s, "slo_attainment": s.slo_attainment,
           "arrived": s.num_arrived, "completed": s.num_completed, "rejected": s.num_rejected,
           "rejected_context": s.num_rejected_context, "aborted": s.num_aborted,
           "top_abort_reason": next(iter(top_reasons(s, "aborted", k=1, width=120)), ("", 0))[0], "wall_s": out.wall_s}
    return row, (out.result.requests if keep_requests else None)


REJECTIONS = ("count", "exclude")


def capacity(workload: Sequence[RequestSpec] | str, policy: str, hardware: HardwareChoice | SLO | str = HardwareChoice(),
             *old_args: Any, slo: SLO | str | None = DEFAULT_SLO, target: float | None = None, lo: float = DEFAULT_LO,
             hi: float = DEFAULT_HI, rel_tol: float = 0.05, max_expansions: int = DEFAULT_MAX_EXPANSIONS,
             rejections: str = "count", on_probe: Callable[[float, float], None] | None = None,
             target_attainment: float | None = None, fanout: Any = None) -> CapacityResult:
    """Highest mean request rate whose SLO attainment stays >= ``target`` (default 0.9; the
    CLI's ``--target``), by bisection.

    The search brackets the answer itself: when ``lo`` misses the target it tries 4x lower,
    when ``hi`` meets it 4x higher, up to ``max_expansions`` times each (``result.expansions``
    says what it did). Each probe keeps its aborted and rejected counts.
    ``rejections``: ``"count"`` (a rejected request misses the SLO: attainment over every
    arrived request) or ``"exclude"`` (attainment over the requests served: rejected ones are
    left out). With ``"count"`` a workload whose requests are rejected at any rate (over the
    context, ...) caps attainment at ``1 - rejected/arrived``; ``result.rejection_note`` says so.
    Needs an SLO with at least one target: without one every rate "passes" and the search
    would report its upper bound as the capacity. ``fanout`` (a ``Fanout`` running more than
    one probe at once) probes ahead of the search (``capacity_search_ahead``): same result;
    ``on_probe`` then also hears the probes the search turned out not to need.
    """
    import warnings

    from servelab.workloads.workload import scale_to_rate

    if not isinstance(hardware, HardwareChoice):  # the old order: capacity(wl, policy, slo, hardware)
        warnings.warn("capacity(workload, policy, slo, hardware) is deprecated: write capacity(workload, policy, "
                      "hardware, slo=...) (the order of run_simulation and sweep)", DeprecationWarning, stacklevel=2)
        slo, hardware = hardware, (old_args[0] if old_args else HardwareChoice())
    elif old_args:
        raise TypeError(f"capacity() takes 3 positional arguments (workload, policy, hardware), got {3 + len(old_args)}")
    if target_attainment is not None:
        warnings.warn("capacity(target_attainment=...) is deprecated: write target=... (the CLI's --target)",
                      DeprecationWarning, stacklevel=2)
        target = target_attainment if target is None else target
    target = 0.9 if target is None else target
    if rejections not in REJECTIONS:
        raise UserError(f"rejections must be one of {', '.join(REJECTIONS)}, got {rejections!r}")
    workload = _workload(workload)
    slo, _ = resolve_slo(slo, workload, "slo")
    if slo is not None and all(v is None for v in (slo.ttft_s, slo.tpot_s, slo.tbt_s, slo.e2el_s)) or \
            slo is None and not any(spec.slo is not None for spec in workload):
        raise UserError("capacity needs an SLO with at least one target (e.g. ttft:2s,tpot:100ms)")
    check_policy(policy, hardware)  # a bad spec fails here, before the first probe
    reasons: dict[str, int] = {}
    search = dict(lo=lo, hi=hi, target_attainment=target, rel_tol=rel_tol, max_expansions=max_expansions)

    def heard(rate: float, probe: tuple) -> None:
        for reason, count in probe[4]:
            reasons[reason] = max(reasons.get(reason, 0), count)
        if on_probe is not None:
            on_probe(rate, probe[0])

    width = fanout.parallel if fanout is not None else 1
    if width > 1:
        from servelab.metrics.capacity import capacity_search_ahead

        def run_rates(rates: list[float]) -> list[tuple]:
            points = [(workload, policy, hardware, slo, rejections, rate) for rate in rates]
            return fanout.map(capacity_point, points, lambda k, done: heard(rates[k], done))

        res = capacity_search_ahead(run_rates, width, **search)
    else:
        def attainment_at(rate: float) -> tuple:
            probe = capacity_point((workload, policy, hardware, slo, rejections, rate))
            heard(rate, probe)
            return probe

        res = capacity_search(attainment_at, **search)
    return replace(res, rejections=rejections, rejection_note=_rejection_note(res, rejections, reasons))


def capacity_point(point: tuple) -> tuple[float, int, int, int, tuple]:
    """One capacity probe, (attainment, aborted, rejected, arrived, top rejection reasons):
    module-level, so other processes can run it. ``capacity_search`` reads the first four."""
    from servelab.workloads.workload import scale_to_rate

    workload, policy, hardware, slo, rejections, rate = point
    s = run_simulation(scale_to_rate(workload, rate), policy, hardware, slo=slo).summary
    attainment = s.slo_attainment
    if rejections == "exclude":
        served = s.num_arrived - s.num_rejected
        attainment = s.num_slo_met / served if served else 0.0
    return attainment, s.num_aborted, s.num_rejected, s.num_arrived, tuple(top_reasons(s, "rejected", k=3, width=120))


def _rejection_note(res: CapacityResult, rejections: str, reasons: dict[str, int]) -> str:
    """One line when rejections shape the answer: how many, why, and what they cap attainment at."""
    rejected = [p for p in res.probes if p.num_rejected]
    if not rejected:
        return ""
    least = min(rejected, key=lambda p: p.num_rejected)
    why = "; ".join(f"{r} ({n})" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:2])
    every = len(rejected) == len(res.probes)
    line = (f"{least.num_rejected:,} of {least.num_arrived:,} requests rejected "
            f"{'at every rate probed' if every else f'at {least.rate:.4g} req/s'}" + (f" ({why})" if why else ""))
    if rejections == "exclude":
        return line + "; left out of attainment (rejections=exclude)"
    ceiling = 1 - least.num_rejected / least.num_arrived if least.num_arrived else 0.0
    capped = " < the target: the capacity is set by rejections, not load" if ceiling < res.target_attainment else ""
    return (line + f"; they count as misses (rejections=count), so attainment cannot exceed {ceiling:.3f}{capped}"
            f" (--rejections exclude judges only the requests served)")
