"""What a run writes next to its numbers: its folder, its context, its tables.

A result file must say how it was made, or it cannot be compared later: ``run_context``
gathers the workload spec, the policy with its resolved parameters, the SLO, the seed, the
hardware (or the machine a calibrated cost model was measured on), tp/pp and the servelab
version. ``resolve_out`` gives every run without ``--out`` its own timestamped folder, so a
second run never overwrites the first.

Files a simulate run writes (documented in the README):
    summary.json     the run's context under "context", then the summary (RunSummary.to_dict)
    timeseries.csv   one row per executed step (a decode jump counts as one row) with the
                     columns of ``servelab.metrics.collector.STEP_COLUMNS``: instance_id,
                     start_s, duration_s, num_tokens, num_rows, num_padding_tokens,
                     kv_used_blocks, kv_total_blocks, num_waiting, num_running, flops
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from servelab.cli.common import check_out_dir

RESULTS_ROOT = Path("results")


def resolve_out(out: Optional[Path], command: str) -> Path:
    """``out`` as given, or ``results/<command>/<UTC time>`` (``-2``, ``-3`` ... if taken)."""
    if out is not None:
        return check_out_dir(out)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = RESULTS_ROOT / command / stamp
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{stamp}-{k}")
    return check_out_dir(path)


def slo_context(slo: Any) -> Optional[dict[str, float]]:
    if slo is None:
        return None
    return {k: v for k, v in asdict(slo).items() if v is not None}


def resolved_params(registry: Any, name: str, params: Any) -> dict[str, Any]:
    """Every field of the Config the registry builds from ``params`` (defaults included, values
    coerced), so a result says what ran, not only what was typed."""
    from servelab.core.registry import build_config

    config = build_config(getattr(registry.get(name), "Config", None), dict(params), name)
    if config is None:
        return {}
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v) for k, v in asdict(config).items()}


def cluster_context(cluster: Any) -> dict[str, Any]:
    """Policies and routers with their resolved parameters (defaults and presets filled in)."""
    from servelab.core.policy import POLICIES, ROUTERS

    return {"router": cluster.router, "router_params": resolved_params(ROUTERS, cluster.router, cluster.router_params),
            "groups": [{"count": g.count, "role": g.role, "policy": g.policy,
                        "policy_params": resolved_params(POLICIES, g.policy, g.policy_params),
                        "gpu": g.gpu, "model": g.model, "tp": g.tp, "pp": g.pp, "max_num_seqs": g.max_num_seqs,
                        "max_batch_tokens": g.max_batch_tokens, "block_size": g.block_size,
                        "memory_reserve_fraction": g.memory_reserve_fraction, "host_kv_gb": g.host_kv_gb}
                       for g in cluster.groups],
            "max_model_len": cluster.max_model_len, "on_overflow": cluster.on_overflow}


def cost_model_context(path: Optional[Path], cost: Any, hardware: Any = None) -> dict[str, Any]:
    """Where every term of the run's step times comes from: for the models built per instance,
    the description of the first instance's (``ProfiledCostModel.describe``: each operator's
    table, the attention kernel, the CPU overhead, the collectives, and any roofline fallback)."""
    from servelab.simulator.hardware import is_cost_options

    if cost is None or is_cost_options(cost):
        if hardware is None:
            return {"kind": "built per instance", "options": repr(cost)}
        from servelab.catalog.instance import InstanceSpec
        from servelab.simulator.hardware import cost_for_spec

        built = cost_for_spec(InstanceSpec(hardware.gpu, hardware.model, tp=hardware.tp, pp=hardware.pp), cost)
        if hasattr(built, "describe"):
            return built.describe()
        return {"kind": "roofline", "source": "catalog GPU and model, profile-fitted coefficients"}
    from servelab.api import measured_hardware

    name, peak = measured_hardware(cost)
    return {"kind": "linear (calibrated)", "path": str(path), "measured_on": name, "peak_flops": peak,
            "meta": dict(getattr(cost, "meta", {}))}


def run_context(*, workload: str, seed: int, slo: Any, hardware: Any, policies: dict[str, Any],
                cost_model_path: Optional[Path] = None, cost: Any = None, **extra: Any) -> dict[str, Any]:
    """Everything needed to rerun and compare: JSON-safe."""
    from servelab import __version__

    return {"servelab_version": __version__, "command": " ".join(["servelab", *sys.argv[1:]]),
            "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "workload": workload, "seed": seed, "slo": slo_context(slo),
            "hardware": {"num_instances": hardware.num_instances, "gpu": hardware.gpu, "model": hardware.model,
                         "tp": hardware.tp, "pp": hardware.pp, "max_num_seqs": hardware.max_num_seqs,
                         "max_batch_tokens": hardware.max_batch_tokens, "block_size": hardware.block_size,
                         "gpu_memory_utilization": hardware.gpu_memory_utilization,
                         "swap_space_gb": hardware.swap_space_gb, "max_model_len": hardware.max_model_len,
                         "on_overflow": hardware.on_overflow},
            "cost_model": cost_model_context(cost_model_path, cost, hardware),
            "policies": {spec: cluster_context(cluster) for spec, cluster in policies.items()}, **extra}


def hardware_title(instances: int, gpu: str, model: str, cost: Any) -> str:
    """'2 x A100-80GB / Llama-2-7B (simulated)', or the machine a calibrated model was timed on."""
    from servelab.simulator.hardware import is_cost_options

    if cost is None or is_cost_options(cost):
        from servelab.costmodel.options import DEFAULT_COST_OPTIONS

        kind = (cost or DEFAULT_COST_OPTIONS).op_times
        return f"{instances} x {gpu} / {model} (simulated, {kind} cost model)"
    from servelab.api import measured_hardware

    name, _ = measured_hardware(cost)
    return f"{instances} x {name} (simulated, cost model calibrated there)"


def sweep_table(rows: list[dict], title: str):
    """The table ``sweep`` promises: one row per (policy, rate)."""
    from rich.table import Table

    table = Table(title=title)
    for name in ("policy", "rate (req/s)", "attainment", "TTFT p99 (s)", "TPOT p50 (ms)", "tok/s", "rejected",
                 "aborted"):
        table.add_column(name, justify="left" if name == "policy" else "right")
    for r in rows:
        table.add_row(r["policy"], f"{r['rate']:g}", _fmt(r["slo_attainment"], "{:.3f}"),
                      _fmt(r["ttft_p99_s"], "{:.3f}"), _fmt(r["tpot_p50_s"], "{:.1f}", 1e3),
                      _fmt(r["throughput_tok_s"], "{:,.0f}"), str(r["rejected"]),
                      f"[bold red]{r['aborted']}[/]" if r["aborted"] else "0")
    return table


def probe_table(result: Any, title: str):
    """Every capacity probe in the order run (``result.expansions`` says why each bracket probe ran)."""
    from rich.table import Table

    table = Table(title=title)
    for name in ("#", "rate (req/s)", "attainment", "meets target", "aborted"):
        table.add_column(name, justify="right")
    for k, p in enumerate(result.probes, start=1):
        table.add_row(str(k), f"{p.rate:.4g}", f"{p.attainment:.3f}", "yes" if p.passed else "no",
                      f"[bold red]{p.num_aborted}[/]" if p.num_aborted else "0")
    return table


def _fmt(value: Any, pattern: str, scale: float = 1.0) -> str:
    if value is None or value != value:
        return "-"
    return pattern.format(value * scale)


REQUEST_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "status", "finish_reason",
                   "ttft_s", "tpot_s", "e2e_s", "num_preemptions", "num_transfers")


def write_requests_csv(path: Path, requests: Any) -> Path:
    """One row per request beside a summary: its lengths, how it ended, and its latencies in
    seconds (empty where it has none, e.g. a rejected request)."""
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(REQUEST_COLUMNS)
        for r in sorted(requests, key=lambda r: r.request_id):
            t = r.token_times_s
            ttft = t[0] - r.arrival_time_s if t else None
            tpot = (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None
            e2e = r.finish_time_s - r.arrival_time_s if r.finish_time_s is not None and t else None
            writer.writerow([r.request_id, f"{r.arrival_time_s:.6f}", r.num_prompt_tokens, r.num_generated_tokens,
                             r.status.value, r.finish_reason or "", *("" if x is None else f"{x:.6f}"
                                                                     for x in (ttft, tpot, e2e)),
                             r.num_preemptions, r.num_transfers])
    return path
