"""Pipeline groups at run time: forming several instances into one scheduled unit and back.

A pipeline group replaces its members in the list of schedulable instances by one driver
(id = first member) whose executor is a ``PipelineExecutor`` over the members' layer ranges
and whose KV capacity is the smallest member's (every token has KV on every stage). Members'
requests join the group after an exchange: each request's KV of the layers now held by the
other stages crosses the link to them (the request stalls until it lands); groups merge whole
into a larger one, each member keeping part of its range (only KV of layers that change hands
moves). Splitting does the reverse; members must hold the whole model again (restore first).

``PipelineGroups`` is the base of ``cluster.reconfigure.Reconfigurer``: it holds the
reconfiguration state (groups, the event log, actions waiting for steps to end) and the
helpers every action uses, and carries out ``FormPipeline`` and ``SplitPipeline``; the
subclass dispatches actions and carries out layer changes, KV resizes and faults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from servelab.cluster.context import ClusterContext
from servelab.cluster.links import LinkJob, Priority
from servelab.cluster.moves import Mover
from servelab.cluster.pipeline import PipelineExecutor
from servelab.cluster.reconfig import FormPipeline, SplitPipeline
from servelab.core.driver import InstanceDriver
from servelab.core.events import EventKind
from servelab.core.instance import InstanceLimits, InstanceRuntime
from servelab.core.kv_blocks import KVCacheConfig
from servelab.core.request import Request, RequestStatus


class ReconfigContext(ClusterContext, Protocol):
    """The driver as the reconfigurer sees it: its ``ClusterContext`` and its mover (restored
    weights and exchanged KV cross the mover's links; a failed instance's transfers end there)."""

    mover: Mover


@dataclass
class PipelineGroup:
    group_id: int
    members: list[InstanceDriver]  # stage order; their own drivers, idle while grouped
    executor: PipelineExecutor
    formed_s: float


class PipelineGroups:
    """Reconfiguration state and shared helpers, and the pipeline-group actions (form, exchange,
    split, report); ``Reconfigurer`` is the only subclass."""

    def __init__(self, cluster: ReconfigContext, factory: Any = None) -> None:
        self.cluster = cluster
        self.factory = factory
        self.groups: dict[int, PipelineGroup] = {}
        self.member_of: dict[int, int] = {}  # instance id -> group id
        self.events_log: list[tuple[float, str, dict]] = []  # (time, kind, details): drops, restores, faults
        self._finished_groups: list[dict] = []
        self._waiting: list[Any] = []  # forms and splits waiting for their instances' steps to end

    def _log(self, kind: str, **details: Any) -> None:
        self.events_log.append((self.cluster.now_s, kind, details))

    # ---- helpers ----
    def _need_factory(self, what: str):
        if self.factory is None or not hasattr(self.factory, "hardware"):
            raise NotImplementedError(f"{what}: this cluster's instances cannot be rebuilt at run time")
        return self.factory

    def _quiesce(self, d: InstanceDriver) -> None:
        c = self.cluster
        if d.run is not None:
            cut = d.interrupt(c.now_s)
            if cut is not None:
                c.push_step_done(d, cut)

    def _physical(self, instance_id: int) -> InstanceDriver:
        gid = self.member_of.get(instance_id)
        if gid is not None:
            return next(m for m in self.groups[gid].members if m.instance_id == instance_id)
        return self.cluster.drivers[instance_id]

    def _submit(self, lk, job: LinkJob) -> None:
        c = self.cluster
        end = lk.submit(job, c.now_s)
        if end is not None:
            c.events.push(end, EventKind.TRANSFER_DONE, lk.key)

    # ---- pipeline groups ----
    def _form(self, a: FormPipeline) -> None:
        factory = self._need_factory("FormPipeline")
        c = self.cluster
        ids = list(a.instance_ids)
        if len(ids) < 2 or len(set(ids)) != len(ids):
            raise ValueError(f"FormPipeline needs two or more distinct instances, got {ids}")
        olds = list(dict.fromkeys(self.member_of[i] for i in ids if i in self.member_of))  # groups merged (whole)
        for iid in ids:
            if iid not in self.member_of and (iid not in c.active or iid in self.groups):
                raise ValueError(f"FormPipeline: instance {iid} is not an active single instance")
        if any(not {m.instance_id for m in self.groups[g].members} <= set(ids) or c.drivers[g].runtime.reserved
               for g in olds):
            raise ValueError(f"FormPipeline: a group merges whole into a new one, once its exchange landed ({ids})")
        if olds and getattr(factory, "group_executor", None) is not None:
            raise NotImplementedError("FormPipeline: merging groups whose executors hold real KV")
        units = [c.drivers[i] for i in ids if i not in self.member_of] + [c.drivers[g] for g in olds]
        for d in units:
            self._quiesce(d)
        if any(d.busy for d in units):  # at the end of the steps in flight; none starts another
            for d in units:
                d.paused = True
            self._waiting.append(a)
            return
        for d in units:
            d.paused = False
        carried = [(req, [ids.index(h) for h in holders], tokens) for gid in olds for req, holders, tokens
                   in self._dissolve(gid)]
        members = [c.drivers[iid] for iid in ids]
        gid = ids[0]
        links = [c.mover.link(ids[k], ids[k + 1]) for k in range(len(ids) - 1)]
        model = members[0].spec.model_spec
        make_group = getattr(factory, "group_executor", None)  # the engine runs stages; the simulator times them
        executor = make_group(members, links, a, gid) if make_group is not None else \
            PipelineExecutor([m.cost_model for m in members], links,
                                    hidden_bytes_per_token=model.hidden_size * members[0].spec.dtype_bytes,
                                    num_microbatches=a.num_microbatches, clock=lambda: c.now_s, overlap=a.overlap,
                                    former=a.former if a.former is not None else
                                    getattr(factory, "microbatch_former", lambda *_: None)(gid))
        blocks = _group_blocks(executor, members)
        first = members[0].runtime
        kv = KVCacheConfig(first.blocks.block_size, blocks, 0, first.blocks.config.watermark)
        limits = InstanceLimits(a.max_batch_tokens or first.max_batch_tokens, a.max_num_seqs or first.max_num_seqs)
        runtime = InstanceRuntime(gid, kv, limits, first.role, cost_model=executor, spec=members[0].spec)
        group_driver = InstanceDriver(runtime, factory.policy(gid), executor, c.collector,
                                      flops_per_token=sum(m.flops_per_token for m in members),
                                      fast_forward=False, spec=members[0].spec, cost_model=executor)
        group_driver.kv_bytes_per_token = sum(m.kv_bytes_per_token for m in members)
        group_driver.listener = members[0].listener  # a trace recorder (or the server) hears the group's steps too
        group = PipelineGroup(gid, members, executor, c.now_s)
        self.groups[gid] = group
        # members' requests move in after exchanging the KV of the layers the others now hold
        exchange: list[tuple[Request, int, int]] = []  # (request, from member index, tokens)
        for k, m in enumerate(members):
            for req in list(m.runtime.waiting) + list(m.runtime.running):
                exchange.append((req, k, req.num_computed_tokens))
            if m.runtime.swapped or m.runtime.reserved or m.runtime.detached:
                raise ValueError(f"FormPipeline: instance {m.instance_id} holds swapped, reserved or detached "
                                 f"requests; settle them first")
        for iid in ids:
            self.member_of[iid] = gid
        for iid in ids[1:]:
            c.active.discard(iid)
        c.drivers[gid] = group_driver
        c.view.rebuild()
        self._log("form", group=gid, members=ids)
        copy_kv = getattr(executor, "exchange_kv", None)  # an executor holding real KV copies it
        old_tables = {req.request_id: list(members[k].runtime.blocks.block_table(req.request_id))
                      for req, k, _ in exchange} if copy_kv is not None else {}
        for req, k, tokens in exchange:
            m = members[k]
            m.runtime.blocks.free(req.request_id)
            m.policy.on_finish(c.now_s, req)
        exchange += [(req, held[0], tokens) for req, held, tokens in carried]  # a merged group's keep their KV
        holders = {req.request_id: held for req, held, _ in carried}  # members already holding it
        if a.exchange_chunk_bytes is None:
            for req, k, tokens in exchange:
                self._exchange_in(group, req, k, tokens, holders.get(req.request_id))
        else:
            self._exchange_chunked(group, exchange, a.exchange_chunk_bytes, holders)
        if copy_kv is not None:
            copy_kv([(k, old_tables[req.request_id], list(group_driver.runtime.blocks.block_table(req.request_id)),
                      tokens) for req, k, tokens in exchange if tokens])
        c.kick(gid)

    def _dissolve(self, gid: int) -> list[tuple[Request, list[int], int]]:
        """A group merging into a larger one: its members stand alone again (with the layers
        they hold) and its requests leave with the members that hold their KV."""
        c = self.cluster
        group, gd = self.groups.pop(gid), c.drivers[gid]
        reqs = list(gd.runtime.waiting) + list(gd.runtime.running)
        for req in reqs:
            gd.runtime.blocks.free(req.request_id)
            gd.policy.on_finish(c.now_s, req)
        self._release(group)
        self._log("merge", group=gid, members=[m.instance_id for m in group.members])
        held = [m.instance_id for m in group.members]
        return [(req, held, req.num_computed_tokens) for req in reqs]

    def _exchange_chunked(self, group: PipelineGroup, exchange: list, chunk_bytes: float,
                          holders: dict[int, list[int]] | None = None) -> None:
        """KunServe's exchange as streams: per link, every request's KV back to back, cut into
        chunks of ``chunk_bytes`` (activations pass between chunks; ``inf`` is one bulk job that
        holds the link to the end). A request joins when the chunk holding its last byte has
        landed on every other stage."""
        c = self.cluster
        gd = c.drivers[group.group_id]
        pending: dict[int, int] = {}
        streams: dict[tuple[int, int], list[tuple[Request, float]]] = {}
        for req, k, tokens in exchange:
            if not tokens:
                req.status = RequestStatus.QUEUED
                c.add_to(gd, req)
                continue
            gd.runtime.reserve(req, tokens)
            req.status = RequestStatus.TRANSFERRING
            held = (holders or {}).get(req.request_id) or [k]
            for j, dst in enumerate(group.members):
                if j not in held:
                    streams.setdefault((k, j), []).append((req, tokens * dst.kv_bytes_per_token))
                    pending[req.request_id] = pending.get(req.request_id, 0) + 1

        start_s, stalls = c.now_s, []

        def part_landed(req: Request) -> None:
            pending[req.request_id] -= 1
            if pending[req.request_id] == 0:
                stalls.append(c.now_s - start_s)
                if req.request_id in gd.runtime.reserved:
                    c.add_to(gd, req)
                    c.kick(group.group_id)
                if len(stalls) == len(pending):  # the whole exchange landed
                    self._log("exchanged", group=group.group_id, seconds=c.now_s - start_s,
                              num_requests=len(stalls), stall_s=sum(stalls),
                              bytes=sum(n for parts in streams.values() for _, n in parts))

        for (k, j), parts in streams.items():
            src, dst = group.members[k], group.members[j]
            lk = c.mover.link(src.instance_id, dst.instance_id)
            total = sum(n for _, n in parts)
            ends, offset = [], 0.0
            for req, n in parts:
                offset += n
                ends.append((offset, req))
            sent, idx = 0.0, 0
            for size in chunk_sizes(total, chunk_bytes):
                sent += size
                done = []
                while idx < len(ends) and ends[idx][0] <= sent * (1 + 1e-12):
                    done.append(ends[idx][1])
                    idx += 1

                def landed(now_s: float, done=done) -> None:
                    for req in done:
                        part_landed(req)

                self._submit(lk, LinkJob(size, Priority.KV, landed, label=f"exchange i{src.instance_id}"))
            c.mover.transfers.append((src.instance_id, dst.instance_id, c.now_s, float("nan"), total))

    def _exchange_in(self, group: PipelineGroup, req: Request, member_index: int, tokens: int,
                     held: list[int] | None = None) -> None:
        """A member's request joins the group: its KV for the other stages' layers crosses over
        (``held``: the members that already hold theirs, a merged group's)."""
        c = self.cluster
        gd = c.drivers[group.group_id]
        if not tokens:
            req.status = RequestStatus.QUEUED
            c.add_to(gd, req)
            return
        gd.runtime.reserve(req, tokens)
        req.status = RequestStatus.TRANSFERRING
        src = group.members[member_index]
        pending = [0]

        def landed(now_s: float) -> None:
            pending[0] -= 1
            if pending[0] == 0 and req.request_id in gd.runtime.reserved:
                c.add_to(gd, req)
                c.kick(group.group_id)

        for k, dst in enumerate(group.members):
            if k in (held or [member_index]):
                continue
            nbytes = tokens * dst.kv_bytes_per_token
            lk = c.mover.link(src.instance_id, dst.instance_id)
            pending[0] += 1
            end = lk.submit(LinkJob(nbytes, Priority.KV, landed, label=f"exchange r{req.request_id}"), c.now_s)
            if end is not None:
                c.events.push(end, EventKind.TRANSFER_DONE, lk.key)
            c.mover.transfers.append((src.instance_id, dst.instance_id, c.now_s, float("nan"), nbytes))

    def _refresh_group(self, group: PipelineGroup) -> None:
        c = self.cluster
        gd = c.drivers[group.group_id]
        group.executor.stage_costs = [m.cost_model for m in group.members]
        blocks = _group_blocks(group.executor, group.members)
        self._quiesce(gd)
        gd.runtime.resize(blocks)
        gd.kv_bytes_per_token = sum(m.kv_bytes_per_token for m in group.members)

    def _split(self, a: SplitPipeline) -> None:
        self._need_factory("SplitPipeline")
        c = self.cluster
        group = self.groups.get(a.group_id)
        if group is None:
            raise ValueError(f"SplitPipeline: no pipeline group {a.group_id}")
        for m in group.members:
            if m.spec.layers is not None:
                raise ValueError(f"SplitPipeline: instance {m.instance_id} still holds only layers "
                                 f"{m.spec.layers}; restore them first (SetLayers)")
        gd = c.drivers[a.group_id]
        self._quiesce(gd)
        if gd.busy:  # at the end of the step in flight
            gd.paused = True
            self._waiting.append(a)
            return
        reqs = list(gd.runtime.waiting) + list(gd.runtime.running) + list(gd.runtime.reserved.values())
        copy_kv = getattr(group.executor, "split_kv", None)  # an executor holding real KV copies it
        old_tables = {r.request_id: list(gd.runtime.blocks.block_table(r.request_id)) for r in reqs} \
            if copy_kv is not None else {}
        for req in reqs:
            gd.runtime.blocks.free(req.request_id)
            gd.policy.on_finish(c.now_s, req)
        del self.groups[a.group_id]
        self._release(group)
        c.view.rebuild()
        self._log("split", group=a.group_id, members=[m.instance_id for m in group.members])
        # each request goes to the member with the least work, after the KV it lacks arrives
        for i, req in enumerate(reqs):
            target = min(group.members, key=lambda m: (m.runtime.num_outstanding_tokens, m.instance_id))
            tokens = req.num_computed_tokens
            if not tokens:
                req.status = RequestStatus.QUEUED
                c.add_to(target, req)
                continue
            target.runtime.reserve(req, tokens)
            if copy_kv is not None:
                copy_kv(old_tables[req.request_id], target.executor, target.runtime.blocks.block_table(req.request_id),
                        tokens)
            req.status = RequestStatus.TRANSFERRING
            others = [m for m in group.members if m is not target]
            pending = [len(others)]

            def landed(now_s: float, req=req, target=target, pending=pending) -> None:
                pending[0] -= 1
                if pending[0] == 0 and req.request_id in target.runtime.reserved:
                    c.add_to(target, req)
                    c.kick(target.instance_id)

            for src in others:
                nbytes = tokens * target.kv_bytes_per_token / len(group.members)
                lk = c.mover.link(src.instance_id, target.instance_id)
                end = lk.submit(LinkJob(nbytes, Priority.KV, landed, label=f"exchange r{req.request_id}"), c.now_s)
                if end is not None:
                    c.events.push(end, EventKind.TRANSFER_DONE, lk.key)
        for m in group.members:
            c.kick(m.instance_id)

    def _release(self, group: PipelineGroup) -> None:
        """A group ends: its members are schedulable instances again, each with fresh state."""
        c, factory = self.cluster, self.factory
        self._record_group(group)
        for m in group.members:
            self.member_of.pop(m.instance_id, None)
            m.runtime = fresh_runtime(m, factory, m.spec)
            m.policy = factory.policy(m.instance_id)
            m.executor = factory.executor(m.cost_model)
            c.drivers[m.instance_id] = m
            c.active.add(m.instance_id)

    def _record_group(self, group: PipelineGroup) -> None:
        st = group.executor.stats
        self._finished_groups.append({"group": group.group_id, "members": [m.instance_id for m in group.members],
                                      "formed_s": group.formed_s, "ended_s": self.cluster.now_s,
                                      "steps": st.num_steps, "bubble_share": st.bubble_share,
                                      "activation_wait_s": st.activation_wait_s,
                                      "single_microbatch_steps": st.single_microbatch_steps})

    def pipeline_report(self) -> dict[int, dict]:
        out = {}
        for k, rec in enumerate(self._finished_groups):
            out[k] = rec
        for group in self.groups.values():
            st = group.executor.stats
            out[len(out)] = {"group": group.group_id, "members": [m.instance_id for m in group.members],
                             "formed_s": group.formed_s, "ended_s": None, "steps": st.num_steps,
                             "bubble_share": st.bubble_share, "activation_wait_s": st.activation_wait_s,
                             "single_microbatch_steps": st.single_microbatch_steps}
        return out


def chunk_sizes(num_bytes: float, chunk_bytes: float | None) -> list[float]:
    """Sizes of the jobs that carry ``num_bytes`` (one job when ``chunk_bytes`` is None or inf)."""
    if chunk_bytes is None or chunk_bytes == float("inf") or chunk_bytes >= num_bytes or num_bytes <= 0:
        return [num_bytes]
    full, rest = divmod(num_bytes, chunk_bytes)
    return [chunk_bytes] * int(full) + ([rest] if rest > 1e-9 * chunk_bytes else [])


def _group_blocks(executor: Any, members: list[InstanceDriver]) -> int:
    """A group's KV blocks: the smallest member's (every token has KV on every stage), or what
    an executor that holds the stages' caches says they hold (the engine's)."""
    blocks = getattr(executor, "num_gpu_blocks", None)
    return blocks if blocks is not None else min(m.runtime.blocks.num_gpu_blocks for m in members)


def fresh_runtime(d: InstanceDriver, factory: Any, spec) -> InstanceRuntime:
    """An empty runtime for ``d`` holding ``spec``'s layers (a group split or failed), same limits."""
    hw = factory.hardware(spec)
    old = d.runtime
    return InstanceRuntime(d.instance_id, hw.kv_config, InstanceLimits(old.max_batch_tokens, old.max_num_seqs),
                           old.role, cost_model=hw.cost, spec=spec)
