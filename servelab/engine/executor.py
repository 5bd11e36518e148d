"""Executor: runs one applied ``StepPlan`` on the real model and reports a ``StepResult``.

The executor is the engine's side of the plan/result contract. The ``InstanceRuntime`` has
already applied the plan (reserved KV slots, moved block ids for preemption and swaps), so
the executor only moves bytes and computes: it copies the KV blocks the swaps named, then
runs, for each scheduled request, the token slice ``[num_computed_tokens,
num_computed_tokens + n)`` of ``prompt_token_ids + output_token_ids`` at the request's block
table, and samples only for requests whose slice reaches ``num_tokens`` (a prefill chunk
that does not finish the prompt writes KV and emits nothing). A plan with ``padding`` runs
as the dense padded batch it names, so padded policies pay the padding they are built on.

Per request it keeps the sampling parameters and an incremental detokenizer; a request stops
on EOS, a stop token or a stop string (``stopped_ids`` carries the reason); ``max_tokens`` is
the request's ``max_output_tokens``, which the runtime enforces as "length".

Swap copies need the (src, dst) block pairs that ``BlockManager.swap_out/swap_in`` return;
``InstanceRuntime.apply`` returns them on the applied step and the executor copies them, in
order, before the forward pass (a block freed by a swap-out may be reused by a swap-in of the
same plan, so order matters).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from servelab.core.kv_blocks import BlockManager
from servelab.core.plan import StepPlan, StepResult
from servelab.core.instance import SwapCopies
from servelab.core.request import Request
from servelab.engine.detokenize import IncrementalDetokenizer
from servelab.engine.runner import ModelRunner, SeqChunk
from servelab.engine.sampling import SamplingParams, finish_reason

STOP_STRING_REASON = "stop_string"


@dataclass(slots=True)
class _Tracked:
    params: SamplingParams
    prompt_ids: tuple[int, ...]
    detok: IncrementalDetokenizer | None
    text: list[str] = field(default_factory=list)


class RequestStates:
    """Sampling parameters and detokenizers of every request of one engine cluster.

    Shared by the executors of the instances in one process, so a request that moves to
    another instance keeps its sampler seed, stop strings and partial text.
    """

    def __init__(self, *, tokenizer=None, eos_token_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.tracked: dict[int, _Tracked] = {}
        self.sampling: dict[int, SamplingParams] = {}
        self.outputs_text: dict[int, str] = {}  # final text of every request that ended

    def register(self, request_id: int, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        detok = None
        if self.tokenizer is not None:
            detok = IncrementalDetokenizer(self.tokenizer, prompt_ids, stop=params.stop)
        self.tracked[request_id] = _Tracked(params, tuple(prompt_ids), detok)
        self.sampling[request_id] = params

    def end(self, request_id: int) -> str:
        """Forget a request that ended; returns its output text (cut at a stop string)."""
        tracked = self.tracked.pop(request_id, None)
        self.sampling.pop(request_id, None)
        text = ""
        if tracked is not None and tracked.detok is not None:
            tracked.text.append(tracked.detok.finish())
            text = tracked.detok.text
        self.outputs_text[request_id] = text
        return text


class Executor:
    """Runs applied steps for one instance (the engine side of ``core.executor.StepExecutor``)."""

    def __init__(self, runner: ModelRunner, states: RequestStates | None = None, *, tokenizer=None,
                 eos_token_ids: Sequence[int] = ()) -> None:
        self.runner = runner
        self.states = states if states is not None else RequestStates(tokenizer=tokenizer,
                                                                      eos_token_ids=eos_token_ids)
        self.eos_token_ids = self.states.eos_token_ids

    @property
    def outputs_text(self) -> dict[int, str]:
        return self.states.outputs_text

    # ---- request lifecycle ----
    def add_request(self, request: Request, params: SamplingParams) -> None:
        """Register a request's sampling parameters (the cluster does this on arrival)."""
        ids = request.spec.prompt_token_ids
        if ids is None:
            raise ValueError(f"request {request.request_id}: the engine needs prompt_token_ids")
        self.states.register(request.request_id, ids, params)

    def admit(self, request: Request) -> None:
        if request.request_id not in self.states.tracked:
            raise ValueError(f"request {request.request_id} reached an engine instance without sampling parameters")

    def release(self, request_id: int, ended: bool = True) -> str:
        """The request left this instance; when it ended, finish its text and forget it."""
        if not ended:
            return ""
        self.runner.release(request_id)
        return self.states.end(request_id)

    # ---- KV bytes ----
    def export_kv(self, block_ids: list[int]):
        return self.runner.kv_cache.read_blocks(block_ids)

    def import_kv(self, block_ids: list[int], payload) -> None:
        self.runner.kv_cache.write_blocks(block_ids, payload)

    # ---- steps ----
    def copy_swaps(self, copies: Sequence[tuple[str, list[tuple[int, int]]]]) -> None:
        cache = self.runner.kv_cache
        for direction, pairs in copies:
            (cache.swap_out if direction == "out" else cache.swap_in)(pairs)

    def launch(self, applied, blocks: BlockManager) -> StepResult:
        return self.execute(applied.plan, applied.batch, blocks, applied.swap_copies)

    def execute(self, plan: StepPlan, batch: Sequence[Request], blocks: BlockManager,
                swap_copies: SwapCopies = ()) -> StepResult:
        """Swap copies, one forward pass over the plan's slices, sampling, stop checks; timed."""
        t0 = time.perf_counter()
        self.copy_swaps(swap_copies)
        chunks = [self._chunk(req, n, blocks) for req, n in zip(batch, plan.num_tokens)]
        if not chunks:
            return StepResult(duration_s=time.perf_counter() - t0)
        pad = plan.padding
        if pad is None:
            sampled = self.runner.run(chunks, self.states.sampling)
        else:
            sampled = self.runner.run_padded(chunks, pad.num_rows, pad.row_tokens, pad.context_tokens,
                                             self.states.sampling)
        stopped = self._stops(batch, sampled)
        return StepResult(duration_s=time.perf_counter() - t0, sampled_token_ids=sampled, stopped_ids=stopped)

    def _chunk(self, req: Request, n: int, blocks: BlockManager) -> SeqChunk:
        start = req.num_computed_tokens
        end = start + n
        num_prompt = req.num_prompt_tokens
        prompt = self.states.tracked[req.request_id].prompt_ids
        if end <= num_prompt:
            tokens = prompt[start:end]
        elif start >= num_prompt:
            tokens = req.output_token_ids[start - num_prompt:end - num_prompt]
        else:
            tokens = list(prompt[start:]) + req.output_token_ids[:end - num_prompt]
        return SeqChunk(req.request_id, tokens, start, blocks.block_table(req.request_id),
                        sample=end == req.num_tokens)

    def _stops(self, batch: Sequence[Request], sampled: dict[int, int]) -> tuple[tuple[int, str], ...]:
        stopped = []
        for req in batch:
            token = sampled.get(req.request_id)
            if token is None:
                continue
            tracked = self.states.tracked[req.request_id]
            reason = finish_reason(tracked.params, token, req.num_generated_tokens + 1, self.eos_token_ids)
            if tracked.detok is not None:
                tracked.text.append(tracked.detok.add(token))
                if tracked.detok.stopped and reason is None:
                    reason = STOP_STRING_REASON
            if reason is not None:
                stopped.append((req.request_id, reason))
        return tuple(stopped)
