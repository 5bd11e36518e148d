"""KunServe's drop plan (the paper's Figure 6): which instances pool their parameters.

Groups start as single instances, each holding one whole copy of the model; groups formed
by earlier drops take part too (escalation: ``merge_layers`` lays out their union). A min-heap
keyed by group size repeatedly pops the two smallest groups and merges them into one
pipeline group: the merged group keeps one copy of every layer, so one copy's worth of
parameter memory is freed (the layers the two held in duplicate). Merging stops when the
freed memory covers the need or fewer than two groups are left. Small groups first keeps
pipelines short (the paper's Figure 5: latency grows with the number of stages).

O(N log N) in the number of groups. Ties are broken by a caller-given key (KunServe
passes the KV load, so the most throttled instances are paired first), then by the groups'
order in the input, so a plan is deterministic.

Two implementations of the same plan. ``_heap_plan`` pops the two smallest from a heap, one
merge per loop turn: simple, and fastest for small clusters. ``_bulk_plan`` (from
``BULK_FROM`` groups on) uses what makes Huffman's two-queue method work: a merged group's
key (size, tie, sequence number) is never smaller than the previous merged one's, so the
merged groups form a second sorted queue, and the next merges take consecutive pairs of one
queue's run below the other's head, a whole run per numpy operation (at 1,024 instances the
heap's per-merge Python work was 1.3-1.7 ms of this machine's CPU; see ``time_drop_plan``).
``tests/designs/kunserve/test_drop_plan.py`` checks both give the same plan on random inputs.
"""

from __future__ import annotations

import heapq
import time
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import itemgetter
from typing import Mapping, Sequence

import numpy as np

BULK_FROM = 256  # groups; below this the heap's loop is cheaper than numpy's per-call overhead


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
    (at most the model's layer count: a stage holds at least one layer)."""
    if len(groups) >= BULK_FROM:
        plan = _bulk_plan(groups, need_bytes, copy_bytes, tie, max_group_size)
        if plan is not None:
            return plan
    return _heap_plan(groups, need_bytes, copy_bytes, tie, max_group_size)


def _heap_plan(groups: Sequence[Sequence[int]], need_bytes: float, copy_bytes: float,
               tie: Mapping[int, float] | None, max_group_size: int | None) -> DropPlan:
    """One merge per turn: O(log N) heap work plus one tuple concatenation (a C copy of the
    members, O(N log N) elements over a whole plan of balanced merges: cheaper here than
    keeping a tree and flattening it)."""
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


def _bulk_plan(groups: Sequence[Sequence[int]], need_bytes: float, copy_bytes: float,
               tie: Mapping[int, float] | None, max_group_size: int | None) -> DropPlan | None:
    """The heap's plan, a run of merges per numpy operation (the module docstring says why the
    merged groups come out sorted). Each group is one int64 key, (size, tie rank, sequence
    number) packed high to low, ties ranked with equal values sharing a rank, so comparing
    keys compares what the heap's tuples compare. None where that packing cannot hold (NaN
    ties, or more than 62 bits): the caller falls back to the heap."""
    n = len(groups)
    members = list(map(tuple, groups))  # by sequence number; merged groups are appended
    sizes = np.fromiter(map(len, members), np.int64, n)
    if tie is None:
        ranks = np.zeros(n, np.int64)
    else:
        get = tie.get
        if sizes.min() == 1 and sizes.max() == 1:
            ties = np.fromiter(map(get, map(itemgetter(0), members), repeat(0.0)), np.float64, n)
        else:
            ties = np.fromiter((min(get(i, 0.0) for i in g) for g in members), np.float64, n)
        if np.isnan(ties).any():
            return None
        ranks = np.unique(ties, return_inverse=True)[1].astype(np.int64).reshape(-1)
    sb, rb = (2 * n).bit_length(), max(1, int(ranks.max()).bit_length())
    if sb + rb + int(sizes.sum()).bit_length() > 62:
        return None
    sm, rm, shift = (1 << sb) - 1, (1 << rb) - 1, rb + sb
    # merges the need allows, and the bytes freed after each: the heap's float sums, one merge at a time
    freed = list(accumulate(repeat(copy_bytes, n - 1), initial=0.0))
    limit = min(bisect_left(freed, need_bytes), n - 1) if copy_bytes > 0 else \
        next((k for k, f in enumerate(freed) if not f < need_bytes), n - 1)
    q1 = np.sort((((sizes << rb) | ranks) << sb) | np.arange(n, dtype=np.int64))  # the input groups
    q2 = np.empty(n, np.int64)  # the merged groups, in the order made (sorted)
    n2 = i = j = done = 0
    seq, cap = n, max_group_size
    while done < limit:
        run = None  # the longest run of keys from one queue below the other queue's head
        if i < n and j < n2:
            if q1[i] < q2[j]:
                r, run, lo = int(np.searchsorted(q1[i:], q2[j])), q1, i
            else:
                r, run, lo = int(np.searchsorted(q2[j:n2], q1[i])), q2, j
        elif n2 - j >= 2:  # merged groups only: each new one sorts after every one now queued
            r, run, lo = n2 - j, q2, j
        if run is None or r < 2:  # one merge of the two smallest, wherever they are
            picks, ii, jj = [], i, j
            for _ in range(2):
                if jj < n2 and (ii >= n or q2[jj] < q1[ii]):
                    picks.append(int(q2[jj]))
                    jj += 1
                else:
                    picks.append(int(q1[ii]))
                    ii += 1
            a, b = picks
            size = (a >> shift) + (b >> shift)
            if cap is not None and size > cap:
                break  # the two smallest are too big together: so is every other pair
            q2[n2] = (((size << rb) | min((a >> sb) & rm, (b >> sb) & rm)) << sb) | seq
            members.append(members[a & sm] + members[b & sm])
            i, j, n2, seq, done = ii, jj, n2 + 1, seq + 1, done + 1
            continue
        m = min(r // 2, limit - done)  # consecutive pairs of the run: the next m merges
        a, b = run[lo:lo + 2 * m:2], run[lo + 1:lo + 2 * m:2]
        size = (a >> shift) + (b >> shift)  # non-decreasing along the run
        capped = cap is not None and size[-1] > cap
        if capped:
            m = int(np.searchsorted(size, cap, side="right"))
            a, b, size = a[:m], b[:m], size[:m]
        q2[n2:n2 + m] = (((size << rb) | np.minimum((a >> sb) & rm, (b >> sb) & rm)) << sb) \
            | np.arange(seq, seq + m, dtype=np.int64)
        members.extend([members[x] + members[y] for x, y in zip((a & sm).tolist(), (b & sm).tolist())])
        i, j = (i + 2 * m, j) if run is q1 else (i, j + 2 * m)
        n2, seq, done = n2 + m, seq + m, done + m
        if capped:
            break
    alive = sorted((np.concatenate([q1[i:], q2[j:n2]]) & sm).tolist())
    return DropPlan(tuple(sorted(members[s] for s in alive)), tuple(members[s] for s in alive if s >= n),
                    freed[done], need_bytes)


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
    merge (N-1 of them, the worst case), median over ``repeats`` plans; with the machine's
    1-minute load average at the start (the number is this machine's, measured)."""
    import os

    groups = [(i,) for i in range(num_instances)]
    tie = {i: float((i * 7919) % num_instances) for i in range(num_instances)}
    samples = []
    load = os.getloadavg()[0]
    for _ in range(repeats):
        t0 = time.process_time()  # CPU time: the machine is shared, wall time is not the plan's
        plan = drop_plan(groups, need_bytes=float(num_instances), copy_bytes=1.0, tie=tie)
        samples.append(time.process_time() - t0)
    samples.sort()
    return {"num_instances": num_instances, "median_ms": 1e3 * samples[len(samples) // 2],
            "p99_ms": 1e3 * samples[min(len(samples) - 1, int(0.99 * len(samples)))],
            "num_merges": num_instances - len(plan.groups), "repeats": repeats, "load_avg_1m": load}
