"""``servelab profile-gpu``: time decode attention, GEMMs and an empty step on this device.

Writes the ``servelab.kernel_profile`` JSON (``servelab/costmodel/kernel_profile.py``) that
``servelab simulate --kernel-profile FILE`` loads. Uses whatever device torch sees: on a
CUDA GPU it measures the kernels the simulator otherwise states (run it on the GPU you
simulate); on a CPU it shows the format end to end. ``--preset tiny`` times small shapes in
about a second (what the tests run); ``--preset llama-7b`` the Llama-2-7B layer (32 heads x
128, GEMMs of its projections, batches of 8-128 rows between 128 and 4,096 tokens).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from servelab.cli.common import check_out_file, emit_json, user_errors
from servelab.core.errors import UserError


def profile_gpu(
    out: Path = typer.Option(..., "--out", help="Where to write the kernel profile JSON."),
    preset: str = typer.Option("llama-7b", help="llama-7b (the Llama-2-7B layer) | tiny (seconds, for tests)."),
    device: Optional[str] = typer.Option(None, help="torch device (default: cuda if available, else cpu)."),
    dtype: Optional[str] = typer.Option(None, help="float16 | bfloat16 | float32 (default: float16 on CUDA, "
                                                   "float32 on CPU)."),
    repeats: Optional[int] = typer.Option(None, min=1, help="Timed runs per kernel (median kept)."),
    threads: Optional[int] = typer.Option(None, min=1, help="torch CPU threads."),
    clock: Optional[str] = typer.Option(None, help="wall | cpu (default: wall on CUDA; on a CPU this process's CPU "
                                                   "time, which a shared machine's load does not inflate)."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Time decode attention (split-kv / per-seq / padded on mixed-context batches), a prefill chunk,
    GEMMs at 1-512 tokens and an empty step; write the profile the simulator loads with --kernel-profile."""
    with user_errors():
        if preset not in ("llama-7b", "tiny"):
            raise UserError(f"--preset must be llama-7b or tiny, got {preset!r}")
        if dtype is not None and dtype not in ("float16", "bfloat16", "float32"):
            raise UserError(f"--dtype must be float16, bfloat16 or float32, got {dtype!r}")
        if clock is not None and clock not in ("wall", "cpu"):
            raise UserError(f"--clock must be wall or cpu, got {clock!r}")
        check_out_file(out)
        import dataclasses

        import torch

        from servelab.engine.kernel_timing import TINY_SHAPES, ProfileShapes, profile_kernels

        if threads is not None:
            torch.set_num_threads(threads)
        if device is not None:
            try:
                torch.empty(1, device=device)
            except (RuntimeError, ValueError) as e:
                raise UserError(f"--device {device}: not usable here ({str(e).splitlines()[0]})") from None
        shapes = TINY_SHAPES if preset == "tiny" else ProfileShapes()
        if repeats is not None:
            shapes = dataclasses.replace(shapes, repeats=repeats)
        if clock == "cpu" and torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")).type == "cuda":
            raise UserError("--clock cpu: a CUDA kernel runs asynchronously on the GPU; time it with --clock wall")
        profile = profile_kernels(shapes, device=device, dtype=dtype, clock=clock)
        out.write_text(json.dumps(profile, indent=1) + "\n")
        from servelab.costmodel.kernel_profile import KernelProfile

        loaded = KernelProfile.load(out)
        fits = {k: loaded.fit_kernel(k) for k in loaded.kernels()}
    summary = {"out": str(out), "device": profile["device"], "clock": profile["clock"],
               "empty_step_s": profile["empty_step_s"],
               "kernel_fit_median_error": {k: err for k, (_, _, err) in fits.items()}}
    if json_out:
        emit_json(summary)
        return
    typer.echo(f"measured on {profile['device']} ({profile['dtype']}, {profile['clock']} clock): "
               f"{len(profile['attention'])} attention "
               f"timings, {len(profile['gemms'])} GEMM shapes, empty step {profile['empty_step_s'] * 1e3:.3f} ms")
    for kernel, (coef, factor, err) in fits.items():
        typer.echo(f"  {kernel:<9} floor {coef[0] * 1e6:8.2f} us  per row {coef[1] * 1e6:8.3f} us  per context "
                   f"token {coef[2] * 1e9:8.3f} ns" + (f"  bubble factor {factor:.3g}" if kernel == "per-seq" else "")
                   + f"  (fit median error {err:.1%})")
    typer.echo(f"wrote {out} (use: servelab simulate --kernel-profile {out})")


def register(app: typer.Typer) -> None:
    app.command("profile-gpu")(profile_gpu)
