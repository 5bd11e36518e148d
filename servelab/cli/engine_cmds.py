"""Engine commands: ``generate``, ``make-tiny-model``, ``calibrate``.

Everything that imports torch is imported inside the command bodies, so ``servelab --help``
and the simulator commands never load it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from servelab.cli.common import abort_record, check_out_dir, check_out_file, emit_json, exit_if_aborted, user_errors
from servelab.core.errors import UserError
from servelab.core.limits import MAX_TOKENS

_PRESETS = ("tiny", "bench-30m", "bench-200m")
MAX_KV_BUDGET_MB = 2**20  # 1 TiB: far above any host or GPU, so only a typo is stopped
MAX_THREADS = 1024


def read_prompts(path: Path) -> list[str]:
    """One prompt per line, or JSONL objects with a "prompt" field; blank lines are skipped."""
    from servelab.workloads._parse import WorkloadFileError, read_text

    try:
        path, text = read_text(path)
    except WorkloadFileError as e:
        raise UserError(f"prompts file {e}") from None
    prompts = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{number}: invalid JSON ({e.msg})") from None
            except (ValueError, RecursionError) as e:
                raise UserError(f"{path}:{number}: unreadable JSON ({type(e).__name__})") from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
                raise UserError(f"{path}:{number}: a JSONL row needs a non-empty string field 'prompt'")
            prompts.append(row["prompt"])
        else:
            prompts.append(line.rstrip("\r"))
    if not prompts:
        raise UserError(f"{path}: no prompts")
    return prompts


def build_specs(tokenizer, prompts_file: Optional[Path], workload: Optional[str], data_dir: Optional[Path],
                seed: int, max_tokens: Optional[int]) -> list:
    """RequestSpecs with prompt_token_ids from a prompts file or a text-carrying workload."""
    from servelab.core.request import RequestSpec

    if (prompts_file is None) == (workload is None):
        raise UserError("give exactly one of --prompts FILE or --workload SPEC")
    if max_tokens is not None and not 1 <= max_tokens <= MAX_TOKENS:
        raise UserError(f"--max-tokens must be in [1, {MAX_TOKENS:,}], got {max_tokens}")
    if prompts_file is not None:
        specs = []
        for i, text in enumerate(read_prompts(prompts_file)):
            ids = tuple(tokenizer.encode(text).ids)
            specs.append(RequestSpec(i, 0.0, len(ids), max_tokens or 64, prompt_token_ids=ids, prompt_text=text))
        return specs
    from servelab import api

    specs = api.load_workload(workload, data_dir=data_dir or api.DEFAULT_DATA_DIR, seed=seed)
    out = []
    for spec in specs:
        if spec.prompt_text is None:
            raise UserError(f"workload {workload!r} has no prompt text (request {spec.request_id}); "
                             f"use a text dataset such as gsm8k, or --prompts")
        ids = tuple(tokenizer.encode(spec.prompt_text).ids)
        out.append(replace(spec, num_prompt_tokens=len(ids), prompt_token_ids=ids,
                           num_output_tokens=max_tokens or spec.num_output_tokens))
    return out


def generate(
    model: Path = typer.Option(..., "--model", help="HF checkpoint folder (e.g. from make-tiny-model)."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="One prompt per line, or JSONL with \"prompt\"."),
    workload: Optional[str] = typer.Option(None, "--workload", "-w", help="A text workload, e.g. gsm8k:n=32."),
    policy: str = typer.Option("vllm", "--policy", "-p", help="Policy spec, e.g. sarathi:token_budget=256."),
    max_tokens: Optional[int] = typer.Option(None, help="New tokens per request, >= 1 (if not given: 64 for --prompts, "
                                                        "the workload's own output lengths for --workload)."),
    temperature: float = typer.Option(0.0, help="0 is greedy."),
    top_p: float = typer.Option(1.0), top_k: int = typer.Option(0),
    seed: int = typer.Option(0, help="Sampling seed (request i uses seed + i) and workload seed."),
    stop: Optional[list[str]] = typer.Option(None, "--stop", help="Stop string (repeatable)."),
    ignore_eos: bool = typer.Option(False, help="Keep generating past EOS (fixed-length benchmarks)."),
    kv_budget_mb: float = typer.Option(256.0, help="KV cache memory in MiB."),
    gpu_memory_utilization: Optional[float] = typer.Option(
        None, help="Fraction of device memory (host RAM on CPU) for weights + KV (vLLM's); replaces --kv-budget-mb."),
    block_size: int = typer.Option(16),
    max_batch_tokens: int = typer.Option(2048, "--max-num-batched-tokens", "--max-batch-tokens",
                                         help="Tokens per step (vLLM's name)."),
    max_num_seqs: int = typer.Option(64),
    enable_chunked_prefill: bool = typer.Option(False, "--enable-chunked-prefill",
                                                help="vLLM's chunked prefill: -p vllm becomes sarathi with "
                                                     "token_budget = --max-num-batched-tokens."),
    preemption_mode: Optional[str] = typer.Option(None, help="recompute | swap (the policy's preemption=)."),
    swap_space: float = typer.Option(0.0, "--swap-space", help="Host KV memory per instance in GiB (vLLM's "
                                                                 "--swap-space); needed by preemption=swap."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help="Prompt + max tokens limit at "
                                                "admission (default: the model's max positions)."),
    on_overflow: str = typer.Option("reject", "--on-overflow", help="A request over the context: reject, or "
                                    "truncate its prompt (head and tail kept)."),
    dtype: Optional[str] = typer.Option(None, help="float32 | bfloat16 (default: the checkpoint's)."),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads (default: torch's choice)."),
    data_dir: Optional[Path] = typer.Option(None),
    json_out: bool = typer.Option(False, "--json"),
    instances: int = typer.Option(1, "--instances", "-n", help="Engine instances (P/D presets such as distserve "
                                  "need 2 or more)."),
    router: Optional[str] = typer.Option(None, help="Router spec (default: the policy preset's)."),
    backend: str = typer.Option("inprocess", "--backend", help="inprocess | ray (each instance a Ray actor)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Join this Ray cluster (default: start "
                                              "Ray on this machine); with --backend ray."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Also write a Chrome/Perfetto trace JSON of the run "
                                         "(measured steps per instance, transfers, request flows)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Folder for summary.json (outputs + summary), "
                                       "requests.csv and timeseries.csv (default: a new results/generate/<UTC "
                                       "time>/ per run, printed at the end)."),
) -> None:
    """Serve prompts on the real engine under one policy; print outputs and the run summary (measured).

    Exit status: 0 when every request completed or was rejected, 3 when some request was
    aborted (the outputs and summary are printed first), 2 for bad input.
    """
    with user_errors():
        from servelab.engine.loader import load_checkpoint

        from servelab.cli.vocab import engine_kv_budget_mb, policy_with_vllm_flags

        from servelab.cli.outputs import resolve_out

        _set_threads(threads)
        out = resolve_out(out, "generate")  # before the model loads: an unusable folder fails first
        ray_config = ray_config_for(backend, ray_address)
        policy = policy_with_vllm_flags(policy, enable_chunked_prefill=enable_chunked_prefill,
                                        preemption_mode=preemption_mode, max_num_batched_tokens=max_batch_tokens)
        if gpu_memory_utilization is not None:
            kv_budget_mb = engine_kv_budget_mb(model, gpu_memory_utilization, instances, dtype)
        loaded = load_checkpoint(model, dtype=dtype)
        specs = build_specs(loaded.tokenizer, prompts, workload, data_dir, seed, max_tokens)
        params = _sampling(specs, temperature, top_p, top_k, seed, stop or (), ignore_eos)
        config = _engine_config(loaded, kv_budget_mb, block_size, max_batch_tokens, max_num_seqs, seed, swap_space,
                                max_model_len, on_overflow)
        from servelab.engine.cluster import EngineCluster

        engine = EngineCluster(loaded, policy, config, num_instances=instances, router=router, backend=backend,
                               ray_config=ray_config)
        if trace is not None:
            check_out_file(trace, "--trace")
        try:
            if trace is None:
                result = engine.run(specs, params)
            else:
                from servelab.trace.runs import run_engine_traced, write_run_trace

                result, recorder = run_engine_traced(engine, specs, params)
                write_run_trace(trace, recorder, result, f"generate {policy} on {model.name} (measured)")
        finally:
            engine.close()
    outputs = [{"request_id": r.request_id, "status": r.status.value, "finish_reason": r.finish_reason,
                "num_prompt_tokens": r.num_prompt_tokens, "num_output_tokens": r.num_generated_tokens,
                "text": result.texts.get(r.request_id, "")} for r in sorted(result.requests, key=lambda r: r.request_id)]
    payload = {"policy": policy, "model": str(model), "wall_s": result.wall_s, "outputs": outputs,
               "summary": result.summary.to_dict()}
    from servelab.cli.common import write_json, write_timeseries
    from servelab.cli.outputs import write_requests_csv

    write_json(out / "summary.json", payload)
    write_requests_csv(out / "requests.csv", result.requests)
    write_timeseries(out / "timeseries.csv", result.collector)
    if json_out:
        emit_json(payload)
    else:
        for o in outputs:
            typer.echo(f"[{o['request_id']}] ({o['status']}: {o['finish_reason']}, {o['num_output_tokens']} tokens) "
                       f"{o['text']!r}")
        from servelab.cli.common import console

        from servelab.metrics.report import render_rich

        console().print(render_rich({policy: result.summary},
                                    title=f"{model.name} on this machine (measured, engine)"))
        typer.echo(f"results in {out}/ (summary.json, requests.csv, timeseries.csv)")
    exit_if_aborted([abort_record(policy, result.summary)])


def ray_config_for(backend: str, ray_address: Optional[str]):
    """The Ray backend's settings from ``--backend`` / ``--ray-address`` (None in process)."""
    from servelab.engine.cluster import BACKENDS

    if backend not in BACKENDS:
        raise UserError(f"unknown engine backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if ray_address is not None and backend != "ray":
        raise UserError("--ray-address needs --backend ray")
    if backend != "ray":
        return None
    from servelab.engine.ray_backend import RayConfig

    return RayConfig(address=ray_address)


def _set_threads(threads: Optional[int]) -> None:
    import torch

    if threads is not None:
        if not 1 <= threads <= MAX_THREADS:
            raise UserError(f"--threads must be in [1, {MAX_THREADS}], got {threads}")
        torch.set_num_threads(threads)


def _sampling(specs, temperature, top_p, top_k, seed, stop, ignore_eos) -> dict:
    """Sampling parameters per request (SamplingParams checks the values)."""
    from servelab.engine.sampling import SamplingParams

    return {s.request_id: SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed + s.request_id,
                                         max_tokens=s.num_output_tokens, stop=tuple(stop), ignore_eos=ignore_eos)
            for s in specs}


def _engine_config(loaded, kv_budget_mb, block_size, max_batch_tokens, max_num_seqs, seed, swap_space, max_model_len,
                   on_overflow):
    """EngineConfig checks the sizes; swap space in GiB becomes host blocks of this checkpoint."""
    from servelab.engine.cluster import EngineConfig, host_blocks_for

    if not 0 < kv_budget_mb <= MAX_KV_BUDGET_MB:
        raise UserError(f"--kv-budget-mb must be in (0, {MAX_KV_BUDGET_MB:,}], got {kv_budget_mb}")
    config = EngineConfig(kv_budget_bytes=int(kv_budget_mb * 2**20), block_size=block_size,
                          max_batch_tokens=max_batch_tokens, max_num_seqs=max_num_seqs, seed=seed,
                          max_model_len=max_model_len, on_overflow=on_overflow)
    return replace(config, num_host_blocks=host_blocks_for(loaded, swap_space, block_size))


def make_tiny_model_cmd(
    out_dir: Path = typer.Argument(..., help="Folder to write the checkpoint into."),
    preset: str = typer.Option("tiny", help="tiny (64 hidden, 2 layers) | bench-30m (~30M params) | bench-200m (~196M params)."),
    arch: str = typer.Option("llama", help="llama | qwen2"),
    seed: int = typer.Option(0),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
) -> None:
    """Write a random-weight HF checkpoint with a tokenizer trained on GSM8K (no downloads)."""
    with user_errors():
        if preset not in _PRESETS:
            raise UserError(f"--preset must be one of {_PRESETS}, got {preset!r}")
        if arch not in ("llama", "qwen2"):
            raise UserError(f"--arch must be llama or qwen2, got {arch!r}")
        if dtype not in ("float32", "bfloat16", "float16"):
            raise UserError(f"--dtype must be float32, bfloat16 or float16, got {dtype!r}")
        check_out_dir(out_dir, "OUT_DIR")
        from servelab.engine.tiny_model import BENCH_30M, BENCH_200M, make_tiny_model

        kwargs = {"tiny": {}, "bench-30m": BENCH_30M, "bench-200m": BENCH_200M}[preset]
        path = make_tiny_model(out_dir, arch=arch, seed=seed, dtype=dtype, **kwargs)
    typer.echo(f"wrote {preset} {arch} checkpoint to {path}")


def calibrate_cmd(
    model: Optional[Path] = typer.Option(None, "--model", help="HF checkpoint folder (our engine's steps)."),
    out: Path = typer.Option(..., "--out", help="Where to write the cost model JSON."),
    grid: str = typer.Option("default", help="default (~2-3 min on bench-200m, 2 cores) | reduced (seconds)."),
    block_size: Optional[int] = typer.Option(None, help="KV block size (default 16; with --base-url: the "
                                             "server's /metrics, else 16)."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="Instead of --model: probe this running "
                                           "OpenAI-compatible server (vLLM, servelab serve, ...) through its API."),
    time_budget: float = typer.Option(300.0, "--time-budget", help="With --base-url: seconds the probes may take."),
    repeats: int = typer.Option(2, help="With --base-url: times each probe runs."),
    load_reference: bool = typer.Option(True, "--load-reference/--no-load-reference",
                                        help="With --base-url: time a short reference probe between probes and "
                                             "divide each probe's samples by the load level it shows."),
    tokenizer: Optional[Path] = typer.Option(None, help="With --base-url: the server's tokenizer (checkpoint "
                                             "folder), for its vocabulary size (probe prompts are random ids)."),
    api_key: Optional[str] = typer.Option(None, envvar="OPENAI_API_KEY"),
    max_num_seqs: Optional[int] = typer.Option(None, help="With --base-url: the server's limit when /metrics "
                                               "does not say (default 256)."),
    max_num_batched_tokens: Optional[int] = typer.Option(None, help="With --base-url: as --max-num-seqs "
                                                         "(default 2048)."),
    max_model_len: Optional[int] = typer.Option(None, help="With --base-url: when /v1/models does not say."),
    dtype: Optional[str] = typer.Option(None),
    threads: Optional[int] = typer.Option(None),
    attention_kernel: Optional[str] = typer.Option(None, "--attention-kernel",
                                                   help="The decode kernel the engine runs and the fit's attention "
                                                        "term follows: split-kv (the engine's default) | padded; auto "
                                                        "runs split-kv and keeps both terms, to compare."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Time engine steps over a grid of shapes (--model), or probe a running server through its API
    (--base-url), fit the linear cost model, save it for ``simulate --cost-model``."""
    if base_url is not None or model is None:
        from servelab.cli.remote_cmds import calibrate_remote_cmd

        calibrate_remote_cmd(base_url, model, out, block_size=block_size, time_budget=time_budget, repeats=repeats,
                             tokenizer=tokenizer, api_key=api_key, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                             json_out=json_out, load_reference=load_reference)
        return
    block_size = 16 if block_size is None else block_size
    with user_errors():
        if grid not in ("default", "reduced"):
            raise UserError(f"--grid must be default or reduced, got {grid!r}")
        from servelab.costmodel.linear import ATTENTION_KERNELS

        if attention_kernel is not None and attention_kernel not in ATTENTION_KERNELS:
            raise UserError(f"--attention-kernel must be one of {', '.join(ATTENTION_KERNELS)}, "
                            f"got {attention_kernel!r}")
        check_out_file(out)
        from servelab.engine.calibrate import REDUCED_GRID, CalibrationGrid, calibrate
        from servelab.engine.loader import load_checkpoint

        _set_threads(threads)
        loaded = load_checkpoint(model, dtype=dtype)
        chosen = REDUCED_GRID if grid == "reduced" else CalibrationGrid()
        from servelab.cli.common import progress_bar

        with progress_bar("timing engine steps over the grid", not json_out) as bar:
            progress = None if bar is None else (lambda k, n: bar(k / n))
            ran = attention_kernel if attention_kernel in ("padded", "split-kv") else "split-kv"
            cost, error, samples = calibrate(loaded, chosen, block_size=block_size, progress=progress,
                                             decode_kernel=ran, attention_kernel=attention_kernel)
        out.parent.mkdir(parents=True, exist_ok=True)
        cost.save(out)
    from servelab.costmodel.linear import HELD_OUT_WARN_MEDIAN, held_out_error

    held = held_out_error(samples, cost.attention_kernel, bool(cost.token_factors))
    payload = {"out": str(out), "fit": {"num_samples": error.num_samples, "median_rel_error": error.median_rel_error,
                                        "p90_rel_error": error.p90_rel_error, "max_rel_error": error.max_rel_error},
               "held_out": None if held is None else {"median_rel_error": held.median_rel_error,
                                                      "p90_rel_error": held.p90_rel_error},
               "coefficients": cost.to_json()["coefficients"]}
    if held is not None and held.median_rel_error > HELD_OUT_WARN_MEDIAN:
        typer.secho(f"warning: held-out median error {held.median_rel_error:.1%} (leave-one-out over "
                    f"{held.num_samples} steps) is over {HELD_OUT_WARN_MEDIAN:.0%}: the steps were too noisy "
                    f"(a loaded machine?) or too few for this model; rerun on an idle machine or with "
                    f"--grid default before trusting simulations with it", fg=typer.colors.YELLOW, err=True)
    if json_out:
        emit_json(payload)
        return
    typer.echo(f"fit over {error.num_samples} measured steps: {error}"
               + (f"; held out (leave-one-out): {held}" if held is not None else ""))
    for name, value in payload["coefficients"].items():
        typer.echo(f"  {name:<15} {value:.3e}")
    typer.echo(f"wrote {out} (use: servelab simulate --cost-model {out})")


def register(app: typer.Typer) -> None:
    app.command("generate")(generate)
    app.command("make-tiny-model")(make_tiny_model_cmd)
    app.command("calibrate")(calibrate_cmd)
