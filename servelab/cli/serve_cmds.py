"""Serving commands: ``serve`` (OpenAI-compatible server on the engine), ``bench`` (load
generator for any such server) and ``serve-vs-sim`` (bench against serve, next to the
simulator's prediction for the same workload).

Torch, FastAPI and uvicorn are imported inside the command bodies only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from servelab.cli.common import check_out_dir, check_out_file, emit_json, user_errors
from servelab.cli.vocab import engine_kv_budget_mb, policy_with_vllm_flags
from servelab.core.errors import UserError

def serve(
    model_arg: Optional[Path] = typer.Argument(None, metavar="[MODEL]", help="HF checkpoint folder, as in "
                                               "`vllm serve MODEL` (or --model)."),
    model: Optional[Path] = typer.Option(None, "--model", help="HF checkpoint folder (e.g. from make-tiny-model)."),
    policy: str = typer.Option("vllm", "--policy", "-p", help="Policy spec or preset (vllm, sarathi, distserve, ...)."),
    router: Optional[str] = typer.Option(None, help="Router spec (default: the policy preset's)."),
    instances: int = typer.Option(1, "--instances", "-n", help="Engine instances (in this process, or Ray actors)."),
    backend: str = typer.Option("inprocess", "--backend", help="inprocess | ray (each instance a Ray actor)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Join this Ray cluster (default: start "
                                              "Ray on this machine); with --backend ray."),
    host: str = typer.Option("127.0.0.1", help="Listen address (loopback unless told otherwise)."),
    port: int = typer.Option(8000),
    api_key: Optional[str] = typer.Option(None, envvar="SERVELAB_API_KEY",
                                          help="Require 'Authorization: Bearer KEY' on every /v1 call."),
    served_model_name: Optional[str] = typer.Option(None, help="The model name clients use (default: --model)."),
    kv_budget_mb: float = typer.Option(256.0, help="KV cache memory per instance, MiB."),
    block_size: int = typer.Option(16),
    max_num_batched_tokens: int = typer.Option(2048, "--max-num-batched-tokens", "--max-batch-tokens"),
    max_num_seqs: int = typer.Option(64),
    swap_space: float = typer.Option(0.0, "--swap-space", help="Host KV memory per instance in GiB (vLLM's "
                                                                 "--swap-space); needed by preemption=swap."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help="Prompt + max tokens limit "
                                                "(default: the model's max positions); longer requests get a 400."),
    enable_chunked_prefill: bool = typer.Option(False, "--enable-chunked-prefill",
                                                help="vLLM's chunked prefill: -p vllm becomes sarathi with "
                                                     "token_budget = --max-num-batched-tokens."),
    preemption_mode: Optional[str] = typer.Option(None, help="recompute | swap (the policy's preemption=)."),
    gpu_memory_utilization: Optional[float] = typer.Option(
        None, help="Fraction of device memory (host RAM on CPU) for weights + KV; replaces --kv-budget-mb."),
    dtype: Optional[str] = typer.Option(None, help="float32 | bfloat16 (default: the checkpoint's)."),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads."),
    chat_template: Optional[Path] = typer.Option(None, help="Jinja chat template file (default: the checkpoint's)."),
    request_log: Optional[Path] = typer.Option(None, help="Append one JSON line per ended request (engine times)."),
    shutdown_timeout: float = typer.Option(5.0, help="Seconds requests in flight get to finish on shutdown."),
    seed: int = typer.Option(0, help="Sampler seed for requests without their own."),
    log_level: str = typer.Option("info", help="uvicorn log level (info prints one line per request)."),
    engine_process: bool = typer.Option(True, "--engine-process/--engine-thread",
                                        help="Run the engine in its own process (default; as vLLM's engine core) "
                                             "or on a thread of the HTTP process. --backend ray: a thread."),
) -> None:
    """OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics).

    `servelab serve MODEL` (vLLM's form) and `servelab serve --model MODEL` are the same."""
    with user_errors():
        from servelab.cli.engine_cmds import _set_threads, ray_config_for

        model = one_model(model_arg, model)
        from servelab.server.run import ServerConfig, run_server

        _set_threads(threads)
        if request_log is not None:
            check_out_file(request_log, "--request-log")  # before the model loads, not at the first request
        ray_config = ray_config_for(backend, ray_address)
        policy = policy_with_vllm_flags(policy, enable_chunked_prefill=enable_chunked_prefill,
                                        preemption_mode=preemption_mode, max_num_batched_tokens=max_num_batched_tokens)
        if gpu_memory_utilization is not None:
            kv_budget_mb = engine_kv_budget_mb(model, gpu_memory_utilization, instances, dtype)
        if log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
            raise UserError(f"--log-level must be critical, error, warning, info, debug or trace, got {log_level!r}")
        from servelab.cli.engine_cmds import _engine_config
        from servelab.engine.loader import load_checkpoint

        # with the engine in its own process, the weights load there only (here they doubled the memory)
        loaded = load_checkpoint(model, dtype=dtype, weights=not (engine_process and backend == "inprocess"))
        engine = _engine_config(loaded, kv_budget_mb, block_size, max_num_batched_tokens, max_num_seqs, seed,
                                swap_space, max_model_len, "reject")
        config = ServerConfig(model=model, policy=policy, router=router, num_instances=instances, engine=engine,
                              host=host, port=port, api_key=api_key, served_model_name=served_model_name,
                              dtype=dtype, chat_template=chat_template, request_log=request_log,
                              shutdown_timeout_s=shutdown_timeout, log_level=log_level, backend=backend,
                              ray_config=ray_config, engine_process=engine_process and backend == "inprocess")
        typer.echo(f"serving {config.model_name} on http://{host}:{port} (policy {policy}, {instances} instance(s))",
                   err=True)
        run_server(config, loaded)


def bench(
    base_url: str = typer.Option(..., "--base-url", help="Server root, e.g. http://127.0.0.1:8000."),
    workload: Optional[str] = typer.Option(None, "--workload", "-w", help="Workload spec: its lengths (and times "
                                           "with --trace-timing), e.g. 'poisson:n=200,prompt=fixed(128),"
                                           "output=fixed(64)'. Or --dataset-name random."),
    dataset_name: Optional[str] = typer.Option(None, "--dataset-name", help="vLLM's: 'random' (fixed "
                                               "--random-input-len / --random-output-len, --num-prompts of "
                                               "them) is -w 'burst:n=N,prompt=fixed(I),output=fixed(O)'; other "
                                               "datasets: give -w (gsm8k, arxiv, traces, ...)."),
    random_input_len: int = typer.Option(1024, "--random-input-len", help="With --dataset-name random."),
    random_output_len: int = typer.Option(128, "--random-output-len", help="With --dataset-name random."),
    endpoint: str = typer.Option("/v1/completions", help="/v1/completions or /v1/chat/completions."),
    model: Optional[str] = typer.Option(None, help="Model name to send (default: the server's first)."),
    tokenizer: Optional[Path] = typer.Option(None, help="The server's checkpoint folder (or tokenizer.json): "
                                                        "prompts of exactly the planned token count."),
    prompt_format: str = typer.Option("text", help="text | ids (token ids in the prompt; needs --tokenizer)."),
    num_prompts: Optional[int] = typer.Option(None, help="Use the first N requests of the workload."),
    request_rate: float = typer.Option(math.inf, help="Requests per second (inf: all at once)."),
    burstiness: float = typer.Option(1.0, help="Gamma shape of the gaps, as vLLM (1 = Poisson; CV = 1/sqrt)."),
    trace_timing: bool = typer.Option(False, "--trace-timing", help="Keep the workload's own arrival times."),
    max_concurrency: Optional[int] = typer.Option(None, help="Cap on requests in flight."),
    request_timeout: float = typer.Option(6 * 3600.0, "--request-timeout", help="Seconds a request may take "
                                          "before it counts as failed."),
    goodput: Optional[list[str]] = typer.Option(None, help="SLO targets in ms, e.g. --goodput ttft:500 "
                                                           "--goodput tpot:50 (or 'ttft:500 tpot:50')."),
    metric_percentiles: str = typer.Option("50,90,99"),
    percentile_metrics: Optional[str] = typer.Option(None, "--percentile-metrics", help="vLLM's: which of ttft,"
                                                     "tpot,itl,e2el get the pNN fields (default: all four)."),
    ignore_eos: bool = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="Force each output length."),
    temperature: float = typer.Option(0.0),
    api_key: Optional[str] = typer.Option(None, envvar="OPENAI_API_KEY"),
    result_dir: Path = typer.Option(Path("results/bench"), help="Folder for the JSON, CSV and plots."),
    result_filename: Optional[str] = typer.Option(None, help="Default: bench-<rate>qps-<model>-<YYYYmmdd-HHMMSS>.json (vLLM's pattern; a rerun never "
                                                         "replaces a result). A name given is overwritten."),
    seed: int = typer.Option(0),
    data_dir: Optional[Path] = typer.Option(None),
    disable_tqdm: bool = typer.Option(False, "--disable-tqdm"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Load any OpenAI-compatible server with a workload; TTFT/TPOT/ITL/e2e, throughput, goodput."""
    with user_errors():
        from servelab.bench.session import BenchOptions, bench_session

        check_out_dir(result_dir, "--result-dir")
        workload = bench_workload(workload, dataset_name, num_prompts, random_input_len, random_output_len)
        options = BenchOptions(base_url=base_url, workload=workload, endpoint=endpoint, model=model,
                               tokenizer=tokenizer, prompt_format=prompt_format, num_prompts=num_prompts,
                               request_rate=request_rate, burstiness=burstiness, trace_timing=trace_timing,
                               max_concurrency=max_concurrency, request_timeout_s=request_timeout,
                               goodput=tuple(goodput or ()), metric_percentiles=metric_percentiles, percentile_metrics=percentile_metrics,
                               ignore_eos=ignore_eos, temperature=temperature,
                               api_key=api_key, seed=seed, data_dir=data_dir, progress=not (disable_tqdm or json_out))
        summary, paths = bench_session(options, result_dir, result_filename)
    if json_out:
        emit_json(summary)
        return
    from servelab.bench.session import format_summary

    typer.echo(format_summary(summary))
    typer.echo("wrote " + ", ".join(str(p) for p in paths))


def one_model(positional: Optional[Path], option: Optional[Path]) -> Path:
    """The checkpoint from ``serve MODEL`` or ``serve --model MODEL`` (one of them, or both the same)."""
    if positional is None and option is None:
        raise UserError("give the checkpoint folder: servelab serve MODEL (or --model MODEL)")
    if positional is not None and option is not None and positional != option:
        raise UserError(f"two models given: {positional} and --model {option}; give one")
    return positional if positional is not None else option


def bench_workload(workload: Optional[str], dataset_name: Optional[str], num_prompts: Optional[int],
                   input_len: int, output_len: int) -> str:
    """The workload spec from ``-w`` or vLLM's ``--dataset-name`` (random only; the rest point to ``-w``)."""
    if workload is not None and dataset_name is not None:
        raise UserError("give either --workload or --dataset-name, not both")
    if workload is not None:
        return workload
    if dataset_name is None:
        raise UserError("give the requests: --workload SPEC (e.g. 'burst:n=100,prompt=fixed(128),output=fixed(64)') "
                        "or --dataset-name random")
    if dataset_name != "random":
        raise UserError(f"--dataset-name {dataset_name!r}: only 'random' maps directly (servelab downloads "
                        f"nothing); give -w with a dataset it has (gsm8k, arxiv, alpaca, longbench, azure-conv, "
                        f"...), e.g. -w 'gsm8k:n=200'")
    return f"burst:n={num_prompts or 1000},prompt=fixed({input_len}),output=fixed({output_len})"


def serve_vs_sim(
    model: Path = typer.Option(..., "--model", help="HF checkpoint folder (the server's and the tokenizer's)."),
    cost_model: Path = typer.Option(..., "--cost-model", help="servelab calibrate's JSON for this model here."),
    workload: str = typer.Option("burst:n=40,prompt=uniform(32,256),output=uniform(16,64)", "--workload", "-w",
                                 help="Lengths and count of the requests (arrival times come from --rates)."),
    rates: str = typer.Option("0.25,0.5,1", help="Comma-separated request rates (req/s)."),
    policy: str = typer.Option("vllm", "--policy", "-p"),
    instances: int = typer.Option(1, "--instances", "-n"),
    threads: int = typer.Option(1, help="torch threads of the server."),
    kv_budget_mb: float = typer.Option(256.0), block_size: int = typer.Option(16),
    max_num_batched_tokens: int = typer.Option(2048), max_num_seqs: int = typer.Option(64),
    burstiness: float = typer.Option(1.0), seed: int = typer.Option(0),
    out: Path = typer.Option(Path("results/serve_vs_sim"), help="Folder for per-rate bench files and the JSON."),
    doc: Optional[Path] = typer.Option(None, help="Also write the markdown report here (e.g. docs/server.md)."),
    data_dir: Optional[Path] = typer.Option(None),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """The same workload through bench against serve (measured) and the simulator with the calibrated cost model."""
    import shlex
    import sys

    with user_errors():
        from servelab.bench.compare import CompareOptions, run_compare
        from servelab.bench.compare_report import render
        from servelab.cli.common import parse_floats

        check_out_dir(out)
        options = CompareOptions(model=model, cost_model=cost_model, workload=workload,
                                 rates=tuple(parse_floats(rates, "--rates")), policy=policy, num_instances=instances,
                                 threads=threads, kv_budget_mb=kv_budget_mb, block_size=block_size,
                                 max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                 burstiness=burstiness, seed=seed, data_dir=data_dir, progress=not json_out)
        payload = run_compare(options, out)
        command = "servelab " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        text = render(payload, command, _model_note(model), _cost_note(cost_model, model))
        (out / "serve_vs_sim.md").write_text(text)
        if doc is not None:
            doc.parent.mkdir(parents=True, exist_ok=True)
            doc.write_text(text)
    if json_out:
        emit_json(payload)
    else:
        typer.echo(text)


def _model_note(model: Path) -> str:
    """What the checkpoint is, read from it (not what the docs' run happened to use)."""
    from servelab.engine.loader import load_config

    c = load_config(model)
    return (f"`{model}`, {count_text(c.num_params)} parameters ({c.num_layers} layers, hidden {c.hidden_size}, "
            f"{c.torch_dtype})")


def _cost_note(cost_model: Path, model: Path) -> str:
    """Where the cost model came from, read from its own ``meta`` (the calibration run's machine,
    threads, date and checkpoint); says so when it was calibrated on another checkpoint."""
    import json

    try:
        meta = json.loads(cost_model.read_text()).get("meta", {}) or {}
    except (OSError, ValueError, AttributeError):
        meta = {}
    if not meta:
        return f"`{cost_model}` (it records no provenance)"
    where = meta.get("hardware") or meta.get("processor") or meta.get("machine") or "an unrecorded machine"
    parts = [f"`{cost_model}`: {meta.get('source', 'servelab calibrate')} on {where}"]
    if meta.get("torch_threads"):
        parts.append(f"{meta['torch_threads']} torch thread(s)")
    if meta.get("date"):
        parts.append(f"on {meta['date']}")
    note = ", ".join(parts)
    calibrated_on = meta.get("model")
    if calibrated_on and Path(calibrated_on).resolve() != model.resolve():
        note += f"; calibrated on the checkpoint `{calibrated_on}`, not on `{model}`"
    return note


def count_text(n: int) -> str:
    """93,248 -> '93.2K', 196,800,000 -> '197M' (never '0M')."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("bench")(bench)
    app.command("serve-vs-sim")(serve_vs_sim)
