"""Reporting: run summaries as a rich table or markdown, and sweep curves as a PNG.

Rendering only reads ``RunSummary`` objects; nothing here computes a metric. Several
summaries render side by side, one column each (one per policy, say). How requests ended
comes first and is repeated in a one-line ``headline`` under the table, with the most common
reasons: a run that rejected or aborted requests must not read like one that served them all. matplotlib is
imported inside ``plot_sweep`` with the Agg backend, so importing this module never pulls
in a plotting backend. A sweep figure must say where its numbers come from (simulated
with which cost model, GPU and model, or measured), hence the required ``caption``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Callable, Mapping, Sequence

from servelab.metrics.summary import RunSummary

Summaries = RunSummary | Mapping[str, RunSummary]


def _ms(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v * 1e3:.1f}"


def _num(v: float, digits: int = 2) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def _pct(v: float) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v * 100:.1f}%"


def _mean_of(values: list[float | None]) -> float:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return sum(kept) / len(kept) if kept else math.nan


def top_reasons(s: RunSummary, status: str, k: int = 2, width: int = 60) -> list[tuple[str, int]]:
    """The ``k`` most common end reasons of ``status`` requests, numbers folded into ``N`` so
    that "prompt 5000 + max_tokens 10 exceeds ..." rejections count as one reason."""
    counts: dict[str, int] = {}
    for st, reason, n in s.end_reasons:
        if st == status:
            key = re.sub(r"\d+(\.\d+)?", "N", reason or "(no reason)")
            key = key if len(key) <= width else key[: width - 3] + "..."
            counts[key] = counts.get(key, 0) + n
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


def _reasons(s: RunSummary, status: str) -> str:
    return "; ".join(f"{n} x {reason}" for reason, n in top_reasons(s, status)) or "-"


def _rejected(s: RunSummary) -> str:
    return f"{s.num_rejected} ({s.num_rejected_context} over the context)" if s.num_rejected_context else str(
        s.num_rejected)


def headline(label: str, s: RunSummary) -> str:
    """One line: how the arrived requests ended, with the top rejection and abort reasons."""
    rejected = f"{s.num_rejected} rejected" + (f" ({s.num_rejected_context} over the context)"
                                               if s.num_rejected_context else "")
    aborted = f"{s.num_aborted} ABORTED" if s.num_aborted else "0 aborted"
    line = f"{label}: {s.num_arrived} arrived, {s.num_completed} completed, {rejected}, {aborted}"
    for status, word, count in (("rejected", "rejection", s.num_rejected), ("aborted", "abort", s.num_aborted)):
        if count:
            line += f"; top {word} reasons: {_reasons(s, status)}"
    return line


_NO_SLO = "no SLO given"

# (label, formatter): one table row each.
_ROWS: tuple[tuple[str, Callable[[RunSummary], str]], ...] = (
    ("arrived", lambda s: str(s.num_arrived)),
    ("completed", lambda s: str(s.num_completed)),
    ("rejected", _rejected),
    ("aborted", lambda s: str(s.num_aborted)),
    ("top rejection reasons", lambda s: _reasons(s, "rejected")),
    ("top abort reasons", lambda s: _reasons(s, "aborted")),
    ("SLO attainment", lambda s: _pct(s.slo_attainment) if s.has_slo else _NO_SLO),
    ("goodput (req/s)", lambda s: _num(s.goodput_requests_per_s) if s.has_slo else _NO_SLO),
    ("goodput (tok/s)", lambda s: _num(s.goodput_tokens_per_s, 1) if s.has_slo else _NO_SLO),
    ("throughput (req/s)", lambda s: _num(s.requests_per_s)),
    ("throughput (tok/s)", lambda s: _num(s.output_tokens_per_s, 1)),
    ("duration (s)", lambda s: _num(s.duration_s, 1)),
    ("TTFT mean / p50 / p99 (ms)", lambda s: " / ".join(_ms(v) for v in (s.ttft.mean, s.ttft.p50, s.ttft.p99))),
    ("TPOT mean / p50 / p99 (ms)", lambda s: " / ".join(_ms(v) for v in (s.tpot.mean, s.tpot.p50, s.tpot.p99))),
    ("TBT p50 / p99 / max (ms)", lambda s: " / ".join(_ms(v) for v in (s.tbt.p50, s.tbt.p99, s.tbt.max))),
    ("e2e mean / p99 (s)", lambda s: f"{_num(s.e2e.mean)} / {_num(s.e2e.p99)}"),
    ("queueing mean / p99 (ms)", lambda s: f"{_ms(s.queueing.mean)} / {_ms(s.queueing.p99)}"),
    ("preemptions recompute / swap", lambda s: f"{s.num_preemptions_recompute} / {s.num_preemptions_swap}"),
    ("padding waste", lambda s: _pct(s.padding_waste)),
    ("KV utilisation mean / max", lambda s: f"{_pct(s.kv_utilization_mean)} / {_pct(s.kv_utilization_max)}"),
    ("queue length mean / max", lambda s: f"{_num(s.queue_length_mean, 1)} / {_num(s.queue_length_max, 0)}"),
    ("busy fraction (mean over instances)", lambda s: _pct(_mean_of([i.busy_fraction for i in s.instances]))),
    ("MFU while busy (mean over instances)", lambda s: _pct(_mean_of([i.mfu for i in s.instances]))),
)


def _as_mapping(summaries: Summaries) -> Mapping[str, RunSummary]:
    if isinstance(summaries, RunSummary):
        return {"run": summaries}
    if not summaries:
        raise ValueError("nothing to report: no run summaries given")
    for label, s in summaries.items():
        if not isinstance(s, RunSummary):
            raise TypeError(f"report column {label!r} is a {type(s).__name__}, not a RunSummary")
    return summaries


def summary_rows(summaries: Summaries) -> tuple[list[str], list[list[str]]]:
    """Header (``metric`` then one label per summary) and formatted rows."""
    by_label = _as_mapping(summaries)
    header = ["metric", *by_label]
    rows = [_fit_units([label, *(fmt(s) for s in by_label.values())]) for label, fmt in _ROWS]
    return header, rows


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _fit_units(row: list[str]) -> list[str]:
    """A millisecond row whose largest value is 10 s or more is shown in seconds (4,978.1 s,
    not 4978067.0 ms); every cell of the row changes together, so columns stay comparable."""
    label, cells = row[0], row[1:]
    if not label.endswith("(ms)"):
        return row
    values = [float(x) for c in cells for x in _NUMBER.findall(c)]
    if not values or max(values) < 10_000:
        return row
    to_s = [_NUMBER.sub(lambda m: f"{float(m.group()) / 1e3:,.1f}", c) for c in cells]
    return [label[:-4] + "(s)", *to_s]


def render_rich(summaries: Summaries, *, title: str | None = None):
    """A ``rich.table.Table`` with one column per summary."""
    from rich.table import Table

    header, rows = summary_rows(summaries)
    by_label = _as_mapping(summaries)
    caption = "\n".join(headline(label, s) for label, s in by_label.items())
    aborted = any(s.num_aborted for s in by_label.values())
    table = Table(title=title, caption=caption, caption_style="bold red" if aborted else "bold",
                  caption_justify="left")
    table.add_column(header[0], style="bold")
    for label in header[1:]:
        table.add_column(label, justify="right")
    for row in rows:
        style = "bold red" if row[0] == "aborted" and aborted else None
        table.add_row(*row, style=style)
    return table


def render_markdown(summaries: Summaries) -> str:
    header, rows = summary_rows(summaries)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * (len(header) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += [""] + [f"- {headline(label, s)}" for label, s in _as_mapping(summaries).items()]
    return "\n".join(lines) + "\n"


# Sweep keys as people read them: (label, unit, factor from the stored unit).
AXES: dict[str, tuple[str, str, float]] = {
    "rate": ("request rate", "req/s", 1.0),
    "slo_attainment": ("SLO attainment", "%", 100.0),
    "ttft_p50_s": ("TTFT p50", "ms", 1000.0), "ttft_p99_s": ("TTFT p99", "ms", 1000.0),
    "tpot_p50_s": ("TPOT p50", "ms", 1000.0), "tpot_p99_s": ("TPOT p99", "ms", 1000.0),
    "throughput_tok_s": ("output throughput", "tokens/s", 1.0),
    "goodput_req_s": ("goodput", "req/s", 1.0),
}
_STYLES = (("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("P", "--"), ("X", "-."), ("*", ":"))
CAPTION_CHARS = 120  # characters per caption line at 7 pt on a 6.4-inch figure


def axis_label(key: str) -> str:
    """``ttft_p99_s`` -> ``TTFT p99 (ms)``; an unknown key is shown as it is."""
    label, unit, _ = AXES.get(key, (key, "", 1.0))
    return f"{label} ({unit})" if unit else label


def plot_sweep(rows: Sequence[Mapping], x: str, y: str, out_path: str | Path, *, caption: str,
               series: str = "policy", title: str | None = None) -> Path:
    """One line per ``series`` value (e.g. policy) of ``y`` against ``x`` (e.g. rate); saves a PNG.

    Axes carry names and units (``AXES``: TPOT in ms, as the tables print it); each series has
    its own marker and dash, and one identical to an earlier series says so in the legend, so
    no line hides another. The caption (what was simulated, the command) is wrapped, not cut.
    Rows whose ``y`` is None or NaN are skipped (a run that produced no value).
    """
    import textwrap

    lines = _group_sweep(rows, x, y, series)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xf, yf = AXES.get(x, ("", "", 1.0))[2], AXES.get(y, ("", "", 1.0))[2]
    caption_lines = [part for line in caption.splitlines()
                     for part in textwrap.wrap(line, CAPTION_CHARS, break_long_words=True, break_on_hyphens=False)
                     or [""]]
    bottom = 0.03 + 0.026 * len(caption_lines)
    fig, ax = plt.subplots(figsize=(6.4, 4.4 + 0.12 * len(caption_lines)))
    try:
        for k, ((name, points), label) in enumerate(zip(lines.items(), series_labels(lines))):
            marker, dash = _STYLES[k % len(_STYLES)]
            ax.plot([p[0] * xf for p in points], [p[1] * yf for p in points], marker=marker, linestyle=dash,
                    markersize=7 - min(k, 4), alpha=0.85, label=label, zorder=2 + k)
        ax.set_xlabel(axis_label(x))
        ax.set_ylabel(axis_label(y))
        ax.set_title(title or f"{AXES.get(y, (y,))[0]} vs {AXES.get(x, (x,))[0]}")
        ax.grid(alpha=0.3)
        ax.legend(title=series)
        fig.text(0.01, 0.01, "\n".join(caption_lines), fontsize=7, ha="left", va="bottom")
        fig.tight_layout(rect=(0, bottom, 1, 1))
        out = Path(out_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
    finally:
        plt.close(fig)
    return out


def series_labels(lines: Mapping[object, list[tuple[float, float]]]) -> list[str]:
    """Legend labels; a series identical to an earlier one says so ("sarathi (same as vllm)"),
    since its line lies exactly on the other's. Sorts each series' points."""
    drawn: dict[tuple, str] = {}
    labels = []
    for name, points in lines.items():
        points.sort()
        key = tuple(points)
        labels.append(str(name) + (f" (same as {drawn[key]})" if key in drawn else ""))
        drawn.setdefault(key, str(name))
    return labels


def _group_sweep(rows: Sequence[Mapping], x: str, y: str, series: str) -> dict[object, list[tuple[float, float]]]:
    if not rows:
        raise ValueError("plot_sweep: no rows to plot")
    lines: dict[object, list[tuple[float, float]]] = {}
    for k, row in enumerate(rows):
        for key in (x, y, series):
            if key not in row:
                raise ValueError(f"plot_sweep: row {k} has no {key!r} (keys: {sorted(row)})")
        value = row[y]
        if value is None or not math.isfinite(float(value)):
            continue
        lines.setdefault(row[series], []).append((float(row[x]), float(value)))
    if not lines:
        raise ValueError(f"plot_sweep: every row has an empty {y!r}")
    return lines
