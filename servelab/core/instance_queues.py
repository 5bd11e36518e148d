"""Instance queues: the requests and KV blocks one instance holds, and the changes to them
that do not need a step (arrivals, reservations for incoming KV, moves out, preemption, swaps,
rejection and abort).

``InstanceQueues`` is the state half of ``core.instance.InstanceRuntime``, which adds step
application (a ``StepPlan`` in, a ``StepResult`` back) on top; nothing else subclasses it. The
invariants ``check_invariants`` asserts hold after every public call: a request is in exactly
one of waiting / running / swapped / reserved / detached, running requests are split between
the decode group and the others, and the outstanding-token total equals its definition.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.core.decode_group import DecodeGroup
from servelab.core.kv_blocks import BlockManager, KVCacheConfig
from servelab.core.request import Request, RequestStatus


class PlanError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class InstanceLimits:
    max_batch_tokens: int = 8192  # tokens in one step (activation memory, chunk budget cap)
    max_num_seqs: int = 256  # rows in one step

    def __post_init__(self) -> None:
        if not 1 <= self.max_num_seqs <= self.max_batch_tokens:  # vLLM's rule: a step can decode every row
            raise ValueError(f"instance limits need 1 <= max_num_seqs <= max_batch_tokens, got {self}")


class InstanceQueues:
    """Queues and blocks of one instance.

    Besides the queued requests (waiting, running, swapped) it may hold KV for requests that
    are not scheduled here: ``reserved`` (blocks set aside for a request whose KV is on its
    way in, or parked in a candidate buffer) and ``detached`` (a request that left, whose KV
    is still being copied out). Neither is scheduled; both hold blocks; reserved requests
    count in the load (their work is coming), detached ones do not.

    ``__slots__``: every step reads these fields, and with many instances the object is cold;
    in the object they take no values array of their own to fetch (issue 29).
    """

    __slots__ = ("instance_id", "role", "blocks", "max_batch_tokens", "max_num_seqs", "cost_model", "spec",
                 "waiting", "_running", "_others", "group", "swapped", "reserved", "_reserved_owed", "detached",
                 "_by_id", "num_preemptions", "num_swaps", "load_watch", "_owed", "_inflight_group")

    def __init__(self, instance_id: int, kv: KVCacheConfig, limits: InstanceLimits = InstanceLimits(),
                 role: str = "mixed", *, cost_model=None, spec=None) -> None:
        if role not in ("mixed", "prefill", "decode"):
            raise ValueError(f"instance role must be mixed, prefill or decode, got {role!r}")
        self.instance_id = instance_id
        self.role = role
        self.blocks = BlockManager(kv)
        self.max_batch_tokens = limits.max_batch_tokens
        self.max_num_seqs = limits.max_num_seqs
        self.cost_model = cost_model
        self.spec = spec
        self.waiting: list[Request] = []
        self._running: list[Request] = []
        self._others: dict[int, Request] = {}  # running requests outside the decode group
        self.group: DecodeGroup | None = None  # steady decoders advanced in O(1) (simulator only)
        self.swapped: list[Request] = []
        self.reserved: dict[int, Request] = {}
        self._reserved_owed: dict[int, int] = {}  # the work a reservation added to the load
        self.detached: dict[int, Request] = {}
        self._by_id: dict[int, Request] = {}
        self.num_preemptions = 0
        self.num_swaps = 0
        self.load_watch = None  # called with the instance id whenever the outstanding total changes
        self._owed = 0
        self._inflight_group = 0  # rows of the step in flight that are decode-group members

    def enable_decode_group(self) -> None:
        """Advance steady decoders as one group (for executors that read no per-request state)."""
        if self.group is None:
            self.group = DecodeGroup(self.blocks)

    # ---- read-only views (InstanceState) ----
    @property
    def running(self) -> list[Request]:
        """Requests holding GPU KV and taking steps (their counters brought up to date)."""
        if self.group is not None:
            self.group.sync_all()
        return self._running

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def running_others(self) -> list[Request]:
        """Running requests outside the decode group (all of them when there is none), in order."""
        return list(self._others.values())

    @property
    def num_outstanding_tokens(self) -> int:
        """Work still owed here: sum over requests of prompt + expected output - computed tokens.

        Kept as a running total (routers ask on every arrival; a scan would cost O(queue)).
        """
        return self._owed

    @property
    def _outstanding(self) -> int:
        return self._owed

    @_outstanding.setter
    def _outstanding(self, value: int) -> None:
        """Every change of the total tells ``load_watch`` (a cluster's least-loaded index,
        ``cluster.load_index``), which then re-reads this instance's load instead of all of them."""
        self._owed = value
        if self.load_watch is not None:
            self.load_watch(self.instance_id)

    @property
    def is_idle(self) -> bool:
        return not self._by_id

    @property
    def num_requests(self) -> int:
        return len(self._by_id)

    def has(self, request_id: int) -> bool:
        """True when the request is queued here (waiting, running or swapped)."""
        return request_id in self._by_id

    def get(self, request_id: int) -> Request:
        try:
            return self._by_id[request_id]
        except KeyError:
            raise PlanError(f"instance {self.instance_id}: request {request_id} is not here") from None

    # ---- arrivals ----
    def add(self, request: Request) -> None:
        """Queue a request (new, or transferred in with its KV already computed elsewhere; a
        reserved request's blocks become its KV here)."""
        request.instance_id = self.instance_id
        if self.reserved.pop(request.request_id, None) is not None:  # its KV was reserved here
            self._outstanding -= self._reserved_owed.pop(request.request_id)
        self._outstanding += owed_tokens(request)
        if request.status is not RequestStatus.TRANSFERRING:
            request.status = RequestStatus.QUEUED
        self._by_id[request.request_id] = request
        self.waiting.append(request)

    def can_reserve(self, num_tokens: int) -> bool:
        """Incoming KV is admitted as a new request is: it leaves the watermark free for the
        requests already here to grow (vLLM's decode worker pulls a prefill's KV only when its
        scheduler admits it). Without that, a burst of hand-offs fills every block while nothing
        runs, and each arrival must then give its KV up and recompute. An empty cache takes
        anything that fits. Nor is it pulled while a request swapped out here waits to come
        back: vLLM v0 admits nothing new then, and DistServe's decoding scheduler takes its
        swapped queue first (else landing KV keeps the swapped requests out)."""
        if self.swapped:
            return False
        blocks = self.blocks
        reserve = blocks.watermark_blocks if blocks.num_used_gpu_blocks else 0
        return blocks.blocks_for(num_tokens) + reserve <= blocks.num_free_gpu_blocks

    def reserve(self, request: Request, num_tokens: int) -> None:
        """Set aside KV slots for ``num_tokens`` of a request that is not queued here (its KV is
        on its way in, or it waits in a candidate buffer). Raises MemoryError when short."""
        if request.request_id in self._by_id or request.request_id in self.reserved:
            raise PlanError(f"instance {self.instance_id}: request {request.request_id} is already here")
        self.blocks.allocate(request.request_id, num_tokens)
        self.reserved[request.request_id] = request
        owed = max(owed_tokens(request), 0)
        self._reserved_owed[request.request_id] = owed
        self._outstanding += owed

    def unreserve(self, request_id: int) -> Request:
        """Give back a reservation (the request went elsewhere, or ended)."""
        req = self.reserved.pop(request_id)
        self.blocks.free(request_id)
        self._outstanding -= self._reserved_owed.pop(request_id)
        return req

    def detach(self, request_id: int) -> Request:
        """Take a queued request out of scheduling but keep its KV blocks (a move out begins)."""
        req = self.get(request_id)
        if req.status is RequestStatus.SWAPPED:
            raise PlanError(f"request {request_id} is swapped out; swap it in before moving it")
        self._leave_group(request_id)
        self._outstanding -= owed_tokens(req)
        del self._by_id[request_id]
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self._running:
            self._run_remove(req)
        self.detached[request_id] = req
        return req

    def reattach(self, request_id: int) -> Request:
        """A detached request stays after all (its hand-off target is this instance): its KV
        becomes a reservation here again, ready for ``add``."""
        req = self.detached.pop(request_id)
        self.reserved[request_id] = req
        owed = max(owed_tokens(req), 0)
        self._reserved_owed[request_id] = owed
        self._outstanding += owed
        return req

    def release_detached(self, request_id: int) -> None:
        """The detached request's KV has been copied away: free its blocks."""
        del self.detached[request_id]
        self.blocks.free(request_id)

    def resize(self, num_gpu_blocks: int) -> None:
        """Change the GPU KV capacity (layers dropped or restored, memory given back)."""
        self.blocks.resize(num_gpu_blocks)

    # ---- queue changes ----
    def _admit(self, admitted: list[Request]) -> None:
        """Move admitted requests from waiting to running (usually a prefix of waiting: O(k))."""
        waiting = self.waiting
        k = len(admitted)
        if all(a is w for a, w in zip(admitted, waiting[:k])):
            del waiting[:k]
        else:
            gone = {id(r) for r in admitted}
            self.waiting = [r for r in waiting if id(r) not in gone]
        self._running.extend(admitted)
        others = self._others
        for req in admitted:
            others[req.request_id] = req

    def _run_remove(self, req: Request) -> None:
        self._running.remove(req)
        self._others.pop(req.request_id, None)

    def _dissolve_group(self) -> None:
        for rid in list(self.group.members):
            self._leave_group(rid)

    def _leave_group(self, request_id: int) -> None:
        """A member is touched one by one (preempted, swapped, moved, ended): out of the group."""
        group = self.group
        if group is not None and request_id in group.members:
            self._others[request_id] = group.leave(request_id)

    def _preempt(self, req: Request) -> None:
        if req.status is RequestStatus.TRANSFERRING and self.blocks.is_on_gpu(req.request_id):
            self._preempt_waiting(req)
            return
        if req.status not in _RUNNING:
            raise PlanError(f"request {req.request_id} is {req.status.value}; only running requests and "
                            "handed-off requests queued with their KV are preempted")
        self._leave_group(req.request_id)
        self.blocks.free(req.request_id)
        self._outstanding += req.num_computed_tokens
        req.reset_for_recompute()
        self.num_preemptions += 1
        self._run_remove(req)
        self.waiting.insert(0, req)

    def _preempt_waiting(self, req: Request) -> None:
        """A request handed off here waits with its KV (queued behind one that must recompute):
        dropping that KV is the only way to free memory when nothing else can run."""
        self._outstanding -= owed_tokens(req)
        self.blocks.free(req.request_id)
        req.reset_for_recompute()
        self._outstanding += owed_tokens(req)
        self.num_preemptions += 1

    def _swap_out(self, req: Request) -> list[tuple[int, int]]:
        if req.status not in _RUNNING:
            raise PlanError(f"request {req.request_id} is {req.status.value}; only running requests swap out")
        if not self.blocks.can_swap_out(req.request_id):
            raise PlanError(f"request {req.request_id}: host KV pool is full")
        self._leave_group(req.request_id)
        moved = self.blocks.swap_out(req.request_id)
        req.status = RequestStatus.SWAPPED
        req.num_swaps += 1
        self.num_swaps += 1
        self._run_remove(req)
        self.swapped.append(req)
        return moved

    def _swap_in(self, req: Request) -> list[tuple[int, int]]:
        if req.status is not RequestStatus.SWAPPED:
            raise PlanError(f"request {req.request_id} is {req.status.value}, not swapped")
        if not self.blocks.can_swap_in(req.request_id):
            raise PlanError(f"request {req.request_id}: not enough GPU blocks to swap in")
        moved = self.blocks.swap_in(req.request_id)
        req.status = RequestStatus.DECODING if not req.is_prefill else RequestStatus.PREFILLING
        self.swapped.remove(req)
        self._running.append(req)
        self._others[req.request_id] = req
        return moved

    def _reject(self, request_id: int, reason: str, now_s: float) -> Request:
        req = self.get(request_id)
        self._remove(req)
        req.finish(RequestStatus.REJECTED, now_s, reason)
        return req

    def abort(self, request_id: int, reason: str, now_s: float) -> Request:
        req = self.get(request_id)
        self._remove(req)
        req.finish(RequestStatus.ABORTED, now_s, reason)
        return req

    def _remove(self, req: Request) -> None:
        self._leave_group(req.request_id)
        self._outstanding -= owed_tokens(req)
        self.blocks.free(req.request_id)
        del self._by_id[req.request_id]
        if req.request_id in self._others:
            self._run_remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        elif req in self.swapped:
            self.swapped.remove(req)

    def check_invariants(self) -> None:
        if self.group is not None:
            self.group.sync_all()
            members = self.group.members
            assert all(r.request_id in members or r.request_id in self._others for r in self._running), \
                "a running request is neither in the decode group nor outside it"
            assert not (members.keys() & self._others.keys()), "a request is in and outside the decode group"
            assert len(members) + len(self._others) == len(self._running), "running bookkeeping drifted"
            for rid, req in members.items():
                assert req.status is RequestStatus.DECODING and req.num_pending_tokens == 1, \
                    f"decode group member {rid} is not a steady decoder"
        self.blocks.check_invariants()
        for req in self._by_id.values():
            assert 0 <= req.num_computed_tokens <= req.num_tokens, f"request {req.request_id}: bad token counts"
            assert not req.status.is_terminal, f"request {req.request_id} ended but still on instance"
        assert not (self._by_id.keys() & self.reserved.keys()), "a request is queued and reserved at once"
        assert not (self._by_id.keys() & self.detached.keys()), "a request is queued and detached at once"
        owed = sum(owed_tokens(r) for r in self._by_id.values()) + sum(self._reserved_owed.values())
        assert self._outstanding == owed, "outstanding-token total drifted"
        assert self._reserved_owed.keys() == self.reserved.keys(), "reservation bookkeeping drifted"


def owed_tokens(req: Request) -> int:
    """Work a request still owes its instance: prompt + expected output - computed tokens."""
    return req.num_prompt_tokens + req.spec.expected_output_tokens - req.num_computed_tokens


_RUNNING = frozenset({RequestStatus.PREFILLING, RequestStatus.DECODING})
