"""Shared row-level parsing for trace and dataset files, with errors that name file and line.

Loaders read a whole file once, then convert columns with numpy in one call; only when a
vectorised conversion fails do they walk the column again to find the first bad line, so
the fast path stays fast and the error still says exactly where the file is wrong.

Invariant: every error raised here is a ``WorkloadFileError`` whose message starts with
``"<path>:<line>:"`` (1-based line numbers, header is line 1), or ``"<path>:"`` when the
file as a whole cannot be read. Cell values are typed strictly: a JSON ``true`` is not the
number 1, and a token count must be an integer in [min, ``MAX_TOKENS``].
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.core.errors import UserError, shown
from servelab.core.limits import MAX_DURATION_S, MAX_TOKENS


class WorkloadError(UserError):
    """A workload file, row or spec string is malformed; the message says where and why."""


class WorkloadFileError(WorkloadError):
    """A workload file is malformed; the message starts with its path (and line)."""


def fail(path: Path | str, line: int, what: str) -> WorkloadFileError:
    return WorkloadFileError(f"{path}:{line}: {what}")


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
    if not path.exists():
        raise WorkloadFileError(f"{path}: no such file")
    if not path.is_file():
        raise WorkloadFileError(f"{path}: not a regular file")
    return path


def read_text(path: Path | str) -> tuple[Path, str]:
    """The file decoded as UTF-8; a binary or Latin-1 file is an error at its first bad byte."""
    path = open_checked(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise WorkloadFileError(f"{path}: cannot read ({err.strerror})") from None
    try:
        return path, data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        raise fail(path, data.count(b"\n", 0, err.start) + 1,
                   f"not UTF-8 text (byte 0x{data[err.start]:02x} at column {err.start - line_start + 1})") from None


def read_csv(path: Path | str, required: tuple[str, ...]) -> CsvTable:
    """Read a headed CSV; blank lines are skipped, short/long rows and missing columns raise."""
    path, text = read_text(path)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise fail(path, 1, "empty file, expected a header row")
        header = [name.strip().lstrip("\ufeff") for name in header]
        missing = [name for name in required if name not in header]
        if missing:
            raise fail(path, 1, f"missing column(s) {missing}; header is {shown(header, 120)}")
        rows: list[list[str]] = []
        line_numbers: list[int] = []
        num_fields = len(header)
        for row in reader:
            if not row:
                continue
            if len(row) != num_fields:
                raise fail(path, reader.line_num, f"expected {num_fields} fields, got {len(row)}: {shown(row, 80)}")
            rows.append(row)
            line_numbers.append(reader.line_num)
    except csv.Error as err:
        raise fail(path, reader.line_num or 1, f"not valid CSV ({err})") from None
    if not rows:
        raise fail(path, 2, "no data rows")
    return CsvTable(path, {name: i for i, name in enumerate(header)}, rows, line_numbers)


def read_jsonl(path: Path | str, required: tuple[str, ...]) -> tuple[Path, list[dict], list[int]]:
    """Parse one JSON object per non-blank line; every object must hold the ``required`` keys."""
    path, text = read_text(path)
    records: list[dict] = []
    line_numbers: list[int] = []
    for line_number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise fail(path, line_number, f"invalid JSON ({err.msg} at column {err.colno})") from None
        except (ValueError, RecursionError) as err:  # a number beyond int's digit limit, deep nesting
            raise fail(path, line_number, f"unreadable JSON ({type(err).__name__}: {shown(str(err), 80)})") from None
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


def _json_strings(values: list, name: str, path: Path, line_numbers: list[int]) -> None:
    """A JSON file's numbers are JSON numbers: ``"350"`` is a string that only looks like one
    (a reader that took it would read rows the producer never wrote as numbers)."""
    for i, value in enumerate(values):
        if isinstance(value, str):
            raise fail(path, line_numbers[i], f"{name} must be a JSON number, got the string {shown(value)}")


def int_column(values: list, name: str, path: Path, line_numbers: list[int], min_value: int,
               max_value: int = MAX_TOKENS, *, json: bool = False) -> np.ndarray:
    """Convert a column to int64 in [min_value, max_value]; on any bad value, raise naming
    the first offending line. ``json``: the values came from JSON, where a string is wrong."""
    if json:
        _json_strings(values, name, path, line_numbers)
    array = _try_int_array(values)
    if array is None:
        numbers = []
        for i, value in enumerate(values):
            number = _as_int(value)
            if number is None:
                raise fail(path, line_numbers[i], f"{name} must be an integer, got {shown(value)}")
            if not min_value <= number <= max_value:
                raise fail(path, line_numbers[i], f"{name} must be in [{min_value}, {max_value:,}], got {shown(value)}")
            numbers.append(number)
        return np.array(numbers, dtype=np.int64)
    bad = np.flatnonzero((array < min_value) | (array > max_value))
    if bad.size:
        i = int(bad[0])
        raise fail(path, line_numbers[i], f"{name} must be in [{min_value}, {max_value:,}], got {shown(values[i])}")
    return array


def _try_int_array(values: list) -> np.ndarray | None:
    """The vectorised path: all digit strings (CSV) or all exact ints (JSON); None if unsure."""
    try:
        if all(type(value) is str for value in values) or all(type(value) is int for value in values):
            return np.array(values, dtype=np.int64)
    except (ValueError, OverflowError):
        return None
    return None


_DIGITS = re.compile(r"\s*[+-]?\d+\s*")
_TOO_LARGE = 1 << 64  # stands for an integer too long for int(); any range check rejects it


def _as_int(value: object) -> int | None:
    """An integer cell as int; None for anything that is not one (booleans included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return _TOO_LARGE if _DIGITS.fullmatch(value) else None
    return None


def float_column(values: list, name: str, path: Path, line_numbers: list[int], min_value: float, *,
                 json: bool = False) -> np.ndarray:
    """Convert a column to finite float64 (>= ``min_value``), naming the first bad line.
    ``json``: the values came from JSON, where a string is wrong."""
    if json:
        _json_strings(values, name, path, line_numbers)
    array = None
    if all(isinstance(value, (str, int, float)) and not isinstance(value, bool) for value in values):
        try:
            array = np.array(values, dtype=np.float64)
        except (ValueError, TypeError, OverflowError):
            array = None
    if array is not None and array.ndim == 1 and array.size == len(values):
        ok = np.isfinite(array) & (array >= min_value)
        if ok.all():
            return array
        i = int(np.flatnonzero(~ok)[0])
        raise fail(path, line_numbers[i], f"{name} must be a finite number >= {min_value}, got {shown(values[i])}")
    for i, value in enumerate(values):
        try:
            if isinstance(value, bool):
                raise TypeError
            number = float(value)  # type: ignore[arg-type]
        except (ValueError, TypeError, OverflowError):
            raise fail(path, line_numbers[i], f"{name} must be a number, got {shown(value)}") from None
        if not (np.isfinite(number) and number >= min_value):
            raise fail(path, line_numbers[i], f"{name} must be a finite number >= {min_value}, got {shown(value)}")
    raise fail(path, line_numbers[0], f"{name}: could not read the column as numbers")


def check_span(arrival_s: np.ndarray, name: str, path: Path, line_numbers: list[int]) -> None:
    """Arrival times must span at most ``MAX_DURATION_S`` (beyond it a float clock stalls)."""
    if arrival_s.size and arrival_s.max() - arrival_s.min() > MAX_DURATION_S:
        i = int(np.argmax(arrival_s))
        raise fail(path, line_numbers[i], f"{name} lies {arrival_s[i] - arrival_s.min():.3g} s after the first "
                                          f"arrival; a trace may span at most {MAX_DURATION_S:.0e} s")
