"""KunServe's drop plan (the paper's Figure 6): which instances pool their parameters.

Groups start as single instances, each holding one whole copy of the model; groups formed
by earlier drops take part too (escalation: ``merge_layers`` lays out their union). A min-heap
keyed by group size repeatedly pops the two smallest groups and merges them into one
pipeline group: the merged group keeps one copy of every layer, so one copy's worth of
parameter memory is freed (the layers the two held in duplicate). Merging stops when the
freed memory covers the need or fewer than two groups are left. Small groups first keeps
pipelines short (the paper's Figure 5: latency grows with the number of stages).

O(N log N) in the number of groups. Ties are broken by a caller-given key (KunServe
passes the KV load, so the most throttled instances are paired first), then by member ids,
so a plan is deterministic.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True, slots=True)
class DropPlan:
    groups: tuple[tuple[int, ...], ...]  # every group after the plan, members in stage order
    merged: tuple[tuple[int, ...], ...]  # the groups the plan created (a subset of ``groups``)
    freed_bytes: float
    need_bytes: float

    @property
    def satisfied(self) -> bool:
        return self.freed_bytes >= self.need_bytes


def drop_plan(groups: Sequence[Sequence[int]], need_bytes: float, copy_bytes: float,
              tie: Mapping[int, float] | None = None, max_group_size: int | None = None) -> DropPlan:
    """Merge the two smallest groups until ``need_bytes`` are freed (``copy_bytes``: the
    parameters of one model copy). ``tie[instance id]``: lower merges first among groups of
    equal size (the smallest over a group's members). ``max_group_size`` caps a merged group
    (at most the model's layer count: a stage holds at least one layer). A merge is O(log N)
    heap work plus one tuple concatenation (a C copy of the members, O(N log N) elements over
    a whole plan of balanced merges: cheaper here than keeping a tree and flattening it)."""
    get = tie.get if tie is not None else (lambda _i, _d: 0.0)
    heap = [(len(g), get(g[0], 0.0) if len(g) == 1 else min(get(i, 0.0) for i in g), seq, tuple(g))
            for seq, g in enumerate(groups)]
    heapq.heapify(heap)
    freed = 0.0
    made: dict[int, None] = {}  # seq numbers of the groups this plan made, in order
    seq = len(heap)
    pop, replace, cap = heapq.heappop, heapq.heapreplace, max_group_size
    while len(heap) >= 2 and freed < need_bytes:
        a = pop(heap)
        b = heap[0]  # the second smallest: replaced by the merged group in one sift
        if cap is not None and a[0] + b[0] > cap:
            heapq.heappush(heap, a)
            break  # the two smallest are too big together: so is every other pair
        freed += copy_bytes  # the two held every layer twice; the new group keeps one copy
        made.pop(a[2], None)
        made.pop(b[2], None)
        made[seq] = None
        replace(heap, (a[0] + b[0], a[1] if a[1] < b[1] else b[1], seq, a[3] + b[3]))
        seq += 1
    flat = {h[2]: h[3] for h in heap}
    return DropPlan(tuple(sorted(flat.values())), tuple(flat[s] for s in made if s in flat), freed, need_bytes)


def stage_layers(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """Contiguous layer ranges of about equal size, one per stage."""
    bounds = [round(k * num_layers / num_stages) for k in range(num_stages + 1)]
    return [(bounds[k], bounds[k + 1]) for k in range(num_stages)]


def merge_layers(held: Sequence[tuple[int, tuple[int, int]]], num_layers: int
                 ) -> list[tuple[int, tuple[int, int]]] | None:
    """Stage order and layer ranges for a group merged from formed groups (the paper's second
    drop), each member keeping a sub-range of the layers it holds, so nothing is loaded and
    only KV of layers that change hands moves. ``held``: (instance id, [start, end)) of every
    member. A sweep from layer 0 gives the next stage to the unused member holding the
    current layer whose range ends first, about an equal share of what is left. None: no such
    layout (a member would have to load layers)."""
    left = list(held)
    out: list[tuple[int, tuple[int, int]]] = []
    p = 0
    while left:
        n = len(left)
        cands = [(hi, k) for k, (_, (lo, hi)) in enumerate(left) if lo <= p < hi]
        if not cands:
            return None
        hi, k = min(cands)
        end = num_layers if n == 1 else min(hi, p + max(1, round((num_layers - p) / n)), num_layers - n + 1)
        if end > hi or end <= p:
            return None
        out.append((left.pop(k)[0], (p, end)))
        p = end
    return out if p == num_layers else None


def time_drop_plan(num_instances: int, repeats: int = 200) -> dict:
    """CPU time of planning for ``num_instances`` single instances whose need forces every
    merge (N-1 of them, the worst case), median over ``repeats`` plans."""
    groups = [(i,) for i in range(num_instances)]
    tie = {i: float((i * 7919) % num_instances) for i in range(num_instances)}
    samples = []
    for _ in range(repeats):
        t0 = time.process_time()  # CPU time: the machine is shared, wall time is not the plan's
        plan = drop_plan(groups, need_bytes=float(num_instances), copy_bytes=1.0, tie=tie)
        samples.append(time.process_time() - t0)
    samples.sort()
    return {"num_instances": num_instances, "median_ms": 1e3 * samples[len(samples) // 2],
            "p99_ms": 1e3 * samples[min(len(samples) - 1, int(0.99 * len(samples)))],
            "num_merges": num_instances - len(plan.groups), "repeats": repeats}
