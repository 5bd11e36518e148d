"""Shared CLI plumbing: option parsing, friendly errors, output folders, progress bars.

Errors: a ``UserError`` (or a ``typer.BadParameter``) ends the command with one line on
stderr, ``error: <message naming the input>``, and exit status 2. Every other exception is
a bug in servelab and keeps its traceback: the rules about what input is valid live where
the input is read (spec parsers, Configs, loaders), not here.

Exit status ``EXIT_ABORTED`` (3): the run finished and its results were written, but some
request was aborted (stranded, lost with a failed instance, ...); ``exit_if_aborted`` says
so in one stderr line. Rejections are policy decisions (and are counted in the summary),
so they do not change the exit status.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import typer

from servelab.core.errors import UserError
from servelab.core.request import SLO

NO_SLO = ("", "none")
EXIT_ABORTED = 3


def parse_slo(text: str | None, option: str = "--slo") -> SLO | None:
    """'ttft:2,tpot:0.1' -> SLO(ttft_s=2, tpot_s=0.1); '' or 'none' -> no SLO."""
    if text is None or text.strip().lower() in NO_SLO:
        return None
    from servelab.workloads.slo import parse_slo as parse

    return parse(text, option)


def parse_floats(text: str, option: str) -> list[float]:
    """Comma-separated numbers; an empty list is left to the command (it knows if it needs one)."""
    values = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            values.append(float(item))
        except ValueError:
            raise UserError(f"{option}: expected comma-separated numbers, got {item!r} in {text!r}") from None
    return values


def check_out_dir(path: Path, option: str = "--out") -> Path:
    """Create the output folder now, so an unusable path fails before any work is done."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {path}: exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{option} {path}: cannot create the folder ({err.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: folder is not writable")
    return path


def check_out_file(path: Path, option: str = "--out") -> Path:
    """An output file may be overwritten, but must not be a folder and its folder must be writable."""
    if path.is_dir():
        raise UserError(f"{option} {path}: is a folder, expected a file path")
    check_out_dir(path.parent, option)
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{option} {path}: file is not writable")
    return path


@contextmanager
def user_errors() -> Iterator[None]:
    """Bad input ends the command with one line naming it and exit status 2; bugs keep
    their traceback."""
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            yield
        except typer.BadParameter as exc:
            _fail(exc.format_message())
        except UserError as exc:
            _fail(str(exc))


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning about the user's input (an implausible SLO, ...) is one stderr line, not a stack frame."""
    typer.secho(f"warning: {' '.join(str(message).split())}", fg=typer.colors.YELLOW, err=True)


def abort_record(label: str, summary: Any) -> tuple[str, int, int, str]:
    """(label, aborted, arrived, top abort reason) of one run's RunSummary."""
    from servelab.metrics.report import top_reasons

    reasons = top_reasons(summary, "aborted", k=1, width=120)
    return label, summary.num_aborted, summary.num_arrived, reasons[0][0] if reasons else ""


def exit_if_aborted(runs: list[tuple[str, int, int, str]]) -> None:
    """Exit with ``EXIT_ABORTED`` after one stderr line when any run (label, aborted, arrived,
    top reason) aborted a request."""
    hit = [f"{label}: {aborted} of {arrived} ({reason})" for label, aborted, arrived, reason in runs if aborted]
    if hit:
        typer.secho(f"aborted requests (exit status {EXIT_ABORTED}): {', '.join(hit)}", fg=typer.colors.RED,
                    err=True)
        raise typer.Exit(EXIT_ABORTED)


def _fail(message: str) -> None:
    typer.secho(f"error: {' '.join(message.split())}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


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


def console():
    """A rich Console for tables. Piped or logged output gets 200 columns instead of rich's
    default 80 (unless COLUMNS says otherwise), so a table does not wrap into unreadable
    columns in a log; a terminal keeps its own width."""
    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=200)


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


@contextmanager
def progress_log(description: str, enabled: bool):
    """A spinner with elapsed time for work of unknown length (capacity probes); yields
    ``log(line)``, which prints a line above the spinner (or nothing when disabled)."""
    if not enabled:
        yield lambda line: None
        return
    from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), "[progress.description]{task.description}", TimeElapsedColumn(),
                  transient=True) as bar:
        bar.add_task(description, total=None)
        yield bar.console.print


def print_markdown(text: str) -> None:
    """Markdown rendered by rich on a terminal (tables, headings); the plain text when piped,
    so a redirect still gives a file that renders as markdown elsewhere."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        typer.echo(text)
        return
    from rich.markdown import Markdown

    lines = text.split("\n")  # a line break in the text stays one (markdown would join the lines)
    hard = [line + "  " if line.strip() and not line.lstrip().startswith("|") and k + 1 < len(lines)
            and lines[k + 1].strip() and not lines[k + 1].lstrip().startswith("|") else line
            for k, line in enumerate(lines)]
    console.print(Markdown("\n".join(hard)))
