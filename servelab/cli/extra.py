"""Commands contributed by the designs and the engine, attached to the main app.

``reproduce`` (``cli.reproduce_cmds``) and ``analyze`` are groups with one sub-command per
design; each imports its design's module only when run, so ``servelab --help`` stays fast and
torch-free.
"""

from __future__ import annotations

from typing import Optional

import typer

from servelab.cli.common import emit_json, user_errors

analyze_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Closed-form analysis of a design.")


@analyze_app.command("multibin")
def analyze_multibin(
    distribution: str = typer.Option("uniform", help="uniform | exponential"),
    lmin: float = typer.Option(1.0), lmax: float = typer.Option(20.0), mu: float = typer.Option(0.1),
    batch_size: int = typer.Option(128), k_max: int = typer.Option(8),
    eps: Optional[float] = typer.Option(None, help="Report the smallest k with throughput >= c_max - eps."),
    arrival_rate: Optional[float] = typer.Option(None, help="Also give the expected latency (Lemma 5.1)."),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Throughput_k (Thm 4.2), c_max (Eq. 5), k(eps) (Thm 4.3), latency (Lemma 5.1), exponential bound."""
    from servelab.designs.multibin.theory import analyze, format_analysis

    with user_errors():
        result = analyze(distribution, lmin=lmin, lmax=lmax, mu=mu, batch_size=batch_size, k_max=k_max, eps=eps,
                         arrival_rate=arrival_rate)
    if json_out:
        emit_json(result)
    else:
        from servelab.cli.common import print_markdown

        print_markdown(format_analysis(result))


def register(app: typer.Typer) -> None:
    from servelab.cli import reproduce_cmds  # one command per registered reproduction, and reproduce all

    reproduce_cmds.register(app)
    app.add_typer(analyze_app, name="analyze")
    from servelab.cli import serve_cmds  # typer only; FastAPI and torch load inside the commands

    serve_cmds.register(app)
    try:
        from servelab.cli import engine_cmds
    except ImportError:  # the engine commands are optional
        return
    engine_cmds.register(app)
    from servelab.cli import profile_gpu, validate_cmds  # torch loads inside the commands

    profile_gpu.register(app)

    validate_cmds.register(app)
