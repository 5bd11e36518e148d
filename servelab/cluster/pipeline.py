"""Pipeline groups: several instances, each holding a layer range, run as one unit.

A step of a pipeline group is cut into microbatches; microbatch m runs on stage s once
stage s has finished microbatch m-1 and microbatch m's activations have arrived from stage
s-1 (the classic GPipe recurrence, forward only):

    start[m][s] = max(end[m-1][s], end[m][s-1] + send[m][s-1])     end = start + t[m][s]

Two ways to run consecutive steps (``PipelineExecutor(overlap=...)``):

- **overlapped** (default, vLLM's virtual engines and Sarathi-Serve's pipeline): microbatch
  slot m of the next step enters stage 0 as soon as stage 0 is free and slot m's previous
  pass has left the last stage (its tokens are known), so while the group stays busy the
  pipeline stays full and a step costs its slowest stage, not fill plus drain. The
  synchronous driver still decides the step when the previous one ends; the slot's start
  may lie before that decision by at most one pass (a virtual engine decides its own
  microbatch when its previous pass leaves), and the step ends when its last microbatch
  leaves the last stage. After an idle gap the pipeline starts empty.
- **drained** (``overlap=False``): every step fills and drains the pipeline, as one
  synchronous scheduler with no virtual engines runs it; ``end[M-1][S-1]`` from ``now``.

The bubble is the stage time not spent computing: ``S * makespan - sum(t)`` (per step it
can be negative when overlapped, the step's work having started inside the previous step's
window; summed over a run it is the idle stage time). Activations cross the link between
consecutive stages with priority over KV and parameter traffic, but wait for a chunk already
on that link (``Link.occupy``).

``PipelineExecutor`` is the simulator's executor of a group: a cost model per stage (each
built for its layer range, so only the first stage pays the embedding and only the last the
LM head), the links between stages, and a microbatch former: ``former(shape)`` returns
groups of shape rows (KunServe's lookahead formation plugs in here); by default rows are
dealt into ``num_microbatches`` groups of about equal token count. A former may instead
return the microbatches' ``StepShape``s (cutting a prompt chunk between two of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from servelab.core.plan import StepResult, StepShape


@dataclass(frozen=True, slots=True)
class PipelineTiming:
    makespan_s: float
    busy_s: tuple[float, ...]  # per stage
    activation_wait_s: float  # time activations spent waiting for a busy link
    stage_free_s: tuple[float, ...] = ()  # absolute time each stage finishes its last microbatch
    exit_s: tuple[float, ...] = ()  # absolute time each microbatch leaves the last stage

    @property
    def bubble_s(self) -> float:
        return len(self.busy_s) * self.makespan_s - sum(self.busy_s)

    @property
    def bubble_share(self) -> float:
        total = len(self.busy_s) * self.makespan_s
        return self.bubble_s / total if total > 0 else 0.0


def pipeline_schedule(stage_times: Sequence[Sequence[float]], send_times: Sequence[Sequence[float]] = (),
                      start_s: float = 0.0, links: Sequence[Any] = (), stage_free_s: Sequence[float] | None = None,
                      ready_s: Sequence[float] = ()) -> PipelineTiming:
    """Times of ``M`` microbatches over ``S`` stages (``stage_times[m][s]``); ``send_times[m][s]``
    is microbatch m's activation transfer from stage s to s+1 (S-1 entries per row). With
    ``links`` (one per stage boundary) each send also waits for, and then occupies, its link.

    A pipeline already running passes ``stage_free_s`` (when each stage finishes the work it
    holds; default: all free at ``start_s``) and ``ready_s`` (the earliest time microbatch m
    may enter stage 0; microbatches past its end are ready at once): the step then starts
    inside the previous one's tail. ``makespan_s`` is always measured from ``start_s``."""
    num_mb = len(stage_times)
    if num_mb == 0:
        return PipelineTiming(0.0, (), 0.0, tuple(stage_free_s or ()), ())
    num_stages = len(stage_times[0])
    # end of the previous microbatch on each stage
    prev_end = list(stage_free_s) if stage_free_s is not None else [start_s] * num_stages
    wait = 0.0
    exits = []
    for m in range(num_mb):
        arrive = ready_s[m] if m < len(ready_s) else (start_s if stage_free_s is None else prev_end[0])
        for s in range(num_stages):
            begin = max(prev_end[s], arrive)
            end = begin + stage_times[m][s]
            prev_end[s] = end
            if s + 1 < num_stages:
                send = send_times[m][s] if send_times else 0.0
                if links:
                    done = links[s].occupy(end, send)
                    wait += done - end - send
                    arrive = done
                else:
                    arrive = end + send
        exits.append(prev_end[-1])
    makespan = max(exits) - start_s
    busy = tuple(sum(stage_times[m][s] for m in range(num_mb)) for s in range(num_stages))
    return PipelineTiming(makespan, busy, wait, tuple(prev_end), tuple(exits))


def split_shape(shape: StepShape, groups: Sequence[Sequence[int]]) -> list[StepShape]:
    """Sub-shapes of ``shape``: ``groups`` lists row indices (prefill rows first, in order, then
    decode rows numbered after them); decodes are charged their mean context."""
    num_prefill = len(shape.prefill_tokens)
    mean_ctx = shape.decode_context_sum / shape.num_decodes if shape.num_decodes else 0
    out = []
    for rows in groups:
        pt = tuple(shape.prefill_tokens[i] for i in rows if i < num_prefill)
        pc = tuple(shape.prefill_context[i] for i in rows if i < num_prefill)
        nd = sum(1 for i in rows if i >= num_prefill)
        ctx = int(round(mean_ctx * nd))
        out.append(StepShape(pt, pc, nd, ctx, shape.decode_context_max if nd else 0))
    return out


def balance_rows(shape: StepShape, num_microbatches: int) -> list[list[int]]:
    """Token-count chunking: deal rows (largest first) to the microbatch with fewest tokens."""
    return deal_by_size(list(shape.prefill_tokens) + [1] * shape.num_decodes, num_microbatches)


def deal_by_size(sizes: Sequence[int], num_microbatches: int) -> list[list[int]]:
    """Indices of ``sizes`` dealt, largest first, to the group with the smallest total; each
    group in index order, empty groups dropped (the engine's Ray groups cut steps this way too)."""
    k = max(1, min(num_microbatches, len(sizes)))
    groups: list[list[int]] = [[] for _ in range(k)]
    load = [0] * k
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        j = load.index(min(load))
        groups[j].append(i)
        load[j] += sizes[i]
    return [sorted(g) for g in groups if g]


@dataclass
class PipelineStats:
    num_steps: int = 0
    makespan_s: float = 0.0
    bubble_s: float = 0.0
    stage_capacity_s: float = 0.0  # stages x makespan
    activation_wait_s: float = 0.0
    # steps run as one microbatch on a multi-stage group (a former that would not cut them, e.g.
    # lookahead under its MIN tokens): every later stage idles while the earlier ones work
    single_microbatch_steps: int = 0

    @property
    def bubble_share(self) -> float:
        return self.bubble_s / self.stage_capacity_s if self.stage_capacity_s > 0 else 0.0


class PipelineExecutor:
    """Times a group's steps from its stages' cost models and the links between them."""

    def __init__(self, stage_costs: Sequence[Any], stage_links: Sequence[Any], *, hidden_bytes_per_token: float,
                 num_microbatches: int = 2, clock=None, former=None, overlap: bool = True) -> None:
        if len(stage_links) != len(stage_costs) - 1:
            raise ValueError("a pipeline of S stages needs S-1 links between them")
        self.stage_costs = list(stage_costs)
        self.stage_links = list(stage_links)
        self.hidden_bytes_per_token = hidden_bytes_per_token
        self.num_microbatches = num_microbatches
        self.clock = clock  # () -> now_s, to place activations on the links in time
        self.former = former  # shape -> groups of row indices (None: token-count balancing)
        self.overlap = overlap  # consecutive steps overlap while the group stays busy (module docstring)
        self.stats = PipelineStats()
        self._last: PipelineTiming | None = None  # the previous step, when overlapping
        self._last_end_s = float("-inf")

    def time_step(self, shape: StepShape, groups: Sequence[Sequence[int]] | None = None, start_s: float = 0.0
                  ) -> PipelineTiming:
        if groups is None:
            groups = self.former(shape) if self.former is not None else balance_rows(shape, self.num_microbatches)
        if groups and isinstance(groups[0], StepShape):
            parts = list(groups)  # a former that cuts rows itself (KunServe's lookahead)
        else:
            parts = split_shape(shape, groups) if groups else [shape]
        times = [[cost.step_time_s(p) for cost in self.stage_costs] for p in parts]
        sends = [[lk.spec.transfer_time_s(p.num_tokens * self.hidden_bytes_per_token) for lk in self.stage_links]
                 for p in parts]
        carried = self.overlap and self._last is not None and start_s <= self._last_end_s + 1e-9
        if carried:  # the group stayed busy: this step fills the previous one's drain
            timing = pipeline_schedule(times, sends, start_s, self.stage_links,
                                       stage_free_s=self._last.stage_free_s, ready_s=self._last.exit_s)
        else:
            timing = pipeline_schedule(times, sends, start_s, self.stage_links)
        if self.overlap:
            self._last, self._last_end_s = timing, start_s + timing.makespan_s
        st = self.stats
        st.num_steps += 1
        st.single_microbatch_steps += len(parts) == 1 and len(self.stage_costs) > 1
        st.makespan_s += timing.makespan_s
        st.bubble_s += timing.bubble_s
        st.stage_capacity_s += len(self.stage_costs) * timing.makespan_s
        st.activation_wait_s += timing.activation_wait_s
        return timing

    # ---- the executor contract ----
    def launch(self, applied, blocks) -> StepResult:
        now = self.clock() if self.clock is not None else 0.0
        timing = self.time_step(applied.shape, None, now)
        return StepResult(timing.makespan_s)

    def admit(self, request) -> None:
        pass

    def release(self, request_id: int, ended: bool) -> None:
        pass

    def export_kv(self, block_ids):
        return None

    def import_kv(self, block_ids, payload) -> None:
        pass

