"""Multi-Bin Batching (Guldogan et al.), replica level: bins, a central queue, padded batches.

``multibin`` (one instance does everything): an arriving request goes to the bin holding
its expected output length (``spec.expected_output_tokens``: a prediction when one was
filled in, else the oracle length); each bin forms batches of ``batch_size`` (or releases a
partial one after ``max_wait_s``); formed batches wait in one central queue, first formed,
first served; a batch holds the instance as a dense padded batch until its longest member
finishes: no continuous batching, as in the paper. Binning and batch forming are
``servelab.designs.multibin.binning`` (shared with the router and the queue simulator).

``multibin_replica`` is the instance side of the cluster-level ``multibin`` router: it runs
whatever the router placed on it as one padded batch. The simulator queues all of a
router's placements before asking the policy, so a batch arrives whole; ``settle_s`` (0 by
default) adds a wait after the last arrival for executors that deliver requests one by one.

Invariants: a batch never mixes bins; every request runs in exactly one batch; KV for
prompt + max output of every member is checked before a batch starts, so a started batch
never runs out of memory (a request that can never fit is rejected with the reason).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from servelab.designs.multibin.binning import (BinBatcher, BinEdges, FormedBatch, OnlineQuantileEdges, exponential_edges,
                                       uniform_edges)
from servelab.core.plan import EMPTY_PLAN, PaddedBatch, StepPlan
from servelab.core.policy import POLICIES, InstanceState, SchedulingPolicy
from servelab.core.request import Request, RequestStatus
from servelab.core.planning import admission_error, step_limit_error

_BOUNDARIES = ("uniform", "exponential", "explicit", "online")


@dataclass(frozen=True)
class MultiBinConfig:
    """Bins over expected output tokens. ``edges`` are the k-1 inner boundaries for ``explicit``
    (e.g. ``quantile_edges`` of a training split: equal probability mass, Lemma 4.1);
    ``uniform`` spaces them evenly on [lmin, lmax] (Eq. 3); ``exponential`` uses Lemma A.1 with
    rate ``mu`` (per token); ``online`` starts uniform and refits equal-mass quantiles of
    observed output lengths every ``online_refit_every`` completions after ``online_warmup``."""

    batch_size: int = 8
    num_bins: int = 4
    boundaries: str = "uniform"
    lmin: float = 1.0
    lmax: float = 1024.0
    mu: float = 0.01
    edges: tuple[float, ...] = ()
    # a partial bin runs after this long: finite by default, so a served workload that stops
    # short of a full batch never strands a request (None waits for full batches; finite runs
    # still flush partial bins when their last request has arrived)
    max_wait_s: float | None = 2.0
    online_warmup: int = 64
    online_refit_every: int = 64
    online_window: int = 4096

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.num_bins < 1:
            raise ValueError(f"batch_size and num_bins must be >= 1, got {self.batch_size}, {self.num_bins}")
        if self.boundaries not in _BOUNDARIES:
            raise ValueError(f"boundaries must be one of {_BOUNDARIES}, got {self.boundaries!r}")
        if self.boundaries == "explicit" and len(self.edges) != self.num_bins - 1:
            raise ValueError(f"explicit boundaries need num_bins - 1 = {self.num_bins - 1} edges, got {self.edges}")
        if self.max_wait_s is not None and self.max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0 or None, got {self.max_wait_s}")
        # every parameter is checked whichever boundaries use it: mu=-1 beside uniform bins is a typo
        if not 0 < self.mu < math.inf:
            raise ValueError(f"mu must be a finite rate > 0 (per token), got {self.mu}")
        if not 0 <= self.lmin < self.lmax < math.inf:
            raise ValueError(f"lmin and lmax need 0 <= lmin < lmax (finite), got lmin={self.lmin}, lmax={self.lmax}")
        try:
            BinEdges(tuple(self.edges))  # finite and non-decreasing
        except ValueError as err:
            raise ValueError(f"edges: {err}") from None
        if self.edges and self.boundaries != "explicit":
            raise ValueError(f"edges are used only with boundaries=explicit; boundaries={self.boundaries} "
                             f"would ignore them")
        make_edges(self)

    def batcher(self) -> BinBatcher:
        return BinBatcher(self.num_bins, self.batch_size, self.max_wait_s)


def make_edges(config: MultiBinConfig) -> BinEdges | OnlineQuantileEdges:
    if config.boundaries == "explicit":
        return BinEdges(tuple(config.edges))
    if config.boundaries == "exponential":
        return exponential_edges(config.mu, config.batch_size, config.num_bins)
    edges = uniform_edges(config.lmin, config.lmax, config.num_bins) if config.num_bins > 1 else BinEdges(())
    if config.boundaries == "online":
        return OnlineQuantileEdges(config.num_bins, edges, warmup=config.online_warmup,
                                   refit_every=config.online_refit_every, window=config.online_window)
    return edges


def current_edges(edges: BinEdges | OnlineQuantileEdges) -> BinEdges:
    return edges.edges if isinstance(edges, OnlineQuantileEdges) else edges


class PaddedBatchRunner:
    """Runs one batch as a dense padded batch: one padded prefill, then padded decodes until all finish."""

    def __init__(self) -> None:
        self.batch: list[Request] = []
        self._num_rows = 0
        self._max_prompt = 0

    @property
    def active(self) -> bool:
        self.batch = [r for r in self.batch if not r.status.is_terminal]
        return bool(self.batch)

    def start(self, members: list[Request]) -> StepPlan:
        self.batch = members
        self._num_rows = len(members)
        self._max_prompt = max(r.num_pending_tokens for r in members)
        pad = PaddedBatch(num_rows=self._num_rows, row_tokens=self._max_prompt, context_tokens=self._max_prompt)
        return StepPlan(tuple(r.request_id for r in members), tuple(r.num_pending_tokens for r in members),
                        padding=pad)

    def step(self) -> StepPlan:
        rows = [r for r in self.batch if r.num_pending_tokens >= 1]
        longest = max(r.num_tokens for r in self.batch)
        pad = PaddedBatch(num_rows=self._num_rows, row_tokens=1, context_tokens=max(longest, self._max_prompt))
        return StepPlan(tuple(r.request_id for r in rows), tuple(r.num_pending_tokens for r in rows), padding=pad)


def fit_members(members: list[Request], state: InstanceState) -> tuple[list[Request], list[tuple[int, str]]]:
    """Split a batch into what fits now (free KV for prompt + max output each, a padded prefill
    of rows x longest prompt within the step limit) and what never can."""
    rejects = [(r.request_id, why) for r in members
               if (why := admission_error(r, state) or step_limit_error(r, state)) is not None]
    rejected = {rid for rid, _ in rejects}
    fits, free, longest = [], state.blocks.num_free_gpu_blocks, 0
    for req in members:
        if req.request_id in rejected or len(fits) >= state.max_num_seqs:
            continue
        need = state.blocks.blocks_for(req.num_tokens + req.max_output_tokens - req.num_generated_tokens)
        if need <= free and (len(fits) + 1) * max(longest, req.num_pending_tokens) <= state.max_batch_tokens:
            free -= need
            longest = max(longest, req.num_pending_tokens)
            fits.append(req)
    return fits, rejects


@POLICIES.register("multibin")
class MultiBinPolicy(SchedulingPolicy):
    Config = MultiBinConfig

    def __init__(self, config: MultiBinConfig = MultiBinConfig()) -> None:
        self.config = config
        self.edges = make_edges(config)
        self._batcher = config.batcher()
        self._queue: deque[FormedBatch] = deque()
        self._runner = PaddedBatchRunner()
        self._binned: set[int] = set()
        self.served_batches: list[FormedBatch] = []  # for tests and reports: every batch started

    def on_arrival(self, now_s: float, request: Request) -> None:
        if request.request_id in self._binned:
            return  # requeued after a rejection elsewhere; it already has a bin
        self._binned.add(request.request_id)
        bin_index = current_edges(self.edges).bin_of(request.spec.expected_output_tokens)
        self._queue.extend(self._batcher.add(request.request_id, bin_index, now_s))

    def on_finish(self, now_s: float, request: Request) -> None:
        if isinstance(self.edges, OnlineQuantileEdges) and request.status is RequestStatus.FINISHED:
            self.edges.observe(request.num_generated_tokens)

    def next_wakeup_s(self, now_s: float) -> float | None:
        return self._batcher.next_deadline_s()

    def on_arrivals_done(self, now_s: float) -> None:
        """No more arrivals: partial bins run now instead of waiting for members that never come."""
        self._queue.extend(self._batcher.flush(now_s))
        # batches ready at the same instant go bin by bin, as the central queue orders them
        self._queue = deque(sorted(self._queue, key=lambda b: (b.ready_s, b.bin_index, b.member_ids[0])))

    def schedule(self, now_s: float, state: InstanceState) -> StepPlan:
        if self._runner.active:
            return self._runner.step()
        self._queue.extend(self._batcher.release_due(now_s))
        while self._queue:
            batch = self._queue[0]
            by_id = {r.request_id: r for r in state.waiting}
            members = [by_id[i] for i in batch.member_ids if i in by_id]
            fits, rejects = fit_members(members, state)
            if rejects:
                return StepPlan(reject=tuple(rejects))
            if not members:
                self._queue.popleft()
                continue
            if not fits:
                return EMPTY_PLAN  # cannot happen when idle: admission_error rejected it
            self._queue.popleft()
            if len(fits) < len(members):  # rows or memory cap: the rest stays at the head of the queue
                rest = tuple(r.request_id for r in members if r not in fits)
                self._queue.appendleft(FormedBatch(batch.bin_index, rest, batch.ready_s, False))
            self.served_batches.append(FormedBatch(batch.bin_index, tuple(r.request_id for r in fits),
                                                   batch.ready_s, batch.full))
            return self._runner.start(fits)
        return EMPTY_PLAN


@dataclass(frozen=True)
class ReplicaConfig:
    settle_s: float = 0.0  # extra wait after the last placement before a batch starts

    def __post_init__(self) -> None:
        if self.settle_s < 0:
            raise ValueError(f"settle_s must be >= 0, got {self.settle_s}")


@POLICIES.register("multibin_replica", hidden=True)
class MultiBinReplicaPolicy(SchedulingPolicy):
    """Runs each group of placed requests as one padded batch until its longest member finishes."""

    Config = ReplicaConfig

    def __init__(self, config: ReplicaConfig = ReplicaConfig()) -> None:
        self.config = config
        self._runner = PaddedBatchRunner()
        self._last_arrival_s = -1.0
        self.served_batches: list[tuple[int, ...]] = []

    def on_arrival(self, now_s: float, request: Request) -> None:
        self._last_arrival_s = now_s

    def next_wakeup_s(self, now_s: float) -> float | None:
        return self._last_arrival_s + self.config.settle_s if now_s < self._last_arrival_s + self.config.settle_s else None

    def schedule(self, now_s: float, state: InstanceState) -> StepPlan:
        if self._runner.active:
            return self._runner.step()
        if not state.waiting or now_s < self._last_arrival_s + self.config.settle_s:
            return EMPTY_PLAN
        fits, rejects = fit_members(list(state.waiting), state)
        if rejects:
            return StepPlan(reject=tuple(rejects))
        if not fits:
            return EMPTY_PLAN
        self.served_batches.append(tuple(r.request_id for r in fits))
        return self._runner.start(fits)
