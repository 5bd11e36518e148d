"""AlignedServe's host KV pool and candidate buffers: the state behind the router's decisions.

``PoolBuffers`` is the base of ``router.AlignedServeRouter`` (whose docstring describes the
design). It keeps the quad-tree of requests parked in the cluster's host KV pool, and for each
decode instance a ``Slot``: its running batch's id and its two buffers in a prefill
instance's HBM. It pools requests (``_pool_in``), cuts candidate batches by Density First
Search or FCFS (``_cut_batch``), schedules starved requests (``_starved``) and queues requests
in a buffer, prefetching their KV over NVLink when it can (``_to_buffer``). The router adds the
event hooks and Algorithm 2, which releases requests from the buffers to the decode instance.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from servelab.cluster.links import LinkKind
from servelab.core.policy import ClusterState, Move
from servelab.core.request import Request
from servelab.designs.alignedserve.config import AlignedServeConfig
from servelab.designs.alignedserve.quadtree import Batch, QuadTree
from servelab.designs.alignedserve.stats import AlignedStats



@dataclass
class Slot:
    """One decode instance's running batch and its two buffers (on ``buffer_iid``)."""

    iid: int
    buffer_iid: int
    batch_id: int = -1  # the newest batch that has joined the running batch
    candidate: deque = field(default_factory=deque)  # Candidate Batch Buffer (Requests)
    candidate_id: int = -1
    requests: deque = field(default_factory=deque)  # Candidate Requests Buffer
    ready: set = field(default_factory=set)  # request ids whose KV is where it can be released from
    incoming: dict = field(default_factory=dict)  # request id -> time the release was decided
    evicting: set = field(default_factory=set)
    dynamic_left: int = 0  # pool requests the running batch may still pull in (bounds a switch's delay)
    credit: int = 0  # completions since the last join (the paper's trigger; ``one-for-one``: a count)
    small: bool = True  # the running batch was under min_batch when this event began
    wait_since: float | None = None  # the instance has waited for joining KV since then


class PoolBuffers:
    """The pool's quad-tree, the slots' buffers and the bookkeeping of who holds which request;
    ``AlignedServeRouter`` is the only subclass."""

    def __init__(self, config: AlignedServeConfig = AlignedServeConfig()) -> None:
        self.config = config
        self.tree = QuadTree(config.max_len, config.leaf_width)
        self.stats = AlignedStats()
        self._slots: dict[int, Slot] = {}
        self._pooled: dict[int, Request] = {}  # in the pool and in the tree
        self._since: dict[int, float] = {}  # request id -> time it entered the pool
        self._waiting_since: dict[int, float] = {}  # not yet on a decode GPU: since prefill / eviction
        self._evicted: set[int] = set()  # evicted and not back on a decode GPU yet
        self._tag: dict[int, int] = {}  # request id -> batch id
        self._owner: dict[int, int] = {}  # request id -> decode instance whose buffers hold it
        self._next_batch_id = 0
        self._arrivals_done = False
        self._room: dict[int, int] = {}  # buffer instance -> blocks this event may still prefetch into

    # ---- the pool and batches ----
    def _begin(self, cluster: ClusterState) -> None:
        """Start handling an event: the buffers' free blocks are re-read (moves returned by the
        last event have reserved theirs by now)."""
        self._room = {}
        if self._slots:
            return
        prefill = [i.instance_id for i in cluster.instances_with_role("prefill")]
        topo = getattr(cluster, "topology", None)
        for k, inst in enumerate(cluster.instances_with_role("decode")):
            near = [p for p in prefill if topo is None or topo.server_of[p] == topo.server_of[inst.instance_id]]
            pick = near or prefill
            buf = pick[k % len(pick)] if pick else inst.instance_id
            self._slots[inst.instance_id] = Slot(inst.instance_id, buf)

    def _pool_in(self, request: Request, now_s: float, cluster: ClusterState) -> None:
        rid = request.request_id
        if request.status.is_terminal or rid in self.tree:
            return
        self._owner.pop(rid, None)
        for slot in self._slots.values():
            slot.evicting.discard(rid)
        bs = self._block_size(cluster)
        self.tree.insert(rid, request.num_computed_tokens, -(-request.num_computed_tokens // bs), now_s)
        self._pooled[rid] = request
        self._since.setdefault(rid, now_s)
        if rid not in self._tag:  # from prefill (never batched): its pool wait starts
            self._waiting_since.setdefault(rid, now_s)
        if cluster.pool is not None:
            self.stats.sample_pool(now_s, cluster.pool.used_bytes)

    def _take(self, rid: int) -> Request:
        self.tree.remove(rid)
        self._since.pop(rid, None)
        return self._pooled.pop(rid)

    def _starved(self, now_s: float, cluster: ClusterState) -> list:
        """Starvation (Section 3.4): a subtree of the quad-tree that has generated no batch for
        ``max_wait_s`` gets priority: a batch is cut from it at once (Density First Search
        started at that subtree, taken even if small) and, tagged with its own batch id like
        any batch, goes to the least-loaded decode instance's requests buffer, which joins
        before any candidate batch."""
        cfg = self.config
        if cfg.max_wait_s <= 0:
            return []
        actions: list = []
        while True:
            node = self.tree.starving(now_s, cfg.max_wait_s)
            if node is None:
                break
            slot = min(self._slots.values(), key=lambda s: (len(s.requests) + len(s.candidate), s.iid))
            if cfg.prefix_aware:
                batch = self.tree.search(self._max_blocks(slot, cluster), cfg.min_batch, force=True, start=node)
            else:  # FCFS batches (the ablation): the oldest requests go first anyway
                batch = self._fcfs(self._max_blocks(slot, cluster), cfg.min_batch, True)
            batch_id = self._next_batch_id
            self._next_batch_id += 1
            self.stats.num_starved += len(batch.request_ids)
            self.stats.num_starved_batches += 1
            self._record_cut(batch, cluster, slot)
            self.tree.mark_batch(batch.request_ids, now_s)
            for rid in batch.request_ids:
                self._tag[rid] = batch_id
                actions += self._to_buffer(slot, self._take(rid), slot.requests, cluster)
        return actions

    def _cut_batch(self, slot: Slot, now_s: float, cluster: ClusterState) -> list:
        """Density First Search (or FCFS for the ablation) for the slot's next candidate batch."""
        if not self._pooled:
            return []
        cfg = self.config
        max_blocks = self._max_blocks(slot, cluster)
        inst = cluster.instance(slot.iid)
        idle = not inst.running and not inst.waiting and not slot.requests and not slot.incoming
        drained = self._arrivals_done and all(p.num_outstanding_tokens == 0 and not p.waiting
                                              for p in cluster.instances_with_role("prefill"))
        force = drained or (cfg.idle_force and idle)
        t0 = time.thread_time()
        if cfg.prefix_aware:
            batch = self.tree.search(max_blocks, cfg.min_batch, force=force)
        else:
            batch = self._fcfs(max_blocks, cfg.min_batch, force)
        self.stats.batch_gen_s.append(time.thread_time() - t0)
        if batch is None:
            return []
        self._record_cut(batch, cluster, slot)
        self.tree.mark_batch(batch.request_ids, now_s)
        slot.candidate_id = self._next_batch_id
        self._next_batch_id += 1
        actions: list = []
        for rid in sorted(batch.request_ids, key=lambda r: self.tree.length_of(r)):
            req = self._take(rid)
            self._tag[rid] = slot.candidate_id
            actions += self._to_buffer(slot, req, slot.candidate, cluster)
        if cluster.pool is not None:
            self.stats.sample_pool(now_s, cluster.pool.used_bytes)
        return actions

    def _fcfs(self, max_blocks: int, min_requests: int, force: bool) -> Batch | None:
        ids, blocks = [], 0
        for rid in sorted(self._since, key=lambda r: (self._since[r], r)):
            b = self.tree.blocks_of(rid)
            if blocks + b > max_blocks and ids:
                break
            ids.append(rid)
            blocks += b
        if not ids or (len(ids) < min_requests and not force and blocks <= max_blocks):
            return None
        lengths = [self.tree.length_of(r) for r in ids]
        return Batch(tuple(ids), blocks, min(lengths), max(lengths), 0, len(ids) < min_requests)

    def _to_buffer(self, slot: Slot, req: Request, queue: deque, cluster: ClusterState) -> list:
        """Queue ``req`` in one of the slot's buffers; prefetch its KV to the buffer GPU when
        GPU-prefetch-for-GPU is on, else it stays in the pool until it is released."""
        rid = req.request_id
        self._owner[rid] = slot.iid
        queue.append(req)
        if self._prefetching(slot, cluster):
            blocks = cluster.instance(slot.buffer_iid).blocks
            capacity = blocks.num_gpu_blocks - blocks.num_gpu_blocks // 10  # a tenth stays free for prefills
            room = self._room.get(slot.buffer_iid)
            if room is None:
                room = blocks.num_free_gpu_blocks - blocks.num_gpu_blocks // 10
            need = -(-req.num_computed_tokens // blocks.block_size)
            if need <= room:
                self._room[slot.buffer_iid] = room - need
                self.stats.num_prefetched += 1
                return [Move(req, slot.buffer_iid, hold=True, reason="alignedserve prefetch")]
            self._room[slot.buffer_iid] = room
            self.stats.num_prefetch_skipped += 1
            self.stats.prefetch_skips.append((need, room, capacity))
        slot.ready.add(rid)  # released from the pool directly (over PCIe)
        return []

    def _prefetching(self, slot: Slot, cluster: ClusterState) -> bool:
        if not self.config.prefetch or slot.buffer_iid == slot.iid:
            return False
        topo = getattr(cluster, "topology", None)
        if topo is None:  # the engine: copies are measured, the buffer is another instance's memory
            return True
        return topo.kind(slot.buffer_iid, slot.iid) is LinkKind.NVLINK

    def _record_cut(self, batch: Batch, cluster: ClusterState, slot: Slot) -> None:
        """A batch was cut: its shape, and the pool's depth just before (the premise: Density
        First Search narrows only when the pool holds more blocks than the threshold)."""
        self.stats.batch_sizes.append(len(batch.request_ids))
        self.stats.batch_cases.append(batch.case)
        self.stats.batch_spans.append(batch.max_len - batch.min_len)
        self.stats.num_forced_batches += batch.forced
        self.stats.cut_pool.append((len(self.tree), self.tree.num_blocks, self._max_blocks(slot, cluster)))
        self.stats.batch_fill.append(batch.num_blocks / self._max_blocks(slot, cluster))

    # ---- helpers ----
    def _max_blocks(self, slot: Slot, cluster: ClusterState) -> int:
        return max(1, int(self.config.block_fraction * cluster.instance(slot.iid).blocks.num_gpu_blocks))

    def _block_size(self, cluster: ClusterState) -> int:
        slot = next(iter(self._slots.values()), None)
        if slot is None:
            return self.config.leaf_width
        return cluster.instance(slot.iid).blocks.block_size

