"""``servelab reproduce multibin-engine``: Multi-Bin Batching Figures 5 and 7 measured on our engine.

The steps (``engine.py`` has the measurements): make or load the checkpoint (the
``bench-30m`` preset in the run's temporary folder, removed at the end and on Ctrl-C),
sample the GSM8K requests, measure Figure 5's batch times and fit the line, calibrate the
per-step cost model (full size only), measure Figure 7 one k at a time (so progress, the ETA
and the partial results advance per k), and run the queue simulator on every GSM8K request
with the measured line. ``_write`` makes ``multibin_engine.md`` and its plot; the runner writes
``multibin_engine.json`` (the numbers ``multibin.md`` quotes).

Options: ``num_requests`` and ``ks`` replace the size's; ``model`` a checkpoint folder;
``threads`` torch's intra-op threads during the run (restored afterwards).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from servelab.core.errors import UserError
from servelab.designs.multibin.reproduce import engine as eng
from servelab.reproduce.runner import Reproduction, Run, Step


@dataclass(frozen=True)
class EngineSizes:
    num_requests: int = 128
    ks: tuple[int, ...] = (1, 2, 4, 8, 16)
    fig5_tokens: tuple[int, ...] = eng.FIG5_TOKENS
    fig5_repeats: int = 2
    calibrated: bool = True  # also time the token-level simulator with this machine's calibrated step costs
    batch_size: int = 8
    max_tokens: int = 1024
    preset: str = "bench-30m"


FULL = EngineSizes()
REDUCED = EngineSizes(num_requests=16, ks=(1, 2), fig5_tokens=(16, 32, 64), fig5_repeats=1, calibrated=False,
                      max_tokens=128)


def _sizes(run: Run) -> EngineSizes:
    """The size, with ``--num-requests`` / ``--ks`` applied and checked (one line, before any work)."""
    sizes, opts = run.sizes, run.options
    if opts.get("ks") is not None:
        try:
            ks = tuple(int(k) for k in str(opts["ks"]).split(",") if k.strip())
        except ValueError:
            raise UserError(f"--ks must be comma-separated integers, got {opts['ks']!r}") from None
        sizes = replace(sizes, ks=ks)
    if opts.get("num_requests") is not None:
        sizes = replace(sizes, num_requests=int(opts["num_requests"]))
    threads = opts.get("threads", 1)
    if sizes.num_requests < 1 or threads < 1:
        raise UserError(f"--num-requests and --threads must be >= 1, got {sizes.num_requests} and {threads}")
    if not sizes.ks or not all(1 <= k <= sizes.num_requests for k in sizes.ks):
        raise UserError(f"--ks must list bin counts in [1, --num-requests={sizes.num_requests}], got "
                        f"{','.join(map(str, sizes.ks))}")
    return sizes


def _command(run: Run, sizes: EngineSizes) -> str:
    model = run.options.get("model")
    return (f"servelab reproduce multibin-engine{' --reduced' if run.reduced else ''} --num-requests "
            f"{sizes.num_requests} --ks {','.join(map(str, sizes.ks))} --seed {run.seed} --out {run.out_dir}"
            + (f" --model {model}" if model else ""))


def _start(run: Run) -> None:
    run.sizes = sizes = _sizes(run)  # bad options fail here, before torch loads
    import torch

    threads = run.options.get("threads", 1)
    run.on_exit(torch.set_num_threads, torch.get_num_threads())
    torch.set_num_threads(threads)
    model = run.options.get("model")
    run.results.update({"model": "given folder" if model is not None else sizes.preset,
                        "model_dir": str(model or ""), "threads": threads, "num_requests": sizes.num_requests,
                        "seed": run.seed, "batch_size": sizes.batch_size, "max_tokens": sizes.max_tokens,
                        "ks": tuple(sizes.ks), "command": run.options.get("command") or _command(run, sizes),
                        "fig7": [], "fig7_wall_s": 0.0, "calibrated": None, "calibration_wall_s": 0.0})


def _steps(run: Run) -> list[Step]:
    sizes, res, log, state = run.sizes, run.results, run.say, {}

    def load(_: Run) -> None:
        from servelab.engine.loader import load_checkpoint

        model = run.options.get("model")
        folder = Path(model) if model is not None else eng.make_preset(run.tmp_dir("ckpt") / sizes.preset,
                                                                       sizes.preset, log)
        loaded = state["loaded"] = load_checkpoint(folder, dtype="float32")
        specs = state["specs"] = eng.gsm8k_requests(loaded.tokenizer, sizes.num_requests, run.seed, sizes.max_tokens)
        lengths = np.array([s.num_output_tokens for s in specs])
        res.update({"num_params": sum(p.numel() for p in loaded.model.parameters()),
                    "mean_output_tokens": float(lengths.mean()), "max_output_tokens": int(lengths.max()),
                    "total_output_tokens": int(lengths.sum())})

    def figure5(_: Run) -> dict:
        t0 = time.perf_counter()
        out = eng.measure_figure5(state["loaded"], state["specs"], sizes.fig5_tokens, sizes.fig5_repeats,
                                  sizes.batch_size, log)
        res["fig5_wall_s"] = time.perf_counter() - t0
        return out

    def calibrate(_: Run) -> None:
        t0 = time.perf_counter()
        step_cost, error = eng.calibrate_steps(state["loaded"], log)
        state["step_cost"] = step_cost
        res["calibration_wall_s"] = time.perf_counter() - t0
        res["calibrated"] = {"c_step_s": step_cost.c_step, "c_token_s": step_cost.c_token, "c_row_s": step_cost.c_row,
                             "c_decode_ctx_s": step_cost.c_decode_ctx, "c_prefill_attn_s": step_cost.c_prefill_attn,
                             "fit_error": error}

    def figure7(k: int):
        def measure(_: Run) -> None:
            t0 = time.perf_counter()
            res["fig7"] += eng.measure_figure7(state["loaded"], state["specs"], (k,), sizes.batch_size,
                                               res["fig5"]["fit"], state.get("step_cost"), log)
            res["fig7_wall_s"] += time.perf_counter() - t0
        return measure

    return [
        Step("checkpoint and GSM8K requests", load),
        Step("figure 5", figure5, "fig5"),
        *([Step("calibration", calibrate)] if sizes.calibrated else []),
        *[Step(f"figure 7, k={k}", figure7(k)) for k in sizes.ks],
        Step("full-size line (queue simulator, all GSM8K)",
             lambda _: eng.full_size_line(state["loaded"].tokenizer, res["fig5"]["fit"], sizes.batch_size,
                                          sizes.max_tokens, run.seed), "full_size_line"),
    ]


def _write(run: Run) -> dict:
    from servelab.designs.multibin.reproduce.engine_report import write_engine_report

    write_engine_report(run.out_dir, run.results)
    return run.results


def _summary(results: dict) -> dict:
    from servelab.designs.multibin.reproduce.engine_report import summary_json

    return summary_json(results)


REPRODUCTION = Reproduction("multibin-engine", {"full": FULL, "reduced": REDUCED}, _steps, _write, start=_start,
                            json_name="multibin_engine.json", to_json=_summary, report="multibin_engine.md")
