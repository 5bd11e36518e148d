"""The ``alignedserve`` router: prefill -> host KV pool -> prefix-aligned batches -> decode.

Arrivals go to the prefill instance with the least outstanding work; at the end of its
prompt each request is handed off to the cluster's host KV pool (``POOL``) and enters the
quad-tree. For each decode instance the router keeps, in the HBM of a prefill instance (its
*buffer*, reserved with ``Move(hold=True)``):

- the Candidate Batch Buffer: the next batch, cut by Density First Search and prefetched
  from the pool over PCIe ahead of time (GPU-prefetch-for-GPU);
- the Candidate Requests Buffer: requests evicted from the running batch, and pool
  requests whose prefix matches the running batch's (dynamic scheduling).

After every decode iteration (Algorithm 2): case 3 first, evict the longest request (of the
old batch during a switch) to the requests buffer over NVLink while the next steps'
growth would not fit; case 1, requests from the requests buffer join; case 2, when that
buffer is empty, requests of the candidate batch join (a batch switch); once the candidate
batch has all joined, the next one is cut and prefetched. Joins follow ``config.join``:
the paper's rule refills the blocks completed requests released, up to the batch's block
threshold, and fills a running batch that is under ``min_batch``; ``one-for-one`` replaces
completions by count; ``greedy`` joins whenever blocks are free. A quad-tree subtree that
has generated no batch for ``max_wait_s`` gets the next batch (starvation). Without
prefetch (or without NVLink) batches go from the pool straight to the decode GPU; with
``wait_for_kv`` the decode instance's next iteration waits until joining KV has landed.

The pool, the buffers and batch cutting are the base class ``PoolBuffers`` (``buffers.py``);
this module is the router's event hooks and Algorithm 2.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace
from typing import Sequence

from servelab.core.policy import POOL, ROUTERS, ClusterState, InstanceState, Move, Placement, Router
from servelab.core.request import Request
from servelab.designs.alignedserve.buffers import PoolBuffers, Slot
from servelab.designs.alignedserve.config import AlignedServeConfig


@ROUTERS.register("alignedserve")
class AlignedServeRouter(PoolBuffers, Router):
    Config = AlignedServeConfig

    # ---- placement and hand-off ----
    def on_arrival(self, now_s: float, request: Request, cluster: ClusterState) -> list[Placement]:
        prefill = cluster.instances_with_role("prefill")
        if not prefill or not cluster.instances_with_role("decode"):
            return [Placement(request, None, "alignedserve router needs prefill and decode instances")]
        target = min(prefill, key=lambda inst: (inst.num_outstanding_tokens, inst.instance_id))
        return [Placement(request, target.instance_id)]

    def handoff_point(self, request: Request, instance: InstanceState) -> int | None:
        return request.num_prompt_tokens if instance.role == "prefill" else None

    def handoff_target(self, now_s: float, request: Request, source_id: int, cluster: ClusterState) -> int:
        if cluster.pool is None:  # no host pool (an engine cluster built without one): P/D as DistServe
            decode = cluster.instances_with_role("decode")
            return max(decode, key=lambda i: (i.blocks.num_free_gpu_blocks, -i.instance_id)).instance_id
        return POOL

    # ---- events ----
    def on_moved(self, now_s: float, request: Request, destination: int, cluster: ClusterState) -> list:
        self._begin(cluster)
        rid = request.request_id
        if destination == POOL:
            self._pool_in(request, now_s, cluster)
            return self._tick(now_s, cluster)
        slot = self._slots.get(self._owner.get(rid, -2))
        if slot is None:
            return []
        if destination == slot.iid:
            t0 = slot.incoming.pop(rid, None)
            if t0 is not None:
                self.stats.release_s.append(now_s - t0)
            since = self._waiting_since.pop(rid, None)
            if since is not None:  # first landing: the pool wait; later ones: rejoining after eviction
                (self.stats.rejoin_wait_s if rid in self._evicted else self.stats.pool_wait_s).append(now_s - since)
                self._evicted.discard(rid)
            if not slot.incoming and slot.wait_since is not None:
                self.stats.kv_wait_s.append(now_s - slot.wait_since)
                slot.wait_since = None
            self._owner.pop(rid, None)
            return []
        if destination == slot.buffer_iid:  # landed in a buffer (prefetched or evicted)
            slot.evicting.discard(rid)
            slot.ready.add(rid)
            return self._schedule(slot, now_s, cluster)
        return []

    def on_step_done(self, now_s: float, instance_id: int, shape, finished: Sequence[Request],
                     cluster: ClusterState) -> list:
        self._begin(cluster)
        slot = self._slots.get(instance_id)
        if slot is None:
            return []
        slot.credit += len(finished)
        if shape.num_decodes == 0:
            return []
        t0 = time.thread_time()
        inst = cluster.instance(instance_id)
        self.stats.num_iterations += 1
        counts: dict[int, int] = {}
        for r in inst.running:
            tag = self._tag.get(r.request_id, -1)
            counts[tag] = counts.get(tag, 0) + 1
        if len(counts) > 1:
            self.stats.num_switch_iterations += 1
            self.stats.switch_minority.append(1 - max(counts.values()) / len(inst.running))
        self.stats.step_contexts.append((shape.num_decodes, shape.decode_context_sum, shape.decode_context_max))
        self.stats.used_share.append(inst.blocks.num_used_gpu_blocks / max(1, inst.blocks.num_gpu_blocks))
        if inst.cost_model is not None:
            took = inst.cost_model.step_time_s(shape)
            self.stats.step_s.append(took)
            # the iteration bubble: the same rows and KV reads with the context spread evenly (no long row)
            even = replace(shape, decode_context_max=-(-shape.decode_context_sum // shape.num_decodes))
            self.stats.step_even_s.append(took if even == shape else inst.cost_model.step_time_s(even))
        actions = self._schedule(slot, now_s, cluster)
        joining = {self._tag.get(m.request.request_id, -1) for m in actions
                   if isinstance(m, Move) and m.destination == slot.iid}
        if any(t != u for t in joining for u in counts):  # requests of another batch join the running one
            self.stats.num_switch_events += 1
        self.stats.schedule_s.append(time.thread_time() - t0)
        return actions

    def on_instance_idle(self, now_s: float, instance_id: int, cluster: ClusterState) -> list:
        self._begin(cluster)
        return self._tick(now_s, cluster)

    def on_timer(self, now_s: float, cluster: ClusterState) -> list:
        self._begin(cluster)
        return self._tick(now_s, cluster)

    def on_arrivals_done(self, now_s: float, cluster: ClusterState) -> list:
        self._arrivals_done = True
        self._begin(cluster)
        return self._tick(now_s, cluster)

    def next_wakeup_s(self, now_s: float) -> float | None:
        if self.config.max_wait_s <= 0 or not len(self.tree):
            return None
        return self.tree.oldest_stamp + self.config.max_wait_s

    def report(self) -> dict:
        return self.stats.summary()

    def _tick(self, now_s: float, cluster: ClusterState) -> list:
        actions = self._starved(now_s, cluster)
        for slot in self._slots.values():
            actions += self._schedule(slot, now_s, cluster)
        return actions

    # ---- Algorithm 2 ----
    def _schedule(self, slot: Slot, now_s: float, cluster: ClusterState) -> list:
        inst = cluster.instance(slot.iid)
        actions = self._evict(slot, inst, cluster, now_s)
        if actions:
            return actions
        actions += self._dynamic(slot, inst, cluster)
        # the paper's second trigger: a running batch under its minimum size takes what fits
        slot.small = inst.num_running + len(inst.waiting) + len(slot.incoming) < self.config.min_batch
        actions += self._release(slot, slot.requests, inst, now_s)  # case 1
        if not slot.requests:
            before = len(slot.candidate)
            actions += self._release(slot, slot.candidate, inst, now_s)  # case 2 (a batch switch)
            if len(slot.candidate) < before and slot.batch_id != slot.candidate_id:
                slot.batch_id = slot.candidate_id
                slot.dynamic_left = self.config.requests_buffer
        if not slot.candidate:
            actions += self._cut_batch(slot, now_s, cluster)
            if not slot.candidate:
                self._steal(slot, inst)
            if not slot.requests:
                actions += self._release(slot, slot.candidate, inst, now_s)
                if slot.candidate_id != slot.batch_id and not inst.running:
                    slot.batch_id = slot.candidate_id
                    slot.dynamic_left = self.config.requests_buffer
        return actions

    def _steal(self, slot: Slot, inst: InstanceState) -> None:
        """An idle decode GPU with an empty pool takes the unjoined, ready requests of the
        largest candidate batch another decode GPU still waits to run (they keep their batch id).
        Without it a batch cut for a busy GPU waits for that GPU's completions while this one
        idles: the offline run's end, where sparse long-prompt ranges are cut last."""
        if not self.config.steal or inst.running or inst.waiting or slot.incoming or slot.requests or self._pooled:
            return
        donors = [s for s in self._slots.values() if s is not slot and any(r.request_id in s.ready for r in s.candidate)]
        if not donors:
            return
        donor = max(donors, key=lambda s: (sum(r.request_id in s.ready for r in s.candidate), -s.iid))
        keep: deque = deque()
        for req in donor.candidate:
            rid = req.request_id
            if rid in donor.ready and not req.status.is_terminal:
                donor.ready.discard(rid)
                slot.ready.add(rid)
                self._owner[rid] = slot.iid
                slot.candidate.append(req)
                self.stats.num_stolen += 1
            else:
                keep.append(req)
        donor.candidate = keep
        slot.candidate_id = donor.candidate_id
        self.stats.num_steals += 1

    def _release(self, slot: Slot, queue: deque, inst: InstanceState, now_s: float) -> list:
        """Requests of ``queue``, in order, whose KV is ready join the decode instance while its
        free blocks cover them and the running batch's growth. One still in transit does not
        hold up those behind it: it may be an eviction waiting for room in the very buffer
        that they would free (a deadlock found by the full reproduction, OPT-13B, 75% short)."""
        actions = []
        bs = inst.blocks.block_size
        free = inst.blocks.num_free_gpu_blocks
        num_seqs = inst.num_running + len(inst.waiting) + len(slot.incoming)
        rule = self.config.join
        # the paper's batch holds at most block_fraction of the decode GPU's blocks (Algorithm 1's
        # threshold); after completions the released HBM is refilled up to it, not one row per row
        budget = int(self.config.block_fraction * inst.blocks.num_gpu_blocks)
        used = inst.blocks.num_gpu_blocks - free
        headroom = -(-(num_seqs * self.config.growth_tokens) // bs) + 1
        kept: list[Request] = []  # not ready yet (in transit): those behind them may go first
        if inst.swapped:  # the instance admits no KV while its own swapped requests wait to come back
            return actions
        while queue:
            req = queue[0]
            rid = req.request_id
            if req.status.is_terminal:
                queue.popleft()
                continue
            if rid not in slot.ready:
                kept.append(queue.popleft())
                continue
            need = -(-(req.num_computed_tokens + 1) // bs)
            empty = num_seqs == 0
            # the decode instance admits incoming KV only above its watermark once a block is used
            # (``can_reserve``); released below it, the KV would wait there for memory, unseen here
            floor = inst.blocks.watermark_blocks if inst.blocks.num_used_gpu_blocks or actions else 0
            if not empty and (need + max(headroom, floor) > free or num_seqs >= inst.max_num_seqs):
                break
            small = slot.small
            if rule != "greedy" and not small and slot.credit <= 0:
                break  # the paper's triggers: no completion since the last join and the batch is not small
            if rule == "paper" and not small and used + need > budget:
                slot.credit = 0  # the released HBM is refilled up to the batch's block threshold
                break
            self.stats.num_joins += 1
            self.stats.num_joins_small += small
            self.stats.num_joins_completions += not small
            if rule == "one-for-one":
                slot.credit = max(0, slot.credit - 1)
            if self.config.wait_for_kv and inst.num_running and slot.wait_since is None:
                slot.wait_since = now_s
            queue.popleft()
            slot.ready.discard(rid)
            slot.incoming[rid] = now_s
            free -= need
            used += need
            num_seqs += 1
            headroom = -(-(num_seqs * self.config.growth_tokens) // bs) + 1
            actions.append(Move(req, slot.iid, reason="alignedserve schedule"))
        queue.extendleft(reversed(kept))
        return actions

    def _evict(self, slot: Slot, inst: InstanceState, cluster: ClusterState, now_s: float) -> list:
        """Case 3: while the next ``evict_lookahead`` steps' growth would not fit, evict the
        longest running request (of the old batch during a switch) to the requests buffer."""
        bs = inst.blocks.block_size
        running = [r for r in inst.running if r.request_id not in slot.evicting]
        if len(running) <= 1:
            return []
        la = self.config.evict_lookahead
        need = sum(1 for r in running if (r.num_computed_tokens % bs) + la >= bs)
        free = inst.blocks.num_free_gpu_blocks
        if free >= need:
            return []
        old = [r for r in running if self._tag.get(r.request_id, -1) != slot.batch_id]
        victims = sorted(old or running, key=lambda r: (-r.num_computed_tokens, r.request_id))
        actions = []
        buf = cluster.instance(slot.buffer_iid) if slot.buffer_iid != slot.iid else None
        buf_free = buf.blocks.num_free_gpu_blocks if buf is not None else 0
        for victim in victims:
            if free >= need or len(running) - len(actions) <= 1:
                break
            blocks = -(-victim.num_computed_tokens // bs)
            rid = victim.request_id
            slot.evicting.add(rid)
            self.stats.num_evictions += 1
            self._waiting_since[rid] = now_s
            self._evicted.add(rid)
            if buf is not None and buf_free >= blocks + 1 and self._prefetching(slot, cluster):
                buf_free -= blocks
                self._owner[rid] = slot.iid
                slot.requests.appendleft(victim)
                actions.append(Move(victim, slot.buffer_iid, hold=True, reason="alignedserve evict"))
            else:
                self.stats.num_evictions_to_pool += 1
                actions.append(Move(victim, POOL, reason="alignedserve evict"))
            free += blocks
            need -= 1 if (victim.num_computed_tokens % bs) + la >= bs else 0
        return actions

    def _dynamic(self, slot: Slot, inst: InstanceState, cluster: ClusterState) -> list:
        """Pool requests whose prefix lies in the running batch's range wait in the requests
        buffer, so they join this batch rather than a later one."""
        room = min(self.config.requests_buffer - len(slot.requests), slot.dynamic_left)
        if room <= 0 or not self._pooled or not self.config.prefix_aware:
            return []
        lengths = [r.num_computed_tokens for r in inst.running if self._tag.get(r.request_id) == slot.batch_id]
        if not lengths:
            return []
        picks = self.tree.in_range(min(lengths), max(lengths), room)
        actions: list = []
        for rid in picks:
            req = self._take(rid)
            self._tag[rid] = slot.batch_id
            self.stats.num_dynamic += 1
            slot.dynamic_left -= 1
            actions += self._to_buffer(slot, req, slot.requests, cluster)
        return actions
