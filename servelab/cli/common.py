"""Shared CLI plumbing: option parsing, friendly errors, output folders, progress bars."""

from __future__ import annotations

import dataclasses
import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import typer

from servelab.core.request import SLO

USER_ERRORS = (ValueError, KeyError, FileNotFoundError, MemoryError)


def parse_slo(text: str | None) -> SLO | None:
    """'ttft:2,tpot:0.1' -> SLO(ttft_s=2, tpot_s=0.1)."""
    if not text:
        return None
    values: dict[str, float] = {}
    for item in text.split(","):
        key, sep, val = item.partition(":")
        key = key.strip().lower()
        if not sep or key not in ("ttft", "tpot", "tbt"):
            raise typer.BadParameter(f"--slo: expected ttft:S,tpot:S,tbt:S, got {item!r}")
        try:
            values[f"{key}_s"] = float(val)
        except ValueError:
            raise typer.BadParameter(f"--slo: {val!r} is not a number of seconds") from None
    try:
        return SLO(**values)
    except ValueError as exc:
        raise typer.BadParameter(f"--slo: {exc}") from None


def parse_floats(text: str, option: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{option}: expected comma-separated numbers, got {text!r}") from None


@contextmanager
def user_errors() -> Iterator[None]:
    """Bad input ends the command with its message, never a traceback."""
    try:
        yield
    except typer.BadParameter:
        raise
    except USER_ERRORS as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=_jsonable))


def write_timeseries(path: Path, collector: Any) -> None:
    """Per-step KV use, queue length and batch size over time (one row per step or decode jump)."""
    from servelab.metrics.collector import STEP_COLUMNS

    steps = collector.steps
    columns = [getattr(steps, name) for name in STEP_COLUMNS]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        f.write(",".join(STEP_COLUMNS) + "\n")
        for row in zip(*columns):
            f.write(",".join(f"{v:.9g}" for v in row) + "\n")


def emit_json(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=_jsonable) + "\n")


@contextmanager
def progress_bar(description: str, enabled: bool):
    """Yields a callback(fraction) that drives a rich progress bar (or nothing when disabled)."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, Progress, TimeElapsedColumn

    with Progress("[progress.description]{task.description}", BarColumn(), "{task.percentage:>3.0f}%",
                  TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task(description, total=1.0)
        yield lambda fraction: bar.update(task, completed=fraction)
