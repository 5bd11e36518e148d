"""``--config FILE.toml``: a run's options in a file people keep and share.

The file holds the same options as the command line, under their long names with ``_`` or
``-`` (``max_num_seqs``, ``max-num-seqs``), either at the top (shared by every command) or
in a section per command (``[simulate]``, ``[sweep]``, ``[capacity]``), which wins. Two
tables replace long spec strings:

    [workload]              source = "poisson", rate = 5, n = 1000, prompt = "uniform(32,512)"
    [policy]                name = "sarathi", token_budget = 512

and lists may be TOML arrays (``policies = ["vllm", "sarathi:token_budget=512"]``,
``rates = [1, 2, 4]``). The values become the command's defaults (click's ``default_map``),
so they pass through the very same parsing and checks as typed options (workload spec
grammar, the policy's Config, ``HardwareChoice``), and an option given on the command line
still overrides the file. An unknown key, a key the command does not take, or a value of the
wrong type is one error line naming the file and the key.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Optional

import typer

from servelab.core.errors import UserError

COMMANDS = ("simulate", "sweep", "capacity")
_SPEC_TABLES = {"workload": "source", "policy": "name"}


def config_option():
    return typer.Option(None, "--config", is_eager=True, callback=_apply, expose_value=True,
                        help="TOML file with this command's options (examples/simulate.toml); options given "
                             "on the command line override it.")


def _apply(ctx: typer.Context, param: Any, value: Optional[Path]) -> Optional[Path]:
    if value is None or ctx.resilient_parsing:
        return value
    from servelab.cli.common import user_errors

    with user_errors():
        params = {p.name: p for p in ctx.command.params if p.name != "config"}
        values = load_config(value, ctx.info_name or "", set(params), _options_elsewhere(ctx))
        for name, given in values.items():  # a wrong type names the file and key, not a flag
            try:
                params[name].process_value(ctx, given)
            except Exception as err:  # click's BadParameter, pydantic's errors: any conversion failure
                message = getattr(err, "message", None) or str(err)
                raise UserError(f"--config {value}: {name} = {given!r}: {message}") from None
        ctx.default_map = {**(ctx.default_map or {}), **values}
    return value


def find_config(path: Path) -> Path:
    """``path`` as given (relative to the working folder), else relative to the servelab
    checkout (``examples/simulate.toml`` from any folder); not found is one line saying where
    it looked."""
    path = Path(path)
    if path.is_file() or path.is_absolute():
        return path
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / path).is_file():
        return checkout / path
    raise UserError(f"--config {path}: no such file (looked in {Path.cwd()} and in the servelab checkout "
                    f"{checkout})")


def load_config(path: Path, command: str, options: set[str], elsewhere: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The ``default_map`` for ``command`` (whose parameter names are ``options``) from ``path``;
    a shared key in ``elsewhere`` (an option of another config command) is skipped."""
    path = find_config(path)
    where = f"--config {path}"
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as err:
        raise UserError(f"{where}: cannot read ({err.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{where}: not valid TOML ({err})") from None
    shared = {k: v for k, v in data.items() if not (k in COMMANDS and isinstance(v, dict))}
    section = data.get(command, {}) if isinstance(data.get(command), dict) else {}
    values: dict[str, Any] = {}
    for scope, table in (("", shared), (f"[{command}] ", section)):
        for key, raw in table.items():
            name = key.replace("-", "_")
            if name == "json":
                name = "json_out"
            if name not in options:
                if not scope and name in elsewhere:
                    continue  # a shared key for another command (rates when simulating)
                raise UserError(f"{where}: {scope}unknown key {key!r} for {command}; valid: "
                                f"{', '.join(sorted(o for o in options if o != 'json_out'))}")
            values[name] = _value(name, raw, f"{where}: {scope}{key}")
    return values


def _options_elsewhere(ctx: typer.Context) -> frozenset[str]:
    """Parameter names of the other commands that take ``--config``, read from the root command
    the context belongs to (so this module needs nothing from the app that uses it)."""
    commands = getattr(ctx.find_root().command, "commands", {})
    return frozenset(p.name for name, cmd in commands.items() if name in COMMANDS and name != ctx.info_name
                     for p in cmd.params)


def _value(name: str, raw: Any, where: str) -> Any:
    """TOML value -> the string or scalar the option parses."""
    if isinstance(raw, dict):
        if name not in _SPEC_TABLES:
            raise UserError(f"{where}: a table is only allowed for {', '.join(_SPEC_TABLES)}")
        return _spec_from_table(raw, _SPEC_TABLES[name], where)
    if isinstance(raw, list):
        if not raw or any(isinstance(x, (dict, list)) for x in raw):
            raise UserError(f"{where}: expected a non-empty list of numbers or strings")
        sep = ";" if name == "policies" else ","
        if name == "policies":
            return ",".join(str(x).replace(",", ";") for x in raw)
        return sep.join(str(x) for x in raw)
    if not isinstance(raw, (str, int, float, bool)):
        raise UserError(f"{where}: unsupported value {raw!r}")
    return raw


def _spec_from_table(table: dict, head: str, where: str) -> str:
    """``{source = "poisson", rate = 5}`` -> ``poisson:rate=5`` (checked later by its parser)."""
    if not isinstance(table.get(head), str) or not table[head]:
        raise UserError(f"{where}: needs {head} = \"...\"")
    params = []
    for key, value in table.items():
        if key == head:
            continue
        if isinstance(value, (dict, list)):
            raise UserError(f"{where}.{key}: expected a number or a string, got {type(value).__name__}")
        text = str(value).lower() if isinstance(value, bool) else str(value)
        params.append(f"{key}={text}")
    return table[head] + (":" + ",".join(params) if params else "")
