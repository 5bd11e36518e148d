"""``servelab reproduce all``: every paper's reproduction (reduced; ``--full`` for the paper's
sizes too) and docs/reproduction/README.md, the claims of all five in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from servelab.cli.common import check_out_dir, emit_json, user_errors
from servelab.core.errors import UserError


def reproduce_all_cmd(
    docs: Path = typer.Option(Path("docs/reproduction"), help="Folder of the full reports; README.md is written "
                              "here (and the full reports too, with --full)."),
    out: Path = typer.Option(Path("results/reproduction/reduced"), help="Folder for the reduced reports."),
    full: bool = typer.Option(False, "--full", help="Also rerun every reproduction at the paper's sizes into "
                              "--docs (tens of minutes)."),
    only: Optional[str] = typer.Option(None, help="Comma-separated designs to run (the README still lists all)."),
    seed: int = typer.Option(0),
    readme_only: bool = typer.Option(False, "--readme-only", help="Run nothing: rebuild README.md from the full "
                                     "reports and the reduced runs kept in README.json (after a design's full "
                                     "report changed)."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Run multibin, bucketserve, dynaserve, alignedserve and kunserve; gather their headline claims,
    with the reduced run's verdicts next to the full run's, into docs/reproduction/README.md."""
    from servelab.reproduce_all import REPRODUCTIONS, rebuild_readme, reproduce_all

    with user_errors():
        if readme_only:
            path = rebuild_readme(docs)
            typer.echo(f"wrote {path}")
            return
        check_out_dir(docs, "--docs")
        check_out_dir(out)
        names = tuple(x.strip() for x in only.split(",") if x.strip()) if only else ()
        known = {r.name for r in REPRODUCTIONS}
        if set(names) - known:
            raise UserError(f"--only: unknown design(s) {sorted(set(names) - known)}; choose from {sorted(known)}")
        command = "servelab reproduce all" + (" --full" if full else "") + \
            (f" --only {only}" if only else "") + (f" --out {out}" if out != Path("results/reproduction/reduced")
                                                 else "")
        say = (lambda _m: None) if json_out else (lambda m: typer.echo(f"  {m}", err=True))
        runs = reproduce_all(docs_dir=docs, reduced_dir=out, full=full, seed=seed, command=command, say=say,
                             only=names)
    if json_out:
        emit_json(runs)
        return
    for name, run in runs.items():
        typer.echo(f"{name:<14} {'failed: ' + run['error'] if run.get('error') else 'ok'} ({run['cpu_s']:.0f} CPU-s)")
    typer.echo(f"wrote {docs}/README.md")


def register(reproduce_app: typer.Typer) -> None:
    reproduce_app.command("all")(reproduce_all_cmd)
