"""Collectives and point-to-point transfers from measured NCCL times, by message size.

Input (Vidur): ``profiling/network/<box>/all_reduce.csv`` and the send/recv files: per
(collective, GPUs, GPUs per node, message bytes) the median milliseconds. A family's box:
DGX A100 for the A100 family, DGX H100 for the H100 family, the pairwise-NVLink A40 box for
the A40. What the cost model asks:

- ``all_reduce_s(num_bytes)``: TP's two all-reduces of [tokens, hidden] per layer, on
  ``tp`` GPUs of one node;
- ``send_s(num_bytes)``: PP's activation send between stages (NVLink inside a node, the
  network beyond), and KV hand-offs between instances (``MeasuredLink``).

Tables are ``tables.LogLogTable`` over bytes (monotone; linear in bytes past 64 MiB, the
largest message measured). A GPU whose NVLink differs from the profiled one (A800/H800 cut
to 400 GB/s) reads the table at ``bytes * profiled_bandwidth / its_bandwidth``: a message
on a link half as fast costs what a message twice as large costs on the measured one
(latency is then overstated a little for tiny messages). Where no table exists (TP above
one node, a box without an all-reduce file) the caller falls back to the ring formula and
says so.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path

from servelab.costmodel.links import LinkSpec
from servelab.costmodel.tables import LogLogTable

BOXES = {"a100": "a100_dgx", "h100": "h100_dgx", "a40": "a40_pairwise_nvlink"}
SEND_RECV_FILES = {"a100": "a100_dgx_send_recv.csv", "h100": "h100_dgx_send_recv.csv",
                   "a40": "network/a40_pairwise_nvlink/send_recv.csv"}
_KIND_DEVICES_PER_NODE = {"nvlink": 2, "network": 1}


@functools.lru_cache(maxsize=None)
def _read(path: str, collective: str) -> dict[tuple[int, int], tuple[list[float], list[float]]]:
    out: dict = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["collective"] != collective:
                continue
            xs, ys = out.setdefault((int(row["num_workers"]), int(row["devices_per_node"])), ([], []))
            xs.append(float(row["size"]))
            ys.append(float(row[f"time_stats.{collective}.median"]) * 1e-3)
    return out


@dataclass(frozen=True, eq=False)
class MessageTable:
    table: LogLogTable
    size_scale: float  # bytes are multiplied by this before the lookup (slower links)
    detail: str

    def time_s(self, num_bytes):
        return self.table(num_bytes * self.size_scale)


@functools.lru_cache(maxsize=None)
def all_reduce_table(family: str, num_workers: int, data_dir: str, size_scale: float = 1.0) -> MessageTable | None:
    box = BOXES.get(family)
    path = Path(data_dir) / "profiling" / "network" / str(box) / "all_reduce.csv"
    if box is None or not path.exists():
        return None
    series = _read(str(path), "all_reduce").get((num_workers, num_workers))
    if series is None:
        return None
    note = f" at bytes x {size_scale:.3g} (slower NVLink)" if size_scale != 1.0 else ""
    return MessageTable(LogLogTable.fit(*series, source=f"{box} all_reduce x{num_workers}"), size_scale,
                        f"measured all-reduce on {box}, {num_workers} GPUs in one node{note}")


@functools.lru_cache(maxsize=None)
def send_recv_table(family: str, kind: str, data_dir: str, size_scale: float = 1.0) -> MessageTable | None:
    name = SEND_RECV_FILES.get(family)
    path = Path(data_dir) / "profiling" / str(name)
    if name is None or not path.exists():
        return None
    series = _read(str(path), "send_recv").get((2, _KIND_DEVICES_PER_NODE[kind]))
    if series is None:
        return None
    return MessageTable(LogLogTable.fit(*series, source=f"{name} {kind}"), size_scale,
                        f"measured send/recv over {kind} ({Path(name).name})")


@dataclass(frozen=True, slots=True)
class MeasuredLink(LinkSpec):
    """A link whose transfer time is read from a measured send/recv table; bandwidth and
    latency stay the fitted straight line for code that reasons about them."""

    table: MessageTable | None = None
    lanes: int = 1  # links side by side (an instance's ranks each send their shard)

    def transfer_time_s(self, num_bytes: float) -> float:
        if num_bytes <= 0:
            return 0.0
        if self.table is None:
            return self.latency_s + num_bytes / self.bandwidth_bytes_per_s
        return float(self.table.time_s(float(num_bytes) / self.lanes))
