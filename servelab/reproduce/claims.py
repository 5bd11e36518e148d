"""Claims tables: written by every report, read back by ``servelab reproduce all``.

Writing. A report's claims are rows of a markdown table whose first column is ``claim``
(``markdown_table`` draws any table the same way). ``Claim`` is the structured row a new
experiment should build: the paper's number, ours, the operating point, a verdict, and the
*premises*: the quantities that decide whether the paper's mechanism can act there (memory
actually throttled? pool deep enough? SLO binding?), each with its value and what the
mechanism needs. ``claims_lines`` prints them with a ``premise`` column beside each claim, so
a verdict is never read without whether its premise held.

Reading. ``claims_of`` reads the first claims table of a report, whatever its columns:
``ours`` or ``after`` or ``measured``; a ``verdict`` column, or a verdict at the start of
``gap``/``status``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, slots=True)
class Premise:
    quantity: str  # what decides whether the mechanism can act, e.g. "mean KV demand / capacity in bursts"
    value: str  # its value at the claim's operating point, formatted
    needed: str  # what the mechanism needs, e.g. "> 1"
    holds: bool | None = None  # None: not decided by a threshold (read the numbers)

    def __str__(self) -> str:
        state = {True: "holds", False: "DOES NOT HOLD", None: "see numbers"}[self.holds]
        return f"{self.quantity} = {self.value} (needs {self.needed}): {state}"


@dataclass(frozen=True, slots=True)
class Claim:
    claim: str
    paper: str
    ours: str
    operating_point: str = "-"
    verdict: str = "-"
    premises: tuple[Premise, ...] = ()

    @property
    def premise_holds(self) -> bool | None:
        """False if any premise fails, True if all hold, None if none is decided."""
        decided = [p.holds for p in self.premises if p.holds is not None]
        if not decided:
            return None
        return all(decided)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """``| a | b |`` lines: the header, the ``|---|`` rule and one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def claims_lines(claims: Sequence[Claim]) -> list[str]:
    """The claims table; a ``premise`` column appears when any claim states a premise."""
    with_premise = any(c.premises for c in claims)
    header = ["claim", "paper", "ours", "operating point", "verdict"] + (["premise"] if with_premise else [])
    rows = []
    for c in claims:
        row = [_cell(c.claim), _cell(c.paper), _cell(c.ours), _cell(c.operating_point), _cell(c.verdict)]
        if with_premise:
            row.append("; ".join(_cell(str(p)) for p in c.premises) or "-")
        rows.append(row)
    return markdown_table(header, rows)


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


# ---- reading a report's claims back ----
def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_rows(text: str) -> list[dict[str, str]]:
    """Rows of the first markdown table whose first header cell is ``claim``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and _cells(line)[0].lower() == "claim":
            header = [h.lower() for h in _cells(line)]
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                cells = _cells(row)
                rows.append(dict(zip(header, cells + [""] * (len(header) - len(cells)))))
            return rows
    return []


_VERDICT = re.compile(r"^\**(shape reached|partly reached|not reached|reached|exceeded|matched)\b", re.I)


def verdict_of(row: dict[str, str]) -> str:
    for key in ("verdict", "gap", "status"):
        value = row.get(key, "")
        m = _VERDICT.match(value)
        if m:
            return m.group(1).lower()
    return row.get("verdict", "") or "-"


def claims_of(text: str) -> list[Claim]:
    out = []
    for row in table_rows(text):
        ours = row.get("ours") or row.get("after") or row.get("measured") or "-"
        out.append(Claim(row.get("claim", ""), row.get("paper", "-"), ours,
                         row.get("operating point") or row.get("setting") or "-", verdict_of(row)))
    return out
