"""Moving requests with their KV: hand-offs, migrations, the cluster pool, reserved buffers.

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
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servelab.cluster.links import Link, LinkJob, Priority
from servelab.costmodel.links import LinkSpec
from servelab.core.driver import InstanceDriver
from servelab.core.instance import StepOutcome
from servelab.core.policy import POOL, Move
from servelab.core.request import Request, RequestStatus
from servelab.core.events import EventKind

if TYPE_CHECKING:
    from servelab.cluster.driver import ClusterDriver


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


class Mover:
    def __init__(self, cluster: ClusterDriver, *, measured: bool = False) -> None:
        self.cluster = cluster
        self.measured = measured
        self.links: dict[tuple, Link] = {}
        self.transfers: list[tuple[int, int, float, float, float]] = []  # (src, dst, start, duration, bytes)
        self._active: dict[int, Transfer] = {}  # by request id
        self._blocked: dict[int, list[Transfer]] = defaultdict(list)  # by destination, waiting for memory
        self._deferred: dict[int, list[Move]] = defaultdict(list)  # moves of requests in a step in flight
        self._streams: dict[int, dict[int, Request]] = defaultdict(dict)  # by instance: requests that stream
        self.num_ignored_moves = 0  # moves of requests already in transit (the first one stands)

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

    # ---- entry points ----
    def move(self, m: Move) -> None:
        req = m.request
        if req.status.is_terminal:
            return
        c = self.cluster
        t = self._active.get(req.request_id)
        if t is not None and t.source == req.instance_id and c.drivers[t.source].runtime.has(req.request_id):
            self._cancel_stream(t.source, req)  # it streamed toward its split target: moving it instead
        elif t is not None or any(b.request is req for ts in self._blocked.values() for b in ts):
            self.num_ignored_moves += 1  # already on its way somewhere: the first move stands
            return
        pool = c.pool
        if pool is not None and req.request_id in pool:
            if m.destination == POOL:
                return
            self._begin(req, POOL, m.destination, m.hold, m.chunk_tokens, req.num_computed_tokens)
            return
        iid = req.instance_id
        if iid is None or iid not in c.active:
            raise ValueError(f"Move of request {req.request_id}: it is on no active instance")
        d = c.drivers[iid]
        rt = d.runtime
        if req.request_id in rt.reserved:  # held in this instance's buffer
            if m.destination == iid:
                if not m.hold:
                    req.status = RequestStatus.TRANSFERRING
                    c.add_to(d, req)
                    c.kick(iid)
                return
            self._begin(req, iid, m.destination, m.hold, m.chunk_tokens, req.num_computed_tokens,
                        source_is_reserved=True)
            return
        if m.destination == iid:
            return
        self._streams.get(iid, {}).pop(req.request_id, None)
        if d.busy and (d.run is not None or any(r is req for r in d.applied.batch)):
            if d.run is not None:
                cut = d.interrupt(c.now_s)
                if cut is not None:
                    c.push_step_done(d, cut)
            self._deferred[iid].append(m)
            return
        rt.detach(req.request_id)
        d.policy.on_finish(c.now_s, req)
        self._begin(req, iid, m.destination, m.hold, m.chunk_tokens, req.num_computed_tokens)

    def after_step(self, d: InstanceDriver, outcome: StepOutcome) -> None:
        """Hand off what left the step, stream new KV chunks, retry what waits for memory here."""
        iid = d.instance_id
        for req in outcome.handed_off:
            self._hand_off(d, req)
        streams = self._streams.get(iid)
        if streams:
            for req in outcome.finished:
                self._cancel_stream(iid, req)
            for req in list(streams.values()):
                self._stream_progress(iid, req)
        deferred = self._deferred.pop(iid, None)
        if deferred:
            for m in deferred:
                self.move(m)
        if self._blocked.get(iid):
            self._retry(iid)

    def moving_ids(self) -> set[int]:
        """Requests with a transfer under way or waiting for memory at its destination."""
        return set(self._active) | {t.request.request_id for ts in self._blocked.values() for t in ts}

    def after_resize(self, d: InstanceDriver) -> None:
        if self._blocked.get(d.instance_id):
            self._retry(d.instance_id)

    def on_instance_gone(self, iid: int) -> list[Request]:
        """An instance failed: transfers to or from it are cancelled and the other end's copy is
        freed; returns their requests (their KV is lost with the instance: they must be
        recomputed elsewhere or aborted)."""
        lost = []
        c = self.cluster
        for rid, t in list(self._active.items()):
            if t.destination == iid and t.source != iid:  # the KV is still at the source: it stays there
                self._return_to_source(t)
                continue
            if t.source == iid:
                t.cancelled = True
                del self._active[rid]
                self._release_destination(t)
                lost.append(t.request)
        for dst in list(self._blocked):
            keep = []
            for t in self._blocked[dst]:
                if dst == iid and t.source != iid:
                    t.final = True  # it had left its source: it comes back there
                    self._return_to_source(t)
                elif t.source == iid:
                    lost.append(t.request)
                else:
                    keep.append(t)
            self._blocked[dst] = keep
        self._streams.pop(iid, None)
        self._deferred.pop(iid, None)
        return lost

    def forget(self, req: Request) -> None:
        """``req`` ended while not queued on an instance: free every copy of its KV (a transfer's
        ends, a reserved buffer, the pool) and stop streaming it."""
        c = self.cluster
        rid = req.request_id
        t = self._active.pop(rid, None)
        blocked = [b for dst, ts in self._blocked.items() for b in ts if b.request is req]
        for b in blocked:
            self._blocked[b.destination].remove(b)
        for t in [t] if t is not None else []:
            t.cancelled = True
            self._release_destination(t)
        for t in ([t] if t is not None else []) + blocked:
            self._release_source(t)
        for streams in self._streams.values():
            streams.pop(rid, None)
        if c.pool is not None and rid in c.pool:
            c.pool.remove(rid)
        iid = req.instance_id
        if iid is not None and iid in c.active:
            rt = c.drivers[iid].runtime
            if rid in rt.reserved:
                rt.unreserve(rid)
            if rid in rt.detached:
                c.drivers[iid].release_detached(rid)

    def break_stalemate(self) -> int:
        """Nothing runs or moves anywhere, yet transfers wait for memory: each destination's
        blocks are held by requests waiting to leave it (two instances handing off to each
        other, both full). No step can free a block, so the waiting hand-offs are given up:
        each request goes on from its source (the split was an optimisation, not a must).
        Returns how many came back; the caller calls this only when the cluster is still."""
        c = self.cluster
        if self._active or any(c.drivers[i].busy for i in c.active):
            return 0
        back = 0
        for dst in list(self._blocked):
            waiting, self._blocked[dst] = self._blocked[dst], []
            for t in waiting:
                if t.source == POOL or t.source not in c.active:
                    self._blocked[dst].append(t)
                    continue
                t.final = True  # it had left its source (detached): it comes back there
                self._return_to_source(t)
                back += 1
        return back

    def _return_to_source(self, t: Transfer) -> None:
        """A transfer's destination failed before it landed: the request goes on from its source
        (a stream is simply dropped; a detached request runs where it is; a held or pooled one
        stays held)."""
        c = self.cluster
        req = t.request
        rid = req.request_id
        t.cancelled = True
        self._active.pop(rid, None)
        req.handoff_target = None
        if t.source == POOL:
            req.status = RequestStatus.HELD
            req.instance_id = None
            return
        src = c.drivers[t.source]
        rt = src.runtime
        self._streams.get(t.source, {}).pop(rid, None)
        if rt.has(rid):
            return  # a stream: the request still runs at its source
        if t.source_is_reserved:
            req.status = RequestStatus.HELD
        elif rid in rt.detached and t.final:  # left already: it comes back
            req.handoff_at_tokens = req.stream_kv_tokens = None
            rt.reattach(rid)
            c.add_to(src, req)
            c.kick(t.source)
        # else it was handed off in the step now ending: its hand-off picks a new target

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

    def watch_stream(self, d: InstanceDriver, req: Request) -> None:
        self._streams[d.instance_id][req.request_id] = req

    def on_link_done(self, key: tuple) -> None:
        lk = self.links[key]
        job, next_end = lk.job_done(self.cluster.now_s)
        if next_end is not None:
            self.cluster.events.push(next_end, EventKind.TRANSFER_DONE, key)
        job.on_done(self.cluster.now_s)

    def where(self, req: Request) -> str:
        c = self.cluster
        if req.request_id in self._active:
            t = self._active[req.request_id]
            return f"in transit from {_name(t.source)} to {_name(t.destination)}"
        if c.pool is not None and req.request_id in c.pool:
            return "parked in the cluster KV pool"
        if req.instance_id is not None and req.request_id in c.drivers[req.instance_id].runtime.reserved:
            return f"held in instance {req.instance_id}'s reserved buffer"
        if req.instance_id is None:
            return "held by the router, never placed"
        return f"on instance {req.instance_id} ({req.status.value})"

    # ---- hand-offs ----
    def _hand_off(self, d: InstanceDriver, req: Request) -> None:
        c = self.cluster
        iid = d.instance_id
        req.num_transfers += 1
        t = self._active.get(req.request_id)
        self._streams.get(iid, {}).pop(req.request_id, None)
        if t is not None:  # it streamed: send the rest
            req.handoff_at_tokens = None
            req.handoff_target = None
            req.stream_kv_tokens = None
            req.status = RequestStatus.TRANSFERRING
            extra = req.num_computed_tokens - t.num_tokens
            if extra > 0:  # computed past its split point (a policy that ignores the cap)
                c.drivers[t.destination].runtime.blocks.allocate(req.request_id, extra)
                t.num_tokens = req.num_computed_tokens
            self._submit_chunks(t, req.num_computed_tokens, final=True)
            return
        target = req.handoff_target
        if target is None or (target != POOL and target not in c.active):  # none fixed, or it failed
            try:
                target = c.router.handoff_target(c.now_s, req, iid, c.view)
            except NotImplementedError:
                target = iid
            if target != POOL and target not in c.active:
                target = iid  # nowhere to go: it finishes here
        req.handoff_at_tokens = None
        req.handoff_target = None
        req.stream_kv_tokens = None
        if target == iid:  # it continues where it is (it was moved to its target earlier)
            d.runtime.reattach(req.request_id)
            c.add_to(d, req)
            return
        self._begin(req, iid, target, False, None, req.num_computed_tokens)

    def _stream_progress(self, iid: int, req: Request) -> None:
        """Send complete chunks of a streaming request's KV computed so far."""
        t = self._active.get(req.request_id)
        chunk = req.stream_kv_tokens
        if chunk is None or req.handoff_target in (None, iid) or not self.cluster.drivers[iid].runtime.has(req.request_id):
            return
        if req.handoff_target not in self.cluster.active:  # its target failed: the hand-off picks anew
            self._streams[iid].pop(req.request_id, None)
            req.handoff_target = None
            return
        bs = self.cluster.drivers[iid].runtime.blocks.block_size
        ready = (req.num_computed_tokens // bs) * bs
        if t is None:
            if ready < chunk:
                return
            t = self._reserve_for(req, iid, req.handoff_target, False, chunk, req.handoff_at_tokens, live=True)
            if t is None:  # no room yet: try again after the next step
                return
        if ready - t.sent_tokens >= chunk:
            self._submit_chunks(t, ready, final=False)

    def _cancel_stream(self, iid: int, req: Request) -> None:
        self._streams.get(iid, {}).pop(req.request_id, None)
        t = self._active.pop(req.request_id, None)
        if t is not None:
            t.cancelled = True
            self._release_destination(t)

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


def _name(place: int) -> str:
    return "the KV pool" if place == POOL else f"instance {place}"
