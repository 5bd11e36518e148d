"""KV transfers between two places: the mechanics every move, hand-off and pool entry share.

Every move is the same sequence, whatever its ends (an instance's queue, an instance's
reserved buffer, the cluster pool):

1. the destination reserves the KV slots (blocks, or pool bytes) before any byte moves; when
   it cannot, the move waits in that destination's queue and is retried whenever memory
   there may have freed (after each of its steps, after a pool entry leaves);
2. the KV crosses the link between the two places in chunks (``chunk_tokens``; one chunk by
   default), each a job on a ``Link`` that queues behind other traffic by priority; a
   request that streams (DynaServe) sends chunks while it is still computing, and only the
   rest at its hand-off;
3. when the last chunk lands, the source frees its copy, and the request becomes runnable
   at the destination (or stays held there: ``Move(hold=True)``, a parked pool entry).

The source keeps its KV until the end of the transfer, so a busy link holds memory there.
In the simulator chunks cost the link's time; on the engine (``measured``) each chunk is a
real copy between the two KV caches when it gets the link, and costs what the copy took.

Invariant: a request is in exactly one place (an instance's queue, reserved or detached
set, the pool, or a transfer), and its KV blocks are owned at its source until the
destination holds a complete copy.

``KVTransfers`` owns the links, the transfers under way and those waiting for memory at their
destination, and the steps above (reserve, submit chunks, land, release either end), for an
instance and the cluster KV pool (``POOL``) alike. ``cluster.moves.Mover`` subclasses it with
what decides that a transfer begins: router moves, hand-offs, streams and failures.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from servelab.cluster.context import ClusterContext
from servelab.cluster.links import Link, LinkJob, Priority
from servelab.costmodel.links import LinkSpec
from servelab.core.events import EventKind
from servelab.core.policy import POOL
from servelab.core.request import Request, RequestStatus


@dataclass(slots=True)
class Transfer:
    request: Request
    source: int  # instance id or POOL
    destination: int
    hold: bool
    num_tokens: int  # tokens the destination reserves
    chunk_tokens: int | None
    start_s: float
    num_bytes: float = 0.0
    sent_tokens: int = 0  # submitted to the link so far
    landed_jobs: int = 0
    submitted_jobs: int = 0
    final: bool = False  # the last chunk has been submitted
    cancelled: bool = False
    source_is_reserved: bool = False  # the source held it in its reserved buffer (not detached)
    payload: list = field(default_factory=list)  # (first block index, bytes) landed in the pool


class KVTransfers:
    """Transfers under way (``_active``, by request id) and waiting for memory at their
    destination (``_blocked``), the links they cross, and the log of finished ones."""

    def __init__(self, cluster: ClusterContext, *, measured: bool = False) -> None:
        self.cluster = cluster
        self.measured = measured
        self.links: dict[tuple, Link] = {}
        self.transfers: list[tuple[int, int, float, float, float]] = []  # (src, dst, start, duration, bytes)
        self._active: dict[int, Transfer] = {}  # by request id
        self._blocked: dict[int, list[Transfer]] = defaultdict(list)  # by destination, waiting for memory

    # ---- links ----
    def link(self, source: int, destination: int) -> Link:
        key = (source, destination)
        lk = self.links.get(key)
        if lk is None:
            topo = self.cluster.topology
            if topo is None:  # measured transports: the copy itself is the cost
                lk = self.links[key] = Link(key, LinkSpec(1e12), measured=self.measured)
                return lk
            if source == POOL:
                spec = topo.host_spec(destination)
            elif destination == POOL:
                spec = topo.host_spec(source)
            else:
                spec = topo.spec(source, destination)
            lk = self.links[key] = Link(key, spec, measured=self.measured)
        return lk

    def on_link_done(self, key: tuple) -> None:
        lk = self.links[key]
        job, next_end = lk.job_done(self.cluster.now_s)
        if next_end is not None:
            self.cluster.events.push(next_end, EventKind.TRANSFER_DONE, key)
        job.on_done(self.cluster.now_s)

    # ---- transfers ----
    def _begin(self, req: Request, source: int, destination: int, hold: bool, chunk_tokens: int | None,
               num_tokens: int, *, source_is_reserved: bool = False) -> None:
        t = self._reserve_for(req, source, destination, hold, chunk_tokens, num_tokens,
                              source_is_reserved=source_is_reserved)
        if t is None:
            return
        self._submit_chunks(t, num_tokens, final=True)

    def _reserve_for(self, req: Request, source: int, destination: int, hold: bool, chunk_tokens: int | None,
                     num_tokens: int, *, source_is_reserved: bool = False, live: bool = False) -> Transfer | None:
        """Reserve at the destination; ``live``: the request still runs at the source (a stream
        begins), so it keeps its status and nothing waits when there is no room yet."""
        c = self.cluster
        t = Transfer(req, source, destination, hold, num_tokens, chunk_tokens, c.now_s,
                     source_is_reserved=source_is_reserved)
        if not live:
            req.status = RequestStatus.TRANSFERRING
        if not self._try_reserve(t):
            if not live:
                self._blocked[destination].append(t)
            return None
        self._active[req.request_id] = t
        return t

    def _try_reserve(self, t: Transfer) -> bool:
        c = self.cluster
        req = t.request
        if t.destination == POOL:
            pool = c.pool
            if pool is None:
                raise ValueError(f"request {req.request_id} moves to the KV pool, but the cluster has none")
            nbytes = int(t.num_tokens * self._kv_bytes(t.source))
            if not pool.can_hold(nbytes):
                return False
            pool.reserve(req, t.num_tokens, nbytes)
            return True
        if t.destination not in c.active:
            raise ValueError(f"request {req.request_id} moves to instance {t.destination}, which is not active")
        d = c.drivers[t.destination]
        if d.run is not None:  # a decode run counted on the free blocks: it ends with the step in flight
            cut = d.interrupt(c.now_s)
            if cut is not None:
                c.push_step_done(d, cut)
        rt = d.runtime
        if t.num_tokens and not rt.can_reserve(t.num_tokens):
            return False
        rt.reserve(req, t.num_tokens)
        return True

    def _retry(self, destination: int) -> None:
        waiting, self._blocked[destination] = self._blocked[destination], []
        for i, t in enumerate(waiting):
            if self._try_reserve(t):
                self._active[t.request.request_id] = t
                self._submit_chunks(t, t.num_tokens, final=True)
            else:
                self._blocked[destination] = waiting[i:] + self._blocked[destination]
                return  # first come, first served

    def _submit_chunks(self, t: Transfer, upto_tokens: int, *, final: bool) -> None:
        c = self.cluster
        kv_per_token = self._kv_bytes(t.source)
        lk = self.link(t.source, t.destination) if upto_tokens > t.sent_tokens else None
        size = t.chunk_tokens or max(upto_tokens - t.sent_tokens, 1)
        if lk is not None and t.chunk_tokens and final is False:
            bs = self._block_size(t)
            size = max(bs, (size // bs) * bs)
        while t.sent_tokens < upto_tokens:
            first = t.sent_tokens
            last = min(upto_tokens, first + size)
            t.sent_tokens = last
            nbytes = (last - first) * kv_per_token
            t.num_bytes += nbytes
            t.submitted_jobs += 1
            job = LinkJob(nbytes, Priority.KV, self._landed_fn(t), self._copy_fn(t, first, last),
                          label=f"kv r{t.request.request_id} [{first},{last})")
            end = lk.submit(job, c.now_s)
            if end is not None:
                c.events.push(end, EventKind.TRANSFER_DONE, lk.key)
        if final:
            t.final = True
            if t.landed_jobs == t.submitted_jobs:  # nothing to send (no KV yet), or all landed
                self._finish(t)

    def _landed_fn(self, t: Transfer):
        def landed(now_s: float) -> None:
            t.landed_jobs += 1
            if t.final and t.landed_jobs == t.submitted_jobs and not t.cancelled:
                self._finish(t)
        return landed

    def _copy_fn(self, t: Transfer, first: int, last: int):
        """Engine: copy the chunk's blocks when it gets the link (None in the simulator)."""
        def copy() -> float | None:
            if t.cancelled:
                return 0.0
            return self._copy(t, first, last)
        return copy if self.measured else None

    def _copy(self, t: Transfer, first: int, last: int) -> float:
        import time

        c = self.cluster
        t0 = time.perf_counter()
        req = t.request
        bs = self._block_size(t)
        lo, hi = first // bs, -(-last // bs)
        if t.source == POOL:
            payload = c.pool.entries[req.request_id].payload
            data = [(i, x) for i, x in (payload or []) if lo <= i < hi]
        else:
            src = c.drivers[t.source]
            ids = src.runtime.blocks.block_table(req.request_id)[lo:hi]
            data = [(lo, src.executor.export_kv(ids))]
        if t.destination == POOL:
            entry = c.pool.entries[req.request_id]
            entry.payload = (entry.payload or []) + data
        else:
            dst = c.drivers[t.destination]
            table = dst.runtime.blocks.block_table(req.request_id)
            for start, blob in data:
                if blob is None:
                    continue
                n = _num_blocks(blob)
                dst.executor.import_kv(table[start:start + n], blob)
        return time.perf_counter() - t0

    def _finish(self, t: Transfer) -> None:
        c = self.cluster
        req = t.request
        self._active.pop(req.request_id, None)
        self.transfers.append((t.source, t.destination, t.start_s, c.now_s - t.start_s, t.num_bytes))
        # the source frees its copy
        if t.source == POOL:
            c.pool.remove(req.request_id)
            if self._blocked.get(POOL):
                self._retry(POOL)
        else:
            src = c.drivers[t.source]
            if t.source_is_reserved:
                src.runtime.unreserve(req.request_id)
                src.executor.release(req.request_id, False)
            elif req.request_id in src.runtime.detached:
                src.release_detached(req.request_id)
            if self._blocked.get(t.source):
                self._retry(t.source)
            # the freed blocks may let the source admit what waited on memory
            c.kick(t.source)
        # the destination takes it
        if t.destination == POOL:
            req.status = RequestStatus.HELD
            req.instance_id = None
        else:
            dst = c.drivers[t.destination]
            if t.hold:
                req.status = RequestStatus.HELD
                req.instance_id = t.destination
                dst.executor.admit(req)
            else:
                c.add_to(dst, req)
                if req.handoff_at_tokens is None:
                    req.handoff_at_tokens = c.router.handoff_point(req, c.view.instance(t.destination))
                c.kick(t.destination)
        c.apply(c.router.on_moved(c.now_s, req, t.destination, c.view))

    def _release_destination(self, t: Transfer) -> None:
        c = self.cluster
        if t.destination == POOL:
            if t.request.request_id in c.pool:
                c.pool.remove(t.request.request_id)
        elif t.request.request_id in c.drivers[t.destination].runtime.reserved:
            c.drivers[t.destination].runtime.unreserve(t.request.request_id)

    def _release_source(self, t: Transfer) -> None:
        c = self.cluster
        rid = t.request.request_id
        if t.source == POOL:
            if c.pool is not None and rid in c.pool:
                c.pool.remove(rid)
        elif t.source in c.active:
            rt = c.drivers[t.source].runtime
            if t.source_is_reserved and rid in rt.reserved:
                rt.unreserve(rid)
            elif rid in rt.detached:
                c.drivers[t.source].release_detached(rid)

    def _kv_bytes(self, source: int) -> float:
        c = self.cluster
        if source == POOL:
            return c.drivers[min(c.active)].kv_bytes_per_token
        return c.drivers[source].kv_bytes_per_token

    def _block_size(self, t: Transfer) -> int:
        c = self.cluster
        place = t.source if t.source != POOL else t.destination
        if place == POOL:
            place = min(c.active)
        return c.drivers[place].runtime.blocks.block_size


def _num_blocks(blob: Any) -> int:
    shape = getattr(blob, "shape", None)
    return int(shape[2]) if shape is not None else 0

