"""The paper's Eq. 1: the cost of one chunk, and its coefficients fitted to a cost model.

    cost(c, p) = alpha * (p*c + (c^2 + c)/2) + beta * c + gamma

for a chunk of ``c`` new tokens after ``p`` prefix tokens: attention with the prefix,
attention within the chunk (the quadratic term token-count chunking misses), the MLP per
token and a fixed share. A microbatch costs the sum of its chunks (Eqs. 2-3); a decode is a
chunk of one token after its context.

``fit_eq1`` does what the paper's offline profiling does, against whatever times steps
here: random microbatches are timed by a cost model (the roofline, or a calibrated one) and
(alpha, beta, gamma) come from non-negative least squares over the three features. The fit
reports its R^2 and median relative error so a report can say how well Eq. 1 holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from servelab.core.plan import StepShape


@dataclass(frozen=True, slots=True)
class Eq1:
    alpha: float  # s per attention pair
    beta: float  # s per token
    gamma: float  # s per chunk
    r2: float = float("nan")
    median_rel_err: float = float("nan")

    def chunk_cost(self, tokens: int, prefix: int) -> float:
        return self.alpha * (prefix * tokens + (tokens * tokens + tokens) / 2) + self.beta * tokens + self.gamma

    def batch_cost(self, chunks: Sequence[tuple[int, int]]) -> float:
        """Eq. 3: the sum over (tokens, prefix) chunks."""
        return sum(self.chunk_cost(c, p) for c, p in chunks)

    def largest_part(self, tokens: int, prefix: int, spent: float, target: float) -> int:
        """The largest ``t`` in ``[0, tokens]`` whose chunk ``(t, prefix)`` keeps a step that has
        already spent ``spent`` within ``target`` (``spent + chunk_cost(t, prefix) <= target``;
        0 when even one token does not fit). A chunk's cost grows with ``t``, so a binary
        search finds it; both the step budget over the queue and the lookahead former's cut
        inside a prompt use it."""
        lo, hi = 0, tokens
        while lo < hi:
            t = (lo + hi + 1) // 2
            if spent + self.chunk_cost(t, prefix) <= target:
                lo = t
            else:
                hi = t - 1
        return lo


def features(chunks: Sequence[tuple[int, int]]) -> tuple[float, float, float]:
    attn = sum(p * c + (c * c + c) / 2 for c, p in chunks)
    return attn, float(sum(c for c, _ in chunks)), float(len(chunks))


def chunks_to_shape(chunks: Sequence[tuple[int, int]]) -> StepShape:
    """(tokens, prefix) chunks as a step: one-token chunks after a context are decodes."""
    pre = [(c, p) for c, p in chunks if not (c == 1 and p > 0)]
    dec = [p for c, p in chunks if c == 1 and p > 0]
    return StepShape(tuple(c for c, _ in pre), tuple(c + p for c, p in pre), len(dec), sum(dec), max(dec, default=0))


def random_microbatches(rng: np.random.Generator, num: int, max_tokens: int = 2048,
                        max_context: int = 8192) -> list[list[tuple[int, int]]]:
    """Mixed microbatches: prompt chunks at random offsets and decodes at random contexts."""
    out = []
    for _ in range(num):
        chunks: list[tuple[int, int]] = []
        budget = int(rng.integers(16, max_tokens + 1))
        for _ in range(int(rng.integers(0, 64))):
            chunks.append((1, int(rng.integers(1, max_context))))
        while budget > 0 and rng.random() < 0.8:
            c = int(min(budget, rng.integers(1, max_tokens + 1)))
            chunks.append((c, int(rng.integers(0, max_context - c)) if rng.random() < 0.5 else 0))
            budget -= c
        if not chunks:
            chunks.append((budget, 0))
        out.append(chunks)
    return out


def fit_eq1(cost_model: Any, *, seed: int = 0, num_samples: int = 400, max_tokens: int = 2048,
            max_context: int = 8192) -> Eq1:
    """(alpha, beta, gamma) >= 0 fitted to ``cost_model.step_time_s`` on random microbatches."""
    from scipy.optimize import nnls

    rng = np.random.default_rng(seed)
    batches = random_microbatches(rng, num_samples, max_tokens, max_context)
    x = np.array([features(b) for b in batches])
    y = np.array([cost_model.step_time_s(chunks_to_shape(b)) for b in batches])
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(x / scale, y)
    coef = coef / scale
    pred = x @ coef
    r2 = 1.0 - float(np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2))
    rel = float(np.median(np.abs(pred - y) / y))
    return Eq1(float(coef[0]), float(coef[1]), float(coef[2]), r2, rel)
