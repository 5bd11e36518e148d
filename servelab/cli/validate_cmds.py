"""``servelab validate`` (engine vs simulator on one workload) and ``servelab fidelity-report``
(every policy on the three validation workloads -> docs/fidelity.md). torch loads inside."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from servelab.cli.common import check_out_file, emit_json, user_errors
from servelab.core.errors import UserError


def _command_line() -> str:
    return "servelab " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _load(model: Path, threads: int):
    import torch

    from servelab.engine.loader import load_checkpoint

    if not 1 <= threads <= 1024:
        raise UserError(f"--threads must be in [1, 1024], got {threads}")
    torch.set_num_threads(threads)
    return load_checkpoint(model)


def _cost_model(loaded, cost_model: Optional[Path], out: Path, clock: str) -> tuple[Path, dict]:
    """The given calibration, or a fresh one (timed with ``clock``) saved under ``out``."""
    if cost_model is not None:
        if not cost_model.is_file():
            raise UserError(f"--cost-model {cost_model}: no such file (make one with servelab calibrate)")
        from servelab.costmodel.linear import LinearCostModel

        fit = LinearCostModel.load(cost_model).fit
        return cost_model, ({"num_samples": fit.num_samples, "median_rel_error": fit.median_rel_error,
                             "p90_rel_error": fit.p90_rel_error} if fit is not None else {})
    from servelab.validate.calibration import calibrate_to

    path = out / f"cost_model_{clock}.json"
    _, error = calibrate_to(loaded, path, clock)
    return path, {"num_samples": error.num_samples, "median_rel_error": error.median_rel_error,
                  "p90_rel_error": error.p90_rel_error}


def validate(
    model: Optional[Path] = typer.Option(None, "--model", help="HF checkpoint folder (e.g. make-tiny-model --preset "
                                         "bench-30m): our engine in this process."),
    workload: str = typer.Option("gsm8k", "--workload", "-w", help="gsm8k | azure-conv | long-short (the reduced "
                                 "validation workloads) or any workload spec."),
    policy: Optional[str] = typer.Option(None, "--policy", "-p", help="Policy or preset spec (default: vllm; with "
                                         "--base-url sarathi, vLLM v1's chunked prefill, decodes first)."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="Instead of --model: replay against this running "
                                           "OpenAI-compatible server (needs --cost-model from calibrate --base-url)."),
    replays: int = typer.Option(2, help="With --base-url: replays of the workload (the 2nd measures the noise)."),
    tokenizer: Optional[Path] = typer.Option(None, help="With --base-url: the server's tokenizer folder (vocab size)."),
    api_key: Optional[str] = typer.Option(None, envvar="OPENAI_API_KEY"),
    block_size: Optional[int] = typer.Option(None, help="With --base-url: when /metrics does not say (default 16)."),
    num_gpu_blocks: Optional[int] = typer.Option(None, help="With --base-url: KV blocks, when /metrics does not say."),
    max_model_len: Optional[int] = typer.Option(None, help="With --base-url: when /v1/models does not say."),
    rescale: bool = typer.Option(False, "--rescale", help="With --base-url: time 3 calibration probes first and "
                                 "also report the simulator with the fit scaled to them (load drift since the fit)."),
    router: Optional[str] = typer.Option(None, help="Router spec (default: the preset's)."),
    instances: int = typer.Option(1, "--instances", "-n"),
    cost_model: Optional[Path] = typer.Option(None, help="Calibrated cost model JSON (timed with the same --clock); "
                                              "default: calibrate now (~15 s on bench-30m)."),
    clock: str = typer.Option("cpu", help="cpu (steps in CPU seconds on a virtual clock: for a shared machine) | "
                              "wall (the engine's wall clock)."),
    max_prompt: int = typer.Option(256, help="Prompt cap for a workload spec (tokens)."),
    max_output: int = typer.Option(32, help="Output cap for a workload spec (tokens)."),
    kv_budget_mb: float = typer.Option(64.0),
    max_batch_tokens: Optional[int] = typer.Option(None, "--max-batch-tokens", "--max-num-batched-tokens",
                                                   help="Step token limit (default 512; with --base-url: "
                                                   "/metrics, else 2048)."),
    max_num_seqs: Optional[int] = typer.Option(None, help="Batch row limit (default 16; with --base-url: "
                                               "/metrics, else 256)."),
    seed: int = typer.Option(0), threads: int = typer.Option(1),
    out: Optional[Path] = typer.Option(None, help="Folder (default: results/validate/<time>)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Also write Chrome/Perfetto traces: FILE.json gets "
                                         "the engine's, FILE.sim.json the simulator's."),
    data_dir: Optional[Path] = typer.Option(None),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Run one workload on the real engine (--model), or replay it twice against a running server
    (--base-url), and in the calibrated simulator; per-request TTFT/TPOT/e2e errors, CDF plots, CSVs
    (measured on this machine)."""
    from servelab.cli.outputs import resolve_out

    if base_url is not None or model is None:
        from servelab.cli.remote_cmds import validate_remote_cmd

        with user_errors():
            if model is not None:
                raise UserError("give either --model (our engine) or --base-url (a running server), not both")
        validate_remote_cmd(base_url, workload=workload, cost_model=cost_model, policy=policy or "sarathi",
                            max_prompt=max_prompt, max_output=max_output, replays=replays, tokenizer=tokenizer,
                            api_key=api_key, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_batch_tokens,
                            max_model_len=max_model_len, seed=seed, out=out, data_dir=data_dir, json_out=json_out,
                            rescale=rescale)
        return
    policy = policy or "vllm"
    max_batch_tokens = 512 if max_batch_tokens is None else max_batch_tokens
    max_num_seqs = 16 if max_num_seqs is None else max_num_seqs
    with user_errors():
        from servelab.validate.compare import ValidateOptions, run_validation
        from servelab.validate.report import metrics_line, write_validation
        from servelab.validate.workloads import parse_validation_workload

        if trace is not None:
            check_out_file(trace, "--trace")
        folder = resolve_out(out, "validate")
        w = parse_validation_workload(workload, max_prompt, max_output)
        loaded = _load(model, threads)
        cost_path, _ = _cost_model(loaded, cost_model, folder, clock)
        options = ValidateOptions(model, cost_path, w, policy=policy, router=router, num_instances=instances,
                                  kv_budget_mb=kv_budget_mb, max_batch_tokens=max_batch_tokens,
                                  max_num_seqs=max_num_seqs, seed=seed, data_dir=data_dir, clock=clock)
        v = run_validation(options, loaded)
        paths = write_validation(folder, v, _command_line())
        if trace is not None:
            from servelab.trace.chrome import write_trace
            from servelab.validate.report import trace_of_cluster_side

            write_trace(trace, trace_of_cluster_side(v.real, "engine (measured)"))
            write_trace(trace.with_suffix(".sim.json"), trace_of_cluster_side(v.sim, "simulator"))
    if json_out:
        emit_json({"out": str(folder), "metrics": v.metrics})
        return
    typer.echo(paths["md"].read_text())
    typer.echo(f"wrote {folder}/ (validate.md, validate.json, requests.csv, steps.csv, cdf.png)")
    cells = metrics_line(v.metrics)
    typer.echo("  ".join(f"{k}: {x}" for k, x in cells.items()))


def fidelity_report(
    model: Path = typer.Option(..., "--model", help="The bench-30m checkpoint (servelab make-tiny-model DIR "
                               "--preset bench-30m)."),
    out: Path = typer.Option(Path("docs/fidelity.md"), help="The report; its plots and CSV go beside it."),
    cost_model: Optional[Path] = typer.Option(None, help="Calibrated cost model (default: calibrate now, saved as "
                                              "fidelity/cost_model_<clock>.json beside the report)."),
    clock: str = typer.Option("cpu", help="cpu | wall (see servelab validate)."),
    quick: bool = typer.Option(False, help="Two systems on one workload (about a minute)."),
    calibrate_each: bool = typer.Option(False, "--calibrate-each", help="A compact calibration right before each "
                                        "system's runs (CPU time per step drifts with a shared machine's load)."),
    seed: int = typer.Option(0), threads: int = typer.Option(1),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Every policy and cluster policy on GSM8K prompts, an Azure conv slice and a long/short mix:
    engine vs simulator errors with where they miss and why (measured) -> docs/fidelity.md."""
    with user_errors():
        from servelab.validate.fidelity_doc import write_fidelity_doc

        check_out_file(out)
        loaded = _load(model, threads)
        cost_path, calibration = _cost_model(loaded, cost_model, out.parent / "fidelity", clock)
        command = "servelab fidelity-report --model DIR" + (" --quick" if quick else "") + \
            (f" --clock {clock}" if clock != "cpu" else "") + (f" --out {out}" if out != Path("docs/fidelity.md")
                                                              else "") + \
            (f" --cost-model {cost_model}" if cost_model is not None else "") + \
            (" --calibrate-each" if calibrate_each else "")
        progress = None if json_out else (lambda text: typer.echo(f"  {text}", err=True))
        result = write_fidelity_doc(out, model=model, cost_model=cost_path, calibration=calibration,
                                    command=command, clock=clock, seed=seed, quick=quick, progress=progress,
                                    loaded=loaded, calibrate_each=calibrate_each)
    if json_out:
        emit_json(result)
    else:
        typer.echo(f"wrote {out}: {result['num_runs']} runs ({result['num_all_met']} meet every goal), "
                   f"{result['num_failed']} systems could not run, {result['cpu_s']:.0f} CPU-s")


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("fidelity-report")(fidelity_report)
