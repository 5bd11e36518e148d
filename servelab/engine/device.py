"""Where the engine runs and in which dtype, when the caller does not say.

``auto`` picks CUDA when torch sees a GPU, else the CPU. On CUDA a float32 checkpoint runs in
bfloat16: that is how models are served on GPUs (tensor cores; half the HBM traffic a decode
step is bound by), and our random-weight checkpoints are written in float32 only because the
CPU tests compare against HF in float32. On the CPU the checkpoint's own dtype is kept; pass
``bfloat16`` explicitly on a CPU with AVX512-BF16, where bf16 matmuls measured 2-3x faster than
fp32 (docs/benchmarks/vs_vllm.md). An explicit dtype always wins.
"""

from __future__ import annotations

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
