"""vLLM's option names, mapped onto servelab's concepts, shared by simulate, generate and serve.

- ``--max-num-seqs``, ``--max-num-batched-tokens`` (alias ``--max-batch-tokens``),
  ``--block-size``: the same meaning as in vLLM (rows per step, tokens per step, KV block).
- ``--enable-chunked-prefill``: vLLM's chunked-prefill scheduler is Sarathi-Serve's (decodes
  first, prompts chunked into the step's token budget), so ``vllm`` becomes
  ``sarathi:token_budget=<max-num-batched-tokens>``; ``sarathi`` already is; any other policy
  is an error rather than a flag silently ignored.
- ``--preemption-mode recompute|swap``: the policy's ``preemption`` parameter (swap needs
  ``--swap-space``); a policy without preemption, or a spec that already says otherwise, is an
  error.
- ``--gpu-memory-utilization F``: the fraction of device memory the instance may use for
  weights and KV (vLLM's meaning). Simulator: ``memory_reserve_fraction = 1 - F``. Engine: KV
  budget = F x device memory - weights (the CUDA device's total, or this host's RAM on CPU),
  divided among the instances of the process; it replaces ``--kv-budget-mb``.

Pure functions (no torch): the commands call them before any work, so a bad combination is
one clear line.
"""

from __future__ import annotations

import os

from servelab.core.errors import UserError

PREEMPTION_MODES = ("recompute", "swap")


def policy_with_vllm_flags(policy: str, *, enable_chunked_prefill: bool = False, preemption_mode: str | None = None,
                           max_num_batched_tokens: int | None = None) -> str:
    """The policy spec with vLLM's scheduler flags folded in."""
    from servelab.core.policy import POLICIES
    from servelab.core.registry import parse_name_params

    name, params = parse_name_params(policy)
    if enable_chunked_prefill:
        if name == "vllm":
            name = "sarathi"
            if max_num_batched_tokens is not None:
                params.setdefault("token_budget", max_num_batched_tokens)
        elif name != "sarathi":
            raise UserError(f"--enable-chunked-prefill: vLLM's chunked prefill is the sarathi policy; policy "
                            f"{name!r} has its own prompt handling (use -p vllm or -p sarathi)")
    if preemption_mode is not None:
        if preemption_mode not in PREEMPTION_MODES:
            raise UserError(f"--preemption-mode must be recompute or swap, got {preemption_mode!r}")
        fields = getattr(POLICIES.get(name), "Config", None)
        if fields is None or "preemption" not in getattr(fields, "__dataclass_fields__", {}):
            raise UserError(f"--preemption-mode: policy {name!r} has no preemption parameter")
        if params.get("preemption", preemption_mode) != preemption_mode:
            raise UserError(f"--preemption-mode {preemption_mode} contradicts the policy spec's "
                            f"preemption={params['preemption']}")
        params["preemption"] = preemption_mode
    if not params:
        return name
    return name + ":" + ",".join(f"{k}={v}" for k, v in params.items())


def check_utilization(value: float) -> float:
    if not 0 < value <= 1:
        raise UserError(f"--gpu-memory-utilization must be in (0, 1], got {value}")
    return value


def reserve_fraction(gpu_memory_utilization: float) -> float:
    """The simulator's ``memory_reserve_fraction`` for vLLM's ``--gpu-memory-utilization``."""
    return 1.0 - check_utilization(gpu_memory_utilization)


def device_memory_bytes(device: str = "cpu") -> int:
    """Total memory of the engine's device: the CUDA device's, or this host's RAM."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[1])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def engine_kv_budget_bytes(gpu_memory_utilization: float, weight_bytes: int, num_instances: int,
                           total_bytes: int) -> int:
    """Per-instance KV budget: utilisation x device memory, less the weights, shared evenly."""
    usable = check_utilization(gpu_memory_utilization) * total_bytes - weight_bytes
    if usable <= 0:
        raise UserError(f"--gpu-memory-utilization {gpu_memory_utilization}: {gpu_memory_utilization:g} of "
                        f"{total_bytes / 2**30:.1f} GiB does not even hold the weights ({weight_bytes / 2**30:.2f} GiB)")
    return int(usable // num_instances)


def engine_kv_budget_mb(model_dir, gpu_memory_utilization: float, num_instances: int, dtype: str | None) -> float:
    """``--gpu-memory-utilization`` as the engine's per-instance ``--kv-budget-mb`` for a checkpoint."""
    from servelab.engine.loader import load_config

    config = load_config(model_dir)
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}.get(dtype or config.torch_dtype, 4)
    budget = engine_kv_budget_bytes(gpu_memory_utilization, config.num_params * itemsize, max(num_instances, 1),
                                    device_memory_bytes())
    return budget / 2**20
