"""The global scheduler's fast paths decide exactly what the straightforward code decided.

The decision was made cheaper (``choose_split`` reads each instance's work once, ``add``
probes once and ``queue`` (a beta part) not at all, an emptied timeline zeroes its arrays
before the next write instead of at once, ``advance`` skips the search when no pass has
ended, searches gallop from the head, ``_admit_pass`` looks near first, ``latency_s``
without a closure, ``_pair`` without key tuples). The references below are the code as it
was; each fast path must give the same floats, and a whole simulation run with every
reference swapped in must make the same decisions and the same tokens at the same times."""

from __future__ import annotations

import bisect
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simkit import ToyCostModel

from servelab.designs.dynaserve import router as router_mod
from servelab.designs.dynaserve.passes import coefficients
from servelab.designs.dynaserve.profile import ProfileTable, _locate_one
from servelab.designs.dynaserve.search import gallop_left, gallop_right
from servelab.designs.dynaserve.split import SplitChoice, choose_split, segments_for, work_after
from servelab.designs.dynaserve.timeline import Probe, Segment, Timeline

TARGET = 0.09
TABLE = ProfileTable.from_cost_model(ToyCostModel(step_s=0.02, token_s=1e-4, ctx_s=1e-7), 4096, 64)


# ---- references: the straightforward code ----
def ref_choose_split(prompt, total, alpha, beta, *, max_probes=6, tolerance=0.02):
    lo, hi = 0, total
    split = min(prompt, total)
    best = SplitChoice(split, float("nan"), float("nan"), 0)
    best_gap = float("inf")
    tried: set[int] = set()
    n = 0
    for n in range(1, max_probes + 1):
        tried.add(split)
        a, b = work_after(split, prompt, total, alpha, beta)
        gap = a - b
        if abs(gap) < best_gap:
            best_gap = abs(gap)
            best = SplitChoice(split, a, b, n)
        if abs(gap) <= tolerance * max(a, b):
            break
        if gap > 0:
            hi = split
        else:
            lo = split
        nxt = (lo + hi) // 2
        if nxt in tried:
            nxt = nxt + 1 if gap < 0 else nxt - 1
            if nxt in tried or not lo <= nxt <= hi:
                break
        split = nxt
    return SplitChoice(best.split_tokens, best.alpha_work_s, best.beta_work_s, n)


def ref_latency_s(self, prefill_tokens, mean_context, num_decodes):
    i, wi = _locate_one(self._axes[0], prefill_tokens)
    j, wj = _locate_one(self._axes[1], mean_context)
    k, wk = _locate_one(self._axes[2], num_decodes)
    item = self.latency.item

    def along_k(a, b):
        low = item(a, b, k)
        return low + wk * (item(a, b, k + 1) - low)

    c0 = along_k(i, j) + wj * (along_k(i, j + 1) - along_k(i, j))
    c1 = along_k(i + 1, j) + wj * (along_k(i + 1, j + 1) - along_k(i + 1, j))
    return c0 + wi * (c1 - c0)


def ref_refresh(self):
    """``ProfileTable._refresh`` as it was: the budget grids inverted again at the next lookup."""
    self._applied = self.correction.copy()
    self.latency = np.maximum.accumulate(self.base * self.correction, axis=0)
    self._pending = 0
    self.version += 1
    self._budget_cache.clear()
    self.cached_latency.cache_clear()


class RefTimeline(Timeline):
    """The timeline as it was: arrays zeroed at once, plain searches, one probe per call."""

    def _reset(self, now_s):
        for a in self._arrays():
            a[:] = 0.0
        self.t0 = self.now_s = now_s
        self.head = self.size = self.prefill_tail = 0

    @property
    def work_s(self):
        laid = float(self.cumwork[self.size] - self.cumwork[self.head]) if self.size > self.head else 0.0
        return laid + self.pending_work

    def add(self, seg):
        probe = self.probe(seg)
        self.pending.append(seg)
        self.pending_work = probe.work_s - self.work_s + self.pending_work
        self.pending_prefill += seg.prefill_tokens
        if len(self.pending) >= 32:
            self.flush()
        return probe.segment_end_s

    def advance(self, now_s):
        self.now_s = max(self.now_s, now_s)
        if self.size > self.head:
            self.head += int(self.end[self.head:self.size].searchsorted(self.now_s, side="right"))
        if self.head >= self.size:
            self._reset(self.now_s)
            return
        self.prefill_tail = max(self.prefill_tail, self.head)
        if self.head > len(self.rows) // 2:
            self._compact()

    def _compact(self):
        h, n = self.head, self.size - self.head
        self.t0 = self._start(h)
        for a in self._arrays()[:-2]:
            a[:n] = a[h:self.size]
            a[n:] = 0.0
        for a in (self.cumfree, self.cumwork):
            a[:n + 1] = a[h:self.size + 1] - a[h]
            a[n + 1:] = 0.0
        self.prefill_tail = max(0, self.prefill_tail - h)
        self.head, self.size = 0, n

    def _first_pass(self, ready_s):
        size = self.size
        k = self.head + 1 if size > self.head else size
        if ready_s > self.now_s and size > k:
            j = int(self.end[:size].searchsorted(ready_s, side="left")) + 1
            k = j if j > k else k
        return k if k < size else size

    @property
    def prefill_wait_s(self):
        tail = self._start(self.prefill_tail) if self.head < self.prefill_tail < self.size else self.now_s
        room = self._admit_pass(self.head + 1) if self.size > self.head + 1 else self.size
        if room > self.head + 1:
            tail = max(tail, self._start(room) if room < self.size else self.drain_s)
        return tail - self.now_s + self.pending_prefill * self.coef.full_pass_token_s

    def _admit_pass(self, k):
        if k >= self.size or self.rows.item(k) < self.max_num_seqs:
            return k
        room = np.nonzero(self.rows[k:self.size] < self.max_num_seqs)[0]
        return k + int(room[0]) if len(room) else self.size

    def probe(self, seg):
        c = self.coef
        size, end = self.size, self.end
        drain = end.item(size - 1) if size > self.head else self.now_s
        work_ahead = self.work_s
        added = 0.0
        p, d, ready = seg.prefill_tokens, seg.decode_tokens, seg.ready_s
        work = self.segment_work(p, d, seg.context)
        k = self._first_pass(ready)
        beyond = k >= size
        t = drain if beyond else self._start(k)
        if ready > t:
            t = ready
        if p > 0:
            kp = k if k > self.prefill_tail else self.prefill_tail
            queued = self.pending_prefill
            cumfree = self.cumfree
            avail = cumfree.item(size) - cumfree.item(kp) - queued if kp < size else 0.0
            if p <= avail:
                ke = int(cumfree[:size + 1].searchsorted(cumfree.item(kp) + queued + p, side="left")) - 1
                added += p * c.prefill_token_s
                t = end.item(ke) + added + queued * c.prefill_token_s
                k = ke + 1
            else:
                avail = avail if avail > 0 else 0.0
                added += avail * c.prefill_token_s
                t = max(drain + added, ready) + (p - avail) * c.full_pass_token_s
                beyond = True
        ctx0 = seg.context
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

    def _append(self, n):
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

    def _lay(self, rows, ctx, pre, now_s):
        n = len(rows)
        self._grow(n + 1)
        for a in self._arrays():
            a[:] = 0.0
        self.t0, self.head, self.size = now_s, 0, n
        if not n:
            return
        capped = np.minimum(rows, self.max_num_seqs)
        self.rows[:n] = capped
        self.ctx[:n] = np.divide(ctx * capped, rows, out=np.zeros(n), where=rows > 0)
        self.pre[:n] = pre
        self.end[:n] = now_s
        self._retime(0, n)


def ref_pair(self, insts, now_s):
    if self.config.pairing == "fixed":
        half = (len(insts) + 1) // 2
        return self._least_loaded(insts[:half], now_s), self._least_loaded(insts[half:], now_s)
    keys = []
    for inst in insts:
        t = self._timeline(inst)
        t.advance(now_s)
        work = t.work_s
        keys.append((round(t.prefill_wait_s, 3), work, inst))
    alpha = min(keys, key=lambda k: k[:2])[2]
    beta = min((k for k in keys if k[2] is not alpha), key=lambda k: k[1])[2]
    return alpha, beta


def ref_place(self, request, prompt, total, split, alpha, beta, _ta, _tb, now_s, link):
    ta, tb = self.timelines[alpha], self.timelines[beta]
    if not (ta.table.ready and tb.table.ready):
        return self._placement(request, split, total, alpha, beta)
    latency, per_token = link
    chunk, every = self.config.stream_kv_tokens, self.config.stream_decode_splits

    def transfer(s):
        streamed = chunk and (every or s <= prompt)
        return latency + per_token * (min(s, chunk) if streamed else s)

    a_seg, _ = segments_for(split, prompt, total, now_s, now_s)
    alpha_end = ta.add(a_seg) if a_seg is not None else now_s
    _, b_seg = segments_for(split, prompt, total, now_s, alpha_end + transfer(split))
    if b_seg is not None:
        tb.add(b_seg)
    if 0 < split < total:
        self._splits[request.request_id] = router_mod._Split(request, total, split, alpha, beta, alpha_end)
    return self._placement(request, split, total, alpha, beta)


# ---- state comparison ----
def _same(x, y):
    return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))


def _assert_same_state(fast: Timeline, ref: Timeline):
    for name in ("head", "size", "t0", "now_s", "prefill_tail", "pending_work", "pending_prefill"):
        assert getattr(fast, name) == getattr(ref, name), name
    assert fast.pending == ref.pending
    n = fast.size
    for name in ("rows", "ctx", "pre", "gap", "dur", "free", "end", "work"):
        assert np.array_equal(getattr(fast, name)[:n], getattr(ref, name)[:n]), name
    for name in ("cumfree", "cumwork"):
        assert np.array_equal(getattr(fast, name)[:n + 1], getattr(ref, name)[:n + 1]), name
    assert fast.work_s == ref.work_s and fast.drain_s == ref.drain_s
    assert fast.prefill_wait_s == ref.prefill_wait_s


segments = st.builds(lambda dt, p, d, c: (dt, p, d, c), st.sampled_from([0.0, 0.0, 0.05, 0.4, 3.0]),
                     st.sampled_from([0, 0, 16, 300, 2000, 9000]), st.sampled_from([0, 1, 20, 300, 1500]),
                     st.integers(0, 6000))
ops = st.lists(st.one_of(
    st.tuples(st.just("add"), segments), st.tuples(st.just("queue"), segments), st.tuples(st.just("commit"), segments),
    st.tuples(st.just("probe"), segments), st.tuples(st.just("flush"), st.none()),
    st.tuples(st.just("advance"), st.sampled_from([0.0, 0.01, 0.1, 0.5, 2.0, 30.0])),
    st.tuples(st.just("rebuild"), st.integers(0, 80))), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops, st.integers(0, 2**31 - 1), st.sampled_from([4, 16, 64]))
def test_timeline_fast_paths_match_the_straightforward_timeline(program, seed, max_num_seqs):
    rng = np.random.default_rng(seed)
    fast = Timeline(TABLE, target_s=TARGET, max_num_seqs=max_num_seqs, capacity=8)
    ref = RefTimeline(TABLE, target_s=TARGET, max_num_seqs=max_num_seqs, capacity=8)
    for op, arg in program:
        now = fast.now_s
        if op == "queue":  # add without the predicted end: the same state
            fast.queue(Segment(now + arg[0], *arg[1:]))
            ref.add(Segment(now + arg[0], *arg[1:]))
        elif op in ("add", "commit", "probe"):
            dt, p, d, c = arg
            seg = Segment(now + dt, p, d, c)
            got, want = getattr(fast, op)(seg), getattr(ref, op)(seg)
            if op == "add":  # the segment's predicted end
                assert _same(got, want)
            else:  # a Probe
                assert all(_same(a, b) for a, b in zip(got, want))
        elif op == "flush":
            fast.flush()
            ref.flush()
        elif op == "advance":
            fast.advance(now + arg)
            ref.advance(now + arg)
        else:
            left, ctx = rng.integers(1, 400, arg), rng.integers(0, 4000, arg).astype(np.float64)
            segs = [Segment(now + float(rng.choice([0.0, 0.2])), int(rng.choice([0, 500])), int(rng.integers(0, 200)),
                            int(rng.integers(0, 2000))) for _ in range(int(rng.integers(0, 4)))]
            fast.rebuild(now, left, ctx, segs)
            ref.rebuild(now, left, ctx, segs)
        _assert_same_state(fast, ref)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 12), max_size=70), st.integers(0, 80), st.integers(0, 80),
       st.sampled_from([-1.0, 0.0, 0.5, 3.0, 3.5, 12.0, 13.0]))
def test_gallop_is_bisect_on_sorted_arrays(values, lo, hi, x):
    a = np.array(sorted(values), np.float64)
    lo = min(lo, len(a))
    hi = min(max(hi, lo), len(a))
    assert gallop_left(a, x, lo, hi) == bisect.bisect_left(a, x, lo, hi)
    assert gallop_right(a, x, lo, hi) == bisect.bisect_right(a, x, lo, hi)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 60), st.integers(0, 60), st.integers(1, 12000), st.integers(0, 3000),
       st.sampled_from([0.0, 0.02, 0.3]), st.integers(1, 64))
def test_choose_split_matches_work_after(n_alpha, n_beta, prompt, output, tolerance, max_probes):
    rng = np.random.default_rng(n_alpha * 1000 + n_beta)
    alpha = Timeline(TABLE, target_s=TARGET, max_num_seqs=64)
    beta = Timeline(TABLE, target_s=TARGET, max_num_seqs=64)
    for t, n in ((alpha, n_alpha), (beta, n_beta)):
        t.rebuild(0.0, rng.integers(1, 1500, n), rng.integers(0, 3000, n).astype(np.float64), [])
        t.add(Segment(0.0, int(rng.integers(0, 3000)), 0, 0))  # pending work too
    total = prompt + output
    got = choose_split(prompt, total, alpha, beta, max_probes=max_probes, tolerance=tolerance)
    want = ref_choose_split(prompt, total, alpha, beta, max_probes=max_probes, tolerance=tolerance)
    assert got.split_tokens == want.split_tokens and got.num_probes == want.num_probes
    assert _same(got.alpha_work_s, want.alpha_work_s) and _same(got.beta_work_s, want.beta_work_s)


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 20000), st.floats(0, 40000), st.floats(0, 400))
def test_latency_s_matches_the_closure_version(p, c, n):
    assert TABLE.latency_s(p, c, n) == ref_latency_s(TABLE, p, c, n)


def test_coefficients_unchanged_by_the_fast_latency():
    fast = coefficients(TABLE, TARGET)
    orig = ProfileTable.latency_s
    try:
        ProfileTable.latency_s = ref_latency_s
        assert coefficients(TABLE, TARGET) == fast
    finally:
        ProfileTable.latency_s = orig


def _run_small(specs, router_params=None):
    from servelab.cluster.config import ClusterConfig, InstanceGroup
    from servelab.metrics.request_metrics import RequestTable
    from servelab.simulator import Simulation

    cfg = ClusterConfig(groups=(InstanceGroup(count=2, policy="dynaserve", gpu="A100-80GB", model="Qwen-2.5-14B"),),
                        router="dynaserve", router_params=router_params or {})
    sim = Simulation(specs, cfg)
    res = sim.run()
    table = RequestTable.from_requests(res.requests)
    return sim.router.decisions, table.token_times_s, table.finish_s


@pytest.mark.parametrize("pairing", ["load", "fixed"])  # fixed: the paper's deployment (issue 26's fast path)
def test_a_simulation_with_the_straightforward_code_decides_the_same(monkeypatch, pairing):
    from servelab.core.request import RequestSpec

    rng = np.random.default_rng(3)
    n = 160
    prompts, outputs = rng.choice([100, 300, 2000, 6000], n), rng.choice([5, 30, 300, 1200], n)
    times = np.cumsum(rng.exponential(0.2, n))
    specs = [RequestSpec(i, float(times[i]), int(prompts[i]), int(outputs[i]),
                         predicted_output_tokens=int(outputs[i]) + int(rng.integers(-20, 20))) for i in range(n)]
    fast = _run_small(specs, {"pairing": pairing})
    monkeypatch.setattr(router_mod, "Timeline", RefTimeline)
    monkeypatch.setattr(router_mod, "choose_split", ref_choose_split)
    monkeypatch.setattr(router_mod.DynaServeRouter, "_pair", ref_pair)
    monkeypatch.setattr(router_mod.DynaServeRouter, "_place", ref_place)
    monkeypatch.setattr(ProfileTable, "latency_s", ref_latency_s)
    monkeypatch.setattr(ProfileTable, "_refresh", ref_refresh)
    ref = _run_small(specs, {"pairing": pairing})
    assert fast[0] == ref[0]
    splits = np.array(fast[0])[:, 3]
    assert len(set(splits.tolist())) > 10  # a run that really splits
    assert np.array_equal(fast[1], ref[1]) and np.array_equal(fast[2], ref[2])


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
