"""The decode group: an instance's steady decoders advanced together in O(1) Python per step.

In continuous batching most steps decode every running request by one token. Touching each
request on each step costs about a microsecond of Python per token, which is what bounds a
simulator. The group holds the running requests that are in steady decode (one pending
token, status DECODING) as an overlay on the runtime: a group step advances a shared epoch
counter instead of each member, so

    member's computed tokens  = computed0 + (epoch - epoch0)
    member's generated tokens = generated0 + (epoch - epoch0)
    member's token times      = its times before joining + times[epoch0:epoch]

and the step's shape comes from running aggregates: the decode-context sum is
``sum(computed0 - epoch0) + n * (epoch + 1)``, the longest context the largest key plus the
epoch, and the members that need a new KV block this step are exactly those whose key
``(computed0 - epoch0) mod block_size`` equals ``-epoch mod block_size`` (about n/16 of them).
Members leave at a known epoch (output length or hand-off point), kept in a heap.

A step plan names the group's rows by reference (``rows()``: the group at one membership
version, one object per version), never by copying its members' ids or requests: with tens
of instances each member's objects are cold in the caches, and touching about 100 of them
per step (a tuple of ids, a list of requests, the set that checked them) was what made a
token cost more on many instances (docs/benchmarks/scale_diagnosis.md). ``ids`` and
``requests`` are built only for the readers that want them (a trace, a move, the engine).

Members' attributes on their ``Request`` objects are stale between syncs; ``sync_all`` (the
runtime calls it whenever anyone reads its running requests) and ``leave`` bring them up to
date, and also the block manager's count of reserved slots. Only executors that read no
per-request state use it (the simulator's cost model); the engine steps every request.

Invariant (checked by the runtime's ``check_invariants`` after a sync): every member is a
running request in steady decode, and the aggregates equal their recomputation.
"""

from __future__ import annotations

import heapq

from servelab.core.kv_blocks import BlockManager
from servelab.core.request import Request


class GroupRows:
    """A decode group's members at one membership version, as rows of a step plan: every
    member decodes one token, in join order. A reference, not a copy; ``ids`` / ``requests``
    are read off the group and refuse once its membership has changed since."""

    __slots__ = ("group", "version", "n")

    def __init__(self, group: "DecodeGroup", version: int, n: int) -> None:
        self.group, self.version, self.n = group, version, n

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"GroupRows(n={self.n}, version={self.version})"

    @property
    def is_current(self) -> bool:
        return self.group.version == self.version

    def _check(self) -> "DecodeGroup":
        if self.group.version != self.version:
            raise RuntimeError(f"decode group rows of version {self.version} read after the group changed "
                               f"(version {self.group.version}): take them while the step is in flight")
        return self.group

    @property
    def ids(self) -> tuple[int, ...]:
        return self._check().ids

    @property
    def requests(self) -> list[Request]:
        return self._check().requests


class DecodeGroup:
    __slots__ = ("blocks", "bs", "members", "_base", "epoch", "times", "_by_res", "_key_sum", "_max_heap",
                 "_exit_heap", "_seq", "_ids", "_list", "in_flight", "_reserved_epoch", "_dirty",
                 "version", "_rows")

    def __init__(self, blocks: BlockManager) -> None:
        self.blocks = blocks
        self.bs = blocks.block_size
        self.members: dict[int, Request] = {}  # in join order: the order of the group's plan rows
        self._base: dict[int, tuple[int, int, int, int]] = {}  # rid -> (epoch0, computed0, generated0, seq)
        self.epoch = 0
        self.times: list[float] = []  # times[k]: end of group step k
        # rid -> its live GPU block table, by key class (computed0 - epoch0) mod block size
        self._by_res: list[dict[int, list[int]]] = [{} for _ in range(self.bs)]
        self._key_sum = 0
        self._max_heap: list[tuple[int, int, int]] = []  # (-key, seq, rid), lazily cleaned
        self._exit_heap: list[tuple[int, int, int]] = []  # (exit epoch, seq, rid), lazily cleaned
        self._seq = 0
        self._ids: tuple[int, ...] | None = ()
        self._list: list[Request] | None = []
        self.in_flight = False  # a group step was applied and not yet completed
        self._reserved_epoch = -1  # the epoch whose step's KV slots are reserved
        self._dirty = False  # members' Request attributes lag the epoch
        self.version = 0  # bumped whenever a member joins or leaves
        self._rows: GroupRows | None = None  # the plan rows of the current version

    def rows(self) -> GroupRows:
        """The members as a plan's rows, by reference (O(1); one object per membership version)."""
        rows = self._rows
        if rows is None or rows.version != self.version:
            rows = self._rows = GroupRows(self, self.version, len(self.members))
        return rows

    # ---- reading ----
    @property
    def n(self) -> int:
        return len(self.members)

    @property
    def ids(self) -> tuple[int, ...]:
        if self._ids is None:
            self._ids = tuple(self.members)
        return self._ids

    @property
    def requests(self) -> list[Request]:
        if self._list is None:
            self._list = list(self.members.values())
        return self._list

    def blocks_needed_next(self) -> int:
        """KV blocks the next group step takes (members whose next token starts a block)."""
        if self._reserved_epoch == self.epoch:
            return 0
        return len(self._by_res[(-self.epoch) % self.bs])

    def context_sum_next(self) -> int:
        return self._key_sum + self.n * (self.epoch + 1)

    def context_max_next(self) -> int:
        heap = self._max_heap
        while heap and self._stale(heap[0][2], heap[0][1]):
            heapq.heappop(heap)
        return -heap[0][0] + self.epoch + 1 if heap else 0

    def steps_until_exit(self) -> int:
        """Group steps until the first member leaves (that step included)."""
        heap = self._exit_heap
        while heap and self._stale(heap[0][2], heap[0][1]):
            heapq.heappop(heap)
        return heap[0][0] - self.epoch if heap else 1 << 30

    def _stale(self, rid: int, seq: int) -> bool:
        base = self._base.get(rid)
        return base is None or base[3] != seq

    # ---- membership ----
    def join(self, req: Request) -> None:
        rid = req.request_id
        self._seq += 1
        seq = self._seq
        computed = req.num_computed_tokens
        key = computed - self.epoch
        self._base[rid] = (self.epoch, computed, req.num_generated_tokens, seq)
        self.members[rid] = req
        self._by_res[key % self.bs][rid] = self.blocks.gpu_table(rid)
        self._key_sum += key
        heapq.heappush(self._max_heap, (-key, seq, rid))
        left = req.max_output_tokens - req.num_generated_tokens
        if req.handoff_at_tokens is not None:
            left = min(left, req.handoff_at_tokens - computed)
        heapq.heappush(self._exit_heap, (self.epoch + left, seq, rid))
        self._ids = self._list = None
        self.version += 1

    def leave(self, rid: int) -> Request:
        """Take a member out (synced first); its Request attributes are current afterwards."""
        req = self.members.pop(rid)
        self._sync_one(rid, req)
        epoch0, computed0, _, _ = self._base.pop(rid)
        key = computed0 - epoch0
        del self._by_res[key % self.bs][rid]
        self._key_sum -= key
        self._ids = self._list = None
        self.version += 1
        return req

    def dissolve(self) -> None:
        for rid in list(self.members):
            self.leave(rid)

    def sync_all(self) -> None:
        if self._dirty:
            for rid, req in self.members.items():
                self._sync_one(rid, req)
            self._dirty = False

    def _sync_one(self, rid: int, req: Request) -> None:
        epoch0, computed0, generated0, seq = self._base[rid]
        k = self.epoch - epoch0
        if k:
            req.num_computed_tokens = computed0 + k
            req.num_generated_tokens = generated0 + k
            req.token_times_s.extend(self.times[epoch0:self.epoch])
            self._base[rid] = (self.epoch, computed0 + k, generated0 + k, seq)
        reserved = req.num_computed_tokens + (1 if self._reserved_epoch == self.epoch else 0)
        self.blocks.set_reserved_tokens(rid, reserved)

    # ---- steps ----
    def reserve_step(self) -> None:
        """KV slots of every member for the group step at the current epoch (once)."""
        if self._reserved_epoch == self.epoch:
            return
        self.blocks.extend_tables(self._by_res[(-self.epoch) % self.bs], 1)
        self._reserved_epoch = self.epoch
        self._dirty = True  # the block manager's slot counts of members lag until a sync

    def _reserve_range(self, first: int, end: int) -> None:
        """KV slots for the group steps at epochs [first, end): a member of key class r needs a
        block at every epoch e with (r + e) % block_size == 0, so whole classes are counted."""
        if self._reserved_epoch == first:
            first += 1
        if end <= first:
            return
        bs = self.bs
        extend = self.blocks.extend_tables
        for r, members in enumerate(self._by_res):
            if not members:
                continue
            e0 = first + (-(r + first)) % bs  # the first epoch >= first at which class r needs a block
            if e0 < end:
                extend(members, (end - 1 - e0) // bs + 1)
        self._reserved_epoch = end - 1

    def advance(self, num_steps: int, end_times: list[float]) -> list[Request]:
        """``num_steps`` group steps ended at ``end_times``; returns the members whose output
        length or hand-off point they reached (taken out of the group, synced)."""
        self._reserve_range(self.epoch, self.epoch + num_steps)
        self.epoch += num_steps
        self.times.extend(end_times)
        self._dirty = True
        self.in_flight = False
        out = []
        heap = self._exit_heap
        while heap and heap[0][0] <= self.epoch:
            _, seq, rid = heapq.heappop(heap)
            if not self._stale(rid, seq):
                out.append(self.leave(rid))
        return out
