"""Moving requests with their KV: router moves, hand-offs and streams, and what a failed or
stalled cluster does with the transfers under way.

The transfer mechanics (reserve at the destination, chunks over a link, land, free the
source) are ``cluster.transfers.KVTransfers``, which ``Mover`` extends; its docstring gives the
sequence every move follows and the invariant it keeps.
"""

from __future__ import annotations

from collections import defaultdict
from servelab.cluster.context import ClusterContext
from servelab.cluster.transfers import KVTransfers, Transfer
from servelab.core.driver import InstanceDriver
from servelab.core.instance import StepOutcome
from servelab.core.policy import POOL, Move
from servelab.core.request import Request, RequestStatus


class Mover(KVTransfers):
    def __init__(self, cluster: ClusterContext, *, measured: bool = False) -> None:
        super().__init__(cluster, measured=measured)
        self._deferred: dict[int, list[Move]] = defaultdict(list)  # moves of requests in a step in flight
        self._streams: dict[int, dict[int, Request]] = defaultdict(dict)  # by instance: requests that stream
        self.num_ignored_moves = 0  # moves of requests already in transit (the first one stands)

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

    def watch_stream(self, d: InstanceDriver, req: Request) -> None:
        self._streams[d.instance_id][req.request_id] = req

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


def _name(place: int) -> str:
    return "the KV pool" if place == POOL else f"instance {place}"
