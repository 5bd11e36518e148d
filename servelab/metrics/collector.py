"""Run-time metrics collection: what the simulator or engine reports while a run goes on.

``MetricsCollector`` sits in the simulator's hot loop, so each call only appends one record's
eleven numbers to a flat ``array('d')`` (88 bytes a step, written in sequence; as a tuple of
Python numbers a record took about 400 bytes in objects scattered over the heap, which at a
million requests was gigabytes and, with many instances, cache lines taken from the
instances' own state; issue 29); every ``CHUNK_STEPS`` records the array becomes one float64
block, and the columns become numpy arrays the first time they are read after a change. No summarising happens here: ``summary.summarize`` reads
the arrays this module exposes.

Step records are samples taken at each step's start: KV blocks in use and queue lengths
hold from that step's start until the same instance's next step (or, for its last step,
until that step ends). Cluster-wide series (``cluster_series``) add the per-instance step
functions together.

Invariants: per instance, steps are reported in start-time order; durations and counts
are non-negative (checked when the columns are built, with the offending step named).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from servelab.core.request import Request

PREEMPTION_KINDS = ("recompute", "swap")

CHUNK_STEPS = 1 << 16  # step records kept in the flat array before they are packed into a float64 block

# Column order of a step record.
STEP_COLUMNS = ("instance_id", "start_s", "duration_s", "num_tokens", "num_rows", "num_padding_tokens",
                "kv_used_blocks", "kv_total_blocks", "num_waiting", "num_running", "flops")


@dataclass(frozen=True, eq=False)
class StepColumns:
    """All recorded steps as numpy columns, in report order (float64 except instance_id).

    num_tokens: real tokens the step computed; num_padding_tokens: extra tokens computed only
    because the step ran as a dense padded batch. flops: NaN where not reported.
    """

    instance_id: np.ndarray
    start_s: np.ndarray
    duration_s: np.ndarray
    num_tokens: np.ndarray
    num_rows: np.ndarray
    num_padding_tokens: np.ndarray
    kv_used_blocks: np.ndarray
    kv_total_blocks: np.ndarray
    num_waiting: np.ndarray
    num_running: np.ndarray
    flops: np.ndarray

    def __len__(self) -> int:
        return len(self.start_s)

    @cached_property
    def series_order(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(order, first_of_instance, by_time): steps sorted by instance then time, where each
        instance's run starts in that order, and the permutation of it back to time order."""
        order = np.lexsort((self.start_s, self.instance_id))
        inst = self.instance_id[order]
        first_of_instance = np.concatenate(([True], inst[1:] != inst[:-1]))
        by_time = np.argsort(self.start_s[order], kind="stable")
        return order, first_of_instance, by_time


class MetricsCollector:
    """Accumulates step records, preemptions and ended requests for one run."""

    def __init__(self) -> None:
        self._steps = array("d")  # the records since the last packed block, NUM_FIELDS numbers each
        self._blocks: list[np.ndarray] = []  # packed records, [CHUNK_STEPS x len(STEP_COLUMNS)] each
        self._num_packed = 0
        self._preemptions: list[tuple[int, float, str]] = []
        self.ended_requests: list[Request] = []
        self._columns: StepColumns | None = None

    # ---- hot-path hooks ----
    def on_step(self, instance_id: int, start_s: float, duration_s: float, num_tokens: int, num_rows: int,
                num_padding_tokens: int, kv_used_blocks: int, kv_total_blocks: int, num_waiting: int,
                num_running: int, flops: float | None = None) -> None:
        steps = self._steps
        steps.extend((instance_id, start_s, duration_s, num_tokens, num_rows, num_padding_tokens,
                      kv_used_blocks, kv_total_blocks, num_waiting, num_running, _NAN if flops is None else flops))
        self._columns = None
        if len(steps) >= CHUNK_STEPS * NUM_FIELDS:
            self._pack()

    def _pack(self) -> None:
        """The records so far become one float64 block (flops None -> NaN, as in the columns)."""
        table = _table(self._steps)
        self._blocks.append(table)
        self._num_packed += len(table)
        self._steps = array("d")

    def on_preemption(self, instance_id: int, now_s: float, kind: str) -> None:
        if kind not in PREEMPTION_KINDS:
            raise ValueError(f"preemption kind must be one of {PREEMPTION_KINDS}, got {kind!r} "
                             f"(instance {instance_id} at t={now_s})")
        self._preemptions.append((instance_id, now_s, kind))

    def on_request_end(self, request: Request) -> None:
        times = request.token_times_s
        if type(times) is list and len(times) > 8:  # no more tokens come: drop the list's growth slack
            request.token_times_s = times[:]  # (about 12% of the request's largest record)
        self.ended_requests.append(request)

    # ---- read side ----
    @property
    def num_steps(self) -> int:
        return self._num_packed + len(self._steps) // NUM_FIELDS

    @property
    def steps(self) -> StepColumns:
        if self._columns is None:
            blocks = self._blocks + ([_table(self._steps)] if self._steps else [])
            self._columns = _build_columns(blocks)
        return self._columns

    def num_preemptions(self, kind: str) -> int:
        return sum(1 for p in self._preemptions if p[2] == kind)

    @property
    def preemptions(self) -> tuple[tuple[int, float, str], ...]:
        """(instance_id, time_s, kind) of every preemption, in report order."""
        return tuple(self._preemptions)

    @property
    def instance_ids(self) -> np.ndarray:
        return np.unique(self.steps.instance_id)

    def busy_s(self) -> dict[int, float]:
        """Seconds each instance spent running steps."""
        cols = self.steps
        ids, inverse = np.unique(cols.instance_id, return_inverse=True)
        sums = np.bincount(inverse, weights=cols.duration_s, minlength=len(ids))
        return {int(i): float(s) for i, s in zip(ids, sums)}

    def cluster_series(self, column: str) -> tuple[np.ndarray, np.ndarray, float]:
        """Cluster-wide step function of a sampled column (summed over instances).

        Returns (times_s, values, end_s): ``values[k]`` holds on ``[times_s[k], times_s[k+1])``
        and the last value until ``end_s``. Empty arrays and NaN end when nothing was recorded.
        """
        if column not in ("kv_used_blocks", "kv_total_blocks", "num_waiting", "num_running"):
            raise ValueError(f"no time series for column {column!r}")
        cols = self.steps
        if len(cols) == 0:
            return np.empty(0), np.empty(0), float("nan")
        order, first_of_instance, by_time = cols.series_order
        values = getattr(cols, column)[order]
        deltas = np.diff(values, prepend=0.0)  # change at each step of the same instance
        deltas[first_of_instance] = values[first_of_instance]
        times = cols.start_s[order][by_time]
        end_s = float(np.max(cols.start_s + cols.duration_s))
        return times, np.cumsum(deltas[by_time]), end_s


NUM_FIELDS = len(STEP_COLUMNS)
_NAN = float("nan")


def _table(steps: array) -> np.ndarray:
    """The flat records as a float64 table (one row each, a copy: the array is reused)."""
    return np.frombuffer(steps, dtype=np.float64).reshape(-1, NUM_FIELDS).copy()


def _build_columns(blocks: list[np.ndarray]) -> StepColumns:
    if not blocks:
        return StepColumns(*(np.empty(0, dtype=np.int64 if i == 0 else np.float64)
                             for i in range(len(STEP_COLUMNS))))
    table = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
    negative = np.nonzero(np.any(table[:, 2:10] < 0, axis=1))[0]
    if len(negative):
        k = int(negative[0])
        row = table[k].tolist()
        raise ValueError(f"step {k} (instance {int(row[0])}, t={row[1]}) has a negative duration or count: "
                         f"{dict(zip(STEP_COLUMNS, row))}")
    columns = [table[:, i] for i in range(len(STEP_COLUMNS))]
    columns[0] = columns[0].astype(np.int64)
    return StepColumns(*columns)


def time_weighted_mean(times_s: np.ndarray, values: np.ndarray, end_s: float) -> float:
    """Mean of a step function over ``[times_s[0], end_s]``; NaN when it spans no time."""
    if len(times_s) == 0:
        return float("nan")
    widths = np.diff(times_s, append=max(end_s, float(times_s[-1])))
    total = float(widths.sum())
    if total <= 0:
        return float(np.mean(values))
    return float(np.dot(widths, values) / total)


def record_step(collector: MetricsCollector, runtime, start_s: float, duration_s: float, shape, num_waiting: int,
                flops_per_token: float, num_steps: int = 1) -> None:
    """Record ``num_steps`` identical steps of ``shape`` on ``runtime`` (an InstanceRuntime).

    The one place where a step becomes a metrics row, for the simulator and the engine alike:
    padding is the dense rectangle minus the real tokens; KV and queue figures are read off
    the runtime.
    """
    num_tokens = shape.num_tokens * num_steps
    num_rows = len(shape.prefill_tokens) + shape.num_decodes
    pad = shape.padding
    num_padding = (pad.num_rows * pad.row_tokens - shape.num_tokens) * num_steps if pad is not None else 0
    blocks = runtime.blocks
    collector.on_step(runtime.instance_id, start_s, duration_s, num_tokens, num_rows, max(num_padding, 0),
                      blocks.num_used_gpu_blocks, blocks.num_gpu_blocks, num_waiting, runtime.num_running,
                      flops_per_token * num_tokens)
