"""Links as resources: who talks to whom over what, and transfers that queue for a link.

``Topology`` places instances on servers (``gpus_per_server`` GPUs each, instances filled in
order) and picks a link per pair: NVLink inside a server, the network between servers, PCIe
to host memory. Per-GPU figures come from the catalog scaled by the efficiency fitted to the
measured send/recv profiles (``costmodel.links.fit_send_recv``) of the GPU's family, or are
given explicitly (``TopologyConfig``), e.g. a 200 Gb/s RDMA network or no NVLink at all.

A ``Link`` is one direction of one path with occupancy: one job at a time, a priority queue
in front (activations before KV before parameters, FIFO within a priority), so concurrent
transfers queue and a KV transfer cut into chunks lets activations through between chunks.
Jobs are non-preemptive: an activation waits for the chunk in flight, which is why chunk
size matters (KunServe's coordinated exchange). Analytic users (a pipeline step timed at
launch) may ``occupy`` a link for an interval; event-driven jobs start after it.
"""

from __future__ import annotations

import enum
import functools
import heapq
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from servelab.costmodel.links import LinkSpec


class Priority(enum.IntEnum):
    ACTIVATION = 0
    KV = 1
    PARAMS = 2


class LinkKind(str, enum.Enum):
    NVLINK = "nvlink"
    NETWORK = "network"
    PCIE = "pcie"  # GPU <-> host memory (or GPU <-> GPU without NVLink inside a server)


@dataclass(frozen=True)
class TopologyConfig:
    """How instances sit on servers and what connects them.

    ``gpus_per_server``: instances fill servers in id order (an instance of tp*pp GPUs never
    straddles two servers unless it is larger than one). ``nvlink``: whether GPUs inside a
    server have NVLink (False: they talk over PCIe). ``intra_link`` / ``inter_link`` /
    ``host_link`` override the fitted figures (per direction, per GPU).
    """

    gpus_per_server: int = 8
    nvlink: bool = True
    intra_link: LinkSpec | None = None
    inter_link: LinkSpec | None = None
    host_link: LinkSpec | None = None

    def __post_init__(self) -> None:
        if self.gpus_per_server < 1:
            raise ValueError(f"gpus_per_server must be >= 1, got {self.gpus_per_server}")


@functools.lru_cache(maxsize=None)
def fitted_link_figures(gpu: str, data_dir: str | None = None) -> dict[str, LinkSpec]:
    """NVLink, network and PCIe per GPU for a catalog GPU: datasheet bandwidths scaled by the
    efficiency fitted to its family's send/recv profile (A100 and H100 families), with the
    fitted latency; the datasheet with default efficiencies where no profile exists. Where the
    family's send/recv was measured, NVLink and network are ``MeasuredLink``s: a transfer (a
    KV hand-off) takes the measured time for its size (``costmodel.collectives``)."""
    from servelab.catalog.gpus import get_gpu
    from servelab.costmodel.links import fit_send_recv
    from servelab.costmodel.ops import RooflineParams
    from servelab.costmodel.profile_fit import PROFILE_FAMILIES
    from servelab.paths import default_data_dir

    spec = get_gpu(gpu)
    defaults = RooflineParams()
    eff = {"nvlink": (defaults.comm_efficiency, defaults.comm_latency_s),
           "network": (defaults.comm_efficiency, defaults.comm_latency_s)}
    family = PROFILE_FAMILIES.get(spec.name)
    if family is not None:
        path = Path(data_dir or default_data_dir()) / "profiling" / f"{family[0]}_dgx_send_recv.csv"
        if path.exists():
            profiled = get_gpu(family[1])
            peak = {"nvlink": profiled.nvlink_bandwidth_bytes_per_s, "network": profiled.network_bandwidth_bytes_per_s}
            for kind, fit in fit_send_recv(path).items():
                eff[kind] = (min(1.0, fit.link.bandwidth_bytes_per_s / peak[kind]), fit.link.latency_s)
    from servelab.costmodel.collectives import MeasuredLink, send_recv_table

    tables = {"nvlink": None, "network": None}
    if family is not None:
        profiled = get_gpu(family[1])
        scale = {"nvlink": profiled.nvlink_bandwidth_bytes_per_s / spec.nvlink_bandwidth_bytes_per_s,
                 "network": profiled.network_bandwidth_bytes_per_s / spec.network_bandwidth_bytes_per_s}
        root = str(data_dir or default_data_dir())
        tables = {kind: send_recv_table(family[0], kind, root, scale[kind]) for kind in tables}
    return {
        "nvlink": MeasuredLink(spec.nvlink_bandwidth_bytes_per_s * eff["nvlink"][0], eff["nvlink"][1],
                               tables["nvlink"]),
        "network": MeasuredLink(spec.network_bandwidth_bytes_per_s * eff["network"][0], eff["network"][1],
                                tables["network"]),
        "pcie": LinkSpec(spec.pcie_bandwidth_bytes_per_s * defaults.swap_efficiency, defaults.comm_latency_s),
    }


class Topology:
    """Server of every instance and the link spec between any two places."""

    def __init__(self, gpus: list[str], gpus_per_instance: list[int], config: TopologyConfig = TopologyConfig(),
                 override: LinkSpec | None = None) -> None:
        self.config = config
        self.override = override  # one link for every instance pair (the old single-link model)
        self.gpus = list(gpus)
        self.server_of: list[int] = []
        server, used = 0, 0
        for n in gpus_per_instance:
            if used and used + n > config.gpus_per_server:
                server, used = server + 1, 0
            self.server_of.append(server)
            used += n
            if used >= config.gpus_per_server:
                server, used = server + 1, 0
        self.gpus_per_instance = list(gpus_per_instance)

    @property
    def num_servers(self) -> int:
        return max(self.server_of) + 1 if self.server_of else 0

    def kind(self, a: int, b: int) -> LinkKind:
        if self.server_of[a] != self.server_of[b]:
            return LinkKind.NETWORK
        return LinkKind.NVLINK if self.config.nvlink else LinkKind.PCIE

    def spec(self, a: int, b: int) -> LinkSpec:
        """The link from instance ``a`` to instance ``b`` (one direction). An instance of g GPUs
        moves data over g links in parallel (its TP/PP ranks each send their shard)."""
        if self.override is not None:
            return self.override
        c = self.config
        kind = self.kind(a, b)
        if kind is LinkKind.NETWORK:
            base = c.inter_link or fitted_link_figures(self.gpus[a])["network"]
        elif kind is LinkKind.NVLINK:
            base = c.intra_link or fitted_link_figures(self.gpus[a])["nvlink"]
        else:
            base = c.host_link or fitted_link_figures(self.gpus[a])["pcie"]
        return _widen(base, min(self.gpus_per_instance[a], self.gpus_per_instance[b]))

    def host_spec(self, a: int) -> LinkSpec:
        """Instance ``a``'s GPUs to host memory (and back), all ranks in parallel."""
        base = self.config.host_link or fitted_link_figures(self.gpus[a])["pcie"]
        return _widen(base, self.gpus_per_instance[a])


def _widen(link: LinkSpec, lanes: int) -> LinkSpec:
    """``lanes`` links side by side: a measured link carries 1/lanes of the bytes on each."""
    if lanes <= 1:
        return link
    if hasattr(link, "lanes"):
        import dataclasses

        return dataclasses.replace(link, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s * lanes,
                                   lanes=link.lanes * lanes)
    return LinkSpec(link.bandwidth_bytes_per_s * lanes, link.latency_s)


@dataclass(slots=True)
class LinkJob:
    """One piece of data on one link. ``on_start`` runs when it gets the link (it may copy the
    bytes and return how long that really took, for measured transports); ``on_done`` when it
    has crossed."""

    num_bytes: float
    priority: Priority
    on_done: Callable[[float], None]
    on_start: Callable[[], float | None] | None = None
    label: str = ""


class Link:
    """One direction of one path, with a queue. The cluster driver calls ``submit`` and
    ``job_done`` and schedules the end times they return."""

    __slots__ = ("key", "spec", "busy_until_s", "busy_s", "bytes_moved", "num_jobs", "_queue", "_seq", "current",
                 "measured")

    def __init__(self, key: Any, spec: LinkSpec, *, measured: bool = False) -> None:
        self.key = key
        self.spec = spec
        self.measured = measured  # the job's on_start does the copy and reports its real time
        self.busy_until_s = 0.0
        self.busy_s = 0.0
        self.bytes_moved = 0.0
        self.num_jobs = 0
        self._queue: list[tuple[int, int, LinkJob]] = []
        self._seq = 0
        self.current: LinkJob | None = None

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    def submit(self, job: LinkJob, now_s: float) -> float | None:
        """Queue ``job``; returns its end time if it starts now (the caller schedules it)."""
        self._seq += 1
        heapq.heappush(self._queue, (int(job.priority), self._seq, job))
        if self.current is None:
            return self._start_next(now_s)
        return None

    def job_done(self, now_s: float) -> tuple[LinkJob, float | None]:
        """The current job crossed: returns it and the end time of the next one, if any."""
        job = self.current
        self.current = None
        return job, self._start_next(now_s)

    def occupy(self, start_s: float, duration_s: float) -> float:
        """Analytic use (a pipeline step timed at launch): take the link from ``max(start,
        busy_until)`` for ``duration_s``; returns when that ends."""
        begin = max(start_s, self.busy_until_s)
        self.busy_until_s = begin + duration_s
        self.busy_s += duration_s
        return self.busy_until_s

    def _start_next(self, now_s: float) -> float | None:
        if not self._queue:
            return None
        _, _, job = heapq.heappop(self._queue)
        self.current = job
        start = max(now_s, self.busy_until_s)
        measured = job.on_start() if job.on_start is not None else None
        duration = measured if (self.measured and measured is not None) else self.spec.transfer_time_s(job.num_bytes)
        self.busy_until_s = start + duration
        self.busy_s += duration
        self.bytes_moved += job.num_bytes
        self.num_jobs += 1
        return self.busy_until_s
