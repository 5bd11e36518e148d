"""SLO strings, ``ttft:2,tpot:0.1`` -> ``SLO(ttft_s=2, tpot_s=0.1)``.

One parser for the CLI's ``--slo`` and a workload spec's ``slo=``, so both follow the same
rules: names ``ttft``, ``tpot`` and ``tbt`` (seconds), each at most once, each value a finite
number > 0, at least one of them. A repeated name is an error rather than "the last one
wins", because a typo there changes every attainment number silently.
"""

from __future__ import annotations

import math

from servelab.core.errors import UserError
from servelab.core.request import SLO

SLO_FIELDS = {"ttft": "ttft_s", "tpot": "tpot_s", "tbt": "tbt_s"}
SLO_FORMAT = "ttft:S,tpot:S,tbt:S (seconds, any non-empty subset)"


def parse_slo(text: str, where: str = "SLO") -> SLO:
    """Parse ``text``; ``where`` names the input in errors (``--slo``, ``workload spec 'x'``)."""
    if not text.strip():
        raise UserError(f"{where}: empty; expected {SLO_FORMAT}")
    values: dict[str, float] = {}
    for item in text.split(","):
        name, colon, value = item.partition(":")
        name = name.strip().lower()
        if not colon or name not in SLO_FIELDS:
            raise UserError(f"{where} {text!r}: expected {SLO_FORMAT}, got {item!r}")
        if SLO_FIELDS[name] in values:
            raise UserError(f"{where} {text!r}: {name!r} given twice")
        try:
            seconds = float(value)
        except ValueError:
            raise UserError(f"{where} {text!r}: {name} {value.strip()!r} is not a number of seconds") from None
        if not 0 < seconds < math.inf:
            raise UserError(f"{where} {text!r}: {name} must be a finite number of seconds > 0, got {value.strip()!r}")
        values[SLO_FIELDS[name]] = seconds
    return SLO(**values)
