"""A cost model whose every step is ``scale`` times slower plus ``delta_s`` longer.

The colocation gap test (``coloc_gap.py``) asks whether an engine slower than our cost model
(a per-step fixed cost such as a slower scheduler or sampler, or slower kernels throughout)
would make the paper's chunked-prefill colocation as weak as it reports. Wrapping the
profile-driven model keeps everything else (KV sizing, transfers) as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class AdjustedCost:
    def __init__(self, base: Any, *, scale: float = 1.0, delta_s: float = 0.0) -> None:
        if scale <= 0 or delta_s < 0:
            raise ValueError(f"scale must be > 0 and delta_s >= 0, got {scale}, {delta_s}")
        self.base, self.scale, self.delta_s = base, scale, delta_s

    def step_time_s(self, shape) -> float:
        return self.scale * self.base.step_time_s(shape) + self.delta_s

    def decode_step_times_s(self, num_decodes: int, context_sums: np.ndarray, *args, **kwargs) -> np.ndarray:
        times = np.asarray(self.base.decode_step_times_s(num_decodes, context_sums, *args, **kwargs))
        return self.scale * times + self.delta_s

    def __getattr__(self, name: str) -> Any:  # transfers, swaps, sources: the base model's
        return getattr(self.base, name)
