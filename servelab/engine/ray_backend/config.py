"""How the Ray backend starts: where Ray runs, how KV crosses between actors, polling."""

from __future__ import annotations

from dataclasses import dataclass

from servelab.core.errors import UserError

KV_TRANSPORTS = ("auto", "object_store", "gloo")


@dataclass(frozen=True, slots=True)
class RayConfig:
    """``address`` None starts Ray on this machine with ``num_cpus``; else joins that cluster
    (``auto``, ``ray://host:10001`` or ``host:6379``). ``kv_transport``: how KV blocks move
    between actors (``object_store``: the source's copy goes through Ray's shared-memory store;
    ``gloo``: torch.distributed send/recv between the two actors; ``auto``: gloo for transfers
    under ``gloo_max_bytes``, the object store above, the crossover measured in docs/ray.md:
    gloo has the smaller fixed cost, the store the higher bandwidth). ``torch_threads`` per actor
    (None: the CPUs the actor reserved). ``poll_s``: the longest the driver blocks waiting for a
    step before it looks at arrivals again."""

    address: str | None = None
    num_cpus: int = 2
    kv_transport: str = "auto"
    gloo_max_bytes: int = 16 << 20
    torch_threads: int | None = None
    poll_s: float = 0.001

    def __post_init__(self) -> None:
        if self.kv_transport not in KV_TRANSPORTS:
            raise UserError(f"ray kv_transport must be one of {', '.join(KV_TRANSPORTS)}, got {self.kv_transport!r}")
        if self.gloo_max_bytes < 0:
            raise UserError(f"ray gloo_max_bytes must be >= 0, got {self.gloo_max_bytes}")
        if self.num_cpus < 1:
            raise UserError(f"ray num_cpus must be >= 1, got {self.num_cpus}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise UserError(f"ray torch_threads must be >= 1, got {self.torch_threads}")
        if not 0 < self.poll_s <= 1:
            raise UserError(f"ray poll_s must be in (0, 1], got {self.poll_s}")
        if self.address is not None and not self.address.strip():
            raise UserError("ray address is empty (leave it out to start Ray on this machine)")
