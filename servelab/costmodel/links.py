"""Point-to-point links (NVLink, network, PCIe) as latency + bytes / bandwidth, and the fit
of that model to measured NCCL send/recv times.

The send/recv profiles (``<gpu>_dgx_send_recv.csv``, Vidur) hold the median time of one
send of ``size`` bytes between two GPUs, either in one node (``devices_per_node`` 2: NVLink)
or in two nodes (``devices_per_node`` 1: the inter-node network).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.catalog.gpus import GPUSpec
from servelab.costmodel.fitting import FitError, fit_error, nonneg_relative_lstsq


@dataclass(frozen=True, slots=True)
class LinkSpec:
    bandwidth_bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0 or self.latency_s < 0:
            raise ValueError(f"invalid {self}: bandwidth must be > 0 and latency >= 0")

    def transfer_time_s(self, num_bytes: float) -> float:
        """Zero bytes cost nothing: no message is sent."""
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s if num_bytes > 0 else 0.0


def nvlink(gpu: GPUSpec, efficiency: float = 1.0, latency_s: float = 0.0) -> LinkSpec:
    return LinkSpec(gpu.nvlink_bandwidth_bytes_per_s * efficiency, latency_s)


def network(gpu: GPUSpec, efficiency: float = 1.0, latency_s: float = 0.0) -> LinkSpec:
    return LinkSpec(gpu.network_bandwidth_bytes_per_s * efficiency, latency_s)


def pcie(gpu: GPUSpec, efficiency: float = 1.0, latency_s: float = 0.0) -> LinkSpec:
    return LinkSpec(gpu.pcie_bandwidth_bytes_per_s * efficiency, latency_s)


@dataclass(frozen=True, slots=True)
class LinkFit:
    link: LinkSpec
    error: FitError


_LINK_KINDS = {2: "nvlink", 1: "network"}  # devices_per_node of a two-GPU send/recv


def fit_send_recv(path: str | Path) -> dict[str, LinkFit]:
    """Fit latency and bandwidth per link kind ("nvlink", "network") to a send/recv profile,
    minimising relative error."""
    sizes: dict[str, list[float]] = {kind: [] for kind in _LINK_KINDS.values()}
    times: dict[str, list[float]] = {kind: [] for kind in _LINK_KINDS.values()}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["collective"] != "send_recv" or int(row["num_workers"]) != 2:
                continue
            kind = _LINK_KINDS.get(int(row["devices_per_node"]))
            if kind is not None:
                sizes[kind].append(float(row["size"]))
                times[kind].append(float(row["time_stats.send_recv.median"]) * 1e-3)
    fits = {}
    for kind in _LINK_KINDS.values():
        if not sizes[kind]:
            continue
        size, time = np.array(sizes[kind]), np.array(times[kind])
        latency, per_byte = nonneg_relative_lstsq(np.column_stack([np.ones_like(size), size]), time)
        if per_byte <= 0:
            raise ValueError(f"{path}: {kind} times do not grow with size; cannot fit a bandwidth")
        fits[kind] = LinkFit(LinkSpec(float(1.0 / per_byte), float(latency)), fit_error(latency + per_byte * size, time))
    if not fits:
        raise ValueError(f"{path}: no two-GPU send_recv rows")
    return fits
