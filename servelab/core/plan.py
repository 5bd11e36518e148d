"""The contract between a scheduling policy and an executor: a step plan out, a step result back.

Both are frozen. A plan names, per request, how many tokens run this step (a prefill chunk
or a decode are the same thing at different offsets), plus the memory moves the instance
must make first (preempt, swap out, swap in) and the requests the policy refuses. The
instance's decode group (simulator only, ``core.decode_group``) is named by reference: its
members decode one token each ahead of the listed rows, and a plan that repeats them costs
O(1), not a copy of ~100 ids per step (issue 29).
``padding`` switches the step to a dense padded batch, so static and bucketed batching pay
the padding cost they were designed around (the simulator charges it, the engine runs it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class PaddedBatch:
    """A dense [num_rows, row_tokens] step: every row is computed as if ``row_tokens`` long.

    ``num_rows`` may exceed the scheduled requests: rows of requests that already finished
    inside a held static batch still cost compute (that is the waste static batching pays).
    ``context_tokens`` is the padded KV length each row attends to.
    """

    num_rows: int
    row_tokens: int
    context_tokens: int

    def __post_init__(self) -> None:
        if self.num_rows < 1 or self.row_tokens < 1 or self.context_tokens < self.row_tokens:
            raise ValueError(f"invalid padded batch {self}")


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one instance runs next.

    request_ids / num_tokens: parallel tuples; request ``request_ids[i]`` computes its next
        ``num_tokens[i]`` tokens (all its pending tokens for a decode, a chunk for prefill).
    group: the instance's decode group rows (``DecodeGroup.rows()``, a ``GroupRows``), or None:
        every member decodes one token, ahead of ``request_ids``' rows (which never name a
        member). Read ``num_rows`` / ``total_tokens`` / ``all_request_ids`` for every row.
    preempt_ids: drop KV and recompute later (vLLM's recompute preemption).
    swap_out_ids / swap_in_ids: move KV to host / back before the step (InferCept-style swap).
    reject: (request_id, reason) pairs the policy refuses (admission control).
    padding: run as a dense padded batch instead of ragged.
    """

    request_ids: tuple[int, ...] = ()
    num_tokens: tuple[int, ...] = ()
    preempt_ids: tuple[int, ...] = ()
    swap_out_ids: tuple[int, ...] = ()
    swap_in_ids: tuple[int, ...] = ()
    reject: tuple[tuple[int, str], ...] = ()
    padding: PaddedBatch | None = None
    group: Any = None

    def __post_init__(self) -> None:
        ids = self.request_ids
        if len(ids) != len(self.num_tokens):
            raise ValueError("request_ids and num_tokens must have the same length")
        if not ids:  # a plan of the decode group alone, or memory moves only: nothing below to check
            return
        if min(self.num_tokens) < 1:
            raise ValueError(f"every scheduled request must run >= 1 token, got {self.num_tokens}")
        if len(set(ids)) != len(ids):
            raise ValueError("a request is scheduled twice in one step")

    @property
    def is_empty(self) -> bool:
        return not (self.request_ids or self.group or self.preempt_ids or self.swap_out_ids or self.swap_in_ids
                    or self.reject)

    @property
    def num_group_rows(self) -> int:
        return len(self.group) if self.group is not None else 0

    @property
    def num_rows(self) -> int:
        """Rows of the step: the decode group's members and the listed requests."""
        return self.num_group_rows + len(self.request_ids)

    @property
    def total_tokens(self) -> int:
        return self.num_group_rows + sum(self.num_tokens)

    @property
    def all_request_ids(self) -> tuple[int, ...]:
        """Every row's request id, the group's first (built: O(rows); valid while the step is in flight)."""
        return self.group.ids + self.request_ids if self.group else self.request_ids

    @property
    def all_num_tokens(self) -> tuple[int, ...]:
        return (1,) * len(self.group) + self.num_tokens if self.group else self.num_tokens


EMPTY_PLAN = StepPlan()


@dataclass(frozen=True, slots=True)
class StepShape:
    """What a cost model needs to time one step: no ids, just sizes.

    prefill_tokens[i] / prefill_context[i]: a chunk of ``prefill_tokens`` new tokens whose
        KV context after the chunk is ``prefill_context`` tokens long.
    num_decodes / decode_context_sum: decode rows and the sum of their context lengths.
    padding: when set, the step is charged as that dense batch instead.
    swap_blocks: KV blocks moved over PCIe before the step (either direction).
    """

    prefill_tokens: tuple[int, ...] = ()
    prefill_context: tuple[int, ...] = ()
    num_decodes: int = 0
    decode_context_sum: int = 0
    decode_context_max: int = 0
    padding: PaddedBatch | None = None
    swap_blocks: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(self.prefill_tokens) + self.num_decodes


@dataclass(frozen=True, slots=True)
class StepResult:
    """What an executor reports back for one step.

    duration_s: how long the step took (simulated or wall clock).
    sampled_token_ids: for each request that emitted a token this step, its new token id
        (the simulator reports -1: it has no vocabulary).
    stopped_ids: requests the executor ended on its own (EOS, stop string), with a reason.
    """

    duration_s: float
    sampled_token_ids: dict[int, int] = field(default_factory=dict)
    stopped_ids: tuple[tuple[int, str], ...] = ()
