"""Committed reports match the commands that make them.

What is checked, honestly:
* every generated report under docs/ (design proposals excluded: they are prose) names the
  command that made it, and that command exists: a ``servelab`` (sub)command of the CLI, or a
  script in scripts/;
* docs/reproduction/README.md is rebuilt by value from what is checked out (the full reports
  and README.json, which keeps the reduced runs' claims) and must be identical: a design that
  regenerates its report also runs ``servelab reproduce all --readme-only``;
* the Multi-Bin Fig. 3 size table in that README is recomputed (deterministic, ~1 s);
* docs/fidelity.md's results table agrees with the CSV written beside it by the same run.
The engine runs behind docs/fidelity.md and the reproductions themselves are not rerun here
(minutes of CPU); their commands are.
"""

from __future__ import annotations

import csv
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
COMMAND = re.compile(r"`((?:servelab|python|\.venv/bin/python|bash) [^`]+)`")
SCRIPT = re.compile(r"\bscripts/[\w./-]+\.(?:py|sh)\b")


def _reports() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "proposals" not in p.relative_to(DOCS).parts)


def _servelab_command_exists(words: list[str]) -> bool:
    import click
    import typer.main

    from servelab.cli.main import app

    group = typer.main.get_command(app)
    for word in words:
        if word.startswith("-") or not isinstance(group, click.Group):
            break
        if word not in group.commands:
            return False
        group = group.commands[word]
    return True


@pytest.mark.parametrize("report", _reports(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_report_names_an_existing_command(report):
    text = report.read_text()
    commands = COMMAND.findall(text)
    scripts = SCRIPT.findall(text)
    assert commands or scripts, f"{report} names no command that makes it"
    for command in commands:
        words = shlex.split(command.replace("[", "").replace("]", ""), posix=True)
        if words[0] == "servelab":
            assert _servelab_command_exists(words[1:]), f"{report}: `{command}` is not a servelab command"
    for script in scripts:
        assert (ROOT / script).is_file(), f"{report}: {script} does not exist"


def test_reproduction_readme_is_what_its_inputs_give():
    from servelab.reproduce.all import readme_text
    import json

    readme, source = DOCS / "reproduction" / "README.md", DOCS / "reproduction" / "README.json"
    assert readme.is_file() and source.is_file(), "docs/reproduction/README.md and .json are committed reports"
    assert readme_text(DOCS / "reproduction", json.loads(source.read_text())) == readme.read_text(), \
        "README.md differs from README.json + the full reports: rerun servelab reproduce all --readme-only"


def test_multibin_fig3_size_table_is_recomputed_exactly():
    import json

    from servelab.designs.multibin.reproduce.readme import fig3_scaling

    source = DOCS / "reproduction" / "README.json"
    assert source.is_file(), "docs/reproduction/README.json is a committed report"
    committed = json.loads(source.read_text())["runs"]["multibin"]["fig3_scaling"]
    sizes = tuple(x["num_requests"] for x in committed)
    for got, want in zip(fig3_scaling(sizes[:2]), committed[:2]):
        assert got["num_requests"] == want["num_requests"]
        assert got["max_err_makespan"] == pytest.approx(want["max_err_makespan"], rel=1e-9)
        assert got["max_err_full_batches"] == pytest.approx(want["max_err_full_batches"], rel=1e-9)


def _pct(cell: str) -> float | None:
    return None if cell.strip() == "-" else float(cell.strip().rstrip("%")) / 100


def test_fidelity_table_matches_its_csv():
    doc, table = DOCS / "fidelity.md", DOCS / "fidelity" / "fidelity.csv"
    assert doc.is_file() and table.is_file(), "docs/fidelity.md and its CSV are committed reports"
    rows = {(r["system"], r["workload"]): r for r in csv.DictReader(table.open())}
    lines = [line for line in doc.read_text().splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    body = [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]
            if line.count("|") == lines[0].count("|")]
    checked = 0
    for cells in body:
        key = (cells[0], cells[1])
        if key not in rows:
            continue
        got = dict(zip(header, cells))
        for column, field in (("TTFT med", "ttft_median"), ("TPOT med", "tpot_median"), ("step med", "step_median")):
            value = rows[key][field]
            expected = None if value in ("", "None") else float(value)
            assert _pct(got[column]) == (pytest.approx(expected, abs=5e-4) if expected is not None else None)
        checked += 1
    assert checked == len(rows) > 0
