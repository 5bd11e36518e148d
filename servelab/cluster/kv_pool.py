"""The cluster KV pool: host memory shared by every instance, holding requests' KV.

A request parked here keeps its KV (and, on the engine, the bytes) until a Move takes it to
an instance. Capacity is in bytes, since instances with different layers or models store
different bytes per token. The pool only does bookkeeping; the cluster driver charges the
PCIe transfers in and out.

Invariant: ``used_bytes`` equals the sum of the entries' bytes and never exceeds capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servelab.core.request import Request


@dataclass(slots=True)
class PoolEntry:
    request: Request
    num_tokens: int
    num_bytes: int
    payload: Any = None  # the KV bytes on the engine (None in the simulator)


class ClusterKVPool:
    def __init__(self, capacity_bytes: float) -> None:
        if not capacity_bytes >= 0:
            raise ValueError(f"KV pool capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = float(capacity_bytes)
        self.used_bytes = 0
        self.entries: dict[int, PoolEntry] = {}
        self.peak_bytes = 0

    def __contains__(self, request_id: int) -> bool:
        return request_id in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def free_bytes(self) -> float:
        return self.capacity_bytes - self.used_bytes

    def can_hold(self, num_bytes: int) -> bool:
        return num_bytes <= self.free_bytes

    def reserve(self, request: Request, num_tokens: int, num_bytes: int) -> PoolEntry:
        """Set space aside for a request whose KV is on its way in."""
        if request.request_id in self.entries:
            raise ValueError(f"request {request.request_id} is already in the KV pool")
        if not self.can_hold(num_bytes):
            raise MemoryError(f"KV pool: request {request.request_id} needs {num_bytes} bytes, "
                              f"{self.free_bytes:.0f} free")
        entry = PoolEntry(request, num_tokens, num_bytes)
        self.entries[request.request_id] = entry
        self.used_bytes += num_bytes
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)
        return entry

    def remove(self, request_id: int) -> PoolEntry:
        entry = self.entries.pop(request_id)
        self.used_bytes -= entry.num_bytes
        return entry

    def requests(self) -> list[Request]:
        return [e.request for e in self.entries.values()]
