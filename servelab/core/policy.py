"""The one scheduling interface: replica-level policies and cluster-level routers.

A ``SchedulingPolicy`` sees ``now_s`` and an ``InstanceState`` (queues, running set, free KV
blocks, load) and returns the next ``StepPlan``. It never reads a clock, sleeps or does I/O,
and never mutates the state it is shown (the instance runtime applies the plan), so one
policy object drives the simulator and the real engine alike. Policies may keep private
bookkeeping (bins, buckets, candidate buffers) fed by the ``on_*`` hooks.

A ``Router`` places arriving requests on instances of a cluster. It may hold requests back
(central queues, as Multi-Bin's first-completed-batch-first-served across servers) and
release them when an instance becomes idle or a timer it asked for fires; it also picks the
instance that receives a request handed off mid-flight (P/D disaggregation, DynaServe).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, Sequence

from servelab.core.plan import StepPlan, StepResult
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

    @property
    def num_outstanding_tokens(self) -> int: ...

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

    def on_arrival(self, now_s: float, request: Request) -> None:
        """A request joined this instance's waiting queue (new, transferred in, or requeued)."""

    def on_finish(self, now_s: float, request: Request) -> None:
        """A request left this instance for good (finished, rejected, aborted or handed off)."""

    def on_step_done(self, now_s: float, plan: StepPlan, result: StepResult) -> None:
        """Feedback after each step (latency monitors, online boundary estimates)."""

    def next_wakeup_s(self, now_s: float) -> float | None:
        """When an idle instance should ask again even without events (max-wait timers)."""
        return None

    @abstractmethod
    def schedule(self, now_s: float, state: InstanceState) -> StepPlan:
        """The next step for this instance; an empty plan means 'nothing to run now'."""


@dataclass(frozen=True, slots=True)
class Placement:
    """A router decision: put ``request`` on ``instance_id``, or reject it with a reason."""

    request: Request
    instance_id: int | None
    reject_reason: str | None = None


class ClusterState(Protocol):
    instances: Sequence[InstanceState]

    def instances_with_role(self, role: str) -> Sequence[InstanceState]: ...


class Router(ABC):
    name: ClassVar[str] = "?"

    @abstractmethod
    def on_arrival(self, now_s: float, request: Request, cluster: ClusterState) -> list[Placement]:
        """Place a new request now, or hold it and return placements of others (or none)."""

    def on_instance_idle(self, now_s: float, instance_id: int, cluster: ClusterState) -> list[Placement]:
        """An instance ran out of work; routers holding requests may release some."""
        return []

    def on_timer(self, now_s: float, cluster: ClusterState) -> list[Placement]:
        """The wake-up asked for by ``next_wakeup_s`` fired."""
        return []

    def next_wakeup_s(self, now_s: float) -> float | None:
        return None

    def handoff_target(self, now_s: float, request: Request, source_id: int, cluster: ClusterState) -> int:
        """Where a request handed off by ``source_id`` continues (P/D, micro-requests)."""
        raise NotImplementedError(f"router {self.name!r} does not support hand-offs")

    def handoff_point(self, request: Request, instance: InstanceState) -> int | None:
        """Token count at which a request placed on ``instance`` must be handed off (or None)."""
        return None


_PLUGINS = ("servelab.baselines", "servelab.designs")
POLICIES: Registry[SchedulingPolicy] = Registry("policy", _PLUGINS)
ROUTERS: Registry[Router] = Registry("router", _PLUGINS)
