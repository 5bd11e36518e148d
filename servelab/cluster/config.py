"""Cluster configuration: groups of identical instances, a router, the topology between them,
the context-length rule and the cluster's host KV pool.

Frozen and validated on construction (a bad value is a ``UserError``: API users build these
by hand); no I/O. The simulator builds instances from it, and
the real engine cluster reads the same object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from servelab.cluster.links import TopologyConfig
from servelab.core.admission import OVERFLOW_MODES
from servelab.core.errors import UserError
from servelab.core.limits import step_limits_error
from servelab.costmodel.links import LinkSpec

_ROLES = ("mixed", "prefill", "decode")


@dataclass(frozen=True)
class InstanceGroup:
    """``count`` instances of the same hardware, model, parallelism, role and policy."""

    count: int = 1
    role: str = "mixed"
    policy: str = "vllm"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    gpu: str = "A100-80GB"
    model: str = "Llama-2-7B"
    tp: int = 1
    pp: int = 1
    max_batch_tokens: int = 8192
    max_num_seqs: int = 256
    memory_reserve_fraction: float = 0.1
    block_size: int = 16
    host_kv_gb: float = 0.0  # host-memory KV pool for swapping (0 disables swap)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise UserError(f"InstanceGroup.count must be >= 1, got {self.count}")
        if self.role not in _ROLES:
            raise UserError(f"InstanceGroup.role must be one of {_ROLES}, got {self.role!r}")
        if self.tp < 1 or self.pp < 1:
            raise UserError(f"tp and pp must be >= 1, got tp={self.tp} pp={self.pp}")
        if self.max_batch_tokens < 1 or self.max_num_seqs < 1 or self.block_size < 1:
            raise UserError("max_batch_tokens, max_num_seqs and block_size must be >= 1")
        if (why := step_limits_error(self.max_batch_tokens, self.max_num_seqs)) is not None:
            raise UserError(f"InstanceGroup: {why}")
        if not 0 <= self.memory_reserve_fraction < 1:
            raise UserError(f"memory_reserve_fraction must be in [0, 1), got {self.memory_reserve_fraction}")
        if not self.host_kv_gb >= 0:
            raise UserError(f"host_kv_gb must be >= 0, got {self.host_kv_gb}")


def default_link() -> LinkSpec:
    """KV transfer path between instances when none is given: NVLink class inside a node."""
    return LinkSpec(bandwidth_bytes_per_s=300e9, latency_s=10e-6)


@dataclass(frozen=True)
class ClusterConfig:
    """``link``: one link for every pair of instances (overrides the topology; kept for
    studies that want a single figure). ``max_model_len``: the context-length limit applied
    at admission (None: the smallest model context in the cluster); ``on_overflow``: reject
    (vLLM) or truncate (LongBench). ``kv_pool_gb``: the cluster's shared host KV pool."""

    groups: tuple[InstanceGroup, ...] = (InstanceGroup(),)
    router: str = "round_robin"
    router_params: Mapping[str, Any] = field(default_factory=dict)
    link: LinkSpec | None = None
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    max_model_len: int | None = None
    on_overflow: str = "reject"
    kv_pool_gb: float = 0.0

    def __post_init__(self) -> None:
        if not self.groups:
            raise UserError("a cluster needs at least one instance group")
        object.__setattr__(self, "groups", tuple(self.groups))
        if self.max_model_len is not None and self.max_model_len < 2:
            raise UserError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.on_overflow not in OVERFLOW_MODES:
            raise UserError(f"on_overflow must be one of {OVERFLOW_MODES}, got {self.on_overflow!r}")
        if not self.kv_pool_gb >= 0:
            raise UserError(f"kv_pool_gb must be >= 0, got {self.kv_pool_gb}")

    @property
    def num_instances(self) -> int:
        return sum(g.count for g in self.groups)

    def instance_groups(self) -> list[InstanceGroup]:
        """One entry per instance, in instance-id order."""
        return [g for g in self.groups for _ in range(g.count)]


def single_instance(policy: str = "vllm", **kwargs: Any) -> ClusterConfig:
    params = kwargs.pop("policy_params", {})
    return ClusterConfig(groups=(InstanceGroup(policy=policy, policy_params=params, **kwargs),))
