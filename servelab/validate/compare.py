"""One validation: a workload on the real engine cluster and in the simulator, compared.

The simulator gets what the engine had: the same requests (arrival times, prompt and output
lengths), policy, router, instance count, batch limits, block size, context limit and the
same number of KV blocks per instance (``runtime.resize`` before the run), with the
``LinearCostModel`` calibrated on this machine as every instance's cost model. Outputs run
to their length (``ignore_eos``), so both sides generate the same tokens per request.

Errors are absolute percentage errors |sim - real| / real per completed request (TTFT, TPOT,
end-to-end latency), and per real step: the cost model's time for the shape the engine ran
against the time the engine measured for it (the simplest honest step measure: it needs no
matching of steps between runs that may batch differently).

Clocks: ``clock="wall"`` runs the engine on the wall clock, as ``servelab generate`` does.
``clock="cpu"`` (the default, for a shared machine) times each engine step in this
process's CPU seconds and runs the cluster on a virtual clock advanced by those times, so
other processes' load does not enter the numbers; the cost model must then be calibrated in
CPU seconds too (``calibrate(..., clock=time.process_time)``). CPU mode leaves out what the
engine spends between steps (the scheduler, sampling bookkeeping): that is the simulator's
blind spot too, and wall mode on an idle machine is the check that includes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from servelab.core.errors import UserError
from servelab.trace.recorder import StepRecord, StepRecorder
from servelab.validate.workloads import ValidationWorkload, engine_specs


@dataclass(frozen=True)
class ValidateOptions:
    model: Path
    cost_model: Path
    workload: ValidationWorkload
    policy: str = "vllm"
    router: str | None = None
    num_instances: int = 1
    kv_budget_mb: float = 64.0
    block_size: int = 16
    max_batch_tokens: int = 512
    max_num_seqs: int = 16
    seed: int = 0
    data_dir: Path | None = None
    clock: str = "cpu"  # cpu | wall

    def __post_init__(self) -> None:
        if self.clock not in CLOCKS:
            raise UserError(f"--clock must be one of {', '.join(CLOCKS)}, got {self.clock!r}")
        if self.num_instances < 1:
            raise UserError(f"--instances must be >= 1, got {self.num_instances}")


CLOCKS = ("cpu", "wall")


class CpuTimedExecutor:
    """An engine executor whose steps report their CPU seconds instead of wall seconds."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.wall_over_cpu: list[float] = []  # each step's wall time / CPU time: the load's toll

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def launch(self, applied: Any, blocks: Any) -> Any:
        t0, w0 = time.process_time(), time.perf_counter()
        result = self.inner.launch(applied, blocks)
        cpu, wall = time.process_time() - t0, time.perf_counter() - w0
        if cpu > 0:
            self.wall_over_cpu.append(wall / cpu)
        return replace(result, duration_s=cpu)


@dataclass
class RunSide:
    """One side of the comparison: its requests, recorded steps, and the objects for a trace."""

    requests: list
    steps: list[StepRecord]
    cluster: Any
    result: Any
    cpu_s: float
    wall_over_cpu: list[float] = field(default_factory=list)  # engine steps in CPU-clock mode


@dataclass
class Validation:
    options: ValidateOptions
    real: RunSide
    sim: RunSide
    cost: Any
    metrics: dict = field(default_factory=dict)


def request_times(req) -> dict[str, float | None]:
    """TTFT, TPOT (mean gap after the first token) and e2e latency of a completed request."""
    t = req.token_times_s
    if not t or req.status.value != "finished":
        return {"ttft": None, "tpot": None, "e2e": None}
    return {"ttft": t[0] - req.arrival_time_s,
            "tpot": (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None,
            "e2e": req.finish_time_s - req.arrival_time_s}


def _ape(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real <= 0:
        return None
    return abs(sim - real) / real


def _stats(values: list[float | None]) -> dict[str, float | None]:
    v = np.array([x for x in values if x is not None], dtype=float)
    if not len(v):
        return {"median": None, "p90": None, "n": 0}
    return {"median": float(np.median(v)), "p90": float(np.percentile(v, 90)), "n": int(len(v))}


def per_request_rows(real: list, sim: list) -> list[dict]:
    by_id = {r.request_id: r for r in sim}
    rows = []
    for r in sorted(real, key=lambda r: r.request_id):
        s = by_id.get(r.request_id)
        rt, st = request_times(r), request_times(s) if s is not None else {}
        row = {"request_id": r.request_id, "arrival_s": r.arrival_time_s, "prompt_tokens": r.num_prompt_tokens,
               "output_tokens": r.num_generated_tokens, "real_status": r.status.value,
               "sim_status": s.status.value if s is not None else "missing"}
        for m in ("ttft", "tpot", "e2e"):
            row[f"real_{m}_s"], row[f"sim_{m}_s"] = rt[m], st.get(m)
            row[f"{m}_ape"] = _ape(st.get(m), rt[m])
        rows.append(row)
    return rows


def step_rows(steps: list[StepRecord], cost: Any) -> list[dict]:
    rows = []
    for rec in steps:
        predicted = float(cost.step_time_s(rec.shape))
        rows.append({"instance_id": rec.instance_id, "start_s": rec.start_s, "kind": rec.kind,
                     "num_tokens": rec.shape.num_tokens, "num_rows": len(rec.shape.prefill_tokens)
                     + rec.shape.num_decodes, "real_s": rec.duration_s, "predicted_s": predicted,
                     "ape": _ape(predicted, rec.duration_s)})
    return rows


def noise_floor(steps: list[StepRecord]) -> dict[str, float | None]:
    """Run-to-run noise of the machine, measured: steps of the same shape (decode batches of
    the same size, context sums within 5%) timed differently; the median |t - group median| /
    group median over groups of >= 3. A cost model cannot beat this floor."""
    groups: dict[tuple, list[float]] = {}
    for rec in steps:
        s = rec.shape
        if s.prefill_tokens or not s.num_decodes or s.padding is not None:
            continue
        key = (rec.instance_id, s.num_decodes, int(np.log(max(s.decode_context_sum, 1)) / np.log(1.05)))
        groups.setdefault(key, []).append(rec.duration_s)
    devs = []
    for times in groups.values():
        if len(times) >= 3:
            m = float(np.median(times))
            devs += [abs(t - m) / m for t in times if m > 0]
    return {"median": float(np.median(devs)) if devs else None, "n": len(devs)}


def sim_overlap(steps: list[StepRecord]) -> float | None:
    """Fraction of the simulated busy time during which another instance also ran a step:
    the in-process engine cluster runs one step at a time, so this is time it must serialise."""
    if len({r.instance_id for r in steps}) < 2:
        return None
    edges = sorted([(r.start_s, 1) for r in steps] + [(r.start_s + r.duration_s, -1) for r in steps])
    busy = overlapped = 0.0
    running, last = 0, edges[0][0] if edges else 0.0
    for t, delta in edges:
        if running >= 1:
            busy += (t - last) * running
        if running >= 2:
            overlapped += (t - last) * running
        running += delta
        last = t
    return overlapped / busy if busy > 0 else None


def summarize_validation(real: list, sim: list, steps: list[StepRecord], cost: Any, sim_steps: list[StepRecord]
                         ) -> dict:
    rows = per_request_rows(real, sim)
    srows = step_rows(steps, cost)
    out = {m: _stats([r[f"{m}_ape"] for r in rows]) for m in ("ttft", "tpot", "e2e")}
    out["step"] = _stats([r["ape"] for r in srows])
    for kind in ("prefill", "decode", "mixed"):
        out[f"step_{kind}"] = _stats([r["ape"] for r in srows if r["kind"] == kind])
    for m in ("ttft", "tpot", "e2e"):  # signed: > 0 means the simulator is slower than the engine
        bias = [(r[f"sim_{m}_s"] - r[f"real_{m}_s"]) / r[f"real_{m}_s"] for r in rows
                if r[f"{m}_ape"] is not None]
        out[f"{m}_bias_median"] = float(np.median(bias)) if bias else None
    out["noise_floor"] = noise_floor(steps)
    out["sim_overlap"] = sim_overlap(sim_steps)
    out["num_requests"] = len(rows)
    out["real_status"] = _count([r["real_status"] for r in rows])
    out["sim_status"] = _count([r["sim_status"] for r in rows])
    out["num_steps"] = {"real": len(steps), "sim": len(sim_steps)}
    out["real_step_s_sum"] = float(sum(r["real_s"] for r in srows))
    out["predicted_step_s_sum"] = float(sum(r["predicted_s"] for r in srows))
    return out


def _count(values: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def run_engine(options: ValidateOptions, loaded: Any, specs: list) -> tuple[RunSide, Any]:
    from servelab.engine.cluster import EngineCluster, EngineConfig
    from servelab.engine.sampling import SamplingParams

    config = EngineConfig(kv_budget_bytes=int(options.kv_budget_mb * 2**20), block_size=options.block_size,
                          max_batch_tokens=options.max_batch_tokens, max_num_seqs=options.max_num_seqs,
                          seed=options.seed)
    engine = EngineCluster(loaded, options.policy, config, num_instances=options.num_instances,
                           router=options.router)
    params = {s.request_id: SamplingParams(temperature=0.0, max_tokens=s.num_output_tokens, ignore_eos=True,
                                           seed=options.seed + s.request_id) for s in specs}
    cluster, states = engine.build(lambda s: params[s.request_id])
    if options.clock == "cpu":
        from servelab.cluster.clocks import SimClock

        cluster.clock = SimClock()
        for d in cluster.drivers:
            d.executor = CpuTimedExecutor(d.executor)
    recorder = StepRecorder().attach(cluster.drivers)
    cpu0 = time.process_time()
    result = cluster.run(specs)
    cpu = time.process_time() - cpu0
    engine_result = engine.result_of(cluster, states, result.wall_s, result.transfers, result.links)
    engine.close()
    side = RunSide(engine_result.requests, recorder.steps, cluster, result, cpu)
    side.wall_over_cpu = [x for d in cluster.drivers for x in getattr(d.executor, "wall_over_cpu", ())]
    return side, engine


def run_simulator(options: ValidateOptions, specs: list, cost: Any, num_gpu_blocks: int, max_model_len: int
                  ) -> RunSide:
    from servelab.cluster.presets import cluster_for
    from servelab.core.registry import parse_name_params
    from servelab.simulator.run import Simulation

    cluster = cluster_for(options.policy, num_instances=options.num_instances, block_size=options.block_size,
                          max_batch_tokens=options.max_batch_tokens, max_num_seqs=options.max_num_seqs)
    cluster = replace(cluster, max_model_len=max_model_len)
    if options.router is not None:
        name, params = parse_name_params(options.router)
        cluster = replace(cluster, router=name, router_params=params)
    bare = [replace(s, prompt_token_ids=None) for s in specs]
    sim = Simulation(bare, cluster, cost_model=cost)
    for d in sim.instances:
        d.runtime.resize(num_gpu_blocks)  # the engine's KV blocks per instance, not the catalog GPU's
    recorder = StepRecorder().attach(sim.instances)
    cpu0 = time.process_time()
    result = sim.run()
    return RunSide(result.requests, recorder.steps, sim.driver, result, time.process_time() - cpu0)


def run_validation(options: ValidateOptions, loaded: Any = None) -> Validation:
    """Engine, then simulator, then the comparison (``loaded``: a checkpoint already loaded)."""
    from servelab.costmodel.linear import LinearCostModel
    from servelab.engine.loader import load_checkpoint
    from servelab import api

    if not Path(options.cost_model).is_file():
        raise UserError(f"--cost-model {options.cost_model}: no such file (make one with servelab calibrate)")
    cost = LinearCostModel.load(options.cost_model)
    loaded = loaded if loaded is not None else load_checkpoint(options.model)
    specs = engine_specs(options.workload, loaded.tokenizer, loaded.config.vocab_size,
                         data_dir=options.data_dir or api.DEFAULT_DATA_DIR, seed=options.seed)
    real, engine = run_engine(options, loaded, specs)
    sim = run_simulator(options, specs, cost, engine.num_gpu_blocks, engine.max_model_len)
    metrics = summarize_validation(real.requests, sim.requests, real.steps, cost, sim.steps)
    metrics["wall_over_cpu_median"] = float(np.median(real.wall_over_cpu)) if real.wall_over_cpu else None
    metrics["transfers"] = {"real_n": len(real.result.transfers or ()),
                            "real_s": float(sum(t[3] for t in real.result.transfers or ())),
                            "sim_n": len(sim.result.transfers or ()),
                            "sim_s": float(sum(t[3] for t in sim.result.transfers or ()))}
    return Validation(options, real, sim, cost, metrics)
