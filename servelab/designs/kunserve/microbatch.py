"""Forming a pipeline step's microbatches (the paper's section 4.3).

A step's rows become *items*: decodes (one token after their context) first, then prompt
chunks (c tokens after a prefix p), in the order the scheduler put them. Two formers cut
the items into microbatches, both able to cut a prompt chunk between two microbatches
(the latter part then has the former as its prefix):

- ``token_chunking`` (vLLM / Sarathi, the paper's Figure 17a): fill microbatches in order
  with ``ceil(tokens / M)`` tokens each. Equal tokens, unequal time: attention is
  quadratic and a later chunk of a prompt costs more than an earlier one.
- ``lookahead`` (the paper's Figure 11 and appendix): divide and conquer. The step becomes
  ``m = min(M, ceil(tokens / MIN))`` microbatches of about equal Eq. 1 cost: a part to be
  cut into k is split where its cost reaches ``floor(k/2)/k`` of its own (half, for M a
  power of two) and both sides recurse. The cut inside a chunk is found by bisection on its
  token count (cost is monotone in it). Unlike the figure's stop-at-MIN recursion, the
  leaf count is fixed, so no leaf is left at a quarter of the others' cost.

  The stage floor (``stage_floor``, the default since the gap_min test; ``stage_floor=false``,
  MIN per step, is the named variant it is compared against): a step with at least M rows is
  cut into M microbatches whatever its tokens. The paper applies MIN to the lookahead batch, *all*
  queued work (``m = ceil(tokens_B / MIN)``, many microbatches under a burst); a step with
  little or nothing queued (a decode step) is "normal execution", which its lookahead does
  not cover (section 4.4) and its pipeline (vLLM's, one virtual engine per stage) runs one
  microbatch per stage. Without the floor, MIN cut per step leaves a decode step of <= MIN
  rows whole: on a two-stage group it runs on one stage at a time while the other idles (the
  appendix's Eq. 4 with m = 1: twice one stage's cost). The paper gives no value of MIN.

Both return the microbatches as ``StepShape``s for ``PipelineExecutor`` (decodes charged
their mean context, as the step shape carries only the sum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.core.plan import StepShape
from servelab.designs.kunserve.eq1 import Eq1, chunks_to_shape

Chunk = tuple[int, int]  # (tokens, prefix)


def items_of(shape: StepShape) -> list[Chunk]:
    dec = []
    if shape.num_decodes:
        mean = shape.decode_context_sum / shape.num_decodes
        ctx = [int(mean)] * shape.num_decodes
        for i in range(shape.decode_context_sum - int(mean) * shape.num_decodes):
            ctx[i % shape.num_decodes] += 1
        dec = [(1, max(1, c)) for c in ctx]
    pre = [(c, ctx - c) for c, ctx in zip(shape.prefill_tokens, shape.prefill_context)]
    return dec + pre


def token_chunking(items: list[Chunk], num_microbatches: int) -> list[list[Chunk]]:
    total = sum(c for c, _ in items)
    budget = max(1, math.ceil(total / max(1, num_microbatches)))
    out: list[list[Chunk]] = [[]]
    room = budget
    for c, p in items:
        while c > 0:
            if room == 0:
                out.append([])
                room = budget
            take = min(c, room)
            out[-1].append((take, p))
            c, p, room = c - take, p + take, room - take
    return [b for b in out if b]


def _split_at(batch: list[Chunk], eq: Eq1, fraction: float) -> tuple[list[Chunk], list[Chunk]]:
    """Cut ``batch`` where its Eq. 1 cost reaches ``fraction`` of the whole."""
    target = fraction * eq.batch_cost(batch)
    acc = 0.0
    for i, (c, p) in enumerate(batch):
        cost = eq.chunk_cost(c, p)
        if acc + cost < target:
            acc += cost
            continue
        if c > 1:  # cut inside this chunk: the largest t whose cost keeps the first part <= target
            lo = eq.largest_part(c, p, acc, target)
            if 0 < lo < c:
                return batch[:i] + [(lo, p)], [(c - lo, p + lo)] + batch[i + 1:]
        first = batch[:i + 1] if acc + cost - target < target - acc else batch[:i]
        if not first:
            first = batch[:1]
        return first, batch[len(first):]
    return batch, []


MIN_TOKENS = 32  # the lookahead's MIN (the paper gives no value; ours, kept from issue 13)


def lookahead(items: list[Chunk], num_microbatches: int, eq: Eq1, min_tokens: int = MIN_TOKENS,
              stage_floor: bool = True) -> list[list[Chunk]]:
    """Divide and conquer over Eq. 1 cost into ``m = min(M, ceil(tokens / min_tokens))``
    microbatches (with ``stage_floor``, at least ``min(M, rows)``: module docstring): a part
    that must become ``k`` microbatches is cut at cost fraction ``floor(k/2)/k`` (halves when M
    is a power of two, as in Figure 10) and both sides recurse; the target cost per microbatch
    is the whole's over ``m`` (the appendix's cost_upper)."""
    total = sum(c for c, _ in items)
    m = max(1, min(num_microbatches, math.ceil(total / max(1, min_tokens))))
    if stage_floor:
        m = max(m, min(num_microbatches, len(items)))
    out: list[list[Chunk]] = []

    def recurse(batch: list[Chunk], k: int) -> None:
        if k <= 1 or sum(c for c, _ in batch) <= 1:
            out.append(batch)
            return
        a, b = _split_at(batch, eq, (k // 2) / k)
        if not a or not b:
            out.append(batch)
            return
        recurse(a, k // 2)
        recurse(b, k - k // 2)

    if items:
        recurse(list(items), m)
    return out


@dataclass
class MicrobatchFormer:
    """``former(shape)`` for ``FormPipeline``: ``kind`` is lookahead | tokens. ``scope``
    (lookahead only) is read by KunServe's policy: ``queue`` sizes each step as its share of
    the whole queue's Eq. 1 cost (``lookahead_budget``), ``step`` takes the token budget."""

    kind: str
    num_microbatches: int
    eq: Eq1 | None = None
    scope: str = "step"
    min_tokens: int = MIN_TOKENS  # lookahead's MIN
    stage_floor: bool = True  # lookahead: a step of >= M rows always becomes M microbatches (False: MIN per step)

    def __post_init__(self) -> None:
        if self.kind not in ("lookahead", "tokens"):
            raise ValueError(f"microbatch former must be lookahead or tokens, got {self.kind!r}")
        if self.kind == "lookahead" and self.eq is None:
            raise ValueError("the lookahead former needs Eq. 1 coefficients")
        if self.scope not in ("queue", "step"):
            raise ValueError(f"lookahead scope must be queue or step, got {self.scope!r}")
        if self.min_tokens < 1:
            raise ValueError(f"the lookahead's MIN must be at least 1 token, got {self.min_tokens}")

    def __call__(self, shape: StepShape) -> list[StepShape]:
        items = items_of(shape)
        if self.kind == "lookahead":
            batches = lookahead(items, self.num_microbatches, self.eq, self.min_tokens, self.stage_floor)
        else:
            batches = token_chunking(items, self.num_microbatches)
        return [chunks_to_shape(b) for b in batches] or [shape]
