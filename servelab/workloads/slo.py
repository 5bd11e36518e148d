"""SLO strings, ``ttft:2s,tpot:50ms`` -> ``SLO(ttft_s=2, tpot_s=0.05)``.

One parser for the CLI's ``--slo``, a workload spec's ``slo=`` and a TOML config's ``slo``,
so all follow the same rule:

- names ``ttft``, ``tpot``, ``tbt`` and ``e2el`` (end-to-end latency, vLLM's name), each at
  most once, at least one of them;
- a value is a finite number > 0 with an optional unit, ``s`` or ``ms`` (``2s``, ``500ms``);
- a bare number is in the option's unit: seconds here (``--slo ttft:2``, servelab's convention
  since the start), milliseconds in ``servelab bench --goodput`` (vLLM's). Write the unit when
  sharing a command: ``ttft:2s`` and ``ttft:2000ms`` mean the same everywhere.

A value implausible for its unit (a bare ``ttft:2000`` is 33 minutes; ``tpot:0.01ms`` is
faster than any GPU) is accepted with a ``SLOWarning`` naming the likely intent, because
vLLM users write milliseconds out of habit and the attainment would silently be 100%.
A repeated name is an error rather than "the last one wins", because a typo there changes
every attainment number silently.
"""

from __future__ import annotations

import math
import re
import warnings

from servelab.core.errors import UserError
from servelab.core.request import SLO

SLO_FIELDS = {"ttft": "ttft_s", "tpot": "tpot_s", "tbt": "tbt_s", "e2el": "e2el_s"}
SLO_FORMAT = "ttft:V,tpot:V,tbt:V,e2el:V with V like 2s, 500ms or 2 (bare numbers are seconds; any non-empty subset)"
UNITS = {"s": 1.0, "ms": 1e-3}
_VALUE = re.compile(r"(?P<number>.*?)\s*(?P<unit>[a-zA-Z]*)")
# Plausible range per target, in seconds: outside it the value is probably in the wrong unit.
PLAUSIBLE_S = {"ttft_s": (1e-3, 300.0), "tpot_s": (1e-4, 5.0), "tbt_s": (1e-4, 30.0), "e2el_s": (1e-2, 3600.0)}


class SLOWarning(UserWarning):
    """An SLO value outside the plausible range for its target (probably the wrong unit)."""


def parse_slo(text: str, where: str = "SLO", *, default_unit: str = "s") -> SLO:
    """Parse ``text``; ``where`` names the input in errors (``--slo``, ``workload spec 'x'``).

    ``default_unit`` is the unit of a bare number (``"s"`` for servelab's options, ``"ms"``
    for vLLM's ``--goodput``).
    """
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
        seconds, bare = _seconds(value, name, text, where, default_unit)
        values[SLO_FIELDS[name]] = seconds
        _warn_if_implausible(where, name, value.strip(), seconds, bare, default_unit)
    return SLO(**values)


def _seconds(value: str, name: str, text: str, where: str, default_unit: str) -> tuple[float, bool]:
    """(seconds, whether the unit was left out)."""
    match = _VALUE.fullmatch(value.strip())
    unit = match.group("unit").lower() if match else ""
    if match is None or unit not in ("", *UNITS):
        raise UserError(f"{where} {text!r}: {name} {value.strip()!r} is not a duration (e.g. 2s, 500ms)")
    try:
        number = float(match.group("number"))
    except ValueError:
        raise UserError(f"{where} {text!r}: {name} {value.strip()!r} is not a duration (e.g. 2s, 500ms)") from None
    seconds = number * UNITS[unit or default_unit]
    if not 0 < seconds < math.inf:
        raise UserError(f"{where} {text!r}: {name} must be a finite duration > 0, got {value.strip()!r}")
    return seconds, not unit


def _warn_if_implausible(where: str, name: str, value: str, seconds: float, bare: bool, default_unit: str) -> None:
    low, high = PLAUSIBLE_S[SLO_FIELDS[name]]
    if low <= seconds <= high:
        return
    unit_word = "seconds" if default_unit == "s" else "milliseconds"
    meant = ""
    if bare and default_unit == "s" and seconds > high and low <= seconds * 1e-3 <= high:
        meant = f"; if you meant milliseconds (vLLM's --goodput), write {name}:{value}ms"
    elif bare and default_unit == "ms" and seconds < low and low <= seconds * 1e3 <= high:
        meant = f"; if you meant seconds, write {name}:{value}s"
    where_bare = f" (a bare number is {unit_word})" if bare else ""
    warnings.warn(SLOWarning(f"{where}: {name} {value}{where_bare} is {_human(seconds)}, outside the plausible "
                             f"{_human(low)} to {_human(high)}{meant}"), stacklevel=3)


def _human(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.3g} min"
    if seconds >= 1:
        return f"{seconds:.3g} s"
    return f"{seconds * 1e3:.3g} ms"


# --- which SLO a run is judged by: one rule for the CLI, a config file and the Python API ---
DEFAULT_SLO_TEXT = "ttft:2s,tpot:100ms"
DEFAULT = "default"  # the value of "no --slo given" (CLI) and of the API's slo argument left out
NONE_WORDS = ("", "none")


def resolve_slo(slo, workload=(), where: str = "--slo") -> tuple[SLO | None, str]:
    """(the SLO that replaces every request's own, or None; a one-line description to print).

    - not given (``DEFAULT``): the requests' own SLOs when the workload carries any (a spec's
      ``slo=``), else ``DEFAULT_SLO_TEXT``; the description says it is the default;
    - ``"none"`` (or ``""``): no SLO, no attainment (``SLO()``: no target applies);
    - an ``SLO`` or a string such as ``"ttft:2s,tpot:100ms"``: that one;
    - ``None`` (the Python API's old meaning): the requests' own SLOs only.
    """
    if isinstance(slo, str) and slo.strip().lower() == DEFAULT:
        if any(getattr(spec, "slo", None) is not None for spec in workload):
            return None, "SLO: each request's own (the workload's slo=)"
        return parse_slo(DEFAULT_SLO_TEXT, where), f"SLO: {describe(parse_slo(DEFAULT_SLO_TEXT))} " \
                                                    f"(default; {where} to change, {where} none for none)"
    if slo is None:
        own = any(getattr(spec, "slo", None) is not None for spec in workload)
        return None, "SLO: each request's own (the workload's slo=)" if own else "no SLO given"
    if isinstance(slo, str):
        if slo.strip().lower() in NONE_WORDS:
            return SLO(), "no SLO given"
        slo = parse_slo(slo, where)
    if not isinstance(slo, SLO):
        raise UserError(f"{where}: expected an SLO or a string like {DEFAULT_SLO_TEXT!r}, got {slo!r}")
    if all(getattr(slo, f) is None for f in SLO_FIELDS.values()):
        return slo, "no SLO given"
    return slo, f"SLO: {describe(slo)}"


def describe(slo: SLO) -> str:
    """``SLO(ttft_s=2, tpot_s=0.1)`` -> ``ttft <= 2 s, tpot <= 100 ms``."""
    return ", ".join(f"{name} <= {_human(getattr(slo, field))}" for name, field in SLO_FIELDS.items()
                     if getattr(slo, field) is not None)
