"""Requests: the immutable spec a workload produces and the live state a run mutates.

A workload yields ``RequestSpec`` objects (frozen, reusable across runs); every run wraps
each in a fresh ``Request`` that carries its lifecycle. Token accounting follows the
token-budget view: a request has ``num_tokens`` known tokens (prompt + generated so far)
and ``num_computed_tokens`` whose KV exists; a step schedules some of the difference.
Prefill chunks and decodes are the same thing at different offsets. A request emits a new
token whenever a step brings ``num_computed_tokens`` up to ``num_tokens``.

Invariants: ``0 <= num_computed_tokens <= num_tokens``; a request in a terminal status
(finished, rejected, aborted) has ``finish_reason`` set and is never scheduled again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ServiceClass(enum.Enum):
    """Online requests carry latency SLOs; offline ones are throughput work."""

    ONLINE = "online"
    OFFLINE = "offline"


class RequestStatus(enum.Enum):
    QUEUED = "queued"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    PREEMPTED = "preempted"  # KV dropped; will recompute from scratch
    SWAPPED = "swapped"  # KV in host memory; must be swapped in before running
    TRANSFERRING = "transferring"  # KV moving between instances (P/D, micro-requests)
    HELD = "held"  # KV parked (cluster pool, a reserved buffer); not scheduled anywhere
    FINISHED = "finished"
    REJECTED = "rejected"
    ABORTED = "aborted"

    @property
    def is_terminal(self) -> bool:
        # identity tests: ``self in _TERMINAL`` hashed the member through Enum.__hash__, a Python
        # call, about 30 times per 1k simulated tokens (issue 29)
        return self is RequestStatus.FINISHED or self is RequestStatus.REJECTED or self is RequestStatus.ABORTED


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency targets. ``None`` means no target for that metric."""

    ttft_s: float | None = None
    tpot_s: float | None = None  # mean time per output token after the first
    tbt_s: float | None = None  # bound on every single gap between tokens
    e2el_s: float | None = None  # end-to-end latency, arrival to last token (vLLM's e2el)

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "tbt_s", "e2el_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"SLO.{name} must be > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What a workload says about one request; never mutated."""

    request_id: int
    arrival_time_s: float
    num_prompt_tokens: int
    num_output_tokens: int  # true output length; the simulator stops there
    predicted_output_tokens: int | None = None  # what a length predictor said
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None
    priority: int = 0  # larger is more urgent
    service_class: ServiceClass = ServiceClass.ONLINE
    slo: SLO | None = None
    # ids of fixed-size prompt blocks; equal ids mean a shared prefix (Mooncake hash_ids)
    prefix_block_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1:
            raise ValueError(f"request {self.request_id}: num_prompt_tokens must be >= 1, got {self.num_prompt_tokens}")
        if self.num_output_tokens < 1:
            raise ValueError(f"request {self.request_id}: num_output_tokens must be >= 1, got {self.num_output_tokens}")
        if not self.arrival_time_s >= 0:
            raise ValueError(f"request {self.request_id}: arrival_time_s must be >= 0, got {self.arrival_time_s}")
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.num_prompt_tokens:
            raise ValueError(f"request {self.request_id}: prompt_token_ids has {len(self.prompt_token_ids)} ids "
                             f"but num_prompt_tokens is {self.num_prompt_tokens}")

    @property
    def expected_output_tokens(self) -> int:
        """The output length a non-oracle policy may use: the prediction when there is one."""
        return self.predicted_output_tokens if self.predicted_output_tokens is not None else self.num_output_tokens


@dataclass(slots=True, eq=False)
class Request:
    """Live state of one request in one run.

    ``token_times_s`` holds the emission time of every output token. ``handoff_at_tokens``
    (DistServe, DynaServe micro-requests) makes the current instance give the request away
    once ``num_computed_tokens`` reaches it; the cluster layer moves its KV and clears it.
    ``handoff_target`` names the instance it continues on when a router fixed it at arrival;
    ``stream_kv_tokens`` makes its KV move there in chunks while it is computed.
    """

    spec: RequestSpec
    status: RequestStatus = RequestStatus.QUEUED
    num_computed_tokens: int = 0
    num_generated_tokens: int = 0
    max_output_tokens: int = 0  # stop after this many; set from the spec unless the engine overrides
    instance_id: int | None = None
    handoff_at_tokens: int | None = None
    handoff_target: int | None = None
    stream_kv_tokens: int | None = None
    token_times_s: list[float] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    first_scheduled_time_s: float | None = None
    finish_time_s: float | None = None
    finish_reason: str | None = None
    num_preemptions: int = 0
    num_swaps: int = 0
    num_transfers: int = 0
    # copies of spec fields, read in the simulator's hot loops (plain attributes are cheaper)
    request_id: int = field(init=False)
    arrival_time_s: float = field(init=False)
    num_prompt_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        if self.max_output_tokens == 0:
            self.max_output_tokens = self.spec.num_output_tokens
        self.request_id = self.spec.request_id
        self.arrival_time_s = self.spec.arrival_time_s
        self.num_prompt_tokens = self.spec.num_prompt_tokens

    @property
    def num_tokens(self) -> int:
        """Tokens known so far: the prompt plus every generated token."""
        return self.num_prompt_tokens + self.num_generated_tokens

    @property
    def num_pending_tokens(self) -> int:
        """Tokens that still need a forward pass before the next output token appears."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        return self.num_generated_tokens == 0

    @property
    def is_finished(self) -> bool:
        return self.status.is_terminal

    def finish(self, status: RequestStatus, now_s: float, reason: str) -> None:
        if not status.is_terminal:
            raise ValueError(f"finish() needs a terminal status, got {status}")
        if self.status.is_terminal:
            raise RuntimeError(f"request {self.request_id} already ended ({self.status.value}: {self.finish_reason})")
        self.status = status
        self.finish_time_s = now_s
        self.finish_reason = reason

    def reset_for_recompute(self) -> None:
        """Preemption by recompute: KV is gone; generated tokens are kept and re-prefilled."""
        self.num_computed_tokens = 0
        self.status = RequestStatus.PREEMPTED
        self.num_preemptions += 1
