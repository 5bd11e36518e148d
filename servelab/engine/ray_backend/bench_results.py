"""What the Ray backend benchmark measures (``bench.run``) and its report renders
(``bench_report.render``): plain records, torch-free, so the report needs nothing of the runner."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BenchSize:
    transfer_blocks: tuple[int, ...]
    kv_budget_mb: int
    transfer_repeats: int
    requests: int
    rate: float
    max_output: int
    e2e_repeats: int
    grid: str


@dataclass
class BenchResult:
    size: BenchSize
    meta: dict
    model: str
    kv_bytes_per_token: int
    placement: dict
    transfers: list[dict] = field(default_factory=list)  # per transport and size: median seconds
    fits: dict = field(default_factory=dict)  # transport -> (latency s, bandwidth B/s)
    steps: dict = field(default_factory=dict)
    e2e: list[dict] = field(default_factory=list)
    pipeline: list[dict] = field(default_factory=list)  # the activation hand-off between two stage actors
    pipeline_overlap: list[dict] = field(default_factory=list)  # one step's wall time per microbatch count
    gloo_max_bytes: int = 0  # the auto transport's threshold in the runs below
    wall_s: float = 0.0
    cpu_s: float = 0.0
