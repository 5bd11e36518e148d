"""Loaders for timestamped request traces: Azure LLM 2023, Mooncake, BurstGPT.

Each loader returns a workload: a list of ``RequestSpec`` sorted by arrival time, ids
0..n-1, arrival times in seconds since the earliest row (so the first request arrives at
0). Rows are sorted stably by timestamp if the file is out of order; ties keep file order.
A malformed file raises ``WorkloadError`` naming the file, the 1-based line and the problem.

Choices worth knowing:

* Azure ``TIMESTAMP`` is a wall clock with 7 fractional digits (100 ns); it is parsed with
  numpy ``datetime64[ns]`` in one call, which keeps the 19,366-row conv trace well under
  0.5 s. Zero context or generated tokens is an error (the public files have none).
* Mooncake ``hash_ids`` become ``prefix_block_ids`` (ids of 512-token prompt blocks; equal
  ids mean a shared prefix); ``timestamp`` is in milliseconds.
* BurstGPT logs failed calls with 0 response tokens (and a few with 0 request tokens).
  ``zero_tokens="skip"`` (default) drops them and emits a ``UserWarning`` with the count,
  because a request that generates nothing is not something a serving system schedules;
  ``"clamp"`` keeps them with the count raised to 1; ``"error"`` raises on the first one.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from servelab.core.errors import shown
from servelab.core.request import RequestSpec
from servelab.workloads.memory import check_workload_memory
from servelab.workloads._parse import (WorkloadError, WorkloadFileError, check_span, fail, float_column, int_column,
                                       read_csv, read_jsonl)

MOONCAKE_BLOCK_TOKENS = 512
ZERO_TOKEN_POLICIES = ("skip", "clamp", "error")


def specs_from_arrays(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                      prefix_block_ids: list[tuple[int, ...]] | None = None) -> list[RequestSpec]:
    """Sort by arrival (stable), re-base to 0, number 0..n-1: the workload invariants."""
    check_workload_memory(len(arrival_s), int(output.sum()))  # before any object exists
    order = np.argsort(arrival_s, kind="stable")
    arrival_s = arrival_s[order] - arrival_s[order[0]]
    arrivals = arrival_s.tolist()
    prompts = prompt[order].tolist()
    outputs = output[order].tolist()
    if prefix_block_ids is None:
        return [RequestSpec(i, arrivals[i], prompts[i], outputs[i]) for i in range(len(arrivals))]
    blocks = [prefix_block_ids[j] for j in order.tolist()]
    return [RequestSpec(i, arrivals[i], prompts[i], outputs[i], prefix_block_ids=blocks[i])
            for i in range(len(arrivals))]


def load_azure_llm(path: Path | str) -> list[RequestSpec]:
    """Azure LLM inference trace 2023 (code or conv): TIMESTAMP, ContextTokens, GeneratedTokens."""
    table = read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    stamps = _parse_wall_clock(table.column("TIMESTAMP"), table.path, table.line_numbers)
    prompt = int_column(table.column("ContextTokens"), "ContextTokens", table.path, table.line_numbers, 1)
    output = int_column(table.column("GeneratedTokens"), "GeneratedTokens", table.path, table.line_numbers, 1)
    arrival_s = (stamps - stamps.min()).astype(np.float64) / 1e9
    check_span(arrival_s, "TIMESTAMP", table.path, table.line_numbers)
    return specs_from_arrays(arrival_s, prompt, output)


# datetime64[ns] covers 1677-09-21 .. 2262-04-11 and wraps silently outside it
_FIRST_NS_DAY, _LAST_NS_DAY = np.datetime64("1678-01-01", "s"), np.datetime64("2262-01-01", "s")


def _parse_wall_clock(values: list[str], path: Path, line_numbers: list[int]) -> np.ndarray:
    """'YYYY-MM-DD HH:MM:SS.fffffff' -> int64 nanoseconds; the first bad line is named."""
    try:
        seconds = np.array(values, dtype="datetime64[s]")
        stamps = np.array(values, dtype="datetime64[ns]")
    except (ValueError, OverflowError):
        stamps = None
    if stamps is not None:
        in_range = (seconds >= _FIRST_NS_DAY) & (seconds < _LAST_NS_DAY)
        bad = np.flatnonzero(np.isnat(stamps) | ~in_range | (np.char.str_len(np.array(values)) < 19))
        if bad.size == 0:
            return stamps.astype(np.int64)
        i = int(bad[0])
        raise fail(path, line_numbers[i], f"TIMESTAMP must look like 'YYYY-MM-DD HH:MM:SS.fffffff' "
                                          f"(years 1678-2261), got {shown(values[i])}")
    for i, value in enumerate(values):
        try:
            np.datetime64(value, "s")
        except (ValueError, OverflowError):
            raise fail(path, line_numbers[i],
                       f"TIMESTAMP must look like 'YYYY-MM-DD HH:MM:SS.fffffff', got {shown(value)}") from None
    raise fail(path, line_numbers[0], "TIMESTAMP column could not be parsed")


def load_mooncake(path: Path | str) -> list[RequestSpec]:
    """Mooncake FAST'25 JSONL: timestamp (ms), input_length, output_length, hash_ids."""
    path, records, lines = read_jsonl(path, ("timestamp", "input_length", "output_length", "hash_ids"))
    timestamp_ms = float_column([r["timestamp"] for r in records], "timestamp", path, lines, 0.0, json=True)
    prompt = int_column([r["input_length"] for r in records], "input_length", path, lines, 1, json=True)
    output = int_column([r["output_length"] for r in records], "output_length", path, lines, 1, json=True)
    blocks = []
    for record, line in zip(records, lines):
        hash_ids = record["hash_ids"]
        if not isinstance(hash_ids, list) or not all(type(h) is int for h in hash_ids):
            raise fail(path, line, f"hash_ids must be a list of integers, got {shown(hash_ids, 80)}")
        blocks.append(tuple(hash_ids))
    check_span(timestamp_ms / 1000.0, "timestamp", path, lines)
    return specs_from_arrays(timestamp_ms / 1000.0, prompt, output, blocks)


def load_burstgpt(path: Path | str, *, zero_tokens: str = "skip", model: str | None = None,
                  log_type: str | None = None) -> list[RequestSpec]:
    """BurstGPT CSV: Timestamp (s), Model, Request tokens, Response tokens, Total tokens, Log Type.

    ``model`` / ``log_type`` keep only rows whose column equals the value (e.g. ``"GPT-4"``,
    ``"Conversation log"``); filtering happens before the zero-token policy applies.
    """
    if zero_tokens not in ZERO_TOKEN_POLICIES:
        raise WorkloadError(f"zero_tokens must be one of {ZERO_TOKEN_POLICIES}, got {zero_tokens!r}")
    table = read_csv(path, ("Timestamp", "Model", "Request tokens", "Response tokens"))
    keep = np.ones(len(table.rows), dtype=bool)
    for column, wanted, key in (("Model", model, "model"), ("Log Type", log_type, "log")):
        if wanted is not None:
            if column not in table.columns:
                raise fail(table.path, 1, f"cannot filter on {column!r}: no such column")
            values = np.array(table.column(column))
            if not (keep & (values == wanted)).any():  # say which filter emptied the file, and what it holds
                present = sorted(set(values[keep].tolist()))
                raise WorkloadFileError(
                    f"{table.path}: {key}={wanted!r} keeps none of the {int(keep.sum()):,} rows"
                    f"{f' left by model={model!r}' if key == 'log' and model is not None else ''}; their {column} values: "
                    f"{', '.join(repr(v) for v in present[:8])}{', ...' if len(present) > 8 else ''}")
            keep &= values == wanted
    lines = table.line_numbers
    arrival_s = float_column(table.column("Timestamp"), "Timestamp", table.path, lines, 0.0)
    check_span(arrival_s, "Timestamp", table.path, lines)
    prompt = int_column(table.column("Request tokens"), "Request tokens", table.path, lines, 0)
    output = int_column(table.column("Response tokens"), "Response tokens", table.path, lines, 0)
    zero = keep & ((prompt == 0) | (output == 0))
    if zero.any() and zero_tokens == "error":
        i = int(np.flatnonzero(zero)[0])
        raise fail(table.path, lines[i], "zero request or response tokens (use zero_tokens='skip' or 'clamp')")
    if zero_tokens == "skip":
        if zero.any():
            warnings.warn(f"{table.path}: skipped {int(zero.sum())} rows with 0 request or response tokens",
                          stacklevel=2)
        keep &= ~zero
    if not keep.any():  # every row the filters kept had 0 tokens
        raise WorkloadFileError(f"{table.path}: all {int(zero.sum()):,} rows{' the filters kept' if model or log_type else ''} "
                                f"have 0 request or response tokens, which zero=skip drops (zero=clamp keeps them)")
    return specs_from_arrays(arrival_s[keep], np.maximum(prompt[keep], 1), np.maximum(output[keep], 1))
