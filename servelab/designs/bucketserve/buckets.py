"""Request Bucketing Manager (BucketServe, Algorithm 1): length buckets that split and merge.

Queued requests are grouped by sequence length into buckets that partition ``[0, max_len]``
(half-open ``[low, up)``, the last one closed at ``max_len``). ``adjust`` runs
ADJUSTBUCKETS: when fewer than ``n_max`` requests are queued every bucket merges back into
one; otherwise every bucket whose share of requests below its midpoint exceeds ``theta`` and
that holds more than ``m`` requests is split once at the midpoint: one pass over the buckets
per adjustment, as Algorithm 1 gives it (``repeat=True``, a named variant, repeats the pass
until no bucket qualifies). The paper scans buckets linearly to place a request (O(k)); here the lower bounds
are a sorted list and placement is a bisection, O(log k).

Invariants (property-tested): every queued key is in exactly one bucket and that bucket's
interval holds its length; the buckets tile ``[0, max_len]`` without gaps or overlaps; after
``adjust`` every bucket that qualified before it is split once (with ``repeat``, no bucket
qualifies any more).

Pure bookkeeping: no clock, no I/O. Within a bucket entries are kept sorted by length (for
SJF/LJF and the midpoint count, both by bisection) and sorted by arrival (FCFS); one arrival
heap over all entries, with lazy deletion, finds the longest-waiting bucket, and an array of
bucket sizes lets the split pass look only at buckets holding more than m requests.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass
from typing import Iterator, Literal, Sequence

import numpy as np

Order = Literal["fcfs", "sjf", "ljf"]


@dataclass(frozen=True, slots=True)
class BucketingConfig:
    """max_len: L_max, the longest sequence the model takes (its context window).
    theta: split when more than this share of a bucket lies below its midpoint (paper: 0.5).
    min_split_size: m; a bucket must hold more than m requests to split. ``None`` means
        m = N_max, the paper's choice (Algorithm 1: "Minimum split size m = N_max").
    min_width: a bucket narrower than ``2 * min_width`` tokens is never split, so splitting
        always terminates (not in the paper, which splits real intervals).
    split_high: also split when more than ``theta`` lies at or above the midpoint. The paper
        splits only on a short-heavy bucket; this symmetric variant is off by default.
    repeat: repeat the split pass until no bucket qualifies (the behaviour before issue 32);
        the paper's Algorithm 1 makes one pass per adjustment (False).
    """

    max_len: int = 4096
    theta: float = 0.5
    min_split_size: int | None = None
    min_width: int = 1
    split_high: bool = False
    repeat: bool = False

    def __post_init__(self) -> None:
        if self.max_len < 1:
            raise ValueError(f"BucketingConfig.max_len must be >= 1, got {self.max_len}")
        if not 0 <= self.theta < 1:
            raise ValueError(f"BucketingConfig.theta must be in [0, 1), got {self.theta}")
        if self.min_split_size is not None and self.min_split_size < 0:
            raise ValueError(f"BucketingConfig.min_split_size must be >= 0 or None, got {self.min_split_size}")
        if self.min_width < 1:
            raise ValueError(f"BucketingConfig.min_width must be >= 1, got {self.min_width}")


@dataclass(frozen=True, slots=True)
class BucketEntry:
    key: int  # request id
    length: int  # sequence length S used for bucketing
    arrival_s: float
    seq: int  # insertion counter: tie-breaker so orders are total and deterministic


@dataclass(frozen=True, slots=True)
class BucketView:
    """Read-only summary of one bucket."""

    low: int
    up: int  # exclusive, except the last bucket which also holds ``max_len``
    num_requests: int
    oldest_arrival_s: float | None


@dataclass(frozen=True, slots=True)
class AdjustResult:
    num_splits: int
    merged: bool
    num_buckets: int


class _Bucket:
    __slots__ = ("low", "up", "by_len", "by_arrival", "live")

    def __init__(self, low: int, up: int, entries: list[BucketEntry]) -> None:
        self.low = low
        self.up = up
        self.live: dict[int, BucketEntry] = {e.key: e for e in entries}
        self.by_len: list[tuple[int, int, int]] = sorted((e.length, e.seq, e.key) for e in entries)
        self.by_arrival: list[tuple[float, int, int]] = sorted((e.arrival_s, e.seq, e.key) for e in entries)

    def __len__(self) -> int:
        return len(self.live)

    def entries(self) -> list[BucketEntry]:
        return [self.live[key] for _, _, key in self.by_len]

    def oldest(self) -> BucketEntry | None:
        return self.live[self.by_arrival[0][2]] if self.by_arrival else None


class BucketManager:
    """Buckets of queued requests for one task class; see the module docstring."""

    def __init__(self, config: BucketingConfig) -> None:
        self.config = config
        self._buckets: list[_Bucket] = [_Bucket(0, config.max_len, [])]
        self._lows: list[int] = [0]  # sorted lower bounds, parallel to _buckets
        self._where: dict[int, tuple[int, int]] = {}  # key -> (length, seq); bucket found by bisection
        self._arrivals: list[tuple[float, int, int]] = []  # global arrival heap, lazy deletion
        self._seq = 0
        # bucket sizes as an array, so the split pass filters on "more than m" in one vector op
        self._sizes = np.zeros(1, dtype=np.int64)

    # ---- queries ----
    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: int) -> bool:
        return key in self._where

    @property
    def num_buckets(self) -> int:
        return len(self._buckets)

    def bucket_index(self, length: int) -> int:
        """Index of the bucket whose interval holds ``length``: a bisection, O(log k)."""
        if not 0 <= length <= self.config.max_len:
            raise ValueError(f"sequence length {length} is outside [0, {self.config.max_len}]")
        return bisect.bisect_right(self._lows, length) - 1

    def views(self) -> list[BucketView]:
        out = []
        for b in self._buckets:
            oldest = b.oldest()
            out.append(BucketView(b.low, b.up, len(b), oldest.arrival_s if oldest else None))
        return out

    def edges(self) -> list[int]:
        """Bucket boundaries ``[0, ..., max_len]`` (k + 1 numbers for k buckets)."""
        return self._lows + [self.config.max_len]

    def entries(self, index: int) -> list[BucketEntry]:
        return self._buckets[index].entries()

    def longest(self) -> int:
        """The longest queued sequence length (0 when empty): the last non-empty bucket's top."""
        for b in reversed(self._buckets):
            if b.by_len:
                return b.by_len[-1][0]
        return 0

    def __iter__(self) -> Iterator[BucketEntry]:
        for b in self._buckets:
            yield from b.entries()

    # ---- membership ----
    def add(self, key: int, length: int, arrival_s: float) -> None:
        if key in self._where:
            raise ValueError(f"request {key} is already bucketed")
        index = self.bucket_index(length)
        bucket = self._buckets[index]
        entry = BucketEntry(key, length, arrival_s, self._seq)
        self._seq += 1
        self._where[key] = (length, entry.seq)
        bucket.live[key] = entry
        bisect.insort(bucket.by_len, (length, entry.seq, key))
        bisect.insort(bucket.by_arrival, (arrival_s, entry.seq, key))
        self._sizes[index] += 1
        heapq.heappush(self._arrivals, (arrival_s, entry.seq, key))

    def remove(self, key: int) -> BucketEntry:
        where = self._where.pop(key, None)
        if where is None:
            raise KeyError(f"request {key} is not bucketed")
        length = where[0]
        index = self.bucket_index(length)
        bucket = self._buckets[index]
        entry = bucket.live.pop(key)
        del bucket.by_len[bisect.bisect_left(bucket.by_len, (length, entry.seq, key))]
        del bucket.by_arrival[bisect.bisect_left(bucket.by_arrival, (entry.arrival_s, entry.seq, key))]
        self._sizes[index] -= 1
        if len(self._arrivals) > 64 and len(self._arrivals) > 4 * len(self._where):
            self._arrivals = [item for item in self._arrivals if self._where.get(item[2], (0, -1))[1] == item[1]]
            heapq.heapify(self._arrivals)  # bound the stale items so memory tracks the queue
        return entry  # its heap item goes stale and are dropped lazily

    def remove_many(self, keys: Sequence[int]) -> list[BucketEntry]:
        """``remove`` for a batch leaving together (the decision's hot path): one size update per
        bucket, and a bucket's FCFS head, the usual batch, cut from its arrival order in one slice."""
        where = self._where
        if len(set(keys)) != len(keys) or any(k not in where for k in keys):
            raise KeyError(f"requests {[k for k in keys if k not in where] or list(keys)} are not all bucketed "
                           f"(or repeat)")
        by_index: dict[int, list[int]] = {}
        for key in keys:
            by_index.setdefault(self.bucket_index(where[key][0]), []).append(key)
        out: dict[int, BucketEntry] = {}
        for index, ks in by_index.items():
            bucket = self._buckets[index]
            entries = [bucket.live.pop(k) for k in ks]
            for k in ks:
                del where[k]
            by_len, by_arrival = bucket.by_len, bucket.by_arrival
            for e in entries:
                del by_len[bisect.bisect_left(by_len, (e.length, e.seq, e.key))]
            gone = sorted((e.arrival_s, e.seq, e.key) for e in entries)
            n = len(gone)
            if by_arrival[:n] == gone:
                del by_arrival[:n]
            else:
                for item in gone:
                    del by_arrival[bisect.bisect_left(by_arrival, item)]
            self._sizes[index] -= n
            out.update((e.key, e) for e in entries)
        if len(self._arrivals) > 64 and len(self._arrivals) > 4 * len(where):
            self._arrivals = [item for item in self._arrivals if where.get(item[2], (0, -1))[1] == item[1]]
            heapq.heapify(self._arrivals)
        return [out[k] for k in keys]  # in the order asked, as one ``remove`` after another

    # ---- selection ----
    def oldest_bucket(self) -> int | None:
        """The non-empty bucket whose oldest request has waited longest (online priority).

        That bucket holds the globally oldest request, so one heap over all entries finds it
        in O(log n) amortised instead of a scan over the buckets.
        """
        heap = self._arrivals
        while heap:
            _, seq, key = heap[0]
            where = self._where.get(key)
            if where is not None and where[1] == seq:
                return self.bucket_index(where[0])
            heapq.heappop(heap)
        return None

    def fullest_bucket(self) -> int | None:
        """The bucket with the most requests (ties: the lower one); offline batches fill best there."""
        sizes = [len(b) for b in self._buckets]
        top = max(sizes)
        return sizes.index(top) if top else None

    def candidates(self, index: int, order: Order, limit: int) -> list[BucketEntry]:
        """Up to ``limit`` entries of bucket ``index`` in ``order``, without removing them."""
        bucket = self._buckets[index]
        if limit <= 0 or not bucket.live:
            return []
        if order == "sjf":
            return [bucket.live[k] for _, _, k in bucket.by_len[:limit]]
        if order == "ljf":
            return [bucket.live[k] for _, _, k in reversed(bucket.by_len[-limit:])]
        if order == "fcfs":
            return [bucket.live[k] for _, _, k in bucket.by_arrival[:limit]]
        raise ValueError(f"unknown order {order!r}; expected fcfs, sjf or ljf")

    # ---- ADJUSTBUCKETS ----
    def split_threshold(self, n_max: int) -> int:
        m = self.config.min_split_size
        return n_max if m is None else m

    def qualifies_for_split(self, index: int, n_max: int) -> bool:
        b = self._buckets[index]
        n = len(b)
        if n <= self.split_threshold(n_max) or n == 0 or b.up - b.low < 2 * self.config.min_width:
            return False
        mid = (b.low + b.up) // 2
        below = bisect.bisect_left(b.by_len, (mid, -1, -1))
        theta = self.config.theta
        return below / n > theta or (self.config.split_high and (n - below) / n > theta)

    def adjust(self, n_max: int) -> AdjustResult:
        """ADJUSTBUCKETS with the largest safe batch ``n_max``: one split pass over the buckets
        (Algorithm 1), or passes until no bucket qualifies with ``config.repeat``."""
        if n_max < 0:
            raise ValueError(f"n_max must be >= 0, got {n_max}")
        if len(self._where) < n_max:
            merged = len(self._buckets) > 1
            if merged:
                self._merge_all()
            return AdjustResult(0, merged, 1)
        num_splits = 0
        pending = np.flatnonzero(self._sizes > self.split_threshold(n_max)).tolist()
        while pending:
            # split from the highest index down so lower indices stay valid
            split = sorted((i for i in pending if self.qualifies_for_split(i, n_max)), reverse=True)
            pending = []
            for i in split:
                self._split(i)
                num_splits += 1
                pending = [j + 1 if j > i else j for j in pending] + [i, i + 1]
            if not self.config.repeat:
                break
        return AdjustResult(num_splits, False, len(self._buckets))

    def _split(self, index: int) -> None:
        b = self._buckets[index]
        mid = (b.low + b.up) // 2
        cut = bisect.bisect_left(b.by_len, (mid, -1, -1))
        left = [b.live[k] for _, _, k in b.by_len[:cut]]
        right = [b.live[k] for _, _, k in b.by_len[cut:]]
        self._buckets[index:index + 1] = [_Bucket(b.low, mid, left), _Bucket(mid, b.up, right)]
        self._lows.insert(index + 1, mid)
        self._sizes = np.concatenate((self._sizes[:index], [len(left), len(right)], self._sizes[index + 1:]))

    def repartition(self, edges: list[int]) -> None:
        """Rebuild the buckets on given edges ``[0, ..., max_len]`` (benchmarks, tests, warm starts)."""
        if edges[0] != 0 or edges[-1] != self.config.max_len or any(a >= b for a, b in zip(edges, edges[1:])):
            raise ValueError(f"edges must rise strictly from 0 to {self.config.max_len}, got {edges[:5]}...")
        entries = sorted((e for b in self._buckets for e in b.live.values()), key=lambda e: (e.length, e.seq))
        lows = list(edges[:-1])
        groups: list[list[BucketEntry]] = [[] for _ in lows]
        for e in entries:
            groups[bisect.bisect_right(lows, e.length) - 1].append(e)
        self._buckets = [_Bucket(lo, up, g) for lo, up, g in zip(lows, edges[1:], groups)]
        self._lows = lows
        self._sizes = np.array([len(g) for g in groups], dtype=np.int64)

    def _merge_all(self) -> None:
        entries = [e for b in self._buckets for e in b.live.values()]
        self._buckets = [_Bucket(0, self.config.max_len, entries)]
        self._lows = [0]
        self._sizes = np.array([len(entries)], dtype=np.int64)

    def check_invariants(self) -> None:
        """Raise AssertionError if the buckets do not tile [0, max_len] or an entry is misplaced."""
        assert self._lows == [b.low for b in self._buckets], "lower bounds out of sync"
        assert self._buckets[0].low == 0 and self._buckets[-1].up == self.config.max_len, "buckets do not span"
        for a, b in zip(self._buckets, self._buckets[1:]):
            assert a.up == b.low and a.low < a.up, f"gap or overlap at {a.up}/{b.low}"
        seen = 0
        for i, b in enumerate(self._buckets):
            last = i == len(self._buckets) - 1
            assert len(b.by_len) == len(b.live) == len(b.by_arrival) == self._sizes[i], f"bucket {i}: index out of sync"
            for length, seq, key in b.by_len:
                entry = b.live[key]
                assert entry.seq == seq and entry.length == length, f"request {key}: stale index entry"
                assert b.low <= length < b.up or (last and length == b.up), f"request {key} misplaced"
                assert self._where[key] == (length, seq), f"request {key}: lookup table disagrees"
            seen += len(b)
        assert seen == len(self._where), "a request is in no bucket or in two"
