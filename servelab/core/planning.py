"""Shared planning steps for continuous-batching policies (vLLM, Sarathi and their orderings).

A ``PlanBuilder`` tracks the KV blocks, rows and tokens a plan under construction has
claimed, so every plan it emits is feasible by construction: the instance runtime applies
preemptions before reservations, and the builder counts freed blocks the same way.
"""

from __future__ import annotations

from typing import Callable, Sequence

from servelab.core.plan import StepPlan
from servelab.core.policy import InstanceState
from servelab.core.request import Request

OrderKey = Callable[[Request], tuple]


def fcfs_key(req: Request) -> tuple:
    return (req.arrival_time_s, req.request_id)


def shortest_first_key(req: Request) -> tuple:
    return (req.spec.expected_output_tokens - req.num_generated_tokens, req.arrival_time_s, req.request_id)


def longest_first_key(req: Request) -> tuple:
    return (-(req.spec.expected_output_tokens - req.num_generated_tokens), req.arrival_time_s, req.request_id)


def priority_key(req: Request) -> tuple:
    return (-req.spec.priority, req.arrival_time_s, req.request_id)


ORDERS: dict[str, OrderKey] = {"fcfs": fcfs_key, "sjf": shortest_first_key, "ljf": longest_first_key,
                               "priority": priority_key}


def is_decode(req: Request) -> bool:
    """One pending token after at least one output: the request only needs its next token."""
    return req.num_generated_tokens > 0 and req.num_pending_tokens == 1


def admission_error(req: Request, state: InstanceState) -> str | None:
    """Why a request can never run on this instance (its KV can never fit), or None."""
    blocks = state.blocks
    need = blocks.blocks_for(req.num_prompt_tokens + req.max_output_tokens)
    if need > blocks.num_gpu_blocks - blocks.watermark_blocks:
        return (f"needs {need} KV blocks for {req.num_prompt_tokens}+{req.max_output_tokens} tokens; "
                f"the instance has {blocks.num_gpu_blocks - blocks.watermark_blocks} usable")
    return None


def step_limit_error(req: Request, state: InstanceState) -> str | None:
    """Why a policy that runs a prefill whole (no chunking) can never run ``req`` here: its
    pending tokens exceed the step limit (``max_batch_tokens``, vLLM's
    ``max_num_batched_tokens``). vLLM without chunked prefill ignores such a prompt, and one
    preempted by recompute whose prompt and output so far no longer fit one step; or None."""
    n, limit = req.num_pending_tokens, state.max_batch_tokens
    if n <= limit:
        return None
    what = "its prompt" if not req.num_generated_tokens else "its prompt and output so far, to recompute"
    return (f"needs {n} tokens in one step ({what}) but the step limit is {limit} tokens "
            f"(--max-num-batched-tokens) and this policy does not chunk prefills (sarathi, or "
            f"--enable-chunked-prefill, would)")


class PlanBuilder:
    __slots__ = ("state", "blocks", "free_blocks", "token_budget", "num_tokens", "ids", "counts", "preempt",
                 "swap_out", "reject", "evicted", "group", "num_group_rows")

    def __init__(self, state: InstanceState, *, token_budget: int) -> None:
        self.state = state
        self.blocks = state.blocks
        self.free_blocks = state.blocks.num_free_gpu_blocks
        self.token_budget = token_budget
        self.num_tokens = 0
        self.ids: list[int] = []
        self.counts: list[int] = []
        self.preempt: list[int] = []
        self.swap_out: list[int] = []
        self.reject: list[tuple[int, str]] = []
        self.evicted: set[int] = set()  # preempted or swapped out by this plan
        self.group = None  # the instance's decode group rows (GroupRows), decoding as one (plan prefix)
        self.num_group_rows = 0

    @property
    def group_ids(self) -> tuple[int, ...]:
        """The decode group members' ids when the group is planned (built on a membership change)."""
        return self.group.ids if self.group is not None else ()

    @property
    def rows_left(self) -> int:
        return self.state.max_num_seqs - len(self.ids) - self.num_group_rows

    @property
    def tokens_left(self) -> int:
        return self.token_budget - self.num_tokens

    def blocks_needed(self, req: Request, n: int) -> int:
        want = req.num_computed_tokens + n - self.blocks.num_reserved_tokens(req.request_id)
        return self.blocks.num_blocks_needed(req.request_id, want) if want > 0 else 0

    def try_add(self, req: Request, n: int, *, new_request: bool = False) -> bool:
        """Schedule ``n`` tokens of ``req`` if rows, tokens and blocks allow. A chunk never runs
        past the request's hand-off point: it is cut there (the rest runs on the next instance)."""
        handoff = req.handoff_at_tokens
        if handoff is not None and req.num_computed_tokens + n > handoff:
            n = handoff - req.num_computed_tokens
        if n < 1 or self.rows_left < 1 or n > self.tokens_left:
            return False
        need = self.blocks_needed(req, n)
        # the watermark is charged once, when a request's blocks are first taken: one that
        # arrived with its KV (a P/D hand-off, reserved by ``can_reserve`` with the watermark)
        # is not charged again, or it idles holding its KV while running requests eat the
        # watermark (found by the BucketServe reproduction: DistServe's decode instance held
        # 37 such requests idle beside 24 running, KV 98% full, at 413 output tok/s)
        new_request = new_request and not self.blocks.is_on_gpu(req.request_id)
        reserve = self.blocks.watermark_blocks if new_request else 0
        if need + reserve > self.free_blocks:
            return False
        self.free_blocks -= need
        self.num_tokens += n
        self.ids.append(req.request_id)
        self.counts.append(n)
        return True

    def add_decodes(self, running: list[Request], *, swap: bool = False) -> None:
        """Give every running decode one token, evicting from the back of ``running`` on shortage.

        ``running`` is in priority order (first = most important). Victims are preempted by
        recompute, or swapped to host when ``swap`` is set and the host pool has room.
        """
        if self._add_all_decodes(running):
            return
        queue = list(running)
        while queue:
            req = queue.pop(0)
            if not is_decode(req):
                continue
            while not self.try_add(req, 1):
                if self.rows_left < 1 or self.tokens_left < 1:
                    return
                victim = queue.pop() if queue else req
                self._evict(victim, swap)
                if victim is req:
                    break

    def add_group_decodes(self) -> bool:
        """Every decode at once when the instance keeps a decode group and they all fit: O(1) for
        the group's members, a scan of the few running requests outside it. False (nothing
        added) when there is no group or something does not fit; use ``add_decodes`` then."""
        state = self.state
        group = getattr(state, "group", None)
        if group is None or self.group is not None:
            return False
        members = group.n
        # the running requests outside the group (usually none: then no list is built)
        decodes = () if state.num_running == members else [
            r for r in state.running_others if r.num_generated_tokens and r.num_computed_tokens + 1 == r.num_tokens]
        n = members + len(decodes)
        if n > self.rows_left or n > self.tokens_left:
            return False
        need = group.blocks_needed_next()
        if decodes:
            bs = self.blocks.block_size
            need += sum(1 for r in decodes if r.num_computed_tokens % bs == 0)
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        self.num_tokens += n
        if members:  # by reference: the plan copies none of the members (issue 29)
            self.group, self.num_group_rows = group.rows(), members
        if decodes:
            self.ids.extend(r.request_id for r in decodes)
            self.counts.extend([1] * len(decodes))
        return True

    def _add_all_decodes(self, running: list[Request]) -> bool:
        """Fast path: every decode fits (rows, tokens, blocks), so schedule them in one sweep."""
        bs = self.blocks.block_size
        decodes = [r for r in running if r.num_generated_tokens and r.num_computed_tokens + 1 == r.num_tokens]
        n = len(decodes)
        if n > self.rows_left or n > self.tokens_left:
            return False
        need = sum(1 for r in decodes if r.num_computed_tokens % bs == 0)
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        self.num_tokens += n
        self.ids.extend(r.request_id for r in decodes)
        self.counts.extend([1] * n)
        return True

    def evict_waiting(self, victim: Request) -> None:
        """Preempt (recompute) a request queued here with its KV, freeing its blocks for this plan."""
        self._evict(victim, False)

    def _evict(self, victim: Request, swap: bool) -> None:
        held = len(self.blocks.block_table(victim.request_id))
        if swap and self.blocks.num_free_cpu_blocks - sum(
                len(self.blocks.block_table(r)) for r in self.swap_out) >= held:
            self.swap_out.append(victim.request_id)
        else:
            self.preempt.append(victim.request_id)
        self.free_blocks += held
        self.evicted.add(victim.request_id)

    def build(self, **extra) -> StepPlan:
        return StepPlan(tuple(self.ids), tuple(self.counts), preempt_ids=tuple(self.preempt),
                        swap_out_ids=tuple(self.swap_out), reject=tuple(self.reject), group=self.group, **extra)


def sorted_by(requests: Sequence[Request], key: OrderKey) -> Sequence[Request]:
    """The queue in policy order; queues are kept in FCFS order, so FCFS returns them as they
    are (read-only, no copy)."""
    if key is fcfs_key:
        return requests
    return sorted(requests, key=key)


def run_held_kv(state: InstanceState, waiting: list[Request], b: PlanBuilder, *, chunked: bool = False) -> None:
    """The head of the queue does not fit and nothing runs: if what holds the blocks is
    waiting here with its KV (requests handed off to this instance, queued behind a
    preempted one that must recompute), run those; otherwise no step would ever free a
    block and the queue would be stranded (found by tests/reliability/test_conservation.py:
    distserve on a tiny KV cache). When even those cannot grow (every block is theirs), the
    last of them gives its KV up (recompute), as vLLM preempts its lowest-priority request.
    ``chunked``: a held request's pending tokens may run in part (chunked prefill)."""
    held = [r for r in waiting if state.blocks.is_on_gpu(r.request_id)]
    while held:
        for req in held:
            n = min(req.num_pending_tokens, b.tokens_left) if chunked else req.num_pending_tokens
            if not b.try_add(req, n, new_request=True):
                break
        if b.ids:
            return
        b.evict_waiting(held.pop())
