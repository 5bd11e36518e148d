"""Lookahead over the whole queued work (the paper's section 4.3): how much of the queue a
pipeline group's step takes.

The paper forms microbatches by looking ahead at *all* queued requests: the initial batch
holds every queued token, is cut recursively into halves of equal Eq. 1 cost until a part
has about ``MIN`` tokens, and the microbatches run through the pipeline one after another.
Each step of a group here runs one microbatch per stage (vLLM's virtual engines), so the
plan over the whole queue fixes what a step takes: with ``n`` steps' worth of queued prompt
tokens (``ceil(tokens / room)``, ``room`` being a step's token room after its decodes at
``MIN`` tokens per microbatch) every step gets ``1/n`` of the queue's Eq. 1 cost, not a fixed
token count. A step of late chunks of long prompts (each token attends to a long prefix)
then takes fewer tokens than a step of fresh short prompts, so consecutive steps, and the
microbatches the former cuts from them, cost the same and the overlapped pipeline does not
idle on the difference (the appendix's Eq. 4: a pipeline pays ``max`` of neighbours).

With one step's worth queued or less the step takes what the token budget takes (nothing
to look ahead at). The step-scope variant (``lookahead_scope="step"``) cuts the fixed
budget's tokens into cost-balanced microbatches only within the step.
"""

from __future__ import annotations

import math
from typing import Iterable

from servelab.designs.kunserve.eq1 import Eq1


def queue_step_tokens(prompt_items: Iterable[tuple[int, int]], num_decodes: int, room_tokens: int, eq: Eq1) -> int:
    """Prompt tokens this step takes from the queue's ``(pending tokens, computed prefix)``
    items (in the scheduler's order): the queue's Eq. 1 cost over the steps its tokens need
    at ``room_tokens`` per step. ``room_tokens`` when the queue fits one step (or is empty)."""
    items = [(c, p) for c, p in prompt_items if c > 0]
    total = sum(c for c, _ in items)
    room = max(1, room_tokens)
    if total <= room:
        return room
    steps = math.ceil(total / room)
    target = sum(eq.chunk_cost(c, p) for c, p in items) / steps
    acc, take = 0.0, 0
    for c, p in items:
        cost = eq.chunk_cost(c, p)
        if acc + cost <= target:
            acc, take = acc + cost, take + c
            continue
        take += eq.largest_part(c, p, acc, target)  # the largest part of this prompt within the target
        break
    return max(1, take)
