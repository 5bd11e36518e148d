"""How a run's per-instance cost models are built: ``CostOptions`` (one frozen value per run).

``op_times``: ``profile`` (measured operator tables, ``profiled.ProfiledCostModel``) or
``roofline`` (the fitted analytical model, as before issue 23). ``attention_kernel``:
``split-kv`` | ``per-seq`` | ``padded`` or None for the GPU's default
(``attention.default_kernel``). ``cpu_overhead``: ``measured`` | ``flat`` | ``off`` or None for
the GPU's default (``cpu_overhead.default_mode``: measured on the GPUs it was measured
with). ``kernel_profile``: a file written by ``servelab profile-gpu`` whose measured decode
attention, GEMMs and empty-step time replace the stated and profiled ones.

The simulator takes a ``CostOptions`` where it takes a cost model (``Simulation(...,
cost_model=CostOptions(...))``): each instance then builds its own model from it
(``costmodel.build.build_cost_model``).
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.core.errors import UserError

OP_TIMES = ("profile", "roofline")
CPU_OVERHEAD_MODES = ("measured", "flat", "off")


@dataclass(frozen=True)
class CostOptions:
    op_times: str = "profile"
    attention_kernel: str | None = None
    cpu_overhead: str | None = None
    kernel_profile: str | None = None  # path of a ``servelab profile-gpu`` file

    def __post_init__(self) -> None:
        from servelab.costmodel.attention import KERNELS

        if self.op_times not in OP_TIMES:
            raise UserError(f"op_times must be one of {', '.join(OP_TIMES)}, got {self.op_times!r}")
        if self.attention_kernel is not None and self.attention_kernel not in KERNELS:
            raise UserError(f"--attention-kernel must be one of {', '.join(KERNELS)}, got {self.attention_kernel!r}")
        if self.cpu_overhead is not None and self.cpu_overhead not in CPU_OVERHEAD_MODES:
            raise UserError(f"--cpu-overhead must be one of {', '.join(CPU_OVERHEAD_MODES)}, "
                            f"got {self.cpu_overhead!r}")
        if self.op_times == "roofline" and (self.attention_kernel or self.cpu_overhead or self.kernel_profile):
            raise UserError("--attention-kernel, --cpu-overhead and --kernel-profile apply to the profile cost "
                            "model, not to --op-times roofline")

    @property
    def is_default(self) -> bool:
        return self == CostOptions()


# What a run without cost options gets: the profile-driven model with the GPU's defaults.
DEFAULT_COST_OPTIONS = CostOptions()
