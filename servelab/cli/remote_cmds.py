"""``servelab calibrate --base-url`` and ``servelab validate --base-url``: the simulator fitted
to, and checked against, any running OpenAI-compatible server (``servelab.validate.remote_*``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from servelab.cli.common import check_out_file, emit_json, user_errors
from servelab.core.errors import UserError


def _vocab(tokenizer: Optional[Path]) -> int:
    if tokenizer is None:
        return 500  # ids in [10, 500): in every real vocabulary
    from servelab.bench.prompts import load_tokenizer

    return load_tokenizer(tokenizer).get_vocab_size()


def _limits(base_url: Optional[str], api_key: Optional[str], **flags):
    from servelab.bench.run import BenchConfig
    from servelab.validate.server_info import read_limits

    if base_url is None:
        raise UserError("give --model (our engine) or --base-url (a running server)")
    BenchConfig(base_url=base_url)  # checks the scheme
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    return read_limits(base_url, flags, headers)


def calibrate_remote_cmd(base_url: Optional[str], model: Optional[Path], out: Path, *, block_size, time_budget,
                         repeats, tokenizer, api_key, max_num_seqs, max_num_batched_tokens, max_model_len,
                         json_out: bool, load_reference: bool = True) -> None:
    from servelab.costmodel.linear import HELD_OUT_WARN_MEDIAN

    with user_errors():
        if model is not None:
            raise UserError("give either --model (our engine's steps) or --base-url (a running server), not both")
        check_out_file(out)
        limits = _limits(base_url, api_key, block_size=block_size, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len)
        from servelab.validate.remote_calibrate import calibrate_remote

        echo = (lambda text: typer.echo(text, err=True)) if json_out else typer.echo
        cal = calibrate_remote(base_url, out, limits=limits, budget_s=time_budget, repeats=repeats,
                               vocab=_vocab(tokenizer), api_key=api_key, echo=echo, reference=load_reference)
    held = cal.held_out
    if held is not None and held.median_rel_error > HELD_OUT_WARN_MEDIAN:
        typer.secho(f"warning: held-out median error {held.median_rel_error:.1%} ({held.num_samples} probe samples, "
                    f"each predicted by a fit without its shape's repeats) is over {HELD_OUT_WARN_MEDIAN:.0%}: "
                    + (f"the same probe's repeats differed by {cal.noise['median']:.1%} (median), so " if cal.noise
                       else "")
                    + "the server's steps were too noisy (a loaded machine?) or are not linear in these features; "
                    "rerun with more --repeats, on an idle machine, or with the server and this command at a higher "
                    "priority (against vLLM-CPU on a shared 2-core machine the held-out error was 36% at nice 10 and "
                    "3% at nice -15) before trusting simulations with it",
                    fg=typer.colors.YELLOW, err=True)
    payload = {"out": str(out), "probes": str(cal.probes_path), "elapsed_s": cal.elapsed_s,
               "num_probes": len(cal.runs), "num_skipped": len(cal.skipped),
               "fit": {"num_samples": cal.fit.num_samples, "median_rel_error": cal.fit.median_rel_error,
                       "p90_rel_error": cal.fit.p90_rel_error},
               "held_out": None if held is None else {"median_rel_error": held.median_rel_error,
                                                      "p90_rel_error": held.p90_rel_error},
               "repeat_noise": cal.noise, "request_overhead_s": cal.overhead_s, "load": cal.load,
               "coefficients": cal.model.to_json()["coefficients"], "limits": cal.limits.to_json()}
    if json_out:
        emit_json(payload)
        return
    typer.echo(f"fit over {cal.fit.num_samples} probe samples ({len(cal.runs)} probes, {cal.elapsed_s:.0f} s): "
               f"{cal.fit}" + (f"; held out (leave-one-out): {held}" if held is not None else "")
               + (f"; repeats of a probe differ by {cal.noise['median']:.1%} (median)" if cal.noise else ""))
    ref = cal.load.get("reference")
    if ref:
        typer.echo(f"load: reference probe {ref['median_s'] * 1e3:.1f} ms (median), {ref['min_ratio']:.2f}x-"
                   f"{ref['max_ratio']:.2f}x around the probes; the raw samples' repeats differ by "
                   f"{(cal.load.get('raw_repeat_noise') or {}).get('median', float('nan')):.1%} (median)")
    typer.echo(f"request overhead (TTFT no step explains: HTTP, tokenising, pick-up): {cal.overhead_s * 1e3:.1f} ms, "
               f"kept out of the step costs; validate adds it to each simulated TTFT and e2e")
    for name, value in payload["coefficients"].items():
        typer.echo(f"  {name:<15} {value:.3e}")
    typer.echo(f"wrote {out} and its raw timings {cal.probes_path} "
               f"(use: servelab validate --base-url {base_url} --cost-model {out} -w SPEC)")


def validate_remote_cmd(base_url: Optional[str], *, workload: str, cost_model: Optional[Path], policy: str,
                        max_prompt: int, max_output: int, replays: int, tokenizer: Optional[Path],
                        api_key: Optional[str], block_size, num_gpu_blocks, max_num_seqs, max_num_batched_tokens,
                        max_model_len, seed: int, out: Optional[Path], data_dir: Optional[Path],
                        json_out: bool, rescale: bool = False) -> None:
    from servelab.cli.outputs import resolve_out

    with user_errors():
        if base_url is None:
            raise UserError("give --model (our engine) or --base-url (a running server)")
        if cost_model is None:
            raise UserError("--base-url needs --cost-model (make one with servelab calibrate --base-url URL)")
        if not cost_model.is_file():
            raise UserError(f"--cost-model {cost_model}: no such file (make one with servelab calibrate --base-url)")
        from servelab.validate.remote_validate import RemoteOptions, run_remote_validation
        from servelab.validate.remote_report import write_remote
        from servelab.validate.workloads import parse_validation_workload

        limits = _limits(base_url, api_key, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                         max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         max_model_len=max_model_len)
        w = parse_validation_workload(workload, max_prompt, max_output)
        folder = resolve_out(out, "validate")
        options = RemoteOptions(base_url=base_url, cost_model=cost_model, workload=w, policy=policy,
                                replays=replays, vocab=_vocab(tokenizer), api_key=api_key, seed=seed,
                                data_dir=data_dir, rescale=rescale)
        echo = (lambda text: typer.echo(text, err=True)) if json_out else typer.echo
        echo(f"server {base_url}: model {limits.model}; limits: {limits.describe()}")
        v = run_remote_validation(options, limits, echo=echo)
        paths = write_remote(folder, v)
    if json_out:
        emit_json({"out": str(folder), "metrics": v.metrics})
        return
    typer.echo(paths["md"].read_text())
    typer.echo(f"wrote {folder}/ (validate.md, validate.json, requests.csv, cdf.png)")
