"""Rows of an earlier vs_vllm.md kept for the loads a new report does not run again.

Why: one report covers loads that take minutes to hours on a shared 2-core machine, and the
run records (``results/``) are not committed, so a session that runs only some loads would
otherwise write a report with fewer loads than the committed one. The committed report's rows
of the loads not run again are carried verbatim, each with where it came from (``from``
column: the commit whose report held it, after the commit of its runs where that report named it).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

_RATIO = re.compile(r"\*\*([0-9.]+)x\*\*(?:, ([0-9.]+)x)?")
_LOADAVG = re.compile(r"load average around the runs was ([0-9.]+-[0-9.]+) \(median ([0-9.]+)")
_CARRIED_LOADAVG = re.compile(r"ran at its load average ([0-9.]+-[0-9.]+) \(median ([0-9.]+)\)")


@dataclass
class Carried:
    """An earlier report's per-load and client-agreement rows, by load name."""

    source: str  # e.g. "report of commit 2abe99a"
    load_rows: dict[str, list[tuple[list[str], str]]] = field(default_factory=dict)  # load -> [(cells, from)]
    agree_rows: dict[str, list[tuple[list[str], str]]] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)  # load -> duration ratio servelab / vLLM
    cpu_ratios: dict[str, float] = field(default_factory=dict)
    loadavg: str | None = None  # that report's load-average range and median, as it wrote them
    setup_line: str | None = None  # its "- Both servers: ..." line (the limits both servers ran with)
    runs_lines: tuple[str, ...] = ()  # its "- Repeats: ..." and "- Priority: ..." lines (how its runs ran)

    def loads(self) -> set[str]:
        return set(self.load_rows)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_report(text: str, source: str) -> Carried:
    """The rows of ``text`` (a vs_vllm.md) under its two tables; rows without a ``from`` cell get ``source``."""
    out = Carried(source)
    if m := _LOADAVG.search(text) or _CARRIED_LOADAVG.search(text):
        out.loadavg = f"{m.group(1)} (median {m.group(2)})"
    section, has_from = None, False
    for line in text.splitlines():
        if line.startswith("- Both servers:"):
            out.setup_line = line
        elif line.startswith(("- Repeats:", "- Priority:", "- Carried rows")):
            out.runs_lines += (line,)
        if line.startswith("## "):
            section = "load" if line.startswith("## Per load") else "agree" if "clients agree" in line else None
            has_from = False
            continue
        if section is None or not line.startswith("| ") or line.startswith("|---"):
            continue
        cells = _cells(line)
        if cells[0] == "load":  # a header
            has_from = cells[-1] == "from"
            continue
        origin = cells.pop() if has_from else source
        if "report of commit" not in origin:  # "runs at <commit>": say which report held them
            origin = f"{origin} ({source})" if has_from else origin
        name = cells[0].split(" ")[0]
        (out.load_rows if section == "load" else out.agree_rows).setdefault(name, []).append((cells, origin))
        if section == "load" and (m := _RATIO.search(line)):
            out.ratios[name] = float(m.group(1))
            if m.group(2) and "poisson" not in name:
                out.cpu_ratios[name] = float(m.group(2))
    return out


def committed_report(doc: Path, root: Path) -> Carried | None:
    """The report at ``doc`` as last committed (not the working copy, which a run may have rewritten)."""
    rel = doc.resolve().relative_to(root.resolve()).as_posix()
    commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", rel], capture_output=True, text=True, cwd=root)
    text = subprocess.run(["git", "show", f"HEAD:{rel}"], capture_output=True, text=True, cwd=root)
    if commit.returncode or text.returncode or not commit.stdout.strip():
        return None
    return parse_report(text.stdout, f"report of commit {commit.stdout.strip()}")


def current_commit(root: Path) -> str | None:
    """HEAD's short hash, with ``+dirty`` when servelab/ or scripts/ differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root)
    if head.returncode:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "servelab", "scripts"], capture_output=True,
                           text=True, cwd=root).stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")
