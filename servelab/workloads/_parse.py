"""Shared row-level parsing for trace and dataset files, with errors that name file and line.

Loaders read a whole file once, then convert columns with numpy in one call; only when a
vectorised conversion fails do they walk the column again to find the first bad line, so
the fast path stays fast and the error still says exactly where the file is wrong.

Invariant: every error raised here is a ``WorkloadError`` whose message starts with
``"<path>:<line>:"`` (1-based line numbers, header is line 1).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class WorkloadError(ValueError):
    """A workload file, row or spec string is malformed; the message says where and why."""


def fail(path: Path | str, line: int, what: str) -> WorkloadError:
    return WorkloadError(f"{path}:{line}: {what}")


@dataclass(frozen=True, slots=True)
class CsvTable:
    """The data rows of a CSV file, each with its 1-based line number in the file."""

    path: Path
    columns: dict[str, int]  # column name -> field index
    rows: list[list[str]]
    line_numbers: list[int]

    def column(self, name: str) -> list[str]:
        index = self.columns[name]
        return [row[index] for row in self.rows]


def open_checked(path: Path | str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"{path}: no such file")
    return path


def read_csv(path: Path | str, required: tuple[str, ...]) -> CsvTable:
    """Read a headed CSV; blank lines are skipped, short/long rows and missing columns raise."""
    path = open_checked(path)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise fail(path, 1, "empty file, expected a header row")
        header = [name.strip().lstrip("\ufeff") for name in header]
        missing = [name for name in required if name not in header]
        if missing:
            raise fail(path, 1, f"missing column(s) {missing}; header is {header}")
        rows: list[list[str]] = []
        line_numbers: list[int] = []
        num_fields = len(header)
        for row in reader:
            if not row:
                continue
            if len(row) != num_fields:
                raise fail(path, reader.line_num, f"expected {num_fields} fields, got {len(row)}: {row!r}")
            rows.append(row)
            line_numbers.append(reader.line_num)
    if not rows:
        raise fail(path, 2, "no data rows")
    return CsvTable(path, {name: i for i, name in enumerate(header)}, rows, line_numbers)


def read_jsonl(path: Path | str, required: tuple[str, ...]) -> tuple[Path, list[dict], list[int]]:
    """Parse one JSON object per non-blank line; every object must hold the ``required`` keys."""
    path = open_checked(path)
    records: list[dict] = []
    line_numbers: list[int] = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise fail(path, line_number, f"invalid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(record, dict):
                raise fail(path, line_number, f"expected a JSON object, got {type(record).__name__}")
            missing = [key for key in required if key not in record]
            if missing:
                raise fail(path, line_number, f"missing key(s) {missing}")
            records.append(record)
            line_numbers.append(line_number)
    if not records:
        raise fail(path, 1, "no records")
    return path, records, line_numbers


def int_column(values: list, name: str, path: Path, line_numbers: list[int], min_value: int | None) -> np.ndarray:
    """Convert a column to int64; on any bad value, raise naming the first offending line."""
    array = _try_int_array(values)
    if array is None:
        for i, value in enumerate(values):
            if not _is_int_like(value):
                raise fail(path, line_numbers[i], f"{name} must be an integer, got {value!r}")
        array = np.array([int(float(v)) if isinstance(v, float) else int(v) for v in values], dtype=np.int64)
    if min_value is not None:
        bad = np.flatnonzero(array < min_value)
        if bad.size:
            i = int(bad[0])
            raise fail(path, line_numbers[i], f"{name} must be >= {min_value}, got {values[i]!r}")
    return array


def _try_int_array(values: list) -> np.ndarray | None:
    """The vectorised path: digit strings (CSV) or exact Python ints (JSON); None if unsure."""
    try:
        if values and isinstance(values[0], str):
            return np.array(values, dtype=np.int64)
        if all(type(value) is int for value in values):
            return np.array(values, dtype=np.int64)
    except (ValueError, OverflowError):
        return None
    return None


def float_column(values: list, name: str, path: Path, line_numbers: list[int], min_value: float | None) -> np.ndarray:
    """Convert a column to finite float64 (>= ``min_value``), naming the first bad line."""
    try:
        array = np.array(values, dtype=np.float64)
    except (ValueError, TypeError):
        array = None
    if array is not None and array.ndim == 1:
        ok = np.isfinite(array) & (array >= min_value if min_value is not None else True)
        if ok.all():
            return array
        i = int(np.flatnonzero(~ok)[0])
        raise fail(path, line_numbers[i], f"{name} must be a finite number >= {min_value}, got {values[i]!r}")
    for i, value in enumerate(values):
        try:
            float(value)
        except (ValueError, TypeError):
            raise fail(path, line_numbers[i], f"{name} must be a number, got {value!r}") from None
    raise fail(path, line_numbers[0], f"{name}: could not read the column as numbers")


def _is_int_like(value: object) -> bool:
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, str):
        try:
            int(value.strip())
        except ValueError:
            return False
        return True
    return False
