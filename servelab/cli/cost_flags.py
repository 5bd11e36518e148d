"""The cost-model options of ``servelab simulate``, kept here so the command gains four lines.

``--op-times profile|roofline`` (measured operator tables, the default, or the fitted
roofline), ``--attention-kernel split-kv|per-seq|padded`` (default: the GPU's, see
``servelab.costmodel.attention``), ``--cpu-overhead measured|flat|off`` (default: measured on
the GPUs it was measured with, A100 and A40; the stated flat 1 ms elsewhere) and
``--kernel-profile FILE`` (a ``servelab profile-gpu`` file: its measured decode attention,
GEMMs and empty-step time replace the stated and profiled ones). ``--cost-model FILE`` (a
calibrated linear model) replaces all of them, so combining it with any is an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from servelab.core.errors import UserError


def op_times_option():
    return typer.Option("profile", "--op-times", help="profile: measured operator tables (default); roofline: the "
                                                      "fitted analytical model.")


def attention_kernel_option():
    return typer.Option(None, "--attention-kernel", help="Decode attention kernel: split-kv | per-seq | padded "
                                                         "(default: the GPU's; per-seq on A100, split-kv elsewhere).")


def cpu_overhead_option():
    return typer.Option(None, "--cpu-overhead", help="Per-step CPU overhead: measured (by batch and TP) | flat "
                                                     "(1 ms) | off (default: measured on A100/A40, flat elsewhere).")


def kernel_profile_option():
    return typer.Option(None, "--kernel-profile", help="A servelab profile-gpu file whose measured kernels replace "
                                                       "the stated ones.")


def cost_choice(cost_model: Optional[Path], op_times: str = "profile", attention_kernel: Optional[str] = None,
                cpu_overhead: Optional[str] = None, kernel_profile: Optional[Path] = None) -> Any:
    """A loaded calibrated model, the ``CostOptions`` every instance builds its model from, or
    None for the simulator's default options."""
    from servelab.costmodel.options import CostOptions

    if kernel_profile is not None and not kernel_profile.is_file():
        raise UserError(f"--kernel-profile {kernel_profile}: no such file (make one with servelab profile-gpu)")
    options = CostOptions(op_times, attention_kernel, cpu_overhead, str(kernel_profile) if kernel_profile else None)
    if cost_model is None:
        if kernel_profile is not None:
            from servelab.costmodel.kernel_profile import KernelProfile

            KernelProfile.load(kernel_profile)  # a bad file fails here, before the run
        return None if options == CostOptions() else options  # None: the simulator's default options
    if options != CostOptions():
        raise UserError("--cost-model (a calibrated model) cannot be combined with --op-times, --attention-kernel, "
                        "--cpu-overhead or --kernel-profile")
    from servelab.costmodel.linear import LinearCostModel

    return LinearCostModel.load(cost_model)
