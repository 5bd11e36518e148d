"""UELLM (He et al., ICSOC 2024), the baseline BucketServe compares against, as its paper
describes it: "batches queries based on predicted profiles", prefill and decode coupled.

What UELLM does (BucketServe Sec. V-A, and UELLM's released ``UELM-batch/batch.py``):

* a resource profiler (a fine-tuned LLM) predicts each query's output length;
* the batch scheduler SLO-ODBS sorts the queries by ``a * SLO + b * predicted output``
  (a = 1, b = 0.3) and groups them greedily in that order: a query joins the open batch
  while it holds fewer than ``batch_size`` queries and the padding it adds,
  ``(predicted - batch max) x (rows + 1) x 1.2``, stays within 15,000 tokens; otherwise the
  batch closes and the query opens the next one;
* every batch runs as one HuggingFace ``generate`` call: prompts padded to the longest, a
  dense KV cache, the batch held until its longest output ends (static batching).

Execution is ``static``'s (padded prefill, padded decode, padded KV rectangle reserved up
front); only the choice and order of a batch's requests differ (``candidates``).

Where ours departs (each is a stand-in the BucketServe report names):

* predictions come from the workload (``RequestSpec.predicted_output_tokens``; see
  ``with_predictions`` for the profiler stand-in), else the true length (an oracle);
* online, one batch is formed whenever the instance is free, from the queue at that moment
  (the released code groups one fixed list);
* a request's SLO enters the key as an end-to-end deadline, TTFT + TPOT x predicted output
  (UELLM's queries carry one latency target); no SLO counts as 0;
* every row runs to its true output length (the released code caps generation at the
  predicted length + 500 tokens);
* the LLM deployer (HELR, layer placement over the GPU topology) is not modelled: UELLM gets
  the same instances as every other system.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from servelab.baselines.static import StaticBatchingPolicy, StaticConfig
from servelab.core.policy import POLICIES
from servelab.core.request import Request, RequestSpec


@dataclass(frozen=True)
class UELLMConfig(StaticConfig):
    """batch_size: SLO-ODBS's row cap (10 in the released code). pad_budget_tokens and
    pad_margin: the padding test (15,000 tokens, 1.2). slo_weight / output_weight: a and b of
    the sort key (1.0 and 0.3)."""

    batch_size: int = 10
    pad_budget_tokens: int = 15_000
    pad_margin: float = 1.2
    slo_weight: float = 1.0
    output_weight: float = 0.3

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pad_budget_tokens < 0:
            raise ValueError(f"pad_budget_tokens must be >= 0, got {self.pad_budget_tokens}")
        for name in ("pad_margin", "slo_weight", "output_weight"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")


def predicted_output(req: Request) -> int:
    """The profile UELLM batches by: the predicted output tokens still to generate."""
    return max(req.spec.expected_output_tokens - req.num_generated_tokens, 1)


def sort_key(req: Request, config: UELLMConfig) -> tuple[float, float, int]:
    """SLO-ODBS order: a x SLO (as an end-to-end deadline, seconds) + b x predicted output."""
    pred = predicted_output(req)
    slo = req.spec.slo
    deadline = 0.0
    if slo is not None:
        deadline = (slo.ttft_s or 0.0) + (slo.tpot_s or 0.0) * pred
    return config.slo_weight * deadline + config.output_weight * pred, req.arrival_time_s, req.request_id


def first_group(ordered: Sequence[Request], config: UELLMConfig) -> list[Request]:
    """The first batch SLO-ODBS closes over ``ordered``: the longest prefix that passes the
    row cap and the padding test at every step."""
    if not ordered:
        return []
    group = [ordered[0]]
    longest = predicted_output(ordered[0])
    for req in ordered[1:]:
        pred = predicted_output(req)
        added = (pred - longest) * (len(group) + 1) * config.pad_margin
        if len(group) >= config.batch_size or added > config.pad_budget_tokens:
            break
        group.append(req)
        longest = max(longest, pred)
    return group


@POLICIES.register("uellm")
class UELLMPolicy(StaticBatchingPolicy):
    Config = UELLMConfig

    def __init__(self, config: UELLMConfig = UELLMConfig()) -> None:
        super().__init__(config)

    def candidates(self, waiting: list[Request]) -> list[Request]:
        ordered = sorted(waiting, key=lambda r: sort_key(r, self.config))
        return first_group(ordered, self.config)


def with_predictions(specs: Sequence[RequestSpec], sigma: float, rng: np.random.Generator) -> list[RequestSpec]:
    """The resource profiler's stand-in: each request's predicted output is its true length
    times a lognormal error exp(N(0, sigma)), rounded, at least 1 (sigma 0 is an oracle).

    With sigma 0.3 about 82% of predictions lie within a factor 1.5 of the truth, close to
    the roughly 80% accuracy reported for UELLM's fine-tuned predictor."""
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma}")
    errors = np.exp(rng.normal(0.0, sigma, len(specs))) if sigma > 0 else np.ones(len(specs))
    return [replace(s, predicted_output_tokens=max(1, int(round(s.num_output_tokens * e))))
            for s, e in zip(specs, errors)]
