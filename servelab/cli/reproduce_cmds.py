"""``servelab reproduce NAME``: one command per entry of ``servelab.reproduce.registry``, and
``servelab reproduce all``.

Every design's command takes the same options (``--out``, ``--reduced``, ``--seed``, ``--json``,
``--quiet``; ``--seeds`` and ``--variant`` where the design has them) plus its own, declared in
its registry entry; the runner shows progress with an ETA on stderr and writes partial results
as it goes. The design's module is imported only when its command runs, so ``servelab --help``
stays fast and torch-free.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Optional

import typer

from servelab.cli.common import check_out_dir, emit_json, user_errors
from servelab.core.errors import UserError
from servelab.reproduce.registry import REPRODUCTIONS, Entry

reproduce_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Reproduce a paper's figures and claims (simulated unless a "
                                                       "command says measured).")


def _param(name: str, default: Any, annotation: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _params(entry: Entry) -> list[inspect.Parameter]:
    params = [_param("out", typer.Option(Path("results/reproduction"), help=f"Folder for the report, its plots and "
                                         f"JSON ({entry.name}.partial.json holds the results so far while it runs)."),
                     Path)]
    if entry.has_reduced:
        reduced_s = entry.cpu_s.get("reduced")
        params.append(_param("reduced", typer.Option(False, "--reduced", help="Smaller sizes" + (
            f" (about {reduced_s:.0f} CPU-s)." if reduced_s else ".")), bool))
    params.append(_param("seed", typer.Option(0, help="First seed."), int))
    if entry.seeds:
        params.append(_param("seeds", typer.Option(None, min=1, help="Number of seeds (seed, seed+1, ...); "
                                                                     "claims show a mean and a 95% interval."),
                             Optional[int]))
    if entry.variants:
        params.append(_param("variant", typer.Option(None, help="Run a named variant: " + ", ".join(entry.variants)
                                                     + f" (files {entry.name}-VARIANT.*)."), Optional[str]))
    for opt in entry.options:
        kind = opt.type if opt.type is not None else type(opt.default)
        decls = (f"{opt.flag}/--no-{opt.flag[2:]}",) if kind is bool else (opt.flag,)
        params.append(_param(opt.name, typer.Option(opt.default, *decls, help=opt.help), kind))
    params.append(_param("json_out", typer.Option(False, "--json", help="Print the results as JSON on stdout."), bool))
    params.append(_param("quiet", typer.Option(False, "--quiet", help="No progress lines on stderr."), bool))
    return params


def _design_command(entry: Entry):
    def command(**kw: Any) -> None:
        _run(entry, kw)

    params = _params(entry)
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__name__ = "reproduce_" + entry.name.replace("-", "_")
    command.__doc__ = f"{entry.summary}\n\n{entry.duration_text()}"
    return command


def _run(entry: Entry, kw: dict[str, Any]) -> None:
    from servelab.reproduce.runner import run_reproduction

    out: Path = kw["out"]
    reduced = bool(kw.get("reduced", False))
    with user_errors():
        check_out_dir(out)
        repro = entry.load()
        result = run_reproduction(repro, out, reduced=reduced, seed=kw["seed"],
                                  options={o.name: kw[o.name] for o in entry.options}, num_seeds=kw.get("seeds"),
                                  variant=kw.get("variant"), progress=not kw["quiet"],
                                  expected_cpu_s=entry.cpu_s.get("reduced" if reduced else "full"))
    if kw["json_out"]:
        emit_json(result)
    else:
        stem = entry.name if kw.get("variant") is None else f"{entry.name}-{kw['variant']}"
        typer.echo(f"wrote {out / repro.report.format(stem=stem)} and its plots")


def reproduce_all_cmd(
    out: Path = typer.Option(Path("results/reproduction"), help="Folder for the runs (reduced/, and full/ with "
                             "--full) and for README.md, the claims of all five."),
    docs: Optional[Path] = typer.Option(None, help="Folder of the committed full reports to compare against "
                                        "(default: docs/reproduction here, else in the checkout that holds "
                                        "servelab)."),
    full: bool = typer.Option(False, "--full", help="Also run every reproduction at the paper's sizes (into "
                              "OUT/full, or --docs with --update-docs) and compare against those."),
    update_docs: bool = typer.Option(False, "--update-docs", help="Write README.md and README.json into --docs "
                                     "(and the full reports, with --full): how the committed docs are made."),
    only: Optional[str] = typer.Option(None, help="Comma-separated designs to run (the README still lists all)."),
    seed: int = typer.Option(0),
    readme_only: bool = typer.Option(False, "--readme-only", help="Run nothing: rebuild README.md in --docs "
                                     "(default docs/reproduction) from its README.json and the full reports there "
                                     "(after a design's full report changed)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress lines on stderr."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    from servelab.reproduce.all import DOCS, committed_docs, designs, rebuild_readme, reproduce_all

    with user_errors():
        if readme_only:
            typer.echo(f"wrote {rebuild_readme(docs or DOCS)}")
            return
        names = tuple(x.strip() for x in only.split(",") if x.strip()) if only else ()
        known = {e.name for e in designs()}
        if set(names) - known:
            raise UserError(f"--only: unknown design(s) {sorted(set(names) - known)}; choose from {sorted(known)}")
        docs_dir = docs or committed_docs()
        if update_docs and docs_dir is None:
            docs_dir = DOCS
        check_out_dir(out)
        if update_docs:
            check_out_dir(docs_dir, "--docs")
        command = "servelab reproduce all" + (" --full" if full else "") + (" --update-docs" if update_docs else "") \
            + (f" --only {only}" if only else "") + (f" --out {out}" if out != Path("results/reproduction") else "")
        say = (lambda _m: None) if quiet else (lambda m: typer.echo(f"  {m}", err=True))
        runs = reproduce_all(out_dir=out, full_dir=docs_dir, full=full, seed=seed, command=command, say=say,
                             only=names, readme_dir=docs_dir if update_docs else out,
                             full_out=docs_dir if update_docs else None)
    if json_out:
        emit_json(runs)
        return
    for name, run in runs.items():
        typer.echo(f"{name:<18} {'failed: ' + run['error'] if run.get('error') else 'ok'} ({run['cpu_s']:.0f} CPU-s)")
    typer.echo(f"wrote {(docs_dir if update_docs else out) / 'README.md'}")


def _all_help() -> str:
    entries = [e for e in REPRODUCTIONS if e.in_all]
    reduced, full = (sum(e.cpu_s[size] for e in entries) / 60 for size in ("reduced", "full"))
    return (f"Run {', '.join(e.name for e in entries)} at reduced size (about {reduced:.0f} min of CPU; --full: "
            f"{full:.0f} min more) and gather their headline claims, each reduced verdict next to the full run's, "
            "into OUT/README.md. The committed docs are written only with --update-docs (or --readme-only).")


def _short(summary: str, width: int = 60) -> str:
    """The summary cut at a word boundary for `reproduce --help`'s command list."""
    return summary if len(summary) <= width else summary[:width].rsplit(" ", 1)[0] + "..."


def register(app: typer.Typer) -> typer.Typer:
    for entry in REPRODUCTIONS:
        # short_help: click cuts the listing at the first full stop, and "Figs. 5/11" has one
        reproduce_app.command(entry.name, short_help=_short(entry.summary))(_design_command(entry))
    reproduce_all_cmd.__doc__ = _all_help()
    reproduce_app.command("all")(reproduce_all_cmd)
    app.add_typer(reproduce_app, name="reproduce")
    return reproduce_app
