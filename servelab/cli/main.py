"""``servelab`` entry point: simulate, sweep, capacity, demo, plus the design and engine commands."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from servelab.cli.common import (EXIT_ABORTED, abort_record, check_out_file, emit_json, exit_if_aborted,
                                 parse_floats, parse_slo, progress_bar, progress_log, user_errors, write_json, write_timeseries)
from servelab.cli import cost_flags
from servelab.workloads.slo import DEFAULT, resolve_slo
from servelab.cli.config_file import config_option
from servelab.cli.outputs import (hardware_title, probe_table, resolve_out, run_context, sweep_table,
                                  write_requests_csv)

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="servelab: LLM-serving policies in a calibrated simulator and a real engine.")

WORKLOAD_HELP = "Workload spec, e.g. azure-conv, 'azure-conv:rate=2,window=0-600', 'poisson:rate=5,n=1000,prompt=uniform(32,512),output=exp(200)'."
POLICY_HELP = "Policy name with optional params: vllm, sarathi:token_budget=512, static:batch_size=8, distserve, sjf, ljf, priority, multibin, bucketserve."
SWAP_HELP = "Host (CPU) memory per instance for swapped-out KV, in GiB (vLLM's --swap-space); needed by preemption=swap."
MAX_MODEL_LEN_HELP = "Context limit applied at admission: prompt + max tokens (default: the model's context)."
INSTANCES_HELP = ("Number of instances (-n is kept as a short alias; a workload spec's n= counts requests, "
                  "not instances).")
SLO_HELP = ("ttft:V,tpot:V,tbt:V,e2el:V with units (2s, 500ms; a bare number is seconds, unlike vLLM's "
            "--goodput in ms); 'none' for no SLO. Default: the workload's own slo=, else ttft:2s,tpot:100ms "
            "(printed with the table).")
OUT_HELP = "Folder for {files} (default: a new results/{cmd}/<UTC time>/ per run, printed at the end)."
OVERFLOW_HELP = "A request over the context: reject it (vLLM) or truncate its prompt, keeping head and tail (LongBench)."


def _slo_choice(slo: Optional[str]):
    """--slo parsed once (a warning about its units is printed once): not given -> DEFAULT
    (``workloads.slo.resolve_slo`` picks the workload's own or ttft:2s,tpot:100ms), 'none' -> 'none'."""
    if slo is None:
        return DEFAULT
    parsed = parse_slo(slo)
    return "none" if parsed is None else parsed


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


@app.command()
def simulate(
    workload: str = typer.Option("azure-conv", "--workload", "-w", help=WORKLOAD_HELP),
    policy: str = typer.Option("vllm", "--policy", "-p", help=POLICY_HELP),
    instances: int = typer.Option(1, "--instances", "-n", help=INSTANCES_HELP),
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
    slo: Optional[str] = typer.Option(None, help=SLO_HELP),
    cost_model: Optional[Path] = typer.Option(None, help="A calibrated cost model JSON (servelab calibrate)."),
    op_times: str = cost_flags.op_times_option(), attention_kernel: Optional[str] = cost_flags.attention_kernel_option(),
    cpu_overhead: Optional[str] = cost_flags.cpu_overhead_option(),
    kernel_profile: Optional[Path] = cost_flags.kernel_profile_option(),
    seed: int = typer.Option(0),
    data_dir: Path = typer.Option(None, help="Folder with traces/ and datasets/ (default ../shared/data)."),
    out: Optional[Path] = typer.Option(None, help=OUT_HELP.format(cmd="simulate", files="summary.json and "
                                                                                          "timeseries.csv")),
    json_out: bool = typer.Option(False, "--json", help="Print machine-readable results."),
    config: Optional[Path] = config_option(),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Also write a Chrome/Perfetto trace JSON of the run "
                                         "(a track per instance: steps, swaps, transfers, request flows)."),
    watchdog: str = typer.Option("on", help="End a run in which no request progresses, aborting what is left with a "
                                 "reason: 'on' (50,000 events or a simulated day), 'off', or events=N,idle_s=S "
                                 "(0 turns one limit off)."),
) -> None:
    """Simulate one policy on one workload and print its summary.

    Exit status: 0 when every request completed or was rejected (rejections are counted in
    the summary), 3 when the run finished but some request was aborted, 2 for bad input.
    """
    from servelab import api
    from servelab.metrics.report import render_rich

    with user_errors():
        out = resolve_out(out, "simulate")
        from servelab.simulator import hugepage_arenas

        hugepage_arenas.install()  # before the workload and the instances are built (many instances: faster)
        if trace is not None:
            check_out_file(trace, "--trace")  # before the run, not after it
        slo = _slo_choice(slo)  # a bad --slo fails before the workload loads
        from servelab.cli.vocab import check_utilization, policy_with_vllm_flags

        check_utilization(gpu_memory_utilization)
        from servelab.cluster.watchdog import parse_watchdog

        stop_when_stuck = parse_watchdog(watchdog)
        policy = policy_with_vllm_flags(policy, enable_chunked_prefill=enable_chunked_prefill,
                                        preemption_mode=preemption_mode, max_num_batched_tokens=max_num_batched_tokens)
        hw = _hardware(instances, gpu, model, tp, pp, max_num_seqs, swap_space, max_model_len, on_overflow,
                       max_batch_tokens=max_num_batched_tokens, block_size=block_size,
                       gpu_memory_utilization=gpu_memory_utilization)
        costs = cost_flags.cost_choice(cost_model, op_times, attention_kernel, cpu_overhead, kernel_profile)
        cluster = api.check_policy(policy, hw)
        wl = api.load_workload(workload, data_dir=data_dir or api.DEFAULT_DATA_DIR, seed=seed)
        target, slo_note = resolve_slo(slo, wl)
        recorder = None
        if trace is not None:
            from servelab.trace import StepRecorder

            recorder = StepRecorder()
        with progress_bar(f"simulating {policy}", not json_out) as cb:
            res = api.run_simulation(wl, policy, hw, slo=target, cost_model=costs, progress=cb, recorder=recorder,
                                     watchdog=stop_when_stuck)
    context = run_context(workload=workload, seed=seed, slo=target, hardware=hw, policies={policy: cluster},
                          cost_model_path=cost_model, cost=costs, slo_note=slo_note)
    payload = {"context": context, **res.to_dict()}
    write_json(out / "summary.json", payload)
    write_timeseries(out / "timeseries.csv", res.result.collector)
    write_requests_csv(out / "requests.csv", res.result.requests)
    if recorder is not None:
        from servelab.trace.runs import write_run_trace

        write_run_trace(trace, recorder, res.result, f"simulate {policy} on {workload} (simulated)")
    if json_out:
        emit_json(payload)
    else:
        from servelab.cli.common import console

        console().print(render_rich({policy: res.summary},
                                    title=f"{workload} on {hardware_title(instances, gpu, model, costs)}"))
        typer.echo(slo_note)
        typer.echo(f"simulated {res.result.num_output_tokens:,} output tokens in {res.cpu_s:.2f} CPU-s "
                   f"({res.simulated_tokens_per_cpu_s:,.0f} tokens/CPU-s); results in {out}/ "
                   f"(summary.json, timeseries.csv, requests.csv)" + (f"; trace in {trace}" if trace else ""))
    exit_if_aborted([abort_record(policy, res.summary)])


def _jobs_option():
    return typer.Option(1, "--jobs", "-j", help="Simulations run at once in local processes (same results as 1).")


def _backend_option():
    return typer.Option("local", "--backend", help="local (--jobs processes) | ray (a local Ray, or --ray-address).")


def _ray_address_option():
    return typer.Option(None, "--ray-address", help="Join this Ray cluster (with --backend ray), e.g. ray://host:10001.")


def _fanout(jobs: int, backend: str, ray_address: Optional[str]):
    from servelab.simulator import hugepage_arenas
    from servelab.simulator.fanout import Fanout

    # every process that simulates (this one with --jobs 1, else each worker) installs the
    # huge-page arenas before it allocates, as ``simulate`` does
    return Fanout(jobs, backend, ray_address, setup=hugepage_arenas.install)


@app.command()
def sweep(
    workload: str = typer.Option("azure-conv", "--workload", "-w", help=WORKLOAD_HELP),
    policies: str = typer.Option("vllm,sarathi", help="Comma-separated policy specs (use ';' inside a spec's params)."),
    rates: str = typer.Option("1,2,4", help="Mean arrival rates (req/s); the trace pattern is kept."),
    instances: int = typer.Option(1, "--instances", "-n", help=INSTANCES_HELP),
    gpu: str = typer.Option("A100-80GB"),
    model: str = typer.Option("Llama-2-7B"),
    tp: int = typer.Option(1),
    pp: int = typer.Option(1),
    max_num_seqs: int = typer.Option(256),
    swap_space: float = _swap_option(),
    max_model_len: Optional[int] = _max_model_len_option(),
    on_overflow: str = _overflow_option(),
    slo: Optional[str] = typer.Option(None, help=SLO_HELP),
    seed: int = typer.Option(0),
    data_dir: Path = typer.Option(None),
    out: Optional[Path] = typer.Option(None, help=OUT_HELP.format(cmd="sweep", files="sweep.json and plots")),
    json_out: bool = typer.Option(False, "--json"),
    config: Optional[Path] = config_option(),
    jobs: int = _jobs_option(),
    backend: str = _backend_option(),
    ray_address: Optional[str] = _ray_address_option(),
) -> None:
    """Policies x rates -> a table, sweep.json and plots of attainment / latency / throughput.

    Exit status: 0 when every request of every run completed or was rejected, 3 when some run
    aborted a request (sweep.json and the plots are written first), 2 for bad input.
    """
    from servelab import api
    from servelab.metrics.report import plot_sweep

    with user_errors():
        out = resolve_out(out, "sweep")
        names = [p.strip().replace(";", ",") for p in policies.split(",") if p.strip()]
        rate_values = parse_floats(rates, "--rates")
        slo = _slo_choice(slo)
        hw = _hardware(instances, gpu, model, tp, pp, max_num_seqs, swap_space, max_model_len, on_overflow)
        clusters = {name: api.check_policy(name, hw) for name in names}
        wl = api.load_workload(workload, data_dir=data_dir or api.DEFAULT_DATA_DIR, seed=seed)
        target, slo_note = resolve_slo(slo, wl)
        total = max(len(names) * len(rate_values), 1)
        with progress_bar(f"sweeping {len(names)} policies x {len(rate_values)} rates", not json_out) as cb:
            done: list[dict] = []
            rows = api.sweep(wl, names, rate_values, hw, slo=target,
                             on_point=None if cb is None else lambda r: (done.append(r), cb(len(done) / total)),
                             on_requests=lambda r, reqs: write_requests_csv(
                                 out / "requests" / f"{_file_safe(r['policy'])}@{r['rate']:g}.csv", reqs),
                             fanout=_fanout(jobs, backend, ray_address))
    context = run_context(workload=workload, seed=seed, slo=target, hardware=hw, policies=clusters,
                          rates=rate_values, slo_note=slo_note)
    write_json(out / "sweep.json", {"context": context, "rows": rows})
    title = f"{workload} on {hardware_title(instances, gpu, model, None)}"
    for y in ("slo_attainment", "ttft_p99_s", "tpot_p50_s", "throughput_tok_s"):
        if any(r[y] is not None and r[y] == r[y] for r in rows):  # no attainment plot without an SLO
            plot_sweep(rows, "rate", y, out / f"{y}.png", caption=f"{title}; {slo_note}\n{context['command']}")
    if json_out:
        emit_json({"context": context, "rows": rows})
    else:
        from servelab.cli.common import console

        console().print(sweep_table(rows, title))
        typer.echo(slo_note)
        typer.echo(f"wrote {out}/sweep.json, plots and requests/<policy>@<rate>.csv")
    exit_if_aborted([(f"{r['policy']} at rate {r['rate']:g}", r["aborted"], r["arrived"], r["top_abort_reason"])
                     for r in rows])


@app.command()
def capacity(
    workload: str = typer.Option("azure-conv", "--workload", "-w", help=WORKLOAD_HELP),
    policy: str = typer.Option("vllm", "--policy", "-p", help=POLICY_HELP),
    slo: Optional[str] = typer.Option(None, help="The SLO whose attainment is kept: " + SLO_HELP),
    target: float = typer.Option(0.9, help="SLO attainment to keep."),
    rejections: str = typer.Option("count", help="count: a rejected request misses the SLO (attainment over "
                                   "every request); exclude: judge only the requests served. The output says "
                                   "how many were rejected and the attainment they cap."),
    lo: Optional[float] = typer.Option(None, help="Start of the search range in req/s (default: the API's, 0.5); "
                                                  "lowered 4x at a time while it misses the target."),
    hi: Optional[float] = typer.Option(None, help="End of the search range in req/s (default: the API's, 64); "
                                                  "raised 4x at a time while it still meets the target."),
    max_expansions: Optional[int] = typer.Option(None, help="How many 4x steps each way the bracketing may take "
                                                            "(default: the API's, 6; 0: search [lo, hi] only)."),
    instances: int = typer.Option(1, "--instances", "-n", help=INSTANCES_HELP),
    gpu: str = typer.Option("A100-80GB"),
    model: str = typer.Option("Llama-2-7B"),
    tp: int = typer.Option(1), pp: int = typer.Option(1),
    max_num_seqs: int = typer.Option(256),
    swap_space: float = _swap_option(),
    max_model_len: Optional[int] = _max_model_len_option(),
    on_overflow: str = _overflow_option(),
    seed: int = typer.Option(0),
    data_dir: Path = typer.Option(None),
    out: Optional[Path] = typer.Option(None, help=OUT_HELP.format(cmd="capacity", files="capacity.json")),
    json_out: bool = typer.Option(False, "--json"),
    config: Optional[Path] = config_option(),
    jobs: int = _jobs_option(),
    backend: str = _backend_option(),
    ray_address: Optional[str] = _ray_address_option(),
) -> None:
    """Highest request rate that keeps the SLO attainment: brackets the answer (4x steps down or
    up from --lo/--hi), then bisects, one simulation per probe.

    Exit status: 0 when found, 3 when some probe aborted a request (capacity.json is written
    first: an attainment measured while requests were lost is suspect), 2 for bad input.
    """
    from servelab import api
    from servelab.metrics.capacity import DEFAULT_HI, DEFAULT_LO, DEFAULT_MAX_EXPANSIONS

    lo = DEFAULT_LO if lo is None else lo
    hi = DEFAULT_HI if hi is None else hi
    max_expansions = DEFAULT_MAX_EXPANSIONS if max_expansions is None else max_expansions
    with user_errors():
        out = resolve_out(out, "capacity")
        slo = _slo_choice(slo)
        hw = _hardware(instances, gpu, model, tp, pp, max_num_seqs, swap_space, max_model_len, on_overflow)
        cluster = api.check_policy(policy, hw)
        wl = api.load_workload(workload, data_dir=data_dir or api.DEFAULT_DATA_DIR, seed=seed)
        target_slo, slo_note = resolve_slo(slo, wl)
        with progress_log(f"capacity of {policy}: probing rates", not json_out) as log:
            res = api.capacity(wl, policy, hw, slo=target_slo, target=target, lo=lo, hi=hi,
                               max_expansions=max_expansions, rejections=rejections,
                               on_probe=lambda r, a: log(f"  rate {r:8.4g} req/s -> attainment {a:.3f}"),
                               fanout=_fanout(jobs, backend, ray_address))
    context = run_context(workload=workload, seed=seed, slo=target_slo, hardware=hw, policies={policy: cluster},
                          target_attainment=target, lo=lo, hi=hi, max_expansions=max_expansions,
                          rejections=rejections, slo_note=slo_note)
    payload = {"context": context, "policy": policy, "status": res.status, "capacity_rate": res.capacity_rate,
               "lowest_failing_rate": res.lowest_failing_rate, "target_attainment": res.target_attainment,
               "bracketing": list(res.expansions), "num_aborted": res.num_aborted,
               "rejections": res.rejections, "rejection_note": res.rejection_note,
               "probes": [{"rate": p.rate, "attainment": p.attainment, "passed": p.passed, "aborted": p.num_aborted,
                           "rejected": p.num_rejected, "arrived": p.num_arrived} for p in res.probes]}
    write_json(out / "capacity.json", payload)
    if json_out:
        emit_json(payload)
    else:
        from servelab.cli.common import console

        console().print(probe_table(res, f"capacity probes: {policy} on {workload}"))
        typer.echo(slo_note)
        for note in res.expansions:
            typer.echo(f"bracketing: {note}")
        if res.rejection_note:
            typer.echo(f"rejections: {res.rejection_note}")
        typer.echo(_capacity_line(policy, res, target) + f"; results in {out}/capacity.json")
    if res.num_aborted:
        bad = [f"{p.rate:.4g} req/s: {p.num_aborted}" for p in res.probes if p.num_aborted]
        typer.secho(f"aborted requests in capacity probes (exit status {EXIT_ABORTED}): {', '.join(bad)}",
                    fg=typer.colors.RED, err=True)
        raise typer.Exit(EXIT_ABORTED)


def _capacity_line(policy: str, res, target: float) -> str:
    if res.status == "found":
        return (f"{policy}: capacity {res.capacity_rate:.4g} req/s at attainment >= {target} "
                f"(fails at {res.lowest_failing_rate:.4g}; {res.num_probes} probes)")
    if res.status == "lo_fails" and res.expansions and res.expansions[-1].startswith("attainment stopped"):
        return f"{policy}: no capacity: attainment >= {target} is out of reach at any rate tried"
    if res.status == "lo_fails":
        return (f"{policy}: capacity below {res.lowest_failing_rate:.4g} req/s, the lowest rate tried "
                f"(attainment < {target} there; lower --lo or raise --max-expansions)")
    return (f"{policy}: capacity at least {res.capacity_rate:.4g} req/s, the highest rate tried "
            f"(raise --hi or --max-expansions)")


@app.command()
def demo(
    workload: str = typer.Option("azure-conv", "--workload", "-w", help="The trace (a window of it runs faster, "
                                                                        "e.g. 'azure-conv:window=0-60')."),
    data_dir: Path = typer.Option(None),
    out: Optional[Path] = typer.Option(None, help=OUT_HELP.format(cmd="demo", files="demo.json and demo.md")),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """The Azure 2023 conversation trace (19,366 requests) on 2 simulated A100-80GB / Llama-2-7B
    instances under static, vllm, sarathi and distserve, side by side."""
    from servelab.cli.demo import run_demo

    with user_errors():
        run_demo(data_dir, resolve_out(out, "demo"), json_out, workload)


def _register_optional_commands() -> None:
    """Design and engine commands live in their own modules; the engine ones import torch lazily."""
    from servelab.cli import extra, perf

    extra.register(app)
    perf.register(app)


_register_optional_commands()


if __name__ == "__main__":
    app()


def _file_safe(name: str) -> str:
    """A policy spec as a file name (``sarathi:token_budget=256`` -> ``sarathi_token_budget=256``)."""
    return "".join(ch if ch.isalnum() or ch in "=-._" else "_" for ch in name)
