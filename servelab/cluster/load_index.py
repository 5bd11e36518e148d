"""The least-loaded instance in O(log n) per arrival instead of a scan over every instance.

A least-loaded router reads every instance's outstanding tokens on every arrival. At equal
load per instance the arrivals grow with the instances, so that scan made the cost per
simulated token grow linearly with the cluster (0.47 of one instance's speed at 64
instances). This index gives the same answer, the fewest outstanding tokens with ties to
the lowest instance id, from a heap.

An instance's load (``InstanceDriver.outstanding_tokens_at``) changes only when
(a) its runtime's outstanding total changes (``InstanceQueues.load_watch`` reports it),
(b) a fast-forwarded decode run starts, is cut or ends (the driver reports it), or
(c) a step of a run in flight ends: the load falls by the batch's rows at each step end.
(a) and (b) mark the instance dirty; for (c) the index keeps a timer at the next step end
of the run, the first time the load read now would differ. On a query the dirty and timed
out instances are re-read at ``now`` and pushed with a fresh stamp; older heap entries of
the same instance are stale and skipped. Reading an instance never settles its run, so the
index changes nothing a simulation does: results are identical to the scan.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from typing import Sequence

from servelab.core.driver import InstanceDriver


_ID_BITS = 32  # a heap key is load << _ID_BITS | instance id: one int orders as (load, id) did
_ID_MASK = (1 << _ID_BITS) - 1


class LoadIndex:
    """Least-loaded instance among ``drivers`` (the schedulable ones), queried at non-decreasing times.

    Heap entries are plain ints (``load << 32 | instance id``), not (load, id, stamp) tuples:
    an arrival on many instances pops and pushes several entries on heaps of about 4 x the
    instances, and an int comparison is one call where a tuple's is two or three. An entry is
    current when it equals its instance's key in ``_keys`` (an equal duplicate is as good).
    Timers are bare times too, with the instances due then in ``_due``; an instance's timer
    is current while it is its ``_timer_at``. On many instances the heaps are cold: a tuple
    entry costs two dependent reads per comparison (the tuple, then its first item), a bare
    number one."""

    __slots__ = ("_drivers", "_keys", "_heap", "_timers", "_due", "_timer_at", "_dirty", "_watch")

    def __init__(self, drivers: Sequence[InstanceDriver]) -> None:
        self._drivers = {d.runtime.instance_id: d for d in drivers}
        if any(not 0 <= iid <= _ID_MASK for iid in self._drivers):
            raise ValueError(f"instance ids must be in [0, 2**{_ID_BITS}) for the load index")
        self._keys: dict[int, int | None] = dict.fromkeys(self._drivers)  # the current key (None: never read)
        self._heap: list[int] = []  # load << _ID_BITS | instance id
        self._timers: list[float] = []  # the next step ends of runs, each time once
        self._due: dict[float, list[int]] = {}  # a time in ``_timers`` -> the instances whose timer it is
        self._timer_at: dict[int, float | None] = dict.fromkeys(self._drivers)
        self._dirty: set[int] = set(self._drivers)
        self._watch = self._dirty.add
        for d in drivers:
            d.runtime.load_watch = self._watch

    def detach(self) -> None:
        """Stop listening (the schedulable set changed and a new index replaces this one)."""
        for d in self._drivers.values():
            if d.runtime.load_watch == self._watch:
                d.runtime.load_watch = None

    def least_loaded(self, now_s: float) -> tuple[int, int]:
        """(load, instance id) of the instance with the fewest outstanding tokens at ``now_s``.

        Each query re-reads the instances whose load changed since the last one (at one
        instance, that one; at 32 instances and equal load per instance, about four, as about
        three steps end between two arrivals and the last arrival's instance changed too);
        the re-read is inlined here, as it runs several times per arrival."""
        dirty, timers, timer_at, due = self._dirty, self._timers, self._timer_at, self._due
        while timers and timers[0] <= now_s:
            t = heapq.heappop(timers)
            for iid in due.pop(t):
                if timer_at[iid] == t:
                    timer_at[iid] = None
                    dirty.add(iid)
        if dirty:
            drivers, keys, heap, push = self._drivers, self._keys, self._heap, heapq.heappush
            for iid in dirty:  # as ``InstanceDriver.outstanding_tokens_at``, keeping the next step end
                d = drivers[iid]
                run = d.run
                load = d.runtime.num_outstanding_tokens
                if run is not None:
                    ends = run.ends_list
                    if ends is None:
                        ends = run.ends_list = run.ends.tolist()
                    done = min(bisect_right(ends, now_s), run.final_step)
                    load -= (done - run.num_applied) * d.applied.num_rows
                    if done < run.final_step:
                        t = ends[done]
                        if timer_at[iid] != t:
                            timer_at[iid] = t
                            waiting = due.get(t)
                            if waiting is None:
                                due[t] = [iid]
                                push(timers, t)
                            else:
                                waiting.append(iid)
                    else:
                        timer_at[iid] = None
                else:
                    timer_at[iid] = None
                key = load << _ID_BITS | iid
                if keys[iid] != key:
                    keys[iid] = key
                    push(heap, key)
            dirty.clear()
            if len(heap) > 4 * len(keys) + 64 or len(due) > 4 * len(keys) + 64:
                self._compact()
        heap, keys = self._heap, self._keys
        while True:
            key = heap[0]
            iid = key & _ID_MASK
            if keys[iid] == key:
                return key >> _ID_BITS, iid
            heapq.heappop(heap)

    def _compact(self) -> None:
        keys, timer_at = self._keys, self._timer_at
        self._heap = sorted({k for k in self._heap if keys[k & _ID_MASK] == k})
        due = {}
        for t, iids in self._due.items():
            current = [iid for iid in iids if timer_at[iid] == t]
            if current:
                due[t] = current
        self._due = due
        self._timers = sorted(due)
