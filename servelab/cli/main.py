"""``servelab`` entry point: simulate, sweep, capacity, demo, plus the design and engine commands."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from servelab.cli.common import (abort_record, check_out_dir, emit_json, exit_if_aborted, parse_floats,
                                 parse_slo, progress_bar, user_errors, write_json, write_timeseries)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="servelab: LLM-serving policies in a calibrated simulator and a real engine.")

WORKLOAD_HELP = "Workload spec, e.g. azure-conv, 'azure-conv:rate=2,window=0-600', 'poisson:rate=5,n=1000,prompt=uniform(32,512),output=exp(200)'."
POLICY_HELP = "Policy name with optional params: vllm, sarathi:token_budget=512, static:batch_size=8, distserve, sjf, ljf, priority, multibin, bucketserve."
SWAP_HELP = "Host (CPU) memory per instance for swapped-out KV, in GiB (vLLM's --swap-space); needed by preemption=swap."
MAX_MODEL_LEN_HELP = "Context limit applied at admission: prompt + max tokens (default: the model's context)."
OVERFLOW_HELP = "A request over the context: reject it (vLLM) or truncate its prompt, keeping head and tail (LongBench)."


def _swap_option():
    return typer.Option(0.0, "--swap-space", help=SWAP_HELP)


def _max_model_len_option():
    return typer.Option(None, "--max-model-len", help=MAX_MODEL_LEN_HELP)


def _overflow_option():
    return typer.Option("reject", "--on-overflow", help=OVERFLOW_HELP)


def _hardware(instances: int, gpu: str, model: str, tp: int, pp: int, max_num_seqs: int, swap_space: float = 0.0,
              max_model_len: Optional[int] = None, on_overflow: str = "reject", **vllm_sizes):
    """``vllm_sizes``: max_batch_tokens, block_size, gpu_memory_utilization (simulate's vLLM options)."""
    from servelab.api import HardwareChoice

    return HardwareChoice(num_instances=instances, gpu=gpu, model=model, tp=tp, pp=pp, max_num_seqs=max_num_seqs,
                          swap_space_gb=swap_space, max_model_len=max_model_len, on_overflow=on_overflow, **vllm_sizes)


def _cost_model(path: Optional[Path]):
    if path is None:
        return None
    from servelab.costmodel.linear import LinearCostModel

    return LinearCostModel.load(path)


@app.command()
def simulate(
    workload: str = typer.Option("azure-conv", "--workload", "-w", help=WORKLOAD_HELP),
    policy: str = typer.Option("vllm", "--policy", "-p", help=POLICY_HELP),
    instances: int = typer.Option(1, "--instances", "-n"),
    gpu: str = typer.Option("A100-80GB"),
    model: str = typer.Option("Llama-2-7B"),
    tp: int = typer.Option(1),
    pp: int = typer.Option(1),
    max_num_seqs: int = typer.Option(256),
    max_num_batched_tokens: int = typer.Option(8192, "--max-num-batched-tokens", "--max-batch-tokens",
                                               help="Tokens per step (vLLM's name)."),
    block_size: int = typer.Option(16, help="Tokens per KV block."),
    gpu_memory_utilization: float = typer.Option(0.9, help="Share of GPU memory for weights + KV (vLLM's)."),
    enable_chunked_prefill: bool = typer.Option(False, "--enable-chunked-prefill",
                                                help="vLLM's chunked prefill: -p vllm becomes sarathi with "
                                                     "token_budget = --max-num-batched-tokens."),
    preemption_mode: Optional[str] = typer.Option(None, help="recompute | swap (the policy's preemption=)."),
    swap_space: float = _swap_option(),
    max_model_len: Optional[int] = _max_model_len_option(),
    on_overflow: str = _overflow_option(),
    slo: Optional[str] = typer.Option("ttft:2,tpot:0.1", help="SLO for attainment/goodput: ttft:S,tpot:S,tbt:S "
                                                              "('none' for no SLO)."),
    cost_model: Optional[Path] = typer.Option(None, help="A calibrated cost model JSON (servelab calibrate)."),
    seed: int = typer.Option(0),
    data_dir: Path = typer.Option(None, help="Folder with traces/ and datasets/ (default ../shared/data)."),
    out: Path = typer.Option(Path("results/simulate"), help="Output folder for summary.json."),
    json_out: bool = typer.Option(False, "--json", help="Print machine-readable results."),
) -> None:
    """Simulate one policy on one workload and print its summary.

    Exit status: 0 when every request completed or was rejected (rejections are counted in
    the summary), 3 when the run finished but some request was aborted, 2 for bad input.
    """
    from servelab import api
    from servelab.metrics.report import render_rich

    with user_errors():
        check_out_dir(out)
        target = parse_slo(slo)
        from servelab.cli.vocab import check_utilization, policy_with_vllm_flags

        check_utilization(gpu_memory_utilization)
        policy = policy_with_vllm_flags(policy, enable_chunked_prefill=enable_chunked_prefill,
                                        preemption_mode=preemption_mode, max_num_batched_tokens=max_num_batched_tokens)
        hw = _hardware(instances, gpu, model, tp, pp, max_num_seqs, swap_space, max_model_len, on_overflow,
                       max_batch_tokens=max_num_batched_tokens, block_size=block_size,
                       gpu_memory_utilization=gpu_memory_utilization)
        costs = _cost_model(cost_model)
        api.check_policy(policy, hw)
        wl = api.load_workload(workload, data_dir=data_dir or api.DEFAULT_DATA_DIR, seed=seed)
        with progress_bar(f"simulating {policy}", not json_out) as cb:
            res = api.run_simulation(wl, policy, hw, slo=target, cost_model=costs, progress=cb)
    payload = {"workload": workload, "gpu": gpu, "model": model, **res.to_dict()}
    write_json(out / "summary.json", payload)
    write_timeseries(out / "timeseries.csv", res.result.collector)
    if json_out:
        emit_json(payload)
    else:
        from rich.console import Console

        Console().print(render_rich({policy: res.summary},
                                    title=f"{workload} on {instances} x {gpu} / {model} (simulated)"))
        typer.echo(f"simulated {res.result.num_output_tokens:,} output tokens in {res.cpu_s:.2f} CPU-s "
                   f"({res.simulated_tokens_per_cpu_s:,.0f} tokens/CPU-s); results in {out}/summary.json")
    exit_if_aborted([abort_record(policy, res.summary)])


@app.command()
def sweep(
    workload: str = typer.Option("azure-conv", "--workload", "-w", help=WORKLOAD_HELP),
    policies: str = typer.Option("vllm,sarathi", help="Comma-separated policy specs (use ';' inside a spec's params)."),
    rates: str = typer.Option("1,2,4", help="Mean arrival rates (req/s); the trace pattern is kept."),
    instances: int = typer.Option(1, "--instances", "-n"),
    gpu: str = typer.Option("A100-80GB"),
    model: str = typer.Option("Llama-2-7B"),
    tp: int = typer.Option(1),
    pp: int = typer.Option(1),
    max_num_seqs: int = typer.Option(256),
    swap_space: float = _swap_option(),
    max_model_len: Optional[int] = _max_model_len_option(),
    on_overflow: str = _overflow_option(),
    slo: Optional[str] = typer.Option("ttft:2,tpot:0.1", help="ttft:S,tpot:S,tbt:S ('none' for no SLO)."),
    seed: int = typer.Option(0),
    data_dir: Path = typer.Option(None),
    out: Path = typer.Option(Path("results/sweep")),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Policies x rates -> a table, sweep.json and plots of attainment / latency / throughput.

    Exit status: 0 when every request of every run completed or was rejected, 3 when some run
    aborted a request (sweep.json and the plots are written first), 2 for bad input.
    """
    from servelab import api
    from servelab.metrics.report import plot_sweep

    with user_errors():
        check_out_dir(out)
        names = [p.strip().replace(";", ",") for p in policies.split(",") if p.strip()]
        rate_values = parse_floats(rates, "--rates")
        target = parse_slo(slo)
        hw = _hardware(instances, gpu, model, tp, pp, max_num_seqs, swap_space, max_model_len, on_overflow)
        wl = api.load_workload(workload, data_dir=data_dir or api.DEFAULT_DATA_DIR, seed=seed)
        rows = api.sweep(wl, names, rate_values, hw, slo=target,
                         on_point=None if json_out else lambda r: typer.echo(
                             f"  {r['policy']:<24} rate {r['rate']:>7.2f}  attainment {r['slo_attainment']:.3f}  "
                             f"ttft p99 {r['ttft_p99_s']:.3f}s  tpot p50 {r['tpot_p50_s']:.4f}s  "
                             f"throughput {r['throughput_tok_s']:.0f} tok/s  rejected {r['rejected']}  "
                             f"aborted {r['aborted']}"))
    write_json(out / "sweep.json", rows)
    caption = f"simulated: {workload}, {instances} x {gpu}, {model}, roofline cost model"
    for y in ("slo_attainment", "ttft_p99_s", "tpot_p50_s", "throughput_tok_s"):
        plot_sweep(rows, "rate", y, out / f"{y}.png", caption=caption)
    if json_out:
        emit_json(rows)
    else:
        typer.echo(f"wrote {out}/sweep.json and plots")
    exit_if_aborted([(f"{r['policy']} at rate {r['rate']:g}", r["aborted"], r["arrived"], r["top_abort_reason"])
                     for r in rows])


@app.command()
def capacity(
    workload: str = typer.Option("azure-conv", "--workload", "-w", help=WORKLOAD_HELP),
    policy: str = typer.Option("vllm", "--policy", "-p", help=POLICY_HELP),
    slo: str = typer.Option("ttft:2,tpot:0.1", help="The SLO whose attainment is kept: ttft:S,tpot:S,tbt:S."),
    target: float = typer.Option(0.9, help="SLO attainment to keep."),
    lo: float = typer.Option(0.5), hi: float = typer.Option(64.0),
    instances: int = typer.Option(1, "--instances", "-n"),
    gpu: str = typer.Option("A100-80GB"),
    model: str = typer.Option("Llama-2-7B"),
    tp: int = typer.Option(1), pp: int = typer.Option(1),
    swap_space: float = _swap_option(),
    max_model_len: Optional[int] = _max_model_len_option(),
    on_overflow: str = _overflow_option(),
    seed: int = typer.Option(0),
    data_dir: Path = typer.Option(None),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Highest request rate that keeps the SLO attainment (bisection, one simulation per probe)."""
    from servelab import api

    with user_errors():
        target_slo = parse_slo(slo)
        hw = _hardware(instances, gpu, model, tp, pp, 256, swap_space, max_model_len, on_overflow)
        wl = api.load_workload(workload, data_dir=data_dir or api.DEFAULT_DATA_DIR, seed=seed)
        res = api.capacity(wl, policy, target_slo, hw,
                           target_attainment=target, lo=lo, hi=hi,
                           on_probe=None if json_out else lambda r, a: typer.echo(f"  rate {r:8.3f} -> attainment {a:.3f}"))
    payload = {"policy": policy, "workload": workload, "status": res.status, "capacity_rate": res.capacity_rate,
               "lowest_failing_rate": res.lowest_failing_rate, "target_attainment": res.target_attainment,
               "probes": [(p.rate, p.attainment) for p in res.probes]}
    if json_out:
        emit_json(payload)
    else:
        typer.echo(f"{policy}: capacity {res.capacity_rate} req/s ({res.status}) at attainment >= {target}")


@app.command()
def demo(
    data_dir: Path = typer.Option(None),
    out: Path = typer.Option(Path("results/demo")),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """The Azure 2023 conversation trace (19,366 requests) on 2 simulated A100-80GB / Llama-2-7B
    instances under static, vllm, sarathi and distserve, side by side."""
    from servelab.cli.demo import run_demo

    with user_errors():
        check_out_dir(out)
        run_demo(data_dir, out, json_out)


def _register_optional_commands() -> None:
    """Design and engine commands live in their own modules; the engine ones import torch lazily."""
    from servelab.cli import extra

    extra.register(app)


_register_optional_commands()


if __name__ == "__main__":
    app()
