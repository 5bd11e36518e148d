"""The global scheduler's execution predictor: one instance's assigned work as virtual passes.

A ``Timeline`` is the predicted future of one instance: a sequence of passes (steps), each
with its decode rows, their context sum and its prefill tokens, timed by the instance's
profile table. It is built the way the local scheduler batches: every active decode
advances one token per pass, prefill fills the pass's SLO budget first come first served,
at most ``max_num_seqs`` decodes share a pass. Passes live in numpy arrays indexed
``[head, size)``; pass ``head`` is the one in flight at the last ``advance``.

Reuse of the computed prefix (the paper's "timing arrays"): the passes are kept between
requests; ``advance`` drops the ones the clock has passed, ``commit`` adds one segment's
tokens to the passes it lands in and shifts the later end times (``add`` queues it in O(1)
and ``flush`` commits later, so a decision never pays for re-timing passes), and ``probe``
predicts what a segment would add without changing anything, in O(log passes): prefill lands in
the passes' free budget (prefix sums), decode rows add a marginal cost linear in context
(fitted to the table), and passes beyond the horizon cost a whole pass each. ``rebuild``
starts again from the instance's real queue (calibration against what actually ran).

Time and work: a pass's duration is mostly the weights read (``base``) when it holds a few
decodes, yet more decodes could share it almost for free; a sparse decode pass is long but
not a full GPU. So besides durations the timeline counts each pass's *work*: its duration
above the base plus the base in proportion to how full the pass is (decode rows over the
rows a pass may hold under the SLO, prefill tokens over a full pass). A full pass's work
is its duration; one decode token costs its marginal row time plus its share of the base.
The split search balances work (what limits throughput); times say when a part ends.

Times are absolute (the cluster clock). Invariants: ``end`` is non-decreasing over live
passes; ``cumfree[k]`` / ``cumwork[k]`` are the free prefill budget / work of passes ``[0, k)``.

The pass storage (arrays, clock advance, compaction) is the base class ``PassArrays``
(``pass_arrays.py``); this module predicts (``probe``) and lays work into the passes.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from servelab.designs.dynaserve.pass_arrays import PassArrays
from servelab.designs.dynaserve.passes import Coefficients, coefficients, decode_rows, lay_out
from servelab.designs.dynaserve.profile import ProfileTable
from servelab.designs.dynaserve.search import gallop_left

MAX_PENDING = 32


class Segment(NamedTuple):
    """A micro-request's work on one instance: ``prefill_tokens`` then ``decode_tokens``
    passes of one token each; its first decode runs on a context of ``context`` tokens.
    (Segments and probes are immutable values built a few times per decision: a NamedTuple
    costs less than half a frozen dataclass to build.)"""

    ready_s: float  # earliest start: now, or when its KV has arrived
    prefill_tokens: int
    decode_tokens: int
    context: int


class Probe(NamedTuple):
    finish_s: float  # when the instance would finish all its work with the segment added
    segment_end_s: float  # when the segment's last token would be computed
    work_s: float  # busy time the instance would have ahead (idle waits for KV not counted)


class Timeline(PassArrays):
    def __init__(self, table: ProfileTable, *, target_s: float, max_num_seqs: int, now_s: float = 0.0,
                 capacity: int = 1024) -> None:
        self.table = table
        self.target_s = target_s
        self.max_num_seqs = max_num_seqs
        super().__init__(now_s=now_s, capacity=capacity)
        self.pending: list[Segment] = []  # placed but not laid into passes yet (``add``)
        self.pending_work = 0.0
        self.pending_prefill = 0.0
        self._coef: Coefficients | None = None
        self._coef_unready = True

    @property
    def work_s(self) -> float:
        """Work ahead (see the module docstring), the pass in flight and pending segments included."""
        size, head = self.size, self.head
        laid = self.cumwork.item(size) - self.cumwork.item(head) if size > head else 0.0
        return laid + self.pending_work

    def add(self, seg: Segment) -> float:
        """Place ``seg`` in O(1): it is queued and its work counted now, and laid into the
        passes by ``flush`` (the router calls it after steps, off the decision path, and
        here when ``MAX_PENDING`` segments wait). Returns the segment's predicted end."""
        before = self.work_s
        probe = self._probe(seg, before)
        self._enqueue(seg, probe.work_s - before)
        return probe.segment_end_s

    def queue(self, seg: Segment) -> None:
        """``add`` without predicting the segment's end (a beta part: nothing waits on it), so
        without the search for where it lands: the work it adds is the same closed form."""
        before = self.work_s
        self._enqueue(seg, before + self.segment_work(seg.prefill_tokens, seg.decode_tokens, seg.context) - before)

    def _enqueue(self, seg: Segment, work: float) -> None:
        self.pending.append(seg)
        self.pending_work = work + self.pending_work
        self.pending_prefill += seg.prefill_tokens
        if len(self.pending) >= MAX_PENDING:
            self.flush()

    def flush(self) -> None:
        """Lay the pending segments into the passes, in the order they were placed."""
        pending = self.pending
        self.pending, self.pending_work, self.pending_prefill = [], 0.0, 0.0
        for seg in pending:
            self.commit(seg)
    # ---- linearised costs for probes ----
    @property
    def coef(self) -> Coefficients:
        """Linear costs read off the table when the timeline is first used with a ready table, and
        at every rebuild."""
        if self._coef is None or self._coef_unready:
            self._coef_unready = not self.table.ready
            self._coef = coefficients(self.table, self.target_s)
        return self._coef

    def _alone_s(self, context: float) -> float:
        return self.table.cached_latency(0, int(context) // 64, 1)

    # ---- where a segment lands ----
    def _first_pass(self, ready_s: float) -> int:
        """The first pass that may take new work: after the one in flight, at or after ``ready_s``."""
        size = self.size
        k = self.head + 1 if size > self.head else size
        if ready_s > self.now_s and size > k:
            j = gallop_left(self.end, ready_s, self.head, size) + 1  # from the head: the same max with k
            k = j if j > k else k
        return k if k < size else size

    @property
    def prefill_wait_s(self) -> float:
        """How long a new prefill would wait: for the prefill already assigned here (FCFS), and
        for a free row when the passes ahead hold ``max_num_seqs`` decodes."""
        head, size, tail_pass, now = self.head, self.size, self.prefill_tail, self.now_s
        end = self.end
        tail = end.item(tail_pass - 1) if head < tail_pass < size else now
        if size > head + 1 and self.rows.item(head + 1) >= self.max_num_seqs:  # the next pass is full
            room = self._admit_pass(head + 1)  # > head + 1: start of the pass with room, or the drain
            tail = max(tail, end.item(room - 1))
        return tail - now + self.pending_prefill * self.coef.full_pass_token_s

    def step_s_at(self, t: float) -> float:
        """Predicted duration of the pass running at time ``t`` (a lone decode past the horizon)."""
        k = self._first_pass(t)
        return self.dur.item(k) if k < self.size else self._alone_s(0)

    def _admit_pass(self, k: int) -> int:
        """Decode rows cannot join a full pass (``max_num_seqs``): the first pass with room."""
        size, cap = self.size, self.max_num_seqs
        if k >= size or self.rows.item(k) < cap:
            return k
        lo, step = k, 64  # the room is usually within a few dozen passes: look there first
        while lo < size:
            hi = min(lo + step, size)
            room = np.flatnonzero(self.rows[lo:hi] < cap)
            if len(room):
                return lo + int(room[0])
            lo, step = hi, step * 4
        return size

    def segment_work(self, prefill_tokens: int, decode_tokens: int, context: int) -> float:
        """Work a segment adds wherever it lands: a prefill token costs a full pass's share, a
        decode token its marginal row time at its context plus its share of a full pass's base."""
        c = self.coef
        d = decode_tokens
        return prefill_tokens * c.full_pass_token_s + d * (c.row_s + c.decode_share_s
                                                           + c.row_ctx_s * (context + (d - 1) / 2))

    def probe(self, seg: Segment) -> Probe:
        """What ``seg`` would add, without adding it (O(log passes))."""
        return self._probe(seg, self.work_s)

    def _probe(self, seg: Segment, work_ahead: float) -> Probe:
        c = self.coef
        size, end, head = self.size, self.end, self.head
        drain = end.item(size - 1) if size > head else self.now_s
        added = 0.0  # time the segment adds to the passes it shares
        ready, p, d, ctx0 = seg
        # segment_work(p, d, ctx0) and _first_pass(ready), inline (the same operations)
        work = p * c.full_pass_token_s + d * (c.row_s + c.base_s / c.full_rows + c.row_ctx_s * (ctx0 + (d - 1) / 2))
        if ready > self.now_s:
            k = self._first_pass(ready)
        else:
            k = head + 1 if size > head else size
            if k > size:
                k = size
        beyond = k >= size  # its remaining work runs after the horizon
        t = drain if beyond else self._start(k)  # where the segment has got to
        if ready > t:
            t = ready
        if p > 0:
            kp = k if k > self.prefill_tail else self.prefill_tail
            queued = self.pending_prefill  # placed, not yet laid into passes: ahead of us (FCFS)
            cumfree = self.cumfree
            avail = cumfree.item(size) - cumfree.item(kp) - queued if kp < size else 0.0
            if p <= avail:
                ke = gallop_left(cumfree, cumfree.item(kp) + queued + p, kp, size + 1) - 1  # sums below kp are smaller
                added += p * c.prefill_token_s
                t = end.item(ke) + added + queued * c.prefill_token_s
                k = ke + 1
            else:
                avail = avail if avail > 0 else 0.0
                added += avail * c.prefill_token_s
                t = max(drain + added, ready) + (p - avail) * c.full_pass_token_s
                beyond = True
        if d > 0 and not beyond:
            k = self._admit_pass(k)
            inside = min(k + d, size) - k
            inside = inside if inside > 0 else 0
            added += inside * c.row_s + c.row_ctx_s * (inside * ctx0 + inside * (inside - 1) / 2)
            if inside == d:
                return Probe(drain + added, end.item(k + d - 1) + added, work_ahead + work)
            d -= inside
            ctx0 += inside
            if drain + added > t:
                t = drain + added
        if d > 0:
            t = max(t, drain) + d * self._alone_s(ctx0 + (d - 1) / 2)
        return Probe(max(drain + added, t), t, work_ahead + work)

    def commit(self, seg: Segment) -> Probe:
        """Add ``seg`` to the passes it lands in (prefill FCFS into free budget, then one decode
        row per pass). Each touched pass grows by the segment's marginal cost (the linear
        coefficients, as in ``probe``); later passes shift by the time added. ``rebuild``
        re-times every pass from the table."""
        c = self.coef
        k = self._first_pass(seg.ready_s)
        lo, hi, last = self.size, 0, k
        if seg.ready_s > self.drain_s and k >= self.size:
            gap = seg.ready_s - self.drain_s
            self._append(1)
            self.gap[self.size - 1] = gap
            k = lo = self.size - 1
            hi = self.size
        p = float(seg.prefill_tokens)
        if p > 0:
            kp = max(k, self.prefill_tail)
            if kp < self.size:
                before = self.cumfree[kp:self.size] - self.cumfree[kp]
                take = np.clip(p - before, 0.0, self.free[kp:self.size])
                used = np.nonzero(take)[0]
                if len(used):
                    m = int(used[-1]) + 1
                    take = take[:m]
                    sl = slice(kp, kp + m)
                    self.dur[sl] += take * np.where(self.rows[sl] > 0, c.prefill_token_s, c.full_pass_token_s)
                    self.pre[sl] += take
                    self.free[sl] -= take
                    lo, hi, last = min(lo, kp), max(hi, kp + m), kp + m - 1
                    p -= float(take.sum())
            if p > 0.5:
                b = max(c.full_pass_tokens, 1)
                n = math.ceil(p / b)
                first = self.size
                self._append(n)
                self.pre[first:self.size] = b
                self.pre[self.size - 1] = p - b * (n - 1)
                self.dur[first:self.size] = self.pre[first:self.size] * c.full_pass_token_s
                self.free[first:self.size] = b - self.pre[first:self.size]
                lo, hi, last = min(lo, first), self.size, self.size - 1
            self.prefill_tail = last
            k = last + 1
        d = seg.decode_tokens
        if d > 0:
            k = self._admit_pass(k)
            if k + d > self.size:
                self._append(k + d - self.size)
            sl = slice(k, k + d)
            context = seg.context + np.arange(d, dtype=np.float64)
            grow = c.row_s + c.row_ctx_s * context + np.where(self.dur[sl] > 0, 0.0, c.base_s)
            self.dur[sl] += grow
            self.free[sl] = np.maximum(self.free[sl] - grow / max(c.prefill_token_s, 1e-12), 0.0)
            self.rows[sl] += 1.0
            self.ctx[sl] += context
            lo, hi, last = min(lo, k), max(hi, k + d), k + d - 1
        if hi > lo:
            self._rework(lo, hi)
            self._recum(lo, hi)
        seg_end = float(self.end[min(last, self.size - 1)]) if self.size else self.now_s
        return Probe(self.drain_s, seg_end, self.work_s)

    def _append(self, n: int) -> None:
        """``n`` empty passes after the horizon (from now when the timeline is empty): each
        may take a full pass of prefill."""
        if self._stale:
            self._clear(0)
        self._grow(self.size + n + 1)
        start = self.drain_s if self.size > self.head else max(self.now_s, self._start(self.size))
        if self.size == self.head:
            self._reset_to(start)
        new = slice(self.size, self.size + n)
        self.end[new] = start
        self.free[new] = self.coef.full_pass_tokens
        self.cumfree[self.size + 1:self.size + n + 1] = self.cumfree[self.size]
        self.cumwork[self.size + 1:self.size + n + 1] = self.cumwork[self.size]
        self.size += n
        if self.size > self._hw:
            self._hw = self.size

    def _reset_to(self, start: float) -> None:
        self.head = self.size = self.prefill_tail = 0
        self.t0 = start
        self.cumfree[0] = self.cumwork[0] = 0.0

    def _retime(self, lo: int, hi: int) -> None:
        """Durations and free budgets of passes ``[lo, hi)`` from the table, then work and sums."""
        rows = self.rows[lo:hi]
        mean_ctx = np.divide(self.ctx[lo:hi], rows, out=np.zeros(hi - lo), where=rows > 0)
        self.dur[lo:hi] = self.table.latency_many(self.pre[lo:hi], mean_ctx, rows)
        budget = self.table.budget_many(mean_ctx, rows, self.target_s)
        self.free[lo:hi] = np.maximum(budget - self.pre[lo:hi], 0.0)
        self._rework(lo, hi)
        self._recum(lo, hi)

    def _rework(self, lo: int, hi: int) -> None:
        c = self.coef
        fill = np.minimum(self.rows[lo:hi] / c.full_rows + self.pre[lo:hi] / c.full_pass_tokens, 1.0)
        self.work[lo:hi] = np.maximum(self.dur[lo:hi] - c.base_s, 0.0) + c.base_s * fill

    def _recum(self, lo: int, hi: int) -> None:
        """End times and prefix sums over ``[lo, hi)``; later passes shift by the change."""
        old_end = self.end[hi - 1]
        self.end[lo:hi] = self._start(lo) + np.cumsum(self.dur[lo:hi] + self.gap[lo:hi])
        if hi < self.size:
            self.end[hi:self.size] += self.end[hi - 1] - old_end
        for per_pass, cum in ((self.free, self.cumfree), (self.work, self.cumwork)):
            old = cum[hi]
            cum[lo + 1:hi + 1] = cum[lo] + np.cumsum(per_pass[lo:hi])
            if hi < self.size:
                cum[hi + 1:self.size + 1] += cum[hi] - old

    def rebuild(self, now_s: float, decode_left: np.ndarray, decode_context: np.ndarray,
                segments: list[Segment]) -> None:
        """Start again from the real queue in a few vectorised passes (``passes.lay_out``):
        running decodes (tokens left, context now) from the next pass, segments ready now
        with their prefill first come first served into the free budget, decode-only parts
        still to arrive from their ready time; then every pass is timed from the table.
        Parts still to arrive that start with prefill (rare) are committed one by one. The
        linear coefficients are refreshed from the table here (it learns from steps)."""
        self._reset(now_s)
        self.pending, self.pending_work, self.pending_prefill = [], 0.0, 0.0  # the real queue has them
        self._coef = c = coefficients(self.table, self.target_s)
        self._coef_unready = not self.table.ready
        later = [g for g in segments if g.ready_s > now_s]
        ready = [g for g in segments if g.ready_s <= now_s]
        rows, ctx, pre, tail = lay_out(self.table, self.target_s, c.full_pass_tokens, self.max_num_seqs,
                                       decode_left, decode_context, ready)
        self._lay(rows, ctx, pre, now_s)
        self.prefill_tail = tail
        arriving = [g for g in later if g.prefill_tokens == 0 and g.decode_tokens > 0]
        if arriving and self.size:
            starts = np.searchsorted(self.end[:self.size], [g.ready_s for g in arriving]) + 1
            extra_rows, extra_ctx = decode_rows(starts, [g.decode_tokens for g in arriving],
                                                [g.context for g in arriving], self.max_num_seqs)
            n = max(len(extra_rows), self.size)
            rows, ctx, pre = np.zeros(n), np.zeros(n), np.zeros(n)
            rows[:self.size], ctx[:self.size], pre[:self.size] = (self.rows[:self.size], self.ctx[:self.size],
                                                                  self.pre[:self.size])
            rows[:len(extra_rows)] += extra_rows
            ctx[:len(extra_ctx)] += extra_ctx
            self._lay(rows, ctx, pre, now_s)
            later = [g for g in later if g.prefill_tokens > 0]
        for seg in later:
            self.commit(seg)

    def _lay(self, rows: np.ndarray, ctx: np.ndarray, pre: np.ndarray, now_s: float) -> None:
        """Passes ``[0, len(rows))`` from now with these contents, timed from the table."""
        n = len(rows)
        self._grow(n + 1)
        self._clear(0)
        self.cumfree[0] = self.cumwork[0] = 0.0
        self._hw = n
        self.t0, self.head, self.size = now_s, 0, n
        if not n:
            return
        capped = np.minimum(rows, self.max_num_seqs)
        self.rows[:n] = capped
        self.ctx[:n] = np.divide(ctx * capped, rows, out=np.zeros(n), where=rows > 0)
        self.pre[:n] = pre
        self.end[:n] = now_s
        self._retime(0, n)
