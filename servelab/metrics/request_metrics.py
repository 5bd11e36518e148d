"""Per-request latency metrics, computed column-wise over a whole run.

``RequestTable.from_requests`` walks the run's ``Request`` objects once and stores their
scalars as numpy columns and every output token's emission time in one flat array
(``token_times_s``) indexed by ``token_offsets`` (row ``i`` owns
``token_times_s[token_offsets[i]:token_offsets[i + 1]]``). Everything else is derived
from those arrays without Python loops, so a run with ~100k requests and millions of
tokens is summarised in well under a second.

Definitions (all in seconds):
    TTFT      first token time - arrival time.
    TPOT      mean gap between consecutive tokens after the first
              ((last - first) / (n - 1)); NaN for a one-token output.
    TBT       every single gap between consecutive tokens of one request.
    e2e       finish time - arrival time (finished requests only; NaN otherwise).
    queueing  first scheduled time - arrival time (NaN when never scheduled).
    SLO met   finished, and TTFT <= ttft_s, TPOT <= tpot_s, max TBT <= tbt_s for each
              target that is set; rejected, aborted or unfinished requests never meet it.
              A finished request with no targets at all meets its (empty) SLO.

Invariants (checked on construction): offsets are non-decreasing and end at the number
of tokens; token times of one request never decrease and never precede its arrival.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from servelab.core.request import SLO, Request, RequestStatus

# ``status`` column codes.
FINISHED, REJECTED, ABORTED, UNFINISHED = 0, 1, 2, 3
STATUS_NAMES = ("finished", "rejected", "aborted", "unfinished")

_NAN = float("nan")


@dataclass(frozen=True, eq=False)
class RequestTable:
    """Columnar view of a run's requests: one row per request, NaN where a value is absent.

    slo_*_s: the request's own SLO targets (NaN means no target for that metric).
    instance_id: the instance the request was last on (-1 when never placed).
    """

    request_id: np.ndarray  # int64 [n]
    arrival_s: np.ndarray  # float64 [n]
    first_scheduled_s: np.ndarray  # float64 [n]
    finish_s: np.ndarray  # float64 [n]
    status: np.ndarray  # int8 [n], codes FINISHED / REJECTED / ABORTED / UNFINISHED
    finish_reason: tuple[str | None, ...]  # [n]
    num_prompt_tokens: np.ndarray  # int64 [n]
    num_output_tokens: np.ndarray  # int64 [n], tokens actually emitted
    num_preemptions: np.ndarray  # int64 [n]
    num_swaps: np.ndarray  # int64 [n]
    instance_id: np.ndarray  # int64 [n]
    slo_ttft_s: np.ndarray  # float64 [n]
    slo_tpot_s: np.ndarray  # float64 [n]
    slo_tbt_s: np.ndarray  # float64 [n]
    slo_e2el_s: np.ndarray  # float64 [n]
    token_offsets: np.ndarray  # int64 [n + 1]
    token_times_s: np.ndarray  # float64 [num_tokens]

    def __post_init__(self) -> None:
        n = len(self.request_id)
        for name in ("arrival_s", "first_scheduled_s", "finish_s", "status", "finish_reason",
                     "num_prompt_tokens", "num_output_tokens", "num_preemptions", "num_swaps",
                     "instance_id", "slo_ttft_s", "slo_tpot_s", "slo_tbt_s", "slo_e2el_s"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"RequestTable.{name} has {len(getattr(self, name))} rows, expected {n}")
        offsets = self.token_offsets
        if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(self.token_times_s):
            raise ValueError("RequestTable.token_offsets must have n + 1 entries from 0 to len(token_times_s)")
        if np.any(np.diff(offsets) < 0):
            raise ValueError("RequestTable.token_offsets must be non-decreasing")
        self._check_token_times()

    def _check_token_times(self) -> None:
        backwards = np.nonzero((np.diff(self.token_times_s) < 0) & self._same_row_mask)[0]
        if len(backwards):
            rows = np.searchsorted(self.token_offsets, backwards, side="right") - 1
            raise ValueError(f"token times go backwards for request ids {_preview(self.request_id[np.unique(rows)])}")
        early = self.request_id[self.ttft_s < 0]
        if len(early):
            raise ValueError(f"first token before arrival for request ids {_preview(early)}")

    # ---- construction ----
    @classmethod
    def from_requests(cls, requests: Sequence[Request]) -> RequestTable:
        """One pass over the requests; token times are flattened without per-token Python work."""
        n = len(requests)
        # float64 [n, 13]; None becomes NaN, ints stay exact below 2**53
        numeric = np.array([_row(r) for r in requests], dtype=np.float64).reshape(n, len(_ROW_FIELDS))
        col = dict(zip(_ROW_FIELDS, numeric.T))
        counts = np.fromiter((len(r.token_times_s) for r in requests), np.int64, count=n)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        times = np.fromiter(itertools.chain.from_iterable(r.token_times_s for r in requests),
                            np.float64, count=int(offsets[-1]))
        ints = {name: col.pop(name).astype(np.int64) for name in _INT_FIELDS}
        status = col.pop("status").astype(np.int8)
        floats = {name: np.ascontiguousarray(values) for name, values in col.items()}
        return cls(**ints, **floats, status=status,
                   finish_reason=tuple(r.finish_reason for r in requests), num_output_tokens=counts,
                   token_offsets=offsets, token_times_s=times)

    def __len__(self) -> int:
        return len(self.request_id)

    # ---- token-level helpers ----
    @cached_property
    def _same_row_mask(self) -> np.ndarray:
        """For each consecutive token pair (a ``np.diff`` position), whether both share a request."""
        total = len(self.token_times_s)
        mask = np.ones(max(total - 1, 0), dtype=bool)
        starts = self.token_offsets[1:-1]
        starts = starts[(starts > 0) & (starts < total)]
        mask[starts - 1] = False
        return mask

    @cached_property
    def num_gaps(self) -> np.ndarray:
        """TBT gaps per row: one fewer than its tokens."""
        return np.maximum(self.num_output_tokens - 1, 0)

    @cached_property
    def tbt_gaps_s(self) -> np.ndarray:
        """Every gap between consecutive tokens of one request, grouped by row in row order."""
        return np.diff(self.token_times_s)[self._same_row_mask]

    @cached_property
    def tbt_gap_row(self) -> np.ndarray:
        """Row index of each entry of ``tbt_gaps_s``."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.num_gaps)

    def gaps_of(self, rows: np.ndarray) -> np.ndarray:
        """TBT gaps of the rows selected by a boolean mask over rows."""
        return self.tbt_gaps_s[np.repeat(rows, self.num_gaps)]

    # ---- per-request metrics ----
    @cached_property
    def first_token_s(self) -> np.ndarray:
        has = self.num_output_tokens > 0
        out = np.full(len(self), _NAN)
        out[has] = self.token_times_s[self.token_offsets[:-1][has]]
        return out

    @cached_property
    def last_token_s(self) -> np.ndarray:
        has = self.num_output_tokens > 0
        out = np.full(len(self), _NAN)
        out[has] = self.token_times_s[self.token_offsets[1:][has] - 1]
        return out

    @cached_property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s

    @cached_property
    def tpot_s(self) -> np.ndarray:
        n = self.num_output_tokens
        out = np.full(len(self), _NAN)
        many = n > 1
        out[many] = (self.last_token_s[many] - self.first_token_s[many]) / (n[many] - 1)
        return out

    @cached_property
    def max_tbt_s(self) -> np.ndarray:
        out = np.full(len(self), _NAN)
        many = self.num_output_tokens > 1
        if many.any():
            gap_starts = np.cumsum(self.num_gaps) - self.num_gaps
            out[many] = np.maximum.reduceat(self.tbt_gaps_s, gap_starts[many])
        return out

    @cached_property
    def e2e_s(self) -> np.ndarray:
        return np.where(self.status == FINISHED, self.finish_s - self.arrival_s, _NAN)

    @cached_property
    def queueing_s(self) -> np.ndarray:
        return self.first_scheduled_s - self.arrival_s

    def slo_met(self, slo: SLO | None = None) -> np.ndarray:
        """Boolean mask of requests meeting their SLO; ``slo`` replaces every request's own."""
        if slo is None:
            ttft_t, tpot_t, tbt_t, e2el_t = self.slo_ttft_s, self.slo_tpot_s, self.slo_tbt_s, self.slo_e2el_s
        else:
            ttft_t, tpot_t, tbt_t, e2el_t = (_NAN if v is None else v
                                             for v in (slo.ttft_s, slo.tpot_s, slo.tbt_s, slo.e2el_s))
        with np.errstate(invalid="ignore"):
            met = self.status == FINISHED
            met &= np.isnan(ttft_t) | (self.ttft_s <= ttft_t)
            met &= np.isnan(tpot_t) | np.isnan(self.tpot_s) | (self.tpot_s <= tpot_t)
            met &= np.isnan(tbt_t) | np.isnan(self.max_tbt_s) | (self.max_tbt_s <= tbt_t)
            met &= np.isnan(e2el_t) | (self.e2e_s <= e2el_t)
        return met

    def has_slo(self, slo: SLO | None = None) -> bool:
        """Whether any target applies (``slo`` given, or some request carries its own): without
        one, "attainment" would only be the finished share."""
        if slo is not None:
            return any(v is not None for v in (slo.ttft_s, slo.tpot_s, slo.tbt_s, slo.e2el_s))
        own = (self.slo_ttft_s, self.slo_tpot_s, self.slo_tbt_s, self.slo_e2el_s)
        return bool(len(self)) and any(not np.all(np.isnan(t)) for t in own)


_ROW_FIELDS = ("request_id", "arrival_s", "first_scheduled_s", "finish_s", "status", "num_prompt_tokens",
               "num_preemptions", "num_swaps", "instance_id", "slo_ttft_s", "slo_tpot_s", "slo_tbt_s",
               "slo_e2el_s")
_INT_FIELDS = ("request_id", "num_prompt_tokens", "num_preemptions", "num_swaps", "instance_id")


def _row(r: Request) -> tuple:
    spec, st = r.spec, r.status
    code = (FINISHED if st is RequestStatus.FINISHED else REJECTED if st is RequestStatus.REJECTED
            else ABORTED if st is RequestStatus.ABORTED else UNFINISHED)
    slo = spec.slo
    targets = (None,) * 4 if slo is None else (slo.ttft_s, slo.tpot_s, slo.tbt_s, slo.e2el_s)
    return (spec.request_id, spec.arrival_time_s, r.first_scheduled_time_s, r.finish_time_s, code,
            spec.num_prompt_tokens, r.num_preemptions, r.num_swaps,
            -1 if r.instance_id is None else r.instance_id, *targets)


def _preview(ids: np.ndarray, limit: int = 10) -> str:
    shown = ", ".join(str(int(i)) for i in ids[:limit])
    return shown + (f" ... ({len(ids)} in all)" if len(ids) > limit else "")
