"""The one scheduling interface: replica-level policies and cluster-level routers.

A ``SchedulingPolicy`` sees ``now_s`` and an ``InstanceState`` (queues, running set, free KV
blocks, load) and returns the next ``StepPlan``. It never reads a clock, sleeps or does I/O,
and never mutates the state it is shown (the instance runtime applies the plan), so one
policy object drives the simulator and the real engine alike. Policies may keep private
bookkeeping (bins, buckets, candidate buffers) fed by the ``on_*`` hooks.

A ``Router`` places arriving requests on instances of a cluster. It may hold requests back
(central queues, as Multi-Bin's first-completed-batch-first-served across servers) and
release them when an instance becomes idle or a timer it asked for fires; it may decide at
arrival where a request is split and where its second part runs (DynaServe), pick the
instance that receives a request handed off mid-flight (P/D disaggregation), move requests
with their KV between instances, a cluster KV pool and reserved buffers (Llumnix,
AlignedServe), and reconfigure instances (KunServe). It sees every instance's state, cost
model and hardware spec through the ``ClusterState`` it is given, and may hear every step's
outcome (``on_step_done``; called only for routers that override it, so others cost nothing).

Both hear ``on_arrivals_done`` when the workload is finite and its last request has arrived:
a policy that waits for full batches must then run what it holds (no request is stranded).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Sequence

from servelab.core.plan import StepPlan, StepResult, StepShape
from servelab.core.registry import Registry
from servelab.core.request import Request

if TYPE_CHECKING:
    from servelab.core.kv_blocks import BlockManager


class InstanceState(Protocol):
    """Read-only view of one instance that policies and routers may inspect."""

    instance_id: int
    role: str  # "mixed", "prefill" or "decode"
    waiting: Sequence[Request]  # queued, preempted and transferred-in requests, arrival order
    running: Sequence[Request]  # requests holding GPU KV and taking steps
    swapped: Sequence[Request]  # requests whose KV sits in host memory
    blocks: "BlockManager"
    max_batch_tokens: int  # hard cap of one step (activation memory)
    max_num_seqs: int
    reserved: dict[int, Request]  # KV held here for requests not scheduled here (incoming, buffers)
    cost_model: Any  # times a StepShape on this instance (None when unknown)
    spec: Any  # the instance's InstanceSpec (hardware, model, layers) when known

    @property
    def num_outstanding_tokens(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def is_idle(self) -> bool: ...


class SchedulingPolicy(ABC):
    """Base of every replica-level policy. Subclasses register with ``@POLICIES.register``.

    ``stable_under_decode``: a policy sets this when, having returned a plan that decodes
    every running request and nothing else, it would return the same plan at every later
    step until an arrival, a completion or a KV-block shortage (for a padded decode plan: the
    same rows, the padded context one token longer each step). The simulator then
    fast-forwards such stretches in one vectorised jump; the result is identical.
    """

    name: ClassVar[str] = "?"
    stable_under_decode: ClassVar[bool] = False
    # Opt in to the runtime's decode group (servelab.core.decode_group): steady decoders then
    # advance as one, and a request's counters are current only when read through
    # ``state.running`` / ``state.waiting`` (or after it leaves); references a policy keeps
    # from its hooks may lag. ``PlanBuilder.add_group_decodes`` plans the group in O(1).
    uses_decode_group: ClassVar[bool] = False

    def on_arrival(self, now_s: float, request: Request) -> None:
        """A request joined this instance's waiting queue (new, transferred in, or requeued)."""

    def on_finish(self, now_s: float, request: Request) -> None:
        """A request left this instance for good (finished, rejected, aborted or handed off)."""

    def on_step_done(self, now_s: float, plan: StepPlan, result: StepResult, shape: StepShape) -> None:
        """Feedback after each step (latency monitors, online boundary estimates, profile tables)."""

    def on_arrivals_done(self, now_s: float) -> None:
        """No more requests will arrive at this instance from the workload (finite workloads)."""

    def check_instance(self, state: "InstanceState") -> str | None:
        """Why this policy cannot run on ``state``'s instance (a resource it needs is absent), or
        None. Checked once when a cluster is built, so a misconfiguration fails up front."""
        return None

    def next_wakeup_s(self, now_s: float) -> float | None:
        """When an idle instance should ask again even without events (max-wait timers)."""
        return None

    @abstractmethod
    def schedule(self, now_s: float, state: InstanceState) -> StepPlan:
        """The next step for this instance; an empty plan means 'nothing to run now'."""


@dataclass(frozen=True, slots=True)
class Placement:
    """A router decision: put ``request`` on ``instance_id``, or reject it with a reason.

    ``handoff_at_tokens`` / ``handoff_target`` fix a split now (DynaServe): the request runs
    here until ``handoff_at_tokens`` tokens are computed, then continues on ``handoff_target``
    (when None, the router's ``handoff_target`` is asked at hand-off time). With
    ``stream_kv_tokens`` the KV moves to the target while it is computed, in chunks of at
    least that many tokens (overlapped with compute); otherwise in one transfer at hand-off.
    """

    request: Request
    instance_id: int | None
    reject_reason: str | None = None
    handoff_at_tokens: int | None = None
    handoff_target: int | None = None
    stream_kv_tokens: int | None = None


POOL = -1  # the cluster's host-memory KV pool as a Move source or destination


@dataclass(frozen=True, slots=True)
class Move:
    """Move a request with its KV to ``destination`` (an instance id or ``POOL``).

    The request leaves its instance at the next step boundary (stop and copy); its KV crosses
    the link between the two places, chunked by ``chunk_tokens`` (None: one transfer), and
    the destination reserves the blocks when the transfer starts. With ``hold`` the
    destination keeps the KV in a reserved buffer without scheduling the request (a
    candidate buffer, a prefetch); a later Move with ``hold=False`` to the same instance
    makes it runnable there at no transfer cost.
    """

    request: Request
    destination: int
    hold: bool = False
    chunk_tokens: int | None = None
    reason: str = "router"


class ClusterState(Protocol):
    """What routers see: every schedulable instance (state, ``spec``, ``cost_model``), the
    cluster's links and KV pool, and the time."""

    instances: Sequence[InstanceState]
    now_s: float

    def instances_with_role(self, role: str) -> Sequence[InstanceState]: ...

    def outstanding_tokens(self) -> list[int]:
        """Every instance's ``num_outstanding_tokens``, in ``instances`` order, in one call."""
        ...


Action = Any  # Placement, Move, or a reconfiguration from servelab.cluster.reconfig


class Router(ABC):
    name: ClassVar[str] = "?"

    @abstractmethod
    def on_arrival(self, now_s: float, request: Request, cluster: ClusterState) -> list[Action]:
        """Place a new request now, or hold it and return placements of others (or none)."""

    def on_instance_idle(self, now_s: float, instance_id: int, cluster: ClusterState) -> list[Action]:
        """An instance ran out of work; routers holding requests may release some."""
        return []

    def on_timer(self, now_s: float, cluster: ClusterState) -> list[Action]:
        """The wake-up asked for by ``next_wakeup_s`` fired."""
        return []

    def next_wakeup_s(self, now_s: float) -> float | None:
        return None

    def on_step_done(self, now_s: float, instance_id: int, shape: StepShape, finished: Sequence[Request],
                     cluster: ClusterState) -> list[Action]:
        """Every step's outcome on every instance (only routers that override this are called)."""
        return []

    def on_arrivals_done(self, now_s: float, cluster: ClusterState) -> list[Action]:
        """The workload is finite and its last request has arrived: release whatever is held."""
        return []

    def on_moved(self, now_s: float, request: Request, destination: int, cluster: ClusterState) -> list[Action]:
        """A Move (or a hand-off) finished: ``request``'s KV is now at ``destination``."""
        return []

    def handoff_target(self, now_s: float, request: Request, source_id: int, cluster: ClusterState) -> int:
        """Where a request handed off by ``source_id`` continues (P/D, micro-requests; ``POOL``
        parks it in the cluster's host KV pool until a Move takes it to an instance)."""
        raise NotImplementedError(f"router {self.name!r} does not support hand-offs")

    def handoff_point(self, request: Request, instance: InstanceState) -> int | None:
        """Token count at which a request placed on ``instance`` must be handed off (or None)."""
        return None

    def report(self) -> dict:
        """The router's own statistics for the run (a design's drops, splits, pool depth...), in
        plain JSON values; they reach every run's summary.json as ``policy_reports["router"]``."""
        return {}


_PLUGINS = ("servelab.baselines", "servelab.designs")
POLICIES: Registry[SchedulingPolicy] = Registry("policy", _PLUGINS)
ROUTERS: Registry[Router] = Registry("router", _PLUGINS)
