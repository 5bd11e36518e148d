"""Where the engine runs and in which dtype, when the caller does not say.

``auto`` picks CUDA when torch sees a GPU, else the CPU. On CUDA a float32 checkpoint runs in
bfloat16: that is how models are served on GPUs (tensor cores; half the HBM traffic a decode
step is bound by), and our random-weight checkpoints are written in float32 only because the
CPU tests compare against HF in float32. On the CPU the checkpoint's own dtype is kept; pass
``bfloat16`` explicitly on a CPU with AVX512-BF16, where bf16 matmuls measured 2-3x faster than
fp32 (docs/benchmarks/vs_vllm.md). An explicit dtype always wins.
"""

from __future__ import annotations

import os

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(name: str | torch.device = "auto", *, cuda_available: bool | None = None) -> torch.device:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; other names pass through."""
    if isinstance(name, torch.device):
        return name
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if name == "auto":
        return torch.device("cuda" if cuda_available else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not cuda_available:
        raise ValueError(f"device {name!r} asked for, but torch sees no CUDA GPU")
    return device


def resolve_dtype(requested: str | torch.dtype | None, checkpoint_dtype: str, device: torch.device
                  ) -> str | torch.dtype:
    """The dtype to load in: ``requested`` if given, bf16 for a float32 checkpoint on CUDA,
    else the checkpoint's."""
    if requested is not None:
        return requested
    if device.type == "cuda" and checkpoint_dtype == "float32":
        return "bfloat16"
    return checkpoint_dtype


def cpu_has_bf16() -> bool:
    """Whether this CPU runs oneDNN's bf16 kernels (AVX512 or AVX-NE-CONVERT; AVX512-BF16/AMX
    make them fast). Without them (AVX2-only, e.g. AMD Zen 3) torch's bf16 matmuls fall back to
    a slow path: [32 x 1,024] x [1,024 x 3,072] ran at ~10 GFLOP/s there, float32 at 32 (``F.linear``)
    and 52 (oneDNN-packed), one core."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(probe()) if probe is not None else False


def cpu_serving_dtype() -> str:
    """The dtype the CPU benchmarks serve in by default: bf16 where this CPU has oneDNN's bf16
    path, else float32 (the speed of each on this machine: docs/benchmarks/decode_kernels.md)."""
    return "bfloat16" if cpu_has_bf16() else "float32"


def cpu_description(cpuinfo: str | None = None) -> str:
    """``<model name> (<widest vector ISA>), <n> cores`` for benchmark reports: bf16 and fp32 speeds
    differ several-fold between an AVX512-BF16 CPU and an AVX2-only one."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    lines = cpuinfo.splitlines()
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "unknown CPU")
    flags = set(next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), []))
    isa = ("AVX512-BF16" if "avx512_bf16" in flags else "AVX512, no BF16" if "avx512f" in flags
           else "AVX2, no AVX512" if "avx2" in flags else "no AVX2")
    return f"{name} ({isa}), {os.cpu_count()} cores"
