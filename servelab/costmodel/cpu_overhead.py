"""Per-step CPU overhead of a serving engine, by batch size and TP degree, from measurements.

Input: ``profiling/cpu_overheads/<host>.csv`` (Vidur; vLLM 0.3-0.4 on A100 and A40 hosts):
per (model, batch size 8-128, TP degree) the median milliseconds of the step's CPU-side
phases. The term a step pays while the GPU waits is

    schedule + prepare_inputs_e2e + sampler_e2e + process_model_outputs   (+ ray_comm_time at TP > 1)

(``model_execution_e2e`` is the GPU forward, which the operator tables time). At TP 1 vLLM
runs the model in the driver process, so the measured Ray time there overlaps the step and
is not charged; at TP > 1 every step crosses Ray to the workers (5-7 ms measured).

Which row: the measured (model, TP) whose TP is nearest the instance's, then the model whose
parameter count is nearest; interpolated over batch size (``tables.LogLogTable``: monotone,
linear beyond 128 rows, the batch-8 value below 8, as a step with a handful of rows still
pays the scheduler and sampler launch). The batch is the step's rows (prefill chunks and
decodes); the profile has decode batches only, so a prefill's token count adds nothing here.

These come from one engine of 2024; newer engines overlap scheduling with execution (the
data README says so), which is why the term is named in every run's context and
``--cpu-overhead off`` removes it.
"""

from __future__ import annotations

import csv
import functools
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from servelab.costmodel.tables import LogLogTable

CPU_PHASES = ("schedule_median", "prepare_inputs_e2e_median", "sampler_e2e_median", "process_model_outputs_median")
RAY_COLUMN = "ray_comm_time_mean"
# catalog GPU -> the host file measured with it
MEASURED_HOSTS = {"A100-40GB": "a100", "A100-80GB": "a100", "A40": "a40"}
FLAT_OVERHEAD_S = 1e-3  # the roofline's former flat charge, kept as the "flat" mode


@dataclass(frozen=True, eq=False)
class CPUOverhead:
    """Seconds of CPU work per step as a function of the step's rows."""

    table: LogLogTable | None  # None: a constant
    constant_s: float
    detail: str

    def at(self, rows) -> float:
        if self.table is None:
            return self.constant_s
        return float(self.table.at(max(rows, 1)))

    def dense(self, n: int) -> list[float]:
        """Overhead for 0..n rows (0 rows: no step, no overhead)."""
        if self.table is None:
            return [0.0] + [self.constant_s] * n
        values = self.table.dense(n)
        values[0] = 0.0
        return values


@functools.lru_cache(maxsize=None)
def _read(path: str) -> dict[tuple[str, int], list[tuple[int, float, float]]]:
    rows: dict = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            cpu_s = sum(float(row[c]) for c in CPU_PHASES) * 1e-3
            ray_s = float(row[RAY_COLUMN]) * 1e-3
            rows[(row["model_name"], int(row["tensor_parallel_degree"]))].append((int(row["batch_size"]), cpu_s, ray_s))
    return dict(rows)


def _num_params(model_name: str) -> float | None:
    from servelab.catalog.models import get_model

    try:
        return float(get_model(model_name).num_params)
    except Exception:  # a profiled model outside the catalog: size from its name ("34b", "72B", "20b")
        import re

        m = re.search(r"(\d+(?:\.\d+)?)[bB]", model_name.rsplit("/", 1)[-1])
        return float(m.group(1)) * 1e9 if m else None


def measured_overhead(host: str, model_params: float, tp: int, data_dir: Path) -> CPUOverhead:
    path = data_dir / "profiling" / "cpu_overheads" / f"{host}.csv"
    entries = _read(str(path))

    def distance(entry):
        name, entry_tp = entry
        size = _num_params(name)
        return (abs(entry_tp - tp), abs(math.log(size / model_params)) if size else math.inf, name)

    name, entry_tp = min(entries, key=distance)
    points = entries[(name, entry_tp)]
    charge_ray = tp > 1
    table = LogLogTable.fit([b for b, _, _ in points], [c + (r if charge_ray else 0.0) for _, c, r in points],
                              source=f"{path.name} {name} tp={entry_tp}")
    ray = " + Ray communication (TP > 1)" if charge_ray else ""
    detail = (f"measured {host} host ({path.name}): {name} at TP {entry_tp}, batch "
              f"{min(b for b, _, _ in points)}-{max(b for b, _, _ in points)}: schedule + prepare inputs + "
              f"sampler + output processing{ray}")
    return CPUOverhead(table, 0.0, detail)


def cpu_overhead_for(mode: str, gpu: str, model_params: float, tp: int, data_dir: Path) -> CPUOverhead:
    """``mode``: measured | flat | off (``default_mode`` picks one per GPU)."""
    if mode == "off":
        return CPUOverhead(None, 0.0, "off")
    if mode == "flat":
        return CPUOverhead(None, FLAT_OVERHEAD_S, f"flat {FLAT_OVERHEAD_S * 1e3:g} ms per step (stated, not measured)")
    if mode != "measured":
        from servelab.core.errors import UserError

        raise UserError(f"--cpu-overhead must be measured, flat or off, got {mode!r}")
    host = MEASURED_HOSTS.get(gpu, "a100")
    overhead = measured_overhead(host, model_params, tp, data_dir)
    if gpu not in MEASURED_HOSTS:
        overhead = CPUOverhead(overhead.table, 0.0, f"{overhead.detail} (borrowed: {gpu} was not measured)")
    return overhead


def default_mode(gpu: str) -> str:
    """Measured where it was measured (A100, A40 hosts); the stated flat 1 ms elsewhere."""
    return "measured" if gpu in MEASURED_HOSTS else "flat"
