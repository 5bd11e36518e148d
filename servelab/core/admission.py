"""One context-length rule for the simulator and the engine, applied when a request arrives.

vLLM rejects a request whose prompt plus ``max_tokens`` exceeds ``max_model_len``; a trace
replay may prefer to truncate the prompt instead (LongBench keeps the head and the tail of
an over-long prompt and drops the middle). ``reject`` is the default; ``truncate`` is an
explicit choice, and then the prompt is cut to ``max_model_len - max_tokens`` tokens (head
and tail kept), or the request is still rejected when even that leaves no prompt.

A request over the context never runs and never "finishes": it ends rejected with a reason
that names both numbers, and the run summary counts it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from servelab.core.request import RequestSpec

OVERFLOW_MODES = ("reject", "truncate")
OVERFLOW_WORDS = "exceeds max_model_len"  # in every context rejection's reason, so summaries can count them


def is_overflow_reason(reason: str | None) -> bool:
    """Whether a rejection's reason is this rule's (the request exceeded the context)."""
    return reason is not None and OVERFLOW_WORDS in reason


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    max_model_len: int | None = None  # None: no limit (a model with unknown context)
    on_overflow: str = "reject"

    def __post_init__(self) -> None:
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.on_overflow not in OVERFLOW_MODES:
            raise ValueError(f"on_overflow must be one of {OVERFLOW_MODES}, got {self.on_overflow!r}")


def admit(spec: RequestSpec, max_output_tokens: int, config: AdmissionConfig) -> tuple[RequestSpec | None, str | None]:
    """(the spec to run, None) or (None, why it is rejected). A truncated spec keeps its id."""
    limit = config.max_model_len
    if limit is None or spec.num_prompt_tokens + max_output_tokens <= limit:
        return spec, None
    why = (f"prompt {spec.num_prompt_tokens} + max_tokens {max_output_tokens} {OVERFLOW_WORDS} {limit}")
    if config.on_overflow == "reject":
        return None, why
    keep = limit - max_output_tokens
    if keep < 1:
        return None, why + " (max_tokens alone does not fit; nothing left to truncate to)"
    return truncate_prompt(spec, keep), None


def truncate_prompt(spec: RequestSpec, keep: int) -> RequestSpec:
    """Keep the first ``ceil(keep/2)`` and last ``floor(keep/2)`` prompt tokens (LongBench)."""
    head = (keep + 1) // 2
    tail = keep - head
    ids = spec.prompt_token_ids
    if ids is not None:
        ids = tuple(ids[:head]) + (tuple(ids[len(ids) - tail:]) if tail else ())
    return replace(spec, num_prompt_tokens=keep, prompt_token_ids=ids, prompt_text=None, prefix_block_ids=None)
